"""`agmarl fidelity kube`: replay placements recorded from a real kube-scheduler and measure agreement.

A placement file (the format of ``../shared/k8s/sim-to-real/``) holds ``nodes`` (v1.Node), ``bound``
(v1.Pod with ``spec.nodeName``) and a ``sequence`` of pods created one at a time, each with the node
the real scheduler chose (``node``, null when it marked the pod unschedulable), the
``unschedulable`` message and ``best_nodes`` (every node sharing the top final score; null when the
pod was not scored). The replay starts from nodes + bound pods; for each sequence pod it runs the
project's hard filter and the policy on the current state, then binds the pod where the real
scheduler did (it never follows the policy's choice, so one disagreement cannot snowball).

It reports:
- ``ranked_first``: placed pods whose real node the policy scores highest (ties allowed), out of
  the pods the real scheduler placed;
- ``unschedulable_agreement``: pods where the hard filter finds no feasible node iff the real
  scheduler marked the pod unschedulable, out of every sequence pod;
- ``top_set_exact``: scored pods whose top-scoring set equals the recorded ``best_nodes``;
- with ``--scores`` (the ``scores-*.json`` beside a placement file: per pod, per node, the real
  scheduler's final and per-plugin weighted scores), the share of (pod, node) pairs whose score
  the policy reproduces exactly, per plugin and for the final score.

Conversion of the Kubernetes objects goes through ``agmarl_common.kube.convert``. The replay itself
(``parse_recording``, ``replay``, ``summarise``, ``compare_scores``) is pure; ``fidelity_command``
is the shell: bad input is a ``FidelityError`` printed on one line, exit status 2.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_cli.eval_spec import resolve_policy
from agmarl_common.core.cluster.model import MAX_GPUS, ClusterState, Node, Pod
from agmarl_common.core.cluster.state import bind
from agmarl_common.kube.convert import KubeConvertError, node_from_k8s, pod_from_k8s, pods_on_nodes
from agmarl_common.core.policies.base import Policy, admitted, brief

KIND_LABEL = "kind"  # the category label the recorded pods carry (plain, gpu, spread-soft, ...)


class FidelityError(ValueError):
    """Bad input: the message names the problem."""


@dataclass(frozen=True)
class Step:
    """One sequence entry: the pod, where the real scheduler put it, and its top-scoring nodes."""

    pod: Pod
    kind: str
    node: str | None
    best_nodes: tuple[str, ...] | None
    unschedulable: str | None


@dataclass(frozen=True)
class Recording:
    nodes: tuple[Node, ...]
    bound: tuple[Pod, ...]
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Outcome:
    """What the policy made of one sequence pod."""

    pod: str
    kind: str
    real_node: str | None
    feasible: int  # nodes the hard filter passes
    top_nodes: tuple[str, ...]  # the policy's top-scoring nodes (ties), () when none is feasible
    ranked_first: bool | None  # real node among top_nodes; None for a pod the real scheduler did not place
    unschedulable_agrees: bool  # no feasible node iff the real scheduler found none
    top_set_exact: bool | None  # top_nodes == best_nodes; None when the pod was not scored


# ---------------------------------------------------------------------------------------------
# Input


def _sequence_entry(raw: Any, k: int, node_names: set[str]) -> Step:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("pod"), Mapping):
        raise FidelityError(f"sequence[{k}]: expected an object with a 'pod'")
    pod = pod_from_k8s(raw["pod"])
    node = raw.get("node")
    if node is not None and (not isinstance(node, str) or node not in node_names):
        raise FidelityError(f"sequence[{k}] ({pod.key}): node {node!r} is not one of the file's nodes")
    best = raw.get("best_nodes")
    if best is not None and (not isinstance(best, list) or not all(isinstance(b, str) for b in best)):
        raise FidelityError(f"sequence[{k}] ({pod.key}): best_nodes must be a list of node names or null")
    reason = raw.get("unschedulable")
    return Step(pod=pod, kind=str(pod.labels.get(KIND_LABEL, "")), node=node,
                best_nodes=None if best is None else tuple(best), unschedulable=None if reason is None else str(reason))


def parse_recording(data: Any) -> Recording:
    """A placement file's JSON -> Recording; FidelityError names what is wrong."""
    if not isinstance(data, Mapping):
        raise FidelityError("expected a JSON object with nodes, bound and sequence")
    for key in ("nodes", "sequence"):
        if not isinstance(data.get(key), list) or not data[key]:
            raise FidelityError(f"'{key}' must be a non-empty list")
    if not isinstance(data.get("bound", []), list):
        raise FidelityError("'bound' must be a list")
    try:
        nodes = tuple(node_from_k8s(n) for n in data["nodes"])
        names = {n.name for n in nodes}
        if len(names) != len(nodes):
            raise FidelityError("two nodes share a name")
        bound = tuple(pod_from_k8s(p) for p in data.get("bound") or [])
        for p in bound:
            if p.node_name not in names:
                raise FidelityError(f"bound pod {p.key}: spec.nodeName {p.node_name!r} is not one of the file's nodes")
        steps = tuple(_sequence_entry(raw, k, names) for k, raw in enumerate(data["sequence"]))
    except KubeConvertError as err:
        raise FidelityError(str(err)) from err
    return Recording(nodes=nodes, bound=bound, steps=steps)


