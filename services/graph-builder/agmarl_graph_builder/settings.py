"""graph-builder settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.settings import CommonSettings


class GraphBuilderSettings(CommonSettings):
    queue_group: str = "graph-builder"  # replicas share pending pods through this NATS queue group
    max_buffered: int = 10_000  # pending pods kept while no snapshot has arrived yet
    max_reasons: int = 50  # filtered-out nodes reported with their reason, per pod
    coupled_timeout_seconds: float = 1.0  # longest a coupled pod waits for its peers' decisions
