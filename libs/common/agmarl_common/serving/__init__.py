"""Serving the learned policy: the ONNX Runtime policy (``onnx_model``), the model store and its signatures."""
