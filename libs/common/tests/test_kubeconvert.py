"""Table-driven tests of the Kubernetes JSON -> cluster model conversion (kubeconvert)."""

from __future__ import annotations

import calendar
import json
from fractions import Fraction
from pathlib import Path

import pytest

from agmarl_common.kube import convert as kc
from agmarl_common.core.cluster.filters import feasible_mask, filter_node
from agmarl_common.core.cluster.model import (
    RACK_LABEL,
    ZONE_LABEL,
    LabelRequirement,
    LabelSelector,
    Node,
    Pod,
    PodAffinityTerm,
    Taint,
    Toleration,
    state_from_dict,
    state_to_dict,
)
from agmarl_common.core.cluster.selectors import matches_label_selector

SAMPLES = Path("/work/shared/k8s/extender-samples")


# --- quantities ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("0", Fraction(0)), ("2", Fraction(2)), ("500m", Fraction(1, 2)), ("1.5", Fraction(3, 2)),
    (".5", Fraction(1, 2)), ("1.", Fraction(1)), ("+3", Fraction(3)), ("-1", Fraction(-1)),
    ("1Ki", Fraction(1024)), ("1Mi", Fraction(2**20)), ("1Gi", Fraction(2**30)), ("1.5Gi", Fraction(3 * 2**29)),
    ("1Ti", Fraction(2**40)), ("1Pi", Fraction(2**50)), ("1Ei", Fraction(2**60)),
    ("1k", Fraction(1000)), ("1M", Fraction(10**6)), ("1G", Fraction(10**9)), ("1T", Fraction(10**12)),
    ("1P", Fraction(10**15)), ("1E", Fraction(10**18)), ("100n", Fraction(1, 10**7)), ("5u", Fraction(5, 10**6)),
    ("1e3", Fraction(1000)), ("1E3", Fraction(1000)), ("1.5e3", Fraction(1500)), ("25e-1", Fraction(5, 2)),
    ("1e+2", Fraction(100)), (3, Fraction(3)), (0.25, Fraction(1, 4)), (" 4 ", Fraction(4)),
])
def test_parse_quantity(text, expected):
    assert kc.parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1KiB", "1e", "Mi", "1 Mi", "--1", "1ki", True, None, [1],
                                  float("inf")])
def test_parse_quantity_rejects(text):
    with pytest.raises(kc.KubeConvertError):
        kc.parse_quantity(text)


@pytest.mark.parametrize("text, milli", [
    ("100m", 100), ("1", 1000), ("0.5", 500), ("2.5", 2500), ("1e3", 1_000_000), ("1.0001", 1001),
    ("0.1m", 1), ("32", 32000), ("250m", 250), (4, 4000),
])
def test_cpu_milli_rounds_up(text, milli):
    assert kc.cpu_milli(text) == milli


@pytest.mark.parametrize("text, up, down", [
    ("64Mi", 64, 64), ("1Gi", 1024, 1024), ("128Gi", 131072, 131072), ("1G", 954, 953),
    ("1e3", 1, 0), ("1500Ki", 2, 1), ("0", 0, 0), ("1048576", 1, 1), ("512Ki", 1, 0), ("1Ti", 2**20, 2**20),
])
def test_mib_rounding(text, up, down):
    assert kc.mib(text) == up
    assert kc.mib(text, round_up=False) == down


# --- pods -----------------------------------------------------------------------------------------

def _pod(spec: dict, **meta) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns", **meta}, "spec": spec}


def _c(req: dict | None = None, lim: dict | None = None, **extra) -> dict:
    res = {}
    if req is not None:
        res["requests"] = req
    if lim is not None:
        res["limits"] = lim
    return {"name": "c", "resources": res, **extra}


