"""Retraining learns (issue 12 item 5): `agmarl retrain` makes the real trainer process improve the serving
model with search-based improvement on simulator episodes plus the recorded experience, and the promotion
gate publishes the candidate only because it is better on held-out seeds by the gate's margin.

A real nats-server (the session's), the trainer as a process, the CLI as a process. The serving model is a
small untrained network (random weights, hidden 8), exported and signed with the session's throwaway key and
published as a trainer would publish it; it is the active selection. The EXPERIENCE stream carries decisions
recorded from a good scheduler (fgd-pack on an openb sub-cluster), with rewards. Then:

1. `agmarl retrain --config finetune_learns.yaml`: the run starts from the serving weights, uses the
   experience, and is promoted: its mean paired gain on the gate's 8 held-out seeds (never used by the
   fine-tune, checked) is above the 1.0 point margin and it wins more seeds than it loses. The published
   model, fetched and verified from the Object Store and run through ONNX Runtime as inference runs it, is
   re-evaluated here on those seeds: better than the serving model by more than the margin.
2. The promoted model now serves; `agmarl retrain --config finetune_dryrun.yaml` (no improvement step: the
   candidate is the serving model) is refused: gain 0 on every seed, nothing published.

Cost (~50 s of CPU in all its processes; docs/model.md "The trainer service"): two ONNX exports (~7 s each:
the serving model here, the candidate in the run), the fine-tune's search and gate on 16-node sub-clusters
(~15 s), imports. The trainer runs at the test's priority (AGMARL_TRAIN_NICE=0): a run 10 steps nicer gets a
tenth of a core on a loaded machine; the niceness itself is test_app's subject.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, bind, state_to_dict, to_dict
from agmarl_common.core.sim.inflation import inflate_workload, pick_node
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.serving import modelstore, signing
from agmarl_testing.fixtures import ask_health, wait_healthy
from agmarl_trainer.app import CONFIG_DIR, TrainerApp
from agmarl_trainer.config import load_config
from agmarl_trainer.evaluate import onnx_scorer
from agmarl_trainer.finetune import evaluate_policies, export_model
from agmarl_trainer.imitation import expert_policy, openb_nodes, openb_pods
from agmarl_trainer.model import NetConfig, PolicyNet
from agmarl_trainer.rollout import sub_cluster

from .conftest import wait_for

LEARNS, DRYRUN = "finetune_learns.yaml", "finetune_dryrun.yaml"
WEAK_NET = NetConfig(hidden=8, heads=2, encoder_layers=2, mlp=16)


def weak_model(dst: Path) -> Path:
    """The serving model: untrained (random weights, seed 3), exported as the trainer exports (ONNX, parity
    check, model.pt, manifest)."""
    torch.manual_seed(3)
    net = PolicyNet(WEAK_NET).eval()
    cfg = dataclasses.replace(load_config(CONFIG_DIR / LEARNS), name="weak", net=WEAK_NET)
    export_model(net, cfg, dst, {"note": "test: untrained serving model"}, {})
    return dst


def recorded_decisions(cluster: str, seed: int = 500, n_nodes: int = 16) -> list[m.Experience]:
    """Decisions of fgd-pack on the inflation protocol (an openb sub-cluster of seed ``seed``, not a gate seed) as
    the reward-calculator records them: the cluster before, the pod, the node it was bound to; the reward is the
    share of GPU capacity allocated after the decision."""
    rng = np.random.default_rng(seed)
    workload = openb_pods("default")
    state = ClusterState.empty(sub_cluster(openb_nodes(), n_nodes, rng))
    total = int(state.gpu_count.sum()) * GPU_MILLI
    arrivals = inflate_workload(workload, total, rng)
    rank = rng.permutation(state.n_nodes)
    policy = expert_policy("fgd-pack", 0)
    policy.observe_workload(workload)
    out, used = [], 0
    for pod in arrivals:
        cand = np.flatnonzero(feasible_mask(pod, state))
        if not cand.size:
            continue
        i = pick_node(np.asarray(policy.score(pod, state, cand), np.float64), cand, rank)
        before, state = state, bind(state, pod, i, tuple(policy.choose_gpus(pod, state, i)))
        used += pod.gpu_milli_total
        out.append(m.Experience(id=f"{cluster}-{len(out)}", cluster=cluster,
                                state={"cluster": state_to_dict(before), "pending": [to_dict(pod)]},
                                action={"pod_key": pod.key, "node": before.nodes[i].name, "policy": "fgd-pack"},
                                reward=round(used / total, 4), next_state={}, time=float(len(out))))
    return out


def retrain(nats_url: str, config: str) -> str:
    """`agmarl retrain --config CONFIG`; returns what it printed (the trainer's first answer)."""
    out = subprocess.run([sys.executable, "-m", "agmarl_cli.main", "retrain", "--reason", f"test {config}",
                          "--config", config], env=dict(os.environ, NATS_URL=nats_url), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("trainer: accepted"), out.stdout + out.stderr
    return out.stdout


@pytest.mark.asyncio
async def test_retrain_promotes_a_better_model_and_refuses_one_that_is_not(nats_url, service_processes, tmp_path,
                                                                          model_keys):
    t0 = time.monotonic()
    cluster = f"learns-{uuid.uuid4().hex[:6]}"
    bus = await Bus.connect(nats_url, name="test-retrain-learns")
    previous = await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
    try:
        statuses: list[m.TrainStatus] = []
        published: list[m.ModelPublished] = []

        async def on_status(msg):
            statuses.append(m.decode(m.TrainStatus, msg.data))

        async def on_published(msg):
            published.append(m.decode(m.ModelPublished, msg.data))

        await bus.subscribe(subjects.train_status(), on_status)
        await bus.subscribe(subjects.model_published(), on_published)
        await bus.flush()
        # the run at the test's own priority: its niceness is test_app's subject, and a run 10 steps nicer than
        # the test gets a tenth of a core on a loaded CI machine
        env = {"NATS_URL": nats_url, "AGMARL_CLUSTER": cluster, "AGMARL_HTTP_PORT": "0", "AGMARL_OBJECTIVE": "allocation",
               "AGMARL_TRAIN_NICE": "0", **model_keys.env}
        trainer = service_processes("agmarl_trainer", env=env)  # starts while the serving model is built

        # the serving model, published as the trainer publishes (signed with the session's test key)
        shim = SimpleNamespace(rt=SimpleNamespace(bus=bus, publish=bus.publish),
                               signing_key=signing.load_private_key(model_keys.key))
        weak_dir = weak_model(tmp_path / "weak")
        weak = await TrainerApp.publish_model(shim, weak_dir)
        await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.PolicySelection(
            policy=f"model:{weak}", reason="test: an untrained model serves", time=time.time()))
        decisions = recorded_decisions(cluster)
        for e in decisions:
            await bus.js_publish(subjects.experience(cluster), e, msg_id=e.id)
        await wait_healthy(bus, "trainer", timeout=60, proc=trainer)

        async def buffered() -> bool:
            h = await ask_health(bus, "trainer")
            return h is not None and h.details.get("experience_buffered") == len(decisions)

        assert await wait_for(buffered, 20), trainer.output()[-3000:]

        async def final(n: int) -> m.TrainStatus | None:
            ends = [s for s in statuses if s.status in ("done", "rejected", "failed")]
            return ends[n] if len(ends) > n else None

        # 1. the retrain learns: promoted because better on held-out seeds by the margin
        printed = retrain(nats_url, LEARNS)
        assert LEARNS in printed
        done = await wait_for(lambda: final(0), 240, interval=0.25)
        assert done is not None and done.status == "done", ([s.detail for s in statuses], trainer.output()[-3000:])
        result = json.loads((tmp_path / "state" / "trainer" / done.request_id / "result.json").read_text())
        cfg = load_config(CONFIG_DIR / LEARNS)
        assert result["incumbent"]["policy"] == f"model:{weak}" and result["start_from"].endswith("model.pt")
        assert result["experience"]["transitions"] == len(decisions) and result["experience"]["samples"] > 0
        search = result["search"]
        assert search["kept_iteration"] == 1 and search["kept_held_out"] > search["start_held_out"]
        assert search["curve"][1]["extra_samples"] == result["experience"]["samples"]
        assert search["curve"][1]["labels"] > 0 and result["fit"]["steps"] > 0
        gate = result["gate"]
        held_out = set(gate["held_out_seeds"])
        assert held_out == set(cfg.gate.seeds)
        assert not held_out & (set(search["train_seeds"]) | set(cfg.eval.sub_seeds))  # never used to fine-tune
        paired, policies = gate["paired"], result["evaluation"]["policies"]
        assert gate["promote"] is True and gate["rule"]["min_gain"] == cfg.gate.min_gain == 1.0
        assert paired["runs"] == len(cfg.gate.seeds) and paired["mean_gain"] > cfg.gate.min_gain
        assert paired["wins"] > paired["losses"] and paired["ci95"][0] > 0  # better beyond seed noise
        assert policies["candidate"]["alloc_at_100"] > policies["incumbent"]["alloc_at_100"] + cfg.gate.min_gain
        assert "mean paired gain" in done.detail and "better" in done.detail
        version = done.model_version
        assert [p.version for p in published] == [weak, version] and result["published"] == version != weak

        # what was published, as inference loads it (verified, ONNX Runtime), on the gate's held-out seeds
        artifact = await modelstore.fetch_version(bus, version, trust=model_keys.trust())
        new_dir = modelstore.save(artifact, tmp_path / "fetched")
        inflation_only = dataclasses.replace(cfg, gate=dataclasses.replace(cfg.gate, dynamic_seeds=0))
        again = evaluate_policies({"published": lambda: {"scorer": onnx_scorer(new_dir, incremental=False)}},
                                  inflation_only)["published"]
        assert again["alloc_at_100"] == pytest.approx(policies["candidate"]["alloc_at_100"], abs=0.5), again
        assert again["alloc_at_100"] > policies["incumbent"]["alloc_at_100"] + cfg.gate.min_gain, again

        # 2. the promoted model serves; a run whose candidate is that same model is not promoted
        await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.PolicySelection(
            policy=f"model:{version}", reason="test: the promoted model serves", time=time.time()))
        retrain(nats_url, DRYRUN)
        refused = await wait_for(lambda: final(1), 120, interval=0.25)
        assert refused is not None and refused.status == "rejected", [s.detail for s in statuses]
        assert "promotion gate: not better" in refused.detail
        body = json.loads((tmp_path / "state" / "trainer" / refused.request_id / "result.json").read_text())
        assert body["incumbent"]["policy"] == f"model:{version}" and body["published"] == ""
        assert body["gate"]["paired"]["ties"] == body["gate"]["paired"]["runs"] > 0
        assert body["gate"]["promote"] is False and len(published) == 2
        print(f"retrain learns: serving {policies['incumbent']['alloc_at_100']:.3f} -> promoted "
              f"{policies['candidate']['alloc_at_100']:.3f} on {paired['runs']} held-out seeds (mean paired gain "
              f"{paired['mean_gain']:+.3f}, {paired['wins']} won / {paired['losses']} lost; published model through ONNX "
              f"Runtime {again['alloc_at_100']:.3f}), test "
              f"{time.monotonic() - t0:.1f} s")
    finally:
        kv = await bus.kv(subjects.CONFIG_BUCKET)
        if previous:
            await kv.put(subjects.KEY_ACTIVE_POLICY, previous)
        else:
            await kv.delete(subjects.KEY_ACTIVE_POLICY)
        await bus.close()
