"""``agmarl train``: train (imitation + PPO), export to ONNX, check parity, evaluate, write the model folder.

    agmarl train [--config configs/train/default.yaml] [--out models/<name>] [--evaluate quick|full]
                 [--eval-seeds 42-51] [--eval-workloads default,cpu100] [--distributed]
    agmarl train --evaluate-only --out models/default [--eval-seeds ...]   # evaluate an existing model folder
    agmarl train --quantize models/default --out models/default-int8 [--quant-method dynamic|weight-only]
                                                 # its INT8 variant (agmarl_trainer.quantize; no training)

Writes runs/<name>/ (metrics.csv, checkpoints, history.json) and the model folder: encoder.onnx,
actor.onnx, model.pt, manifest.json (version, sha256 of each file, training config, evaluation,
parity) and report.md. Exit status 0 on success, 1 when the parity check fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from agmarl_common.core import features
from agmarl_trainer.config import config_to_dict, load_config

PARITY_TOL = 1e-4
DEFAULT_CONFIG = "configs/train/default.yaml"


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '1,2,5' -> seeds; '' -> []."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def parity_check(net, model_dir: Path, seed: int = 0) -> dict[str, float]:
    """Max |ONNX - torch| of node_emb and logits on real openb graphs of 60 and 1,523 nodes."""
    import torch

    from agmarl_common.core.cluster.filters import feasible_nodes
    from agmarl_common.core.cluster.model import ClusterState, bind
    from agmarl_trainer.export import onnx_scores, onnx_sessions
    from agmarl_trainer.imitation import openb_nodes, openb_pods
    from agmarl_trainer.rollout import sub_cluster

    sessions = onnx_sessions(model_dir)
    pods = openb_pods("default")
    ctx = features.FeatureContext.from_workload(pods)
    rng = np.random.default_rng(seed)
    worst = {"node_emb": 0.0, "logits": 0.0}
    for n in (60, len(openb_nodes())):
        state = ClusterState.empty(sub_cluster(openb_nodes(), n, rng))
        for pod in pods[: n // 2]:
            cand = feasible_nodes(pod, state)
            if cand.size:
                i = int(rng.choice(cand))
                state = bind(state, pod, i, features.device_for(pod, state, i, ctx))
        batch = [p for p in pods[n // 2: n // 2 + 40] if feasible_nodes(p, state).size][:4]
        g = features.build_graph(batch, state, [feasible_nodes(p, state) for p in batch], ctx)
        emb_o, logits_o, _ = onnx_scores(sessions, g)
        t = {k: torch.from_numpy(getattr(g, k)) for k in ("node_x", "nn_edge_index", "pod_x", "cand_pod",
                                                           "cand_node", "cand_attr")}
        with torch.no_grad():
            emb = net.encoder(t["node_x"], t["nn_edge_index"])
            logits = net.actor(emb, t["node_x"], t["pod_x"], t["cand_pod"], t["cand_node"], t["cand_attr"])
        worst["node_emb"] = max(worst["node_emb"], float(np.abs(emb_o - emb.numpy()).max()))
        worst["logits"] = max(worst["logits"], float(np.abs(logits_o - logits.numpy()).max()))
    return worst


def contract() -> dict:
    from agmarl_trainer.export import ACTOR_INPUTS, ACTOR_OUTPUTS, ENCODER_INPUTS, ENCODER_OUTPUTS, OPSET

    return {"F_NODE": features.F_NODE, "F_POD": features.F_POD, "F_EDGE": features.F_EDGE,
            "node_features": list(features.NODE_FEATURES), "pod_features": list(features.POD_FEATURES),
            "edge_features": list(features.EDGE_FEATURES), "opset": OPSET,
            "encoder": {"inputs": list(ENCODER_INPUTS), "outputs": list(ENCODER_OUTPUTS)},
            "actor": {"inputs": list(ACTOR_INPUTS), "outputs": list(ACTOR_OUTPUTS)},
            "intra_op_num_threads": 1, "device_choice": "features.device_for (least-fragmenting device for a share)"}


def model_manifest(name: str, model_dir: Path, training: dict, evaluation: dict, parity: dict[str, float]) -> dict:
    """The manifest of an exported model folder (before ``write_manifest`` adds the files' sha256): the
    version is ``<name>-<12 hex digits of the ONNX pair's hash>``."""
    from agmarl_trainer.export import sha256_file

    digest = hashlib.sha256((sha256_file(model_dir / "encoder.onnx") + sha256_file(model_dir / "actor.onnx")).encode())
    return {"version": f"{name}-{digest.hexdigest()[:12]}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "training": training, "evaluation": evaluation,
            "parity": {"tolerance": PARITY_TOL, "max_abs_diff": parity}, "contract": contract()}


def _alloc_table(results: dict, trained: Sequence[str]) -> list[str]:
    lines = ["| workload | trained on | model | FGD | BestFit | model - FGD |", "|---|---|---|---|---|---|"]
    for w, per in results.items():
        cell = lambda p: f"{per[p]['mean']:.2f}" if p in per else "-"  # noqa: E731
        lines.append(f"| {w} | {'yes' if w in trained else 'held out'} | {cell('model')} | {cell('fgd')} | "
                     f"{cell('bestfit')} | {per.get('gap_to_fgd', float('nan')):+.2f} |")
    return lines + [""]


def _dynamic_table(results: dict) -> list[str]:
    keys = ("util_gpu_mean", "util_cpu_mean", "balance_mean", "pending_mean", "bound", "unschedulable",
            "hard_violations")
    lines = ["| workload | policy | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for w, per in results.items():
        for p, row in per.items():
            lines.append(f"| {w} | {p} | " + " | ".join(f"{row[k]:g}" for k in keys) + " |")
    return lines + [""]


def search_table(report: dict) -> list[str]:
    """The search's learning curve as Markdown: held-out score per iteration and what was kept (openb
    inflation, or ``protocol: dynamic``)."""
    kept = f"Kept: iteration {report['kept_iteration']} ({report['kept_held_out']:.3f}; start {report['start_held_out']:.3f})."
    if report.get("protocol") == "dynamic":
        lines = ["## Search-based improvement in the dynamic simulator: learning curve", "",
                 f"Fixed-scheme reward summed over 10 s windows, whole episodes of {report['held_out_workloads']} on "
                 f"held-out seeds {report['held_out_seeds']}, greedy policy, mean over seeds; {report['reference']} "
                 f"on the same episodes {report['reference_held_out']:.3f}. {kept}", ""]
        gain, gain_head = "gain_per_label", "rollout gain / label"
    else:
        lines = ["## Search-based improvement (expert iteration): learning curve", "",
                 f"GPU allocation at 100 % arrived, openb inflation on held-out sub-clusters of "
                 f"{report['held_out_nodes']} nodes (seeds {report['held_out_seeds']}, pod lists "
                 f"{report['held_out_workloads']}), greedy policy, mean over seeds; FGD on the same seeds "
                 f"{report['fgd_held_out']:.3f}. {kept}", ""]
        gain, gain_head = "gain_milli_per_label", "gain milli / label"
    lines += [f"| iteration | held-out | - start | KL to start | labels | changed | {gain_head} | s |",
              "|---|---|---|---|---|---|---|---|"]
    for c in report["curve"]:
        mark = " (kept)" if c["iteration"] == report["kept_iteration"] else ""
        lines.append(f"| {c['iteration']}{mark} | {c['held_out']:.3f} | {c['held_out'] - report['start_held_out']:+.3f} | "
                     f"{c['kl']:.4f} | {c['labels']} | {c['changed']} | {c.get(gain, 0)} | {c['seconds']} |")
    return lines + [""]


def write_report(path: Path, manifest: dict, history: dict) -> None:
    """report.md: how the model was trained and every evaluation in the manifest."""
    ev, train = manifest.get("evaluation", {}), manifest["training"]
    trained = train["config"]["train_workloads"]
    kept = {"imitation": "the imitation weights (PPO did not improve the held-out sub-cluster evaluation)",
            "start": "the start model's weights (no search iteration improved the held-out evaluation)"}.get(
        (history.get("kept") or [""])[0], (history.get("kept") or ["the final weights"])[0])
    lines = [f"# Training report: {manifest['version']}", "",
             f"Trained in {train['seconds']:.0f} s with `{train['config_path']}` on openb sub-clusters of "
             f"{train['config']['sim']['nodes_min']}-{train['config']['sim']['nodes_max']} nodes "
             f"(pod lists {', '.join(trained)}); shipped: {kept}.", ""]
    full = ev.get("openb_full_cluster")
    if full:
        lines += ["## openb inflation, full 1,523-node cluster", "",
                  "GPU allocation (% of GPU capacity) when 100 % of the GPU capacity has arrived "
                  "(`sim.inflation.run_inflation`, the FGD paper's protocol, tune 1.3), mean over seeds "
                  f"{full['seeds']}; the model is the exported ONNX pair run through ONNX Runtime.", ""]
        lines += _alloc_table(full["results"], trained)
    other = ev.get("openb_full_cluster_other_workloads")
    if other:
        lines += [f"Other pod lists (seeds {other['seeds']}):", ""] + _alloc_table(other["results"], trained)
    dyn = ev.get("dynamic_synthetic")
    if dyn:
        lines += ["## Dynamic simulator (synthetic workloads)", "", f"{dyn['harness']}; balance_mean is the std of "
                  "node utilisation (lower = more even), pending_mean the mean queue length.", ""]
        lines += _dynamic_table(dyn["results"])
    if history.get("search"):
        lines += search_table(history["search"][0])
    lines += ["## Training history", "", "```json", json.dumps(history, indent=2, default=str), "```", "",
              "## Export parity (ONNX Runtime vs PyTorch, real openb graphs)", "", "```json",
              json.dumps(manifest.get("parity", {}), indent=2), "```", ""]
    path.write_text("\n".join(lines))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agmarl train", description="Train, export and evaluate the learned policy.")
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--out", default="", help="model folder (default models/<config name>)")
    p.add_argument("--runs-dir", default="runs", help="metrics and checkpoints go to <runs-dir>/<name>")
    p.add_argument("--evaluate", choices=("quick", "full"), default="quick",
                   help="full: openb inflation on the full cluster vs FGD and BestFit (slow)")
    p.add_argument("--eval-seeds", default="42-51")
    p.add_argument("--eval-workloads", default="default")
    p.add_argument("--eval-extra-workloads", default="", help="more workloads (e.g. held-out ones) ...")
    p.add_argument("--eval-extra-seeds", default="42-44", help="... evaluated on these seeds")
    p.add_argument("--eval-workers", type=int, default=2)
    p.add_argument("--distributed", action="store_true", help="join a torchrun process group (gloo)")
    p.add_argument("--evaluate-only", action="store_true",
                   help="no training: the full evaluation of the model folder --out, its report and manifest rewritten")
    p.add_argument("--quantize", default="", metavar="MODEL_DIR",
                   help="no training: write the INT8 variant of MODEL_DIR to --out (default <MODEL_DIR>-int8)")
    p.add_argument("--quant-method", default="dynamic", choices=("dynamic", "weight-only"),
                   help="--quantize: int8 weights and activations (dynamic) or int8 weights only (MatMulNBits)")
    return p


def full_evaluation(evaluation: dict, out: Path, args: argparse.Namespace, train_workloads: Sequence[str]) -> None:
    """Add the full evaluation of the model folder ``out`` to ``evaluation``: openb inflation on the full
    cluster (``--eval-workloads`` x ``--eval-seeds``, and ``--eval-extra-workloads``), the dynamic simulator."""
    from agmarl_trainer.evaluate import evaluate_dynamic, evaluate_openb

    seeds = parse_seeds(args.eval_seeds)
    workloads = [w for w in args.eval_workloads.split(",") if w]
    t0 = time.monotonic()
    evaluation["openb_full_cluster"] = {
        "metric": "GPU allocation % of capacity at 100 % arrived (inflation, tune 1.3)",
        "seeds": seeds, "results": evaluate_openb(out, workloads, seeds, workers=args.eval_workers),
        "seconds": round(time.monotonic() - t0, 1)}
    evaluation["dynamic_synthetic"] = {
        "harness": "sim.dynamic.run, 40-node synthetic cluster, 1800 s, seeds 0-1", "results":
        evaluate_dynamic(out, ("diurnal", "batch_online_mix"), (0, 1), workers=args.eval_workers)}
    extra = [w for w in args.eval_extra_workloads.split(",") if w]
    if extra:
        extra_seeds = parse_seeds(args.eval_extra_seeds)
        evaluation["openb_full_cluster_other_workloads"] = {
            "seeds": extra_seeds, "trained_on": list(train_workloads),
            "results": evaluate_openb(out, extra, extra_seeds, workers=args.eval_workers)}


def evaluate_only(out: Path, args: argparse.Namespace) -> int:
    """``--evaluate-only``: the full evaluation of an existing model folder, its report and manifest rewritten
    (the training record kept); the files the manifest lists must match their digests first."""
    from agmarl_trainer.export import sha256_file, write_manifest

    manifest = json.loads((out / "manifest.json").read_text())
    bad = [name for name, digest in manifest.get("files", {}).items()
           if name != "report.md" and sha256_file(out / name) != digest]
    if bad:
        print(f"agmarl train: {out}: digest mismatch for {', '.join(bad)}", file=sys.stderr)
        return 1
    training = manifest.get("training", {})
    evaluation = manifest.setdefault("evaluation", {})
    full_evaluation(evaluation, out, args, training.get("config", {}).get("train_workloads", ()))
    write_report(out / "report.md", manifest, training.get("history", {}))
    write_manifest(out, manifest)
    print(json.dumps({"model_dir": str(out), "version": manifest.get("version"), "evaluation": evaluation},
                     default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quantize:
        from agmarl_trainer.quantize import QuantizeConfig, quantize_model

        out = Path(args.out or f"{args.quantize.rstrip('/')}-int8")
        manifest = quantize_model(args.quantize, out, QuantizeConfig(method=args.quant_method))
        print(json.dumps({"model_dir": str(out), "version": manifest["version"], "variant": manifest["variant"],
                          "quantised_from": manifest["quantised_from"]["version"]}))
        return 0
    cfg = load_config(args.config)
    out = Path(args.out or f"models/{cfg.name}")
    if args.evaluate_only:
        return evaluate_only(out, args)
    run_dir = Path(args.runs_dir) / cfg.name
    from agmarl_trainer import distributed
    from agmarl_trainer.export import export_onnx, write_manifest
    from agmarl_trainer.train import train

    rank, wrap = 0, None
    if args.distributed:
        rank, _ = distributed.init_from_env()
        wrap = distributed.ddp_wrap
    try:
        result = train(cfg, run_dir, wrap=wrap, rank=rank)
    finally:
        distributed.shutdown()
    if rank != 0:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    export_onnx(result.net, out)
    shutil.copyfile(run_dir / "model.pt", out / "model.pt")
    parity = parity_check(result.net, out)
    print(f"parity: {parity}", file=sys.stderr)
    evaluation: dict = {"quick": result.eval}
    cfg = result.config or cfg  # as run: a search start's network shape wins over the config's
    manifest = model_manifest(cfg.name, out, {"config_path": str(args.config), "config": config_to_dict(cfg),
                                              "seconds": round(result.seconds, 1), "history": result.history},
                              evaluation, parity)
    write_manifest(out, manifest)  # complete but for the full evaluation, which reads it
    if args.evaluate == "full":
        full_evaluation(evaluation, out, args, cfg.train_workloads)
    write_report(out / "report.md", manifest, result.history)
    write_manifest(out, manifest)
    print(json.dumps({"model_dir": str(out), "version": manifest["version"], "evaluation": evaluation}, default=str))
    return 0 if max(parity.values()) <= PARITY_TOL else 1


if __name__ == "__main__":
    raise SystemExit(main())
