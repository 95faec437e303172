"""state-collector settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from typing import Literal

from agmarl_common.runtime.settings import CommonSettings, KubeSettings, Source


class CollectorSettings(CommonSettings, KubeSettings):
    source: Source = "simulator"  # where the cluster comes from: the built-in simulator or a Kubernetes API
    sim_nodes: int = 50
    sim_zones: int = 2
    sim_workload: str = "batch_online_mix"
    sim_rate: float | None = None  # mean pod arrivals per simulated second; None = sized to ~50 % load
    sim_seed: int = 42
    sim_time_scale: float = 10.0  # simulated seconds per wall second (the live cluster fills in about a minute)
    tick_seconds: float = 0.25  # wall seconds between simulator steps
    snapshot_seconds: float = 0.25  # wall seconds between full snapshots (events carry every change between them)
    snapshot_cpu_share: float = 0.2  # and at most this share of a core goes to snapshots (0 = every snapshot_seconds)
    # --- trace replay (source "simulator"): the simulator only as the cluster behind the collector ---
    replay_workload: str = ""  # openb:default | openb:<name> | openb:<csv> (inflation) | synthetic:<name> (dynamic); "" = off
    replay_protocol: Literal["inflation", "dynamic"] = "inflation"
    replay_nodes: str = ""  # openb | openb:all | synthetic:<n> | <node csv>; "" = openb's GPU nodes for openb
    replay_ratio: float = 1.3  # inflation: GPU requests arrive up to this x cluster GPU capacity
    replay_tie_break: Literal["node-order", "random"] = "node-order"  # as agmarl eval --tie-break
    replay_in_flight: int = 1  # inflation: pods announced without a decision at most (1 = as the simulator)
    replay_rate: float = 0.0  # inflation: pods announced per second at most (0 = as fast as decided)
    replay_out: str = ""  # inflation: write the result (placements, allocation) here as JSON
    chunk_seconds: float = 600.0  # simulated seconds of workload generated at a time
    retry_seconds: float = 2.0  # re-announce a pod left pending (no decision or unschedulable) after this
    decision_ack_wait: float = 30.0  # seconds before a decision delivered to a process that died unacked is redelivered
    event_store_seconds: float = 10.0  # a decision's outcome event is retried this long into EVENTS (then redelivered)
    # --- source "kubernetes" (k8sapp / k8ssource; kubeconfig, kube_context, batch_scheduler_name: KubeSettings) ---
    watch_timeout_seconds: int = 300  # server-side watch timeout (the watch then resumes from the last rv)
    watch_request_timeout: float = 30.0  # connect timeout and read slack, seconds
    watch_backoff_base: float = 0.5  # reconnect backoff: base * 2^failures with jitter, capped
    watch_backoff_max: float = 30.0
    watch_queue_size: int = 1000  # watch thread -> event loop hand-off (a full queue blocks the watch)
    snapshot_min_interval: float = 0.5  # debounce: at most one snapshot per this many seconds
    snapshot_resync_seconds: float = 10.0  # publish a snapshot at least this often, changed or not
    pending_retry_seconds: float = 10.0  # re-publish a pod still pending after this long
