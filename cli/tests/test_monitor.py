"""Summary pieces computed by the CLI."""

from agmarl_cli.monitor import traces_complete


def test_traces_complete_needs_all_three_services():
    spans = [{"trace_id": "t1", "service": s} for s in ("state-collector", "graph-builder", "inference")]
    spans += [{"trace_id": "t2", "service": s} for s in ("state-collector", "inference")]
    assert traces_complete(["t1", "t2", "t3"], spans) == 1
