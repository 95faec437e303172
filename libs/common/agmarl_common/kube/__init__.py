"""Kubernetes: API objects to the cluster model and back (``convert``, ``nodes``, ``pods``, ``quantity``), the
one kubeconfig loader (``client``) and the one DNS-1123 name check (``names``)."""
