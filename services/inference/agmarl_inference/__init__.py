"""inference: scores candidate nodes with the active policy (baseline or ONNX model) and publishes
decisions; later also the kube-scheduler extender."""
