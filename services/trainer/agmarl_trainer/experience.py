"""Recorded experience -> fine-tuning data, and the bounded buffer the trainer keeps it in.

An ``Experience`` (reward-calculator -> EXPERIENCE stream) is usable for fine-tuning when it says what
the scheduler saw and what it did:

    state["cluster"]   the cluster before the decision: the deflated compact form the reward-calculator sends
                       (``cluster.compact.deflated``: nodes, bound pods as shared specs, compressed; the other
                       pending pods), the plain compact form (experience recorded before it), or
                       ``cluster.model.state_to_dict`` form (a state dict with ``nodes`` at top level is
                       accepted too) with the pending pods in ``state["pending"]``
    action["pod"]      the pod placed (``to_dict`` form); else the pod whose key is ``action["pod_key"]``
                       among ``state["pending"]`` (``ClusterSnapshot.pending`` form)
    action["node"]     the node it was bound to (a name)

Use (``experience_samples``): the decisions whose signal is at or above the median of the usable transitions
become imitation samples. The signal is each decision's own credit (``Experience.credit["total"]``: its
placement's difference reward against a reference policy's on the same cluster, from the reward-calculator)
when every usable transition carries one, else the window reward (shared by all decisions of a window, so it
says little about any one of them). A sample is the graph of that one pending pod (``features.build_graph``, the
code serving uses) labelled with the node it was bound to. Transitions that carry no cluster state (the
reward-calculator leaves it out when it had no snapshot before the decision or the state was too large),
name an unknown pod, or a node the hard filter rejects are counted by reason and not used. Everything
here but ``ExperienceBuffer`` is pure.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from agmarl_common.runtime import messages as m
from agmarl_common.core.cluster.compact import inflated, is_compact, is_deflated, state_from_compact
from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, Pod, pod_from_dict, state_from_dict
from agmarl_common.core.features import FeatureContext, build_graph

log = logging.getLogger("agmarl.trainer.experience")

if TYPE_CHECKING:  # the samples' module imports torch: the trainer service (the buffer) runs without it
    from agmarl_trainer.rollout import Sample


@dataclass(frozen=True)
class Decision:
    """One recorded decision, decoded: the pod, the cluster it saw, its feasible nodes and the pick."""

    state: ClusterState
    pod: Pod
    candidates: np.ndarray  # (C,) int64 feasible node indexes, ascending
    choice: int  # position of the chosen node in ``candidates``
    reward: float
    workload: tuple[Pod, ...]  # the pods the cluster runs and waits for (fragmentation target)
    credit: float | None = None  # its own difference reward (None: the experience carries none)


def _cluster_dict(state: Mapping[str, Any]) -> Mapping[str, Any] | None:
    cluster = state.get("cluster")
    if isinstance(cluster, Mapping) and ("nodes" in cluster or is_deflated(cluster)):
        return cluster
    return state if "nodes" in state else None


def _cluster_and_pending(state: Mapping[str, Any],
                         cluster: Mapping[str, Any]) -> tuple[ClusterState, tuple[Pod, ...]]:
    """The cluster state and the pods waiting besides the one placed (compact, deflated compact or
    ``state_to_dict`` form)."""
    if is_deflated(cluster):
        return state_from_compact(inflated(cluster))
    if is_compact(cluster):
        return state_from_compact(cluster)
    return state_from_dict(cluster), tuple(pod_from_dict(p) for p in state.get("pending", ()) or ())


def _placed_pod(state: Mapping[str, Any], action: Mapping[str, Any]) -> Pod | None:
    if isinstance(action.get("pod"), Mapping):
        return pod_from_dict(action["pod"])
    key = action.get("pod_key", "")
    for raw in state.get("pending", ()) or ():
        pod = pod_from_dict(raw)
        if pod.key == key:
            return pod
    return None


def decode_decision(exp: m.Experience) -> tuple[Decision | None, str]:
    """(decision, "") or (None, reason) with reason one of: no_cluster_state, unknown_pod, unknown_node,
    infeasible_node, invalid."""
    cluster = _cluster_dict(exp.state)
    if cluster is None:
        return None, "no_cluster_state"
    try:
        state, pending = _cluster_and_pending(exp.state, cluster)
        pod = _placed_pod(exp.state, exp.action)
    except (TypeError, ValueError, KeyError):
        return None, "invalid"
    if pod is None:
        return None, "unknown_pod"
    node = str(exp.action.get("node", ""))
    if node not in state.index:
        return None, "unknown_node"
    pod = replace(pod, node_name="", gpu_devices=())  # as it was while pending
    cand = feasible_nodes(pod, state)
    hit = np.flatnonzero(cand == state.index[node])
    if hit.size == 0:
        return None, "infeasible_node"
    workload = tuple(state.all_pods()) + tuple(p for p in pending if p.key != pod.key) + (pod,)
    total = exp.credit.get("total") if isinstance(exp.credit, Mapping) else None
    credit = float(total) if isinstance(total, (int, float)) and np.isfinite(total) else None
    return Decision(state, pod, cand, int(hit[0]), float(exp.reward), workload, credit), ""


def reward_threshold(rewards: Sequence[float], quantile: float = 0.5) -> float:
    """The reward a decision must reach to be imitated (the median by default); +inf when none."""
    return float(np.quantile(np.asarray(rewards, float), quantile)) if len(rewards) else float("inf")


def experience_samples(transitions: Iterable[m.Experience], quantile: float = 0.5, max_samples: int = 0,
                       objective: str = "composite", scheme: str = "fixed", signal: str = "auto"
                       ) -> tuple[list[Sample], dict[str, int]]:
    """Imitation samples from the decisions at or above the ``quantile`` of their signal, and counts by outcome
    (``used``, ``below_threshold``, ``by_credit`` (1 when credit was the signal) and the ``decode_decision``
    reasons). ``signal``: "credit", "reward", or "auto" (credit when every usable decision has one).
    ``max_samples`` > 0 keeps the most recent ones. The graphs carry the deployment's ``objective`` and reward
    ``scheme`` (the inputs the serving model saw)."""
    counts: dict[str, int] = {}
    decisions: list[Decision] = []
    for exp in transitions:
        d, why = decode_decision(exp)
        if d is None:
            counts[why] = counts.get(why, 0) + 1
        else:
            decisions.append(d)
    if signal not in ("auto", "credit", "reward"):
        raise ValueError(f"signal must be auto, credit or reward, not {signal!r}")
    by_credit = signal == "credit" or (signal == "auto" and bool(decisions)
                                       and all(d.credit is not None for d in decisions))

    def value(d: Decision) -> float:
        return (d.credit if d.credit is not None else float("-inf")) if by_credit else d.reward

    cut = reward_threshold([value(d) for d in decisions], quantile)
    above = [d for d in decisions if value(d) >= cut]
    counts["by_credit"] = int(by_credit)
    kept = above[-max_samples:] if max_samples > 0 else above
    counts["below_threshold"] = len(decisions) - len(above)
    counts["used"] = len(kept)
    return [decision_sample(d, objective, scheme) for d in kept], counts


def decision_sample(d: Decision, objective: str = "composite", scheme: str = "fixed") -> Sample:
    """The graph of the one pending pod on the state it saw, labelled with the candidate it was bound to."""
    from agmarl_trainer.rollout import Sample

    graph = build_graph([d.pod], d.state, [d.candidates], FeatureContext.from_workload(d.workload, objective, scheme))
    credit = np.array([d.credit], float) if d.credit is not None else np.zeros(0)
    return Sample(graph, np.array([d.choice], np.int64), reward=d.reward, credit=credit)


# ---------------------------------------------------------------------------------------------
# The buffer (the trainer service's state; file I/O)


def mirror_retry_due(failed_tries: int, adds_since: int, seconds_since: float, max_adds: int = 1024,
                     max_seconds: float = 60.0) -> bool:
    """Whether an add tries the mirror file again after ``failed_tries`` failed tries in a row, ``adds_since``
    adds and ``seconds_since`` seconds since the last one: always when none failed, else after 1, 2, 4, ...
    adds (at most ``max_adds``) or ``max_seconds``, whichever comes first."""
    if failed_tries <= 0:
        return True
    return adds_since >= min(max_adds, 1 << min(failed_tries - 1, 30)) or seconds_since >= max_seconds


class ExperienceBuffer:
    """The last ``capacity`` transitions (deduplicated by id) and at most ``max_bytes`` of their JSON,
    mirrored to a JSONL file so a restart keeps them. The file is rewritten with the kept transitions when
    it holds twice as many lines or bytes; at start only its tail (the newest ``max_bytes``) is read. A
    transition the file cannot take (an OSError: full disk, unwritable directory) is still kept in memory,
    counted in ``mirror_failures`` and logged; the file is then tried again only as ``mirror_retry_due``
    allows (the adds in between are kept and counted, not written), and the first try that succeeds rewrites
    it with every kept transition, so it is back in step with memory."""

    def __init__(self, capacity: int, path: Path | None = None, max_bytes: int = 64 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic):
        self.capacity = max(1, capacity)
        self.max_bytes = max(1, max_bytes)
        self.path = path
        self.items: OrderedDict[str, m.Experience] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.bytes = 0
        self._lines = 0
        self._file_bytes = 0
        self.mirror_failures = 0  # transitions kept but not written to ``path`` when added
        self.mirror_behind = False  # the file must be rewritten to hold every kept transition
        self._clock = clock
        self._failed_tries = 0  # tries of the file that failed in a row
        self._adds_since_try = 0
        self._last_try = 0.0
        if path is not None and path.is_file():
            for line in _tail_lines(path, self.max_bytes):
                try:
                    self._keep(m.Experience.model_validate_json(line), len(line) + 1)
                except ValueError:
                    continue  # a torn last line after a crash
            self.mirror_behind = True  # drop what the tail left out
            self._mirror(None)

    def __len__(self) -> int:
        return len(self.items)

    def _keep(self, exp: m.Experience, size: int) -> bool:
        if exp.id in self.items:
            return False
        self.items[exp.id] = exp
        self._sizes[exp.id] = size
        self.bytes += size
        while len(self.items) > 1 and (len(self.items) > self.capacity or self.bytes > self.max_bytes):
            old, _ = self.items.popitem(last=False)
            self.bytes -= self._sizes.pop(old)
        return True

    def add(self, exp: m.Experience) -> bool:
        """Keep one transition (False when its id is already kept)."""
        line = exp.model_dump_json() + "\n"
        if not self._keep(exp, len(line)):
            return False
        if self.path is not None and not self._mirror(line):
            self.mirror_failures += 1
        return True

    def _mirror(self, line: str | None) -> bool:
        """Append ``line`` to the file (rewrite it when it is behind or too long); False when ``line`` is not
        in the file: the try failed, or it was not due."""
        assert self.path is not None
        self._adds_since_try += 1
        if not mirror_retry_due(self._failed_tries, self._adds_since_try, self._clock() - self._last_try):
            self.mirror_behind = True
            return False
        self._adds_since_try, self._last_try = 0, self._clock()
        written = False
        try:
            if not self.mirror_behind and line is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write(line)
                self._lines += 1
                self._file_bytes += len(line)
                written = True
            if self.mirror_behind or self._lines > 2 * self.capacity or self._file_bytes > 2 * self.max_bytes:
                self.mirror_behind = True  # until ``write`` succeeds
                self.write(self.path)
                written = True
        except OSError as exc:  # e.g. an unwritable state directory: kept in memory, not mirrored
            self.mirror_behind = True  # the file lacks this line (or a rewrite): the next good try rewrites it
            self._failed_tries += 1
            log.error("experience not mirrored to %s (%d tries failed in a row; kept in memory, lost on a restart "
                      "until the file is rewritten): %s", self.path, self._failed_tries, exc)
            return written
        if self._failed_tries:
            log.warning("experience mirrored to %s again: rewritten with all %d kept transitions", self.path,
                        len(self.items))
            self._failed_tries = 0
        return True

    def write(self, path: Path) -> int:
        """Every kept transition, oldest first, as JSONL (atomic replace); returns how many."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        size = 0
        try:
            with tmp.open("w") as f:  # opened first: an unwritable directory fails before any serialising
                for e in self.items.values():
                    size += f.write(e.model_dump_json() + "\n")
            tmp.replace(path)
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk: free what the partial copy took
            raise
        if path == self.path:
            self._lines, self._file_bytes, self.mirror_behind = len(self.items), size, False
        return len(self.items)


def _tail_lines(path: Path, max_bytes: int) -> list[str]:
    """The complete lines among the last ``max_bytes`` of a file (never the whole of a huge file)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if size > max_bytes:
            f.seek(size - max_bytes)
            f.readline()  # a partial line
        data = f.read()
    return [ln for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()]


def read_experience(path: str | Path) -> list[m.Experience]:
    """Transitions of a JSONL file (what ``ExperienceBuffer.write`` wrote); a missing file is empty."""
    p = Path(path)
    if not p.is_file():
        return []
    return [m.Experience.model_validate(json.loads(line)) for line in p.read_text().splitlines() if line.strip()]
