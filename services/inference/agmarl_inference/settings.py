"""inference settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.settings import CommonSettings


class InferenceSettings(CommonSettings):
    queue_group: str = "inference"  # replicas share graph requests through this NATS queue group
    baseline_policy: str = "kube-resources"  # default scoring used as fallback and for blending
    rollout_mode: str = "full"  # shadow | recommend | canary | hybrid | full
    hybrid_model_weight: float = 0.7
    http_host: str = "127.0.0.1"  # kube-scheduler extender HTTP server
    http_port: int = 8080
    canary_namespaces: list[str] = []  # canary mode: only these namespaces get the model's scores
    canary_label_selector: str = ""  # canary mode: or pods matching this label selector (k=v,k2=v2)
    batch_scheduler_name: str = ""  # schedulerName placed jointly in batch mode; empty = batch mode off
