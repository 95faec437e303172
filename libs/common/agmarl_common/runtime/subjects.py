"""The subject catalogue: ``agmarl.v1.<kind>.<cluster>[.<namespace>]``, streams, KV and object buckets.

``CATALOGUE`` is the single list ``proto/subjects.yaml`` is generated from; every service builds
subjects through the functions here, never by string formatting of its own.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

PREFIX = "agmarl.v1"
# NATS token rules: printable ASCII without '.', '*', '>' (and so no whitespace or control characters);
# names from the cluster (namespaces, cluster names) are Kubernetes DNS labels, which pass unchanged
_BAD_TOKEN = re.compile(r"[^!-~]|[.*>]")
TOKEN_MAX = 63  # a Kubernetes namespace (DNS label) is at most 63 characters
_HASH_LEN = 12  # hex digits of sha256 that stand in for the cut part of a longer value


def token(value: str) -> str:
    """A name made safe as one subject token, deterministically: every character outside printable
    ASCII, and '.', '*', '>', becomes '_'; a result longer than ``TOKEN_MAX`` keeps its first
    ``TOKEN_MAX - 13`` characters and ends in ``-`` + 12 hex digits of the value's sha256, so a subject
    stays short (a 4,100-character namespace made a subject the server refused). Only ``*`` and ``>``
    themselves are kept as wildcards, for subscription patterns."""
    if value in ("*", ">"):
        return value
    cleaned = _BAD_TOKEN.sub("_", value) or "_"
    if len(cleaned) <= TOKEN_MAX:
        return cleaned
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LEN]
    return f"{cleaned[:TOKEN_MAX - _HASH_LEN - 1]}-{digest}"


def pending(cluster: str) -> str:
    return f"{PREFIX}.pending.{token(cluster)}"


def snapshot(cluster: str) -> str:
    return f"{PREFIX}.snapshot.{token(cluster)}"


def event(cluster: str) -> str:
    return f"{PREFIX}.event.{token(cluster)}"


def graph(cluster: str) -> str:
    """graph-builder's versioned cluster graph (GraphUpdate: full states and deltas)."""
    return f"{PREFIX}.graph.{token(cluster)}"


def graph_sync(cluster: str) -> str:
    """Request/reply: a cluster view asks graph-builder for the current full graph (reply: GraphUpdate)."""
    return f"{PREFIX}.graph_sync.{token(cluster)}"


def decision(cluster: str, namespace: str) -> str:
    """A decision's subject; the namespace comes from the pod, so it is never a wildcard."""
    ns = namespace or "default"
    return f"{PREFIX}.decision.{token(cluster)}.{token(ns) if ns not in ('*', '>') else '_'}"


def decision_wildcard(cluster: str = "*") -> str:
    return f"{PREFIX}.decision.{token(cluster)}.>"


