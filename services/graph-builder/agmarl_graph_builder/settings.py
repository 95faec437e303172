"""graph-builder settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.runtime.settings import CommonSettings


class GraphBuilderSettings(CommonSettings):
    """graph-builder needs only the common settings (cluster, NATS, telemetry): one process per cluster
    owns the graph; its versions are consecutive, so it runs as a single replica."""
