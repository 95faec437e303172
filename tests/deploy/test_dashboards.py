"""Grafana dashboards: valid dashboard JSON, every PromQL query parses, and every metric a query
reads is one the services export (tests/deploy/dashboard_metrics.txt)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))
DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/datasources.yaml"
PROVIDERS = ROOT / "deploy/grafana/provisioning/dashboards/dashboards.yaml"
METRICS_FILE = Path(__file__).with_name("dashboard_metrics.txt")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Grafana's range variables, replaced by a literal duration before parsing.
GRAFANA_DURATIONS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}

# What the dashboards must show (by the metric that carries it).
REQUIRED = {
    "decisions per second": "agmarl_decisions_total",
    "extender latency": "agmarl_extender_request_duration_seconds",
    "fallback rate": "agmarl_extender_fallbacks_total",
    "reward components": "agmarl_reward_component",
    "utilisation": "agmarl_cluster_utilisation_ratio",
    "balance": "agmarl_cluster_balance_std",
    "active model version and mode": "agmarl_active_policy_info",
    "drift alerts": "agmarl_drift_alerts_total",
}


def exported_metrics() -> set[str]:
    lines = METRICS_FILE.read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")}


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def targets(dashboard: dict):
    """(panel, target) for every query target, rows' nested panels included."""
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner, target


def parse_expr(expr: str):
    for var, literal in GRAFANA_DURATIONS.items():
        expr = expr.replace(var, literal)
    return promql_parser.parse(expr)


def selector_names(expr: str) -> set[str]:
    """Metric names of every vector selector in ``expr`` (name or a __name__ equality matcher)."""
    names: set[str] = set()

    def visit(node) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    assert matcher.op == promql_parser.MatchOp.Equal, f"regex metric name in {expr!r}"
                    names.add(matcher.value)
        return True

    promql_parser.walk(parse_expr(expr), visit)
    return names


def base_name(name: str, known: set[str]) -> str:
    if name in known:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in known:
            return name[: -len(suffix)]
    return name


def provisioned_datasource_uids() -> set[str]:
    data = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))
    return {ds["uid"] for ds in data["datasources"]}


def test_dashboards_exist():
    assert len(DASHBOARDS) >= 2, "expected the scheduling and the policy dashboards"


def test_metric_list_is_well_formed():
    names = exported_metrics()
    assert len(names) >= 19
    for name in names:
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name), name


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_valid_grafana_json(path: Path):
    dashboard = load(path)
    assert isinstance(dashboard.get("uid"), str) and re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", dashboard["uid"])
    assert isinstance(dashboard.get("title"), str) and dashboard["title"].strip()
    assert isinstance(dashboard.get("schemaVersion"), int)
    panels = dashboard.get("panels")
    assert isinstance(panels, list) and panels, "a dashboard without panels"
    ids = [p.get("id") for p in panels]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids), f"panel ids {ids}"
    uids = provisioned_datasource_uids()
    for panel in panels:
        assert panel.get("type") and panel.get("title"), panel
        grid = panel.get("gridPos", {})
        assert {"h", "w", "x", "y"} <= grid.keys() and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        refs = [t.get("refId") for t in panel["targets"]]
        assert len(set(refs)) == len(refs), f"duplicate refId in {panel['title']!r}"
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), f"empty query in {panel['title']!r}"
            ds = target.get("datasource") or panel.get("datasource")
            assert ds and ds.get("type") == "prometheus" and ds.get("uid") in uids, (panel["title"], ds)


def test_dashboard_uids_and_titles_are_unique():
    dashboards = [load(p) for p in DASHBOARDS]
    assert len({d["uid"] for d in dashboards}) == len(dashboards)
    assert len({d["title"] for d in dashboards}) == len(dashboards)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_parses_and_reads_exported_metrics(path: Path):
    known = exported_metrics()
    for panel, target in targets(load(path)):
        names = selector_names(target["expr"])
        assert names, f"{panel['title']!r}: query reads no metric: {target['expr']}"
        unknown = {n for n in names if base_name(n, known) not in known}
        assert not unknown, f"{path.name} {panel['title']!r}: not exported: {sorted(unknown)}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_quantiles_aggregate_buckets_by_le(path: Path):
    """histogram_quantile over a _bucket series summed by le (else the quantile is meaningless)."""
    seen = 0

    def visit(node) -> bool:
        nonlocal seen
        if isinstance(node, promql_parser.Call) and node.func.name == "histogram_quantile":
            seen += 1
            agg = node.args[1]
            assert isinstance(agg, promql_parser.AggregateExpr), str(node)
            assert agg.modifier is not None and "le" in agg.modifier.labels, str(node)
            inner: set[str] = set()
            promql_parser.walk(agg, lambda n: inner.add(n.name) if isinstance(n, promql_parser.VectorSelector)
                               else True)
            assert inner and all(n.endswith("_bucket") for n in inner), str(node)
        return True

    for _, target in targets(load(path)):
        promql_parser.walk(parse_expr(target["expr"]), visit)
    if "scheduling" in path.name:
        assert seen >= 2, "the scheduling dashboard shows p50/p99 latencies"


def test_dashboards_cover_the_required_views():
    known = exported_metrics()
    used = {base_name(n, known) for p in DASHBOARDS for _, t in targets(load(p)) for n in selector_names(t["expr"])}
    missing = {view: metric for view, metric in REQUIRED.items() if metric not in used}
    assert not missing, f"no panel for {missing}"
    latency = [t["expr"] for p in DASHBOARDS for _, t in targets(load(p))
               if "agmarl_extender_request_duration_seconds_bucket" in t["expr"]]
    assert any("0.5" in e for e in latency) and any("0.99" in e for e in latency), "extender p50 and p99"


def test_selector_extraction_rejects_and_detects():
    """The checker itself: unknown names are found, suffixes stripped only for listed bases."""
    known = {"a_seconds", "b_total"}
    names = selector_names('histogram_quantile(0.9, sum by (le) (rate(a_seconds_bucket[$__rate_interval])))'
                           ' / on() group_left sum(rate(c_total{x="1"}[5m])) + {__name__="b_total"}')
    assert names == {"a_seconds_bucket", "c_total", "b_total"}
    assert {base_name(n, known) for n in names} == {"a_seconds", "c_total", "b_total"}
    assert base_name("b_total_count", known) == "b_total"
    with pytest.raises(ValueError):
        parse_expr("sum(rate(a_seconds_bucket[5m])")


def test_provisioning_points_at_the_dashboards():
    providers = yaml.safe_load(PROVIDERS.read_text(encoding="utf-8"))["providers"]
    assert [p["options"]["path"] for p in providers] == ["/var/lib/grafana/dashboards"]
    datasources = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))["datasources"]
    by_type = {d["type"]: d for d in datasources}
    assert by_type["prometheus"]["url"] == "http://prometheus:9090" and by_type["prometheus"].get("isDefault")
    assert by_type["jaeger"]["url"] == "http://jaeger:16686"