def durable(service: str, cluster: str) -> str:
    """The durable consumer name of ``service`` for ``cluster`` (one per cluster: each keeps its own place)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{service}_{cluster}")[:TOKEN_MAX * 2]


def reward(cluster: str) -> str:
    return f"{PREFIX}.reward.{token(cluster)}"


def experience(cluster: str) -> str:
    return f"{PREFIX}.experience.{token(cluster)}"


def policy_selection() -> str:
    return f"{PREFIX}.policy_selection"


def selection_refused() -> str:
    """Inference could not load the model the active selection names (the adaptive-engine rolls back)."""
    return f"{PREFIX}.selection_refused"


def train_request() -> str:
    return f"{PREFIX}.train_request"


def train_status() -> str:
    return f"{PREFIX}.train_status"


def model_published() -> str:
    return f"{PREFIX}.model_published"


def dead_letter(service: str) -> str:
    return f"{PREFIX}.dead_letter.{token(service)}"


def health(service: str) -> str:
    return f"{PREFIX}.health.{token(service)}"


def health_all() -> str:
    """Scatter-gather health ping: every ServiceRuntime answers requests here too."""
    return f"{PREFIX}.health_all"


def subject_label(subject: str) -> str:
    """Bounded-cardinality metric label: tokens after the kind collapse to '*'.

    ``agmarl.v1.decision.prod.team-a`` -> ``agmarl.v1.decision.*.*``; foreign subjects such as
    reply inboxes keep only their first token (``_INBOX.>``).
    """
    tokens = subject.split(".")
    if len(tokens) >= 3 and tokens[0] == "agmarl" and tokens[1] == "v1":
        return ".".join(tokens[:3] + ["*"] * (len(tokens) - 3))
    return tokens[0] + (".>" if len(tokens) > 1 else "")


# --- JetStream ------------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamSpec:
    """What ``Bus.ensure_streams`` creates; storage is 'file' or 'memory', times in seconds."""

    name: str
    subjects: tuple[str, ...]
    storage: str = "file"
    duplicate_window: float = 120.0
    max_age: float = 0.0           # 0 = keep forever (bounded by max_bytes)
    max_bytes: int = 1024 ** 3
    description: str = ""
    replicas: int = 1  # copies on a NATS cluster (deploy/k8s: 3, AGMARL_STREAM_REPLICAS); 1 on one server


DECISIONS = StreamSpec(
    name="DECISIONS", subjects=(f"{PREFIX}.decision.>",), storage="file", duplicate_window=120.0,
    description="Decision log: every scheduling decision (Nats-Msg-Id = decision id), survives a NATS restart; "
                "the binder and the reward-calculator read it through durable consumers")
EXPERIENCE = StreamSpec(
    name="EXPERIENCE", subjects=(f"{PREFIX}.experience.>",), storage="file", duplicate_window=600.0,
    description="Experience transitions for the trainer, deduplicated by Nats-Msg-Id (the decision id)")
EVENTS = StreamSpec(
    name="EVENTS", subjects=(f"{PREFIX}.event.>",), storage="file", duplicate_window=120.0,
    max_age=24 * 3600.0,
    description="Cluster events, one day: the durable record of bind outcomes (pod_bound, bind_rejected); a "
                "restarted reward-calculator reads them back")
STREAMS: tuple[StreamSpec, ...] = (DECISIONS, EXPERIENCE, EVENTS)

CONFIG_BUCKET = "agmarl_config"
KEY_ACTIVE_POLICY = "active_policy"
KEY_ROLLOUT = "rollout"
MODELS_BUCKET = "agmarl_models"


# --- the catalogue ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CatalogueEntry:
    pattern: str
    kind: str
    producer: str
    consumers: tuple[str, ...]
    stream: str | None = None
    description: str = ""


_C, _N, _S = "{cluster}", "{namespace}", "{service}"

CATALOGUE: list[CatalogueEntry] = [
    CatalogueEntry(f"{PREFIX}.pending.{_C}", "pending_pod", "state-collector", ("inference",),
                   None, "A pod waiting to be scheduled: inference decides it on its cluster view, no round trip"),
    CatalogueEntry(f"{PREFIX}.snapshot.{_C}", "snapshot", "state-collector",
                   ("graph-builder", "inference", "reward-calculator", "adaptive-engine", "cli"), None,
                   "Full cluster state with pending pods and utilisation statistics (epoch, seq shared with events); "
                   "inference reads only its pending list, in batch mode"),
    CatalogueEntry(f"{PREFIX}.event.{_C}", "event", "state-collector",
                   ("graph-builder", "inference", "reward-calculator", "cli"), EVENTS.name,
                   "Pod and node lifecycle outcomes in order (epoch, seq); pod_bound carries the pod (the "
                   "reward-calculator rewards bound decisions only, and reads outcomes back from EVENTS after a "
                   "restart; inference reads the bindings back at start, for its decision log's catch-up)"),
    CatalogueEntry(f"{PREFIX}.graph.{_C}", "graph_update", "graph-builder", ("inference",), None,
                   "The versioned whole-cluster graph: full states and ordered changes (cluster views replicate it)"),
    CatalogueEntry(f"{PREFIX}.graph_sync.{_C}", "graph_sync", "inference", ("graph-builder",), None,
                   "Request/reply: a cluster view asks graph-builder for the current full graph (reply graph_update)"),
    CatalogueEntry(f"{PREFIX}.decision.{_C}.{_N}", "decision", "inference",
                   ("state-collector", "inference", "reward-calculator", "cli"), DECISIONS.name,
                   "A scheduling decision with scores and explanation (decision log); source unassisted: a pod "
                   "kube-scheduler bound alone, logged by inference's catch-up at start, which reads the log back"),
    CatalogueEntry(f"{PREFIX}.reward.{_C}", "reward", "reward-calculator", ("adaptive-engine",), None,
                   "Reward of one decision with every component"),
    CatalogueEntry(f"{PREFIX}.experience.{_C}", "experience", "reward-calculator", ("trainer",),
                   EXPERIENCE.name, "Transition (state, action, reward, next state) for training"),
    CatalogueEntry(f"{PREFIX}.policy_selection", "policy_selection", "adaptive-engine,cli", ("inference",),
                   None, "Active policy change (also written to KV agmarl_config/active_policy)"),
    CatalogueEntry(f"{PREFIX}.selection_refused", "selection_refused", "inference", ("adaptive-engine",),
                   None, "The newest selection's model could not be loaded (not found, digest, load): inference "
                   "keeps the previous policy, the adaptive-engine rolls the selection back"),
    CatalogueEntry(f"{PREFIX}.train_request", "train_request", "adaptive-engine,cli", ("trainer",), None,
                   "Retrain request with drift evidence"),
    CatalogueEntry(f"{PREFIX}.train_status", "train_status", "trainer", ("cli",), None,
                   "Progress of a training request"),
    CatalogueEntry(f"{PREFIX}.model_published", "model_published", "trainer",
                   ("inference", "adaptive-engine"), None,
                   "A new model version stored in Object Store agmarl_models (inference caches it; the "
                   "adaptive-engine may promote it to the active selection)"),
    CatalogueEntry(f"{PREFIX}.dead_letter.{_S}", "dead_letter", "*", ("operator",), None,
                   "A message a service rejected or failed to handle"),
    CatalogueEntry(f"{PREFIX}.health.{_S}", "health", "*", ("cli",), None,
                   "Request/reply health check of one service (request payload ignored)"),
    CatalogueEntry(f"{PREFIX}.health_all", "health", "*", ("cli",), None,
                   "Scatter-gather health check: every service replies"),
]
