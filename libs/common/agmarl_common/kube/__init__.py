"""Kubernetes: API objects to the cluster model and back (``convert``, ``nodes``, ``pods``, ``quantity``) and the
one kubeconfig loader (``client``)."""