@pytest.mark.parametrize("spec, cpu, mem", [
    ({"containers": [_c({"cpu": "100m", "memory": "64Mi"})]}, 100, 64),
    ({"containers": [_c({"cpu": "100m"}), _c({"cpu": "250m", "memory": "1Gi"})]}, 350, 1024),
    # an init container larger than the sum wins per resource
    ({"containers": [_c({"cpu": "100m", "memory": "64Mi"})], "initContainers": [_c({"cpu": "2", "memory": "1Mi"})]},
     2000, 64),
    # sidecar (restartable init container): added to the containers, and to later init containers
    ({"containers": [_c({"cpu": "1"})],
      "initContainers": [_c({"cpu": "500m"}, restartPolicy="Always"), _c({"cpu": "1200m"})]}, 1700, 0),
    ({"containers": [_c({"cpu": "1"})],
      "initContainers": [_c({"cpu": "500m"}, restartPolicy="Always"), _c({"cpu": "200m"})]}, 1500, 0),
    # limits without requests request the limit (API server defaulting)
    ({"containers": [_c(None, {"cpu": "2", "memory": "2Gi"})]}, 2000, 2048),
    ({"containers": [_c({"cpu": "1"}, {"cpu": "2", "memory": "1Gi"})]}, 1000, 1024),
    # overhead is added; pod-level requests replace cpu/memory
    ({"containers": [_c({"cpu": "1"})], "overhead": {"cpu": "250m", "memory": "120Mi"}}, 1250, 120),
    ({"containers": [_c({"cpu": "1", "memory": "1Gi"})], "resources": {"requests": {"cpu": "3"}}}, 3000, 1024),
    # summed exactly before rounding: 3 x 0.3333 cpu
    ({"containers": [_c({"cpu": "333.4m"}), _c({"cpu": "333.3m"}), _c({"cpu": "333.3m"})]}, 1000, 0),
    ({"containers": [_c({})]}, 0, 0),
])
def test_pod_requests(spec, cpu, mem):
    pod = kc.pod_from_k8s(_pod(spec))
    assert (pod.cpu_milli, pod.memory_mib) == (cpu, mem)


@pytest.mark.parametrize("resources, annotations, num_gpu, milli", [
    ({"nvidia.com/gpu": "2"}, {}, 2, 1000),
    ({}, {"alibabacloud.com/gpu-milli": "300"}, 1, 300),
    ({}, {"agmarl.io/gpu-milli": "500", "agmarl.io/gpu-count": "1"}, 1, 500),
    ({}, {"alibabacloud.com/gpu-milli": "1000", "alibabacloud.com/gpu-count": "4"}, 4, 1000),
    ({}, {}, 0, 0),
    ({"nvidia.com/gpu": "1"}, {"alibabacloud.com/gpu-milli": "300"}, 1, 1000),  # the resource wins
])
def test_pod_gpus(resources, annotations, num_gpu, milli):
    pod = kc.pod_from_k8s(_pod({"containers": [_c(resources)]}, annotations=annotations))
    assert (pod.num_gpu, pod.gpu_milli) == (num_gpu, milli)


def test_pod_gpu_share_over_several_gpus_is_rejected():
    obj = _pod({"containers": [_c({})]}, annotations={"alibabacloud.com/gpu-milli": "500",
                                                      "alibabacloud.com/gpu-count": "2"})
    with pytest.raises(kc.KubeConvertError, match="not representable"):
        kc.pod_from_k8s(obj)


