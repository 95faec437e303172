"""Loaders for the Alibaba ``cluster-trace-gpu-v2023`` ("openb") node and pod lists.

The CSVs are the inputs of the FGD paper (Weng et al., USENIX ATC'23). They are read from the
shared, read-only data folder (never copied into the repo); every loader takes a path so tests
and other clusters can point elsewhere. A missing file, a missing column or a malformed value is
a ``ValueError`` that names the file and the problem.

Node list columns: ``sn,cpu_milli,memory_mib,gpu,model``.
Pod list columns: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` are required; ``gpu_spec,qos,
pod_phase,creation_time,deletion_time,scheduled_time`` are optional (several public openb pod lists
carry only the five): a missing one takes its neutral value (any GPU model, no QoS class, created at 0,
runs forever).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, HOSTNAME_LABEL, MAX_GPUS, Node, Pod

# <repo>/libs/common/agmarl_common/core/sim/traces.py -> <repo>/../shared/data/traces
_REPO_ROOT = Path(__file__).resolve().parents[5]
TRACES_DIR = _REPO_ROOT.parent / "shared" / "data" / "traces"
OPENB_DIR = TRACES_DIR / "alibaba-openb-gpu-v2023"
FGD_EXPECTED_DIR = TRACES_DIR / "fgd-atc23-expected-results"

ALL_NODES = "openb_node_list_all_node.csv"  # 1523 nodes (1213 with GPUs)
GPU_NODES = "openb_node_list_gpu_node.csv"  # the 1213 GPU nodes: the cluster the FGD paper simulates
GPU_MODEL_LABEL = "alibabacloud.com/gpu-card-model"

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # the rest are optional


def openb_node_path(name: str = ALL_NODES, trace_dir: str | Path | None = None) -> Path:
    """Path of an openb node list (``ALL_NODES`` or ``GPU_NODES``) in ``trace_dir`` (default: shared)."""
    return Path(trace_dir or OPENB_DIR) / name


def openb_pod_path(workload: str = "default", trace_dir: str | Path | None = None) -> Path:
    """Path of ``openb_pod_list_<workload>.csv`` (e.g. ``default``, ``cpu050``, ``gpushare40``)."""
    return Path(trace_dir or OPENB_DIR) / f"openb_pod_list_{workload}.csv"


def _read_rows(path: Path, required: tuple[str, ...], what: str) -> list[dict[str, str]]:
    if not path.is_file():
        raise ValueError(f"{what}: file not found: {path}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise ValueError(f"{what} {path}: missing columns {missing} (found {header})")
        return list(reader)


def _int(row: dict[str, str], col: str, path: Path, line: int, default: int | None = None) -> int:
    raw = (row.get(col) or "").strip()
    if raw == "" and default is not None:
        return default
    try:
        return int(float(raw))
    except ValueError:
        raise ValueError(f"{path}:{line}: column {col!r} is not a number: {raw!r}") from None


def load_openb_nodes(path: str | Path | None = None) -> tuple[Node, ...]:
    """Nodes of an openb node list (default: all 1523 nodes in the shared folder)."""
    p = Path(path) if path is not None else openb_node_path()
    nodes = []
    for line, row in enumerate(_read_rows(p, NODE_COLUMNS, "openb node list"), start=2):
        name = row["sn"].strip()
        gpus = _int(row, "gpu", p, line)
        model = (row.get("model") or "").strip()
        if not name:
            raise ValueError(f"{p}:{line}: empty node name")
        if not 0 <= gpus <= MAX_GPUS:
            raise ValueError(f"{p}:{line}: gpu count {gpus} outside 0..{MAX_GPUS}")
        if gpus > 0 and not model:
            raise ValueError(f"{p}:{line}: node {name} has {gpus} GPUs but no model")
        labels = {HOSTNAME_LABEL: name}
        if model:
            labels[GPU_MODEL_LABEL] = model
        nodes.append(Node(name=name, cpu_milli=_int(row, "cpu_milli", p, line),
                          memory_mib=_int(row, "memory_mib", p, line), gpu_count=gpus,
                          gpu_model=model if gpus > 0 else "", labels=labels))
    return tuple(nodes)


def load_openb_pods(path: str | Path | None = None, namespace: str = "openb") -> tuple[Pod, ...]:
    """Pods of an openb pod list (default: ``openb_pod_list_default.csv``), in file order.

    ``gpu_milli`` is per GPU and clamped to 0..1000 as the FGD simulator does; a pod without GPUs
    gets ``gpu_milli == 0``. ``duration`` is ``deletion_time - scheduled_time`` (or creation time
    when never scheduled), 0 when unknown. Only ``POD_COLUMNS`` are required; in a file without the
    others every pod has no GPU model constraint, no QoS class, creation time 0 and duration 0.
    """
    p = Path(path) if path is not None else openb_pod_path()
    pods = []
    for line, row in enumerate(_read_rows(p, POD_COLUMNS, "openb pod list"), start=2):
        name = row["name"].strip()
        if not name:
            raise ValueError(f"{p}:{line}: empty pod name")
        num_gpu = _int(row, "num_gpu", p, line)
        milli = _int(row, "gpu_milli", p, line, default=0)
        if num_gpu < 0 or num_gpu > MAX_GPUS:
            raise ValueError(f"{p}:{line}: num_gpu {num_gpu} outside 0..{MAX_GPUS}")
        milli = min(max(milli, 0), GPU_MILLI) if num_gpu > 0 else 0
        if num_gpu > 0 and milli == 0:
            raise ValueError(f"{p}:{line}: pod {name} asks {num_gpu} GPUs with gpu_milli 0")
        if num_gpu > 1 and milli < GPU_MILLI:
            raise ValueError(f"{p}:{line}: pod {name} asks a share ({milli}) of {num_gpu} GPUs")
        spec = tuple(s.strip() for s in (row.get("gpu_spec") or "").split("|") if s.strip())
        created = _int(row, "creation_time", p, line, default=0)
        started = _int(row, "scheduled_time", p, line, default=created)
        deleted = _int(row, "deletion_time", p, line, default=0)
        pods.append(Pod(name=name, namespace=namespace, cpu_milli=_int(row, "cpu_milli", p, line),
                        memory_mib=_int(row, "memory_mib", p, line), num_gpu=num_gpu, gpu_milli=milli,
                        gpu_spec=spec, qos=(row.get("qos") or "").strip(), creation_time=float(created),
                        duration=float(max(deleted - started, 0)) if deleted else 0.0))
    return tuple(pods)


def available_workloads(trace_dir: str | Path | None = None) -> list[str]:
    """Workload names (``default``, ``cpu050``...) whose pod lists exist in ``trace_dir``."""
    d = Path(trace_dir or OPENB_DIR)
    return sorted(f.stem.removeprefix("openb_pod_list_") for f in d.glob("openb_pod_list_*.csv"))


# ---------------------------------------------------------------------------------------------
# The FGD paper's published results (experiments/analysis/expected_results in its repository)

FGD_POLICY_LABELS = {"01-Random": "random", "02-DotProd": "dotprod", "03-GpuClustering": "gpu-clustering",
                     "04-GpuPacking": "gpu-packing", "05-BestFit": "bestfit", "06-FGD": "fgd"}
EXPECTED_COLUMNS = ("workload", "sc_policy", "tune", "seed")


def load_fgd_expected(path: str | Path | None = None) -> dict[tuple[str, str, int], np.ndarray]:
    """Published per-seed curves, keyed (workload, policy, seed) -> (131,) values at arrived 0..130 %.

    ``workload`` drops the ``openb_pod_list_`` prefix; ``policy`` uses our names (``FGD_POLICY_LABELS``).
    Default file: ``analysis_allo_discrete.csv`` (GPU allocation %); missing points are NaN.
    """
    p = Path(path) if path is not None else FGD_EXPECTED_DIR / "analysis_allo_discrete.csv"
    out: dict[tuple[str, str, int], np.ndarray] = {}
    for line, row in enumerate(_read_rows(p, EXPECTED_COLUMNS + ("0", "130"), "FGD expected results"), start=2):
        label = row["sc_policy"].strip()
        if label not in FGD_POLICY_LABELS:
            raise ValueError(f"{p}:{line}: unknown policy {label!r}")
        curve = np.array([float(row[str(x)]) if (row.get(str(x)) or "").strip() else np.nan
                          for x in range(131)], dtype=np.float64)
        workload = row["workload"].strip().removeprefix("openb_pod_list_")
        out[(workload, FGD_POLICY_LABELS[label], _int(row, "seed", p, line))] = curve
    return out
