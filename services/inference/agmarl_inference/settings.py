"""inference settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common import settings as common  # the module: its classes are not this service's settings classes


class InferenceSettings(common.ModelInputSettings):
    queue_group: str = "inference"  # replicas share graph requests through this NATS queue group
    baseline_policy: str = "kube-resources"  # default scoring used as fallback and for blending
    rollout_mode: str = "full"  # shadow | recommend | canary | hybrid | full
    hybrid_model_weight: float = 0.7
    http_host: str = "127.0.0.1"  # kube-scheduler extender HTTP server
    http_port: int = 8080
    canary_namespaces: list[str] = []  # canary mode: only these namespaces get the model's scores
    canary_label_selector: str = ""  # canary mode: or pods matching this label selector (k=v,k2=v2)
    batch_scheduler_name: str = ""  # schedulerName placed jointly in batch mode; empty = batch mode off
    extender_budget_ms: int = 100  # every extender answer within this; late model/state -> default scores
    # 16 MiB: a full v1.NodeList (nodeCacheCapable: false) of 5,000 nodes at ~2 KiB each is ~10 MB
    max_body_bytes: int = 16 * 1024 * 1024
    extender_path_prefixes: list[str] = ["", "/ext"]  # the verbs are served under each (scheduler urlPrefix)
    explain_model: bool = True  # add the model's attention / feature contributions to each loop decision