def test_pod_constraints():
    obj = {
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1", "labels": {"app": "web", "tier": "fe"},
                     "annotations": {"agmarl.io/gpu-models": "A100|V100"},
                     "creationTimestamp": "2026-11-29T17:53:35Z",
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "web-abc"}]},
        "spec": {
            "containers": [_c({"cpu": "1", "memory": "1Gi", "ephemeral-storage": "2Gi"})],
            "nodeSelector": {"disk": "ssd"},
            "schedulerName": "agmarl-scheduler", "priority": 1000, "nodeName": "",
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "x", "value": "y"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 5, "preference": {"matchExpressions": [{"key": "fast", "operator": "Exists"}]}}]},
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE_LABEL,
                     "namespaces": ["data"]}]},
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]},
                         "topologyKey": "kubernetes.io/hostname"}],
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 10, "podAffinityTerm": {"labelSelector": {"matchLabels": {"tier": "fe"}},
                                                           "topologyKey": ZONE_LABEL, "matchLabelKeys": ["app"]}}]},
            },
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE_LABEL,
                                           "whenUnsatisfiable": "ScheduleAnyway",
                                           "labelSelector": {"matchLabels": {"app": "web"}}, "minDomains": 3}],
        },
        "status": {"qosClass": "Burstable"},
    }
    pod = kc.pod_from_k8s(obj)
    assert pod.key == "shop/web-1" and pod.uid == "u1" and pod.service == "web-abc"
    assert pod.gpu_spec == ("A100", "V100") and pod.ephemeral_mib == 2048
    assert pod.node_selector == {"disk": "ssd"}
    assert pod.scheduler_name == "agmarl-scheduler" and pod.priority == 1000 and pod.qos == "Burstable"
    assert pod.creation_time == calendar.timegm((2026, 11, 29, 17, 53, 35))
    assert pod.tolerations == (Toleration("gpu", "Exists", "", "NoSchedule"), Toleration("x", "Equal", "y", ""))
    terms = pod.required_node_affinity
    assert terms[0].match_expressions == (LabelRequirement("zone", "In", ("a", "b")),)
    assert terms[1].match_fields == (LabelRequirement("metadata.name", "In", ("n1",)),)
    assert pod.preferred_node_affinity[0].weight == 5
    assert pod.pod_affinity == (PodAffinityTerm(LabelSelector({"app": "db"}), ZONE_LABEL, ("data",)),)
    assert pod.pod_anti_affinity[0].topology_key == "kubernetes.io/hostname"
    pref = pod.preferred_pod_anti_affinity[0]
    assert pref.weight == 10
    # matchLabelKeys merged with the pod's own value
    assert LabelRequirement("app", "In", ("web",)) in pref.term.label_selector.match_expressions
    spread = pod.topology_spread[0]
    assert (spread.max_skew, spread.when_unsatisfiable, spread.min_domains) == (1, "ScheduleAnyway", 3)


