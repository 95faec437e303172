"""The shared library of the six AGMARL-DKS services, in four layers that import downward only
(``tests/test_architecture.py`` checks it):

- ``core``: pure functions and data, no I/O: the cluster model, hard filter and cluster view
  (``core.cluster``), the simulator (``core.sim``), the heuristic policies and scorers (``core.policies``),
  the model inputs (``core.features``), the reward (``core.reward``) and the adaptive gate (``core.adaptive``);
- ``runtime``: what makes a process a service: the wire contract (``messages``, ``subjects``,
  ``permissions``), the NATS bus and its server, the service shell, settings, health, metrics, tracing;
- ``kube``: Kubernetes objects to the cluster model and back, and the one kubeconfig loader;
- ``serving``: the ONNX policy, the signed model store.

Test rigs (fixtures, the stand-in API server, state builders) live in ``libs/testing/agmarl_testing`` and
never ship in the wheel.
"""
