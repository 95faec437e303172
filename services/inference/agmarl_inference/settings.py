"""inference settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.runtime import settings as common  # the module: its classes are not this service's settings classes


class InferenceSettings(common.ModelInputSettings, common.KubeSettings):
    pending_queue_group: str = "inference"  # replicas share pending pods through this NATS queue group
    # the first selection (adaptive-engine), and what inference serves until a selection arrives: models/default,
    # inside this name's wrappers when it wraps a model (cpu-first:model:default: docs/model.md "Placement rules")
    initial_policy: str = "cpu-first:model:default"
    pinned_policy: str = ""  # serve this policy and ignore selections (trace replays, benchmarks); "" = follow the engine
    brief_workload: str = ""  # openb:<name|csv>: tell every policy this workload (FGD's target), as agmarl eval does
    batch_window_s: float = 0.2  # batch mode: a batch closes this long after its first pod ...
    batch_max_pods: int = 256  # ... or when this many pods are due (agmarl_inference.batch.BatchConfig)
    assume_ttl_seconds: float = 30.0  # an assumed decision whose binding is never observed is given back after this
    baseline_policy: str = "kube-resources"  # default scoring used as fallback and for blending
    rollout_mode: common.RolloutMode = "full"  # the model's authority (docs/deploy.md); KV agmarl_config/rollout overrides
    hybrid_model_weight: float = 0.7
    http_host: str = "127.0.0.1"  # kube-scheduler extender HTTP server
    http_port: int = 8080
    canary_namespaces: list[str] = []  # canary mode: only these namespaces get the model's scores
    canary_label_selector: str = ""  # canary mode: or pods matching this label selector (k=v,k2=v2)
    # the decision log's catch-up at start (agmarl_inference.catchup): pods of these schedulers (kube-scheduler
    # profiles that call this extender) bound with no entry in the last unlogged_lookback_seconds get one
    # (source unassisted); [] or 0 = off
    extender_scheduler_names: list[str] = ["agmarl-scheduler"]
    unlogged_lookback_seconds: float = 120.0
    extender_budget_ms: int = 100  # every extender answer within this; late model/state -> default scores
    # 16 MiB: a full v1.NodeList (nodeCacheCapable: false) of 5,000 nodes at ~2 KiB each is ~10 MB
    max_body_bytes: int = 16 * 1024 * 1024
    extender_max_nodes: int = 15_000  # nodes per extender request (NodeNames, Nodes.items, victims); more: 413
    extender_path_prefixes: list[str] = ["", "/ext"]  # the verbs are served under each (scheduler urlPrefix)
    # add the model's attention / feature contributions to each loop decision (computed before it is published:
    # ~1 ms of inference CPU and of latency a decision on the 1,523-node openb cluster, docs/performance.md)
    explain_model: bool = True
    # public keys whose model signatures are trusted: key files or directories of *.pub, ':'-separated; "" =
    # the shipped models/trusted (docs/security.md)
    trusted_model_keys: str = ""
    # directories a local model folder may be loaded from, ':'-separated; "" = models/ and .state/models
    allowed_model_dirs: str = ""
