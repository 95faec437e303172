from pathlib import Path

import numpy as np
import pytest

from agmarl_common.core.sim.traces import (ALL_NODES, GPU_NODES, available_workloads, load_fgd_expected,
                                      load_openb_nodes, load_openb_pods, openb_node_path, openb_pod_path)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------------------------------------
# the shared openb files


def test_all_nodes_match_the_published_cluster():
    nodes = load_openb_nodes()
    assert len(nodes) == 1523
    assert sum(n.gpu_count for n in nodes) == 6212
    assert sum(1 for n in nodes if n.gpu_count > 0) == 1213
    assert all(bool(n.gpu_model) == (n.gpu_count > 0) for n in nodes)
    assert sum(n.cpu_milli for n in nodes) == 125_514_000


def test_gpu_node_list_is_the_gpu_subset():
    gpu = load_openb_nodes(openb_node_path(GPU_NODES))
    assert len(gpu) == 1213 and all(n.gpu_count > 0 for n in gpu)
    assert sum(n.gpu_count for n in gpu) == 6212
    assert openb_node_path(ALL_NODES).name == "openb_node_list_all_node.csv"


def test_default_pod_list_shapes():
    pods = load_openb_pods()
    assert len(pods) == 8152
    by_num = {k: sum(1 for p in pods if p.num_gpu == k) for k in (0, 1, 2, 4, 8)}
    assert by_num == {0: 1088, 1: 6989, 2: 16, 4: 15, 8: 44}
    assert sum(1 for p in pods if p.is_gpu_share) == 3078
    assert all(p.gpu_milli == 0 for p in pods if p.num_gpu == 0)
    assert all(p.gpu_milli == 1000 for p in pods if p.num_gpu > 1)
    assert {p.qos for p in pods} == {"LS", "BE", "Burstable", "Guaranteed"}


def test_workload_names_and_paths():
    names = available_workloads()
    assert {"default", "cpu050", "gpushare40"} <= set(names)
    assert openb_pod_path("cpu050").name == "openb_pod_list_cpu050.csv"
    assert len(load_openb_pods(openb_pod_path("gpushare100"))) == 8152


def test_published_results_load_with_our_policy_names():
    expected = load_fgd_expected()
    assert len(expected) == 540
    assert {p for (_, p, _) in expected} == {"random", "dotprod", "gpu-clustering", "gpu-packing", "bestfit", "fgd"}
    fgd = np.mean([expected[("default", "fgd", s)][100] for s in range(42, 52)])
    assert fgd == pytest.approx(95.23, abs=0.01)  # SOURCE.md's reference number
    assert expected[("default", "fgd", 42)].shape == (131,)


# ---------------------------------------------------------------------------------------------
# tiny literal files


def test_node_rows_become_nodes(tmp_path):
    p = write(tmp_path, "n.csv", NODE_HEADER + "a,32000,65536,0,\nb,96000,393216,8,G2\n")
    a, b = load_openb_nodes(p)
    assert (a.name, a.cpu_milli, a.memory_mib, a.gpu_count, a.gpu_model) == ("a", 32000, 65536, 0, "")
    assert (b.gpu_count, b.gpu_model) == (8, "G2")


def test_pod_rows_become_pods(tmp_path):
    p = write(tmp_path, "p.csv", POD_HEADER
              + "s,6000,12288,1,460,T4|V100M16,LS,Running,10,110,20\n"
              + "w,12000,24576,2,1000,,BE,Failed,0,50,\n"
              + "c,4000,8192,0,0,,BE,Pending,5,0,\n"
              + "big,1000,1024,1,1500,,LS,Running,0,0,0\n")
    s, w, c, big = load_openb_pods(p)
    assert (s.num_gpu, s.gpu_milli, s.gpu_spec, s.is_gpu_share) == (1, 460, ("T4", "V100M16"), True)
    assert s.duration == 90.0 and s.creation_time == 10.0
    assert (w.num_gpu, w.gpu_milli, w.gpu_milli_total, w.duration) == (2, 1000, 2000, 50.0)
    assert (c.num_gpu, c.gpu_milli, c.duration) == (0, 0, 0.0)
    assert big.gpu_milli == 1000  # clamped like the paper's simulator


def test_pod_lists_with_only_the_five_upstream_columns_load_with_neutral_defaults(tmp_path):
    p = write(tmp_path, "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
              "s,6000,12288,1,460\n"
              "w,12000,24576,2,1000\n"
              "c,4000,8192,0,0\n")
    s, w, c = load_openb_pods(p)
    assert (s.name, s.cpu_milli, s.memory_mib, s.num_gpu, s.gpu_milli, s.is_gpu_share) == \
        ("s", 6000, 12288, 1, 460, True)
    assert (w.num_gpu, w.gpu_milli_total, c.num_gpu, c.gpu_milli) == (2, 2000, 0, 0)
    for pod in (s, w, c):
        assert (pod.gpu_spec, pod.qos, pod.creation_time, pod.duration) == ((), "", 0.0, 0.0)
    # the same rows with every column give the same pods
    full = write(tmp_path, "full.csv", POD_HEADER + "s,6000,12288,1,460,,,,,,\nw,12000,24576,2,1000,,,,,,\n"
                 "c,4000,8192,0,0,,,,,,\n")
    assert load_openb_pods(full) == (s, w, c)


@pytest.mark.parametrize("loader,name,text,message", [
    (load_openb_nodes, "missing.csv", None, "file not found"),
    (load_openb_pods, "missing.csv", None, "file not found"),
    (load_openb_nodes, "n.csv", "sn,cpu_milli,memory_mib,gpu\na,1,1,0\n", "missing columns ['model']"),
    (load_openb_pods, "p.csv", "name,cpu_milli\na,1\n", "missing columns"),
    (load_openb_pods, "p.csv", "name,cpu_milli,memory_mib,num_gpu\na,1,1,0\n", "missing columns ['gpu_milli']"),
    (load_openb_nodes, "n.csv", NODE_HEADER + "a,lots,1,0,\n", "'cpu_milli' is not a number"),
    (load_openb_nodes, "n.csv", NODE_HEADER + "a,1,1,9,G2\n", "gpu count 9"),
    (load_openb_nodes, "n.csv", NODE_HEADER + "a,1,1,2,\n", "no model"),
    (load_openb_pods, "p.csv", POD_HEADER + "x,1,1,2,500,,LS,Running,0,0,0\n", "share (500) of 2 GPUs"),
    (load_openb_pods, "p.csv", POD_HEADER + "x,1,1,1,0,,LS,Running,0,0,0\n", "gpu_milli 0"),
])
def test_bad_files_raise_a_clear_value_error(tmp_path, loader, name, text, message):
    path = tmp_path / name if text is None else write(tmp_path, name, text)
    with pytest.raises(ValueError) as err:
        loader(path)
    assert message in str(err.value) and str(path) in str(err.value)
