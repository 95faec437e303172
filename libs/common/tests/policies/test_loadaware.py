"""Trimaran and Koordinator load-aware scorers against hand-computed values."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.policies.base import select_node
from agmarl_common.core.policies.loadaware import (
    KoordLoadAwarePolicy,
    LoadVariationRiskBalancingPolicy,
    TargetLoadPackingPolicy,
    score_load_aware,
    score_load_variation_risk,
    score_target_load_packing,
)


def pod(name="p", cpu=1000, mem=1000, **kw) -> Pod:
    return Pod(name=name, cpu_milli=cpu, memory_mib=mem, **kw)


def loaded(cpu_used: list[int], mem_used: list[int] | None = None, cap: int = 10000) -> ClusterState:
    """Nodes of ``cap`` milli cpu / ``cap`` MiB with one pod bound requesting the given amounts."""
    mem_used = mem_used or [0] * len(cpu_used)
    s = ClusterState.empty([Node(f"n{k}", cap, cap) for k in range(len(cpu_used))])
    for k, (c, m) in enumerate(zip(cpu_used, mem_used)):
        if c or m:
            s = bind(s, pod(f"b{k}", cpu=c, mem=m), k)
    return s


@pytest.mark.parametrize("used, p, expected", [
    # pod estimate 1.5 x 1000 = 1500: predicted 35 % -> round(60 * 35 / 40 + 40) = round(92.5) = 93
    (2000, pod(), 93),
    (2500, pod(), 100),  # exactly at the 40 % target
    (5000, pod(), 23),  # 65 %: round(40 * 35 / 60) = round(23.3) = 23
    (9000, pod(), 0),  # 105 %: over capacity
    (0, pod(cpu=0), 55),  # no request -> 1000m: 10 % -> round(60 * 10 / 40 + 40) = 55
])
def test_target_load_packing(used, p, expected):
    assert score_target_load_packing(p, loaded([used]), np.array([0])).tolist() == [expected]


def test_target_load_packing_prefers_measured_load():
    s = replace(loaded([0, 0]), cpu_load=np.array([2000, 5000]))
    assert score_target_load_packing(pod(), s, np.array([0, 1])).tolist() == [93, 23]
    assert select_node(TargetLoadPackingPolicy(), pod(), s, np.array([0, 1])) == 0
    # packing: the emptier node loses against a node near the target
    s2 = loaded([0, 2500])
    assert select_node(TargetLoadPackingPolicy(), pod(), s2, np.array([0, 1])) == 1


def test_load_variation_risk_balancing():
    s = loaded([2000], [4000])
    # cpu mu 0.3 -> risk 0.15 -> 85; memory mu 0.5 -> 75; min 75
    assert score_load_variation_risk(pod(), s, np.array([0])).tolist() == [75]
    # a cpu std of 4000 (sigma 0.4): risk (0.3 + 0.4) / 2 -> 65 becomes the minimum
    std = np.array([4000.0])
    assert score_load_variation_risk(pod(), s, np.array([0]), cpu_std=std).tolist() == [65]
    # sensitivity 2: sigma 0.4 ** 0.5 = 0.632 -> risk 0.466 -> 53.4 -> 53
    assert score_load_variation_risk(pod(), s, np.array([0]), sensitivity=2, cpu_std=std).tolist() == [53]
    # measured load replaces requests
    s_load = replace(s, cpu_load=np.array([0]), mem_load=np.array([0]))
    assert score_load_variation_risk(pod(), s_load, np.array([0])).tolist() == [95]
    assert LoadVariationRiskBalancingPolicy().score(pod(), s, np.array([0])).tolist() == [75]


def test_load_aware_estimates_and_thresholds():
    s = loaded([4000, 8000], [5000, 5000])
    # n0: usage 3400 (34 %), 3500; pod estimate 850 / 700
    #     cpu (10000 - 4250) * 100 / 10000 = 57, mem (10000 - 4200) = 58 -> 57
    # n1: cpu usage 6800 = 68 % >= 65 % threshold -> 0
    assert score_load_aware(pod(), s, np.array([0, 1])).tolist() == [57, 0]
    assert KoordLoadAwarePolicy().score(pod(), s, np.array([0, 1])).tolist() == [57, 0]
    # without the threshold n1 scores by usage: cpu 10000 - 7650 -> 23, mem 58 -> 40
    assert score_load_aware(pod(), s, np.array([1]), thresholds={"cpu": 0, "memory": 0}).tolist() == [40]


def test_load_aware_measured_load_and_defaults():
    s = replace(loaded([0, 0], [5000, 5000]), cpu_load=np.array([6500, 6400]))
    # n0: 65 % reaches the threshold; n1: cpu (10000 - 7250) -> 27, mem usage 3500 + 700 -> 58 -> 42
    assert score_load_aware(pod(), s, np.array([0, 1])).tolist() == [0, 42]
    # a pod without requests is estimated at 250m / 200Mi: n1 cpu 10000 - 6650 -> 33, mem 10000 - 3700 -> 63 -> 48
    assert score_load_aware(pod(cpu=0, mem=0), s, np.array([1])).tolist() == [48]
