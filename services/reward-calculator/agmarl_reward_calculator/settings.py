"""reward-calculator settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.runtime.settings import CommonSettings, Scheme


class RewardSettings(CommonSettings):
    max_waiting: int = 10_000  # decisions kept while waiting for a later snapshot
    experience_max_bytes: int = 256 * 1024  # an experience over this is sent without its cluster state
    scheme: Scheme = "fixed"  # the composite reward's weighting scheme (inference and trainer read it too)
    load_threshold: float = 0.6  # load_conditional: balance weighted up below, utilisation above
    stress_load: float = 0.75  # lexicographic: SLA gets its own tier at or above this load ...
    stress_sla: float = 0.9  # ... or when the SLA component is below this
    decision_ack_wait: float = 30.0  # seconds before a decision delivered to a process that died unacked is redelivered
    settle_seconds: float = 60.0  # a decision whose pod stays pending this long is dropped unrewarded
    flush_seconds: float = 2.0  # at SIGTERM: wait this long for a snapshot to settle bound decisions, then flush
    outcome_lookback_seconds: float = 900.0  # at start: bind outcomes of the last N s read back from EVENTS (0 = off)
    outcome_recall_timeout: float = 60.0  # settling waits at most this long for that read (which then goes on)
    snapshot_history: int = 8  # recent snapshots kept to find the one each decision was made on
    late_seconds: float = 5.0  # no snapshot kept from less than this before a decision: its experience has no cluster
    # each experience's credit: the difference reward of its placement against this policy's on the same cluster
    # ("" = off); the trainer imitates the decisions with the best credit
    credit_reference: str = "kube-default"
    credit_budget_seconds: float = 0.2  # CPU for the credits of one settling; the rest get {"missing": "budget"}
