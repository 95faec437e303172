"""Named clusters and workloads, one resolver for every harness (``agmarl eval``, the live trace replay
of the state-collector, inference's workload brief):

- nodes: ``openb`` / ``openb:gpu`` (the trace's GPU nodes), ``openb:all``, ``synthetic:<n>``, or a node-list
  CSV path;
- workloads: ``openb:<name>`` (a shared pod list such as ``openb:default``), ``openb:<csv path>``, or
  ``synthetic:<name>``.

Bad names raise ``ValueError`` with the known choices. Files are read, nothing else.
"""

from __future__ import annotations

from pathlib import Path

from agmarl_common.core.cluster.model import Node, Pod
from agmarl_common.core.sim import synthetic, traces

SYNTHETIC_CLUSTER_SEED = 0  # the synthetic cluster is the fixed setting; the seed varies the workload


def openb_workload_path(ref: str) -> Path:
    """The pod-list file of ``openb:<ref>`` (a shared list's name, or a CSV path)."""
    if ref.endswith(".csv") or "/" in ref:
        return Path(ref)
    known = traces.available_workloads()
    if ref not in known:
        raise ValueError(f"unknown workload 'openb:{ref}'; known openb workloads: {', '.join(known) or 'none'}"
                         " (or openb:<csv path>)")
    return traces.openb_pod_path(ref)


def cluster_nodes(ref: str) -> tuple[Node, ...]:
    """The nodes a reference names (module docstring)."""
    if ref in ("openb", "openb:gpu"):
        return traces.load_openb_nodes(traces.openb_node_path(traces.GPU_NODES))
    if ref == "openb:all":
        return traces.load_openb_nodes(traces.openb_node_path(traces.ALL_NODES))
    if ref.startswith("synthetic:"):
        n = ref.removeprefix("synthetic:")
        if not n.isdigit() or not 1 <= int(n) <= 100_000:
            raise ValueError(f"bad node spec {ref!r}: synthetic:<n> with 1 <= n <= 100000")
        return tuple(synthetic.synthetic_cluster(int(n), seed=SYNTHETIC_CLUSTER_SEED))
    return traces.load_openb_nodes(ref)


def default_nodes(workload: str) -> str:
    """The cluster a workload runs on when none is named: openb's GPU nodes for openb, 50 synthetic nodes else."""
    return "openb" if workload.startswith("openb:") else "synthetic:50"


def openb_pods(workload: str) -> tuple[Pod, ...]:
    """The pods of an ``openb:...`` workload."""
    kind, _, ref = workload.partition(":")
    if kind != "openb" or not ref:
        raise ValueError(f"not an openb workload: {workload!r} (openb:default, openb:<name> or openb:<csv path>)")
    return traces.load_openb_pods(openb_workload_path(ref))