def test_nil_affinity_selector_matches_nothing_and_empty_matches_all():
    def term(sel):
        t = {"topologyKey": "kubernetes.io/hostname"}
        if sel is not None:
            t["labelSelector"] = sel
        return kc.pod_from_k8s(_pod({"containers": [], "affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [t]}}})).pod_anti_affinity[0]
    assert not matches_label_selector(term(None).label_selector, {"app": "x"})
    assert not matches_label_selector(term(None).label_selector, {})
    assert matches_label_selector(term({}).label_selector, {"app": "x"})


@pytest.mark.parametrize("spec, status, qos", [
    ({"containers": [_c({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})]}, {}, "Guaranteed"),
    ({"containers": [_c(None, {"cpu": "1", "memory": "1Gi"})]}, {}, "Guaranteed"),
    ({"containers": [_c({"cpu": "1"})]}, {}, "Burstable"),
    ({"containers": [_c()]}, {}, "BestEffort"),
    ({"containers": [_c()]}, {"qosClass": "Guaranteed"}, "Guaranteed"),
])
def test_qos(spec, status, qos):
    assert kc.pod_from_k8s({**_pod(spec), "status": status}).qos == qos


@pytest.mark.parametrize("obj, match", [
    ({"metadata": {}, "spec": {}}, "metadata.name"),
    (_pod({"containers": [_c({"cpu": "lots"})]}), "not a Kubernetes quantity"),
    (_pod({"containers": "nope"}), "expected a list"),
    (_pod({"containers": [], "tolerations": ["x"]}), "toleration"),
    (_pod({"containers": [], "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {}}]}}}), "topologyKey"),
    (_pod({"containers": [], "nodeSelector": ["a"]}), "expected a map"),
    ("pod", "expected a map"),
])
def test_pod_errors(obj, match):
    with pytest.raises(kc.KubeConvertError, match=match):
        kc.pod_from_k8s(obj)


def test_recorded_sample_pods():
    for path in sorted(SAMPLES.glob("*-filter-*-request.json")):
        pod = kc.pod_from_k8s(json.loads(path.read_text())["Pod"])
        assert pod.namespace == "default" and pod.uid
        assert pod.cpu_milli > 0 and pod.memory_mib == 64, path.name
        assert len(pod.tolerations) == 2


# --- nodes ----------------------------------------------------------------------------------------

def _node(name="n1", labels=None, alloc=None, capacity=None, spec=None, conditions=None) -> dict:
    status = {"allocatable": alloc if alloc is not None else {"cpu": "4", "memory": "8Gi", "pods": "110"}}
    if capacity is not None:
        status["capacity"] = capacity
    if conditions is not None:
        status["conditions"] = conditions
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec or {}, "status": status}


@pytest.mark.parametrize("obj, expected", [
    (_node(), dict(cpu_milli=4000, memory_mib=8192, max_pods=110, gpu_count=0, ready=True)),
    (_node(alloc={"cpu": "3500m", "memory": "7999Mi", "pods": "20", "ephemeral-storage": "10Gi"},
           capacity={"cpu": "4", "memory": "8Gi", "pods": "110"}),
     dict(cpu_milli=3500, memory_mib=7999, max_pods=20, ephemeral_mib=10240)),
    (_node(alloc={"cpu": "4"}, capacity={"memory": "1G", "pods": "50"}), dict(memory_mib=953, max_pods=50)),
    (_node(alloc={"cpu": "8", "memory": "1Gi", "nvidia.com/gpu": "4"}, labels={"nvidia.com/gpu.product": "A100"}),
     dict(gpu_count=4, gpu_model="A100")),
    (_node(alloc={"cpu": "8", "memory": "1Gi", "alibabacloud.com/gpu-count": "2"},
           labels={"alibabacloud.com/gpu-card-model": "V100M16"}), dict(gpu_count=2, gpu_model="V100M16")),
    (_node(labels={"nvidia.com/gpu.product": "A100"}), dict(gpu_count=0, gpu_model="")),
    (_node(conditions=[{"type": "Ready", "status": "False"}]), dict(ready=False)),
    (_node(conditions=[{"type": "Ready", "status": "Unknown"}]), dict(ready=False)),
    (_node(conditions=[{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]),
     dict(ready=True)),
    (_node(spec={"unschedulable": True, "taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                                                    {"key": "spot", "effect": "PreferNoSchedule"}]}),
     dict(unschedulable=True, taints=(Taint("gpu", "yes", "NoSchedule"), Taint("spot", "", "PreferNoSchedule")))),
])
def test_node_from_k8s(obj, expected):
    node = kc.node_from_k8s(obj)
    for key, value in expected.items():
        assert getattr(node, key) == value, key


@pytest.mark.parametrize("labels, zone, rack", [
    ({ZONE_LABEL: "z1"}, "z1", ""),
    ({"failure-domain.beta.kubernetes.io/zone": "old"}, "old", ""),
    ({ZONE_LABEL: "new", "failure-domain.beta.kubernetes.io/zone": "old"}, "new", ""),
    ({"topology.kubernetes.io/rack": "r7"}, "", "r7"),
    ({RACK_LABEL: "r1", "rack": "r2"}, "", "r1"),
])
def test_node_topology_labels(labels, zone, rack):
    node = kc.node_from_k8s(_node(labels=labels))
    assert (node.zone, node.rack) == (zone, rack)


def test_node_errors():
    with pytest.raises(kc.KubeConvertError, match="GPUs"):
        kc.node_from_k8s(_node(alloc={"cpu": "1", "nvidia.com/gpu": "16"}))
    with pytest.raises(kc.KubeConvertError, match="taint"):
        kc.node_from_k8s(_node(spec={"taints": [{"key": "a"}]}))


def test_recorded_sample_nodes():
    body = json.loads((SAMPLES / "nocache-filter-1-request.json").read_text())
    nodes = kc.nodes_from_k8s(body["Nodes"])
    assert [n.name for n in nodes] == ["node-0", "node-1", "node-2"]
    assert all(n.cpu_milli == 32000 and n.memory_mib == 131072 and n.max_pods == 110 and n.ready for n in nodes)
    assert all(n.ephemeral_mib == 102400 for n in nodes)


# --- selectors text ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, labels, ok", [
    ("canary=true", {"canary": "true"}, True),
    ("canary=true", {"canary": "false"}, False),
    ("canary==true,team=a", {"canary": "true", "team": "a"}, True),
    ("canary=true,team=a", {"canary": "true"}, False),
    ("tier!=db", {"tier": "web"}, True),
    ("tier!=db", {}, True),
    ("tier!=db", {"tier": "db"}, False),
    ("canary", {"canary": ""}, True),
    ("!canary", {"canary": "x"}, False),
    ("!canary", {}, True),
    ("env in (prod, staging),team notin (x)", {"env": "staging", "team": "y"}, True),
    ("env in (prod, staging)", {"env": "dev"}, False),
    ("", {"a": "b"}, True),
])
def test_parse_label_selector(text, labels, ok):
    assert matches_label_selector(kc.parse_label_selector(text), labels) is ok


@pytest.mark.parametrize("text", ["a=b=c", "in (x)", "!a=b", "a in x"])
def test_parse_label_selector_rejects(text):
    with pytest.raises(kc.KubeConvertError):
        kc.parse_label_selector(text)


# --- cluster state -------------------------------------------------------------------------------

def test_pods_on_nodes_accounts_usage_and_gpu_devices():
    nodes = (Node("a", 4000, 8192, gpu_count=2, gpu_model="A100"), Node("b", 4000, 8192))
    pods = [Pod("p1", 1000, 1024, node_name="a", num_gpu=1, gpu_milli=300),
            Pod("p2", 500, 512, node_name="a", num_gpu=1, gpu_milli=1000),
            Pod("p3", 250, 256, node_name="b"),
            Pod("pending", 100, 100),
            Pod("gone", 100, 100, node_name="zzz")]
    state = kc.pods_on_nodes(nodes, pods)
    assert state.cpu_used.tolist() == [1500, 250] and state.mem_used.tolist() == [1536, 256]
    assert state.pods_used.tolist() == [2, 1]
    # the share took one device (best fit), the whole GPU the other one
    assert sorted(state.gpu_used[0, :2].tolist()) == [300, 1000]
    assert [p.name for p in state.bound[0]] == ["p1", "p2"]
    # same state as the model's own loader gives for the same bound pods
    again = state_from_dict(state_to_dict(state))
    assert (again.gpu_used == state.gpu_used).all() and (again.cpu_used == state.cpu_used).all()


def test_pods_on_nodes_overcommitted_gpu_still_counted():
    nodes = (Node("a", 4000, 8192, gpu_count=1, gpu_model="T4"),)
    pods = [Pod("p1", 0, 0, node_name="a", num_gpu=1, gpu_milli=1000),
            Pod("p2", 0, 0, node_name="a", num_gpu=1, gpu_milli=500)]
    state = kc.pods_on_nodes(nodes, pods)
    assert state.gpu_used[0, 0] == 1500


def test_cluster_state_from_k8s_and_filter():
    node_list = {"items": [_node("a", labels={ZONE_LABEL: "z1"}), _node("b", labels={ZONE_LABEL: "z2"})]}
    web = {"metadata": {"name": "w1", "namespace": "ns", "labels": {"app": "web"}},
           "spec": {"nodeName": "a", "containers": [_c({"cpu": "3", "memory": "1Gi"})]}, "status": {"phase": "Running"}}
    done = {"metadata": {"name": "old", "namespace": "ns"},
            "spec": {"nodeName": "b", "containers": [_c({"cpu": "4"})]}, "status": {"phase": "Succeeded"}}
    state = kc.cluster_state_from_k8s(node_list, {"items": [web, done]})
    assert state.cpu_used.tolist() == [3000, 0]
    incoming = kc.pod_from_k8s({"metadata": {"name": "w2", "namespace": "ns", "labels": {"app": "web"}},
                                "spec": {"containers": [_c({"cpu": "500m"})], "affinity": {"podAntiAffinity": {
                                    "requiredDuringSchedulingIgnoredDuringExecution": [
                                        {"labelSelector": {"matchLabels": {"app": "web"}},
                                         "topologyKey": ZONE_LABEL}]}}}})
    assert feasible_mask(incoming, state).tolist() == [False, True]
    assert filter_node(incoming, state, 0).plugin == "InterPodAffinity"