def _read_json(path: str, flag: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise FidelityError(f"{flag} {path}: no such file")
    try:
        return json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FidelityError(f"{flag} {path}: not readable JSON ({err})") from err


def load_recording(path: str) -> Recording:
    return parse_recording(_read_json(path, "--placements"))


# ---------------------------------------------------------------------------------------------
# Replay (pure)


def _devices(policy: Policy, pod: Pod, state: ClusterState, i: int) -> tuple[int, ...]:
    """GPU devices for a pod bound where the real scheduler put it: the policy's choice, else the
    least-used devices (Kubernetes does not say which devices a pod holds; usage must be counted)."""
    if not pod.num_gpu:
        return ()
    chosen = policy.choose_gpus(pod, state, i)
    if chosen is not None:
        return tuple(chosen)
    order = np.argsort(state.gpu_used[i, : min(int(state.gpu_count[i]), MAX_GPUS)], kind="stable")
    return tuple(int(d) for d in order[: (1 if pod.is_gpu_share else pod.num_gpu)])


def _top_nodes(policy: Policy, pod: Pod, state: ClusterState, feasible: np.ndarray) -> tuple[str, ...]:
    cand = admitted(policy, pod, state, feasible)
    if len(cand) == 0:
        return ()
    scores = np.asarray(policy.score(pod, state, cand), dtype=np.float64)
    return tuple(sorted(state.nodes[int(i)].name for i in cand[scores == scores.max()]))


def replay(recording: Recording, policy: Policy) -> list[Outcome]:
    """Score every sequence pod on the state the real scheduler saw, then bind it where it went."""
    state = pods_on_nodes(recording.nodes, recording.bound)
    out: list[Outcome] = []
    for step in recording.steps:
        feasible = feasible_nodes(step.pod, state)
        top = _top_nodes(policy, step.pod, state, feasible)
        scored = step.best_nodes is not None
        out.append(Outcome(
            pod=step.pod.key, kind=step.kind, real_node=step.node, feasible=int(len(feasible)), top_nodes=top,
            ranked_first=None if step.node is None else step.node in top,
            unschedulable_agrees=(len(feasible) == 0) == (step.node is None),
            top_set_exact=tuple(sorted(step.best_nodes)) == top if scored else None))
        if step.node is not None:
            i = state.index[step.node]
            state = bind(state, step.pod, i, _devices(policy, step.pod, state, i))
    return out


def _share(hits: int, total: int) -> dict[str, Any]:
    return {"agree": hits, "total": total, "share": hits / total if total else None}


def summarise(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The figures: ranked first, unschedulable agreement, exact top sets, and ranked first per kind."""
    placed = [o for o in outcomes if o.ranked_first is not None]
    scored = [o for o in outcomes if o.top_set_exact is not None]
    kinds: dict[str, list[Outcome]] = defaultdict(list)
    for o in placed:
        kinds[o.kind].append(o)
    return {
        "pods": len(outcomes),
        "ranked_first": _share(sum(o.ranked_first for o in placed), len(placed)),
        "unschedulable_agreement": {
            **_share(sum(o.unschedulable_agrees for o in outcomes), len(outcomes)),
            "real_unschedulable": sum(o.real_node is None for o in outcomes),
            "filter_only": sum(o.real_node is not None and o.feasible == 0 for o in outcomes),
            "real_only": sum(o.real_node is None and o.feasible > 0 for o in outcomes),
        },
        "top_set_exact": _share(sum(o.top_set_exact for o in scored), len(scored)),
        "ranked_first_by_kind": {k: _share(sum(o.ranked_first for o in v), len(v)) for k, v in sorted(kinds.items())},
    }


# ---------------------------------------------------------------------------------------------
# Per-plugin comparison with a recorded scores file (pure)


@dataclass
class _Tally:
    """Exact-match counts per compared score (a plugin name or "final") and the first mismatch of each."""

    hits: Counter = field(default_factory=Counter)
    totals: Counter = field(default_factory=Counter)
    first_mismatch: dict[str, Any] = field(default_factory=dict)

    def add(self, what: str, pod: str, node: str, real: int, mine: int) -> None:
        self.hits[what] += mine == real
        self.totals[what] += 1
        if mine != real:
            self.first_mismatch.setdefault(what, {"pod": pod, "node": node, "real": real, "policy": mine})


def _compare_pod(policy: Any, step: Step, state: ClusterState, rec: Mapping[str, Any], tally: _Tally) -> None:
    """Tally one recorded pod's (node, plugin) and (node, final) scores against the policy's."""
    names = [n for n in rec["final"] if n in state.index]
    cand = np.array([state.index[n] for n in names], dtype=np.int64)
    recorded = rec.get("plugins") if isinstance(rec.get("plugins"), Mapping) else {}
    total = np.zeros(len(cand))
    for plugin, values in policy.plugin_scores(step.pod, state, cand).items():
        weighted = np.asarray(values) * policy.plugins[plugin][1]
        total += weighted
        for node, mine in zip(names, weighted):
            tally.add(plugin, step.pod.key, node, int((recorded.get(node) or {}).get(plugin, 0)), int(mine))
    for node, mine in zip(names, total):
        tally.add("final", step.pod.key, node, int(rec["final"][node]), int(mine))


def compare_scores(recording: Recording, policy: Policy, scores: Mapping[str, Any]) -> dict[str, Any]:
    """Exact-match shares of the policy's weighted plugin scores and final score against the real
    scheduler's, over the (pod, node) pairs it scored, replayed as ``replay`` does. A plugin absent
    from a recorded node scored 0 there (the real scheduler skipped it); recorded plugins the policy
    does not model (ImageLocality, DynamicResources) are not compared but count in the final score.
    Needs a policy with ``plugins`` and ``plugin_scores`` (``WeightedPluginsPolicy``)."""
    if not (isinstance(getattr(policy, "plugins", None), Mapping) and callable(getattr(policy, "plugin_scores", None))):
        raise FidelityError(f"--scores needs a weighted-plugins policy; {policy.name!r} has no per-plugin scores")
    tally = _Tally()
    state = pods_on_nodes(recording.nodes, recording.bound)
    for step in recording.steps:
        rec = scores.get(step.pod.name)
        if isinstance(rec, Mapping) and isinstance(rec.get("final"), Mapping) and rec["final"]:
            _compare_pod(policy, step, state, rec, tally)
        if step.node is not None:
            i = state.index[step.node]
            state = bind(state, step.pod, i, _devices(policy, step.pod, state, i))
    return {"per_plugin": {k: _share(tally.hits[k], tally.totals[k]) for k in sorted(tally.totals)},
            "first_mismatch": tally.first_mismatch}


# ---------------------------------------------------------------------------------------------
# The command


def _pct(share: Mapping[str, Any]) -> str:
    if not share["total"]:
        return "n/a (no pods)"
    return f"{share['agree']}/{share['total']} = {100 * share['share']:.1f} %"


def format_report(report: Mapping[str, Any]) -> str:
    s = report["summary"]
    u = s["unschedulable_agreement"]
    lines = [f"kube fidelity · {report['placements']} · policy {report['policy']} · {s['pods']} pods",
             f"real node ranked first (ties allowed): {_pct(s['ranked_first'])}",
             f"unschedulable agreement:               {_pct(u)} "
             f"({u['real_unschedulable']} unschedulable for real; {u['filter_only']} only by the filter, "
             f"{u['real_only']} only for real)",
             f"top-scoring set equals best_nodes:     {_pct(s['top_set_exact'])}",
             "ranked first by kind: " + ", ".join(f"{k} {v['agree']}/{v['total']}"
                                                  for k, v in s["ranked_first_by_kind"].items())]
    for name, share in (report.get("scores") or {}).get("per_plugin", {}).items():
        lines.append(f"  score match {name:32s} {_pct(share)}")
    return "\n".join(lines)


def _check_output(path: str | None) -> None:
    if path is None:
        return
    p = Path(path)
    if not p.parent.is_dir():
        raise FidelityError(f"--json {path}: directory {p.parent} does not exist")
    if p.suffix.lower() != ".json":
        raise FidelityError(f"--json {path}: expected a .json file")


def fidelity_report(placements: str, policy_name: str = "kube-default", scores_path: str | None = None
                    ) -> dict[str, Any]:
    """Load, replay and summarise (raises FidelityError on bad input)."""
    recording = load_recording(placements)
    scores = _read_json(scores_path, "--scores") if scores_path else None
    if scores is not None and not isinstance(scores, Mapping):
        raise FidelityError(f"--scores {scores_path}: expected a JSON object keyed by pod name")
    try:
        policy = resolve_policy(policy_name, 0)
    except ValueError as err:
        raise FidelityError(str(err)) from err
    brief(policy, [s.pod for s in recording.steps])
    outcomes = replay(recording, policy)
    report: dict[str, Any] = {"placements": str(placements), "policy": policy_name,
                              "summary": summarise(outcomes), "pods": [asdict(o) for o in outcomes]}
    if scores is not None:
        try:
            report["scores"] = compare_scores(recording, policy, scores)
        except (TypeError, ValueError, AttributeError) as err:
            raise FidelityError(f"--scores {scores_path}: {err}") from err
    return report


def fidelity_command(placements: str, policy_name: str = "kube-default", json_path: str | None = None,
                     scores_path: str | None = None) -> int:
    """Print the figures (and write them as JSON); 2 with a one-line error on bad input."""
    try:
        _check_output(json_path)
        report = fidelity_report(placements, policy_name, scores_path)
    except FidelityError as err:
        print(f"agmarl fidelity: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1) + "\n")
    print(format_report(report))
    return 0
