"""`agmarl`: the one command-line entry point."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path


def replay_env(args: argparse.Namespace, env: dict[str, str]) -> str | None:
    """The services' environment for a trace replay (``--workload``): the collector replays it, inference
    serves ``--policy`` briefed with the workload, as ``agmarl eval`` runs it. Returns the result path of an
    inflation replay (the run ends when it is written), else None."""
    if args.policy:
        env["AGMARL_PINNED_POLICY"] = args.policy
    if not args.workload:
        return None
    env["AGMARL_REPLAY_WORKLOAD"] = args.workload
    env["AGMARL_REPLAY_PROTOCOL"] = args.protocol
    if args.cluster_nodes:
        env["AGMARL_REPLAY_NODES"] = args.cluster_nodes
    if args.protocol != "inflation":
        return None
    env.update(AGMARL_BRIEF_WORKLOAD=args.workload, AGMARL_OBJECTIVE="allocation", AGMARL_EXPLAIN_MODEL="false",
               AGMARL_SNAPSHOT_SECONDS=env.get("AGMARL_SNAPSHOT_SECONDS", "5"))
    if args.in_flight is not None:
        env["AGMARL_REPLAY_IN_FLIGHT"] = str(args.in_flight)
    if args.replay_rate is not None:
        env["AGMARL_REPLAY_RATE"] = str(args.replay_rate)
    result = args.result or str(Path(".state") / f"replay-{time.strftime('%Y%m%d-%H%M%S')}.json")
    env["AGMARL_REPLAY_OUT"] = str(Path(result).resolve())
    return env["AGMARL_REPLAY_OUT"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agmarl", description="AGMARL-DKS: graph-enhanced multi-agent RL scheduler")
    sub = p.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="start NATS, the six services and a simulated cluster")
    up.add_argument("--duration", type=float, default=None, help="run headless for S seconds, then stop")
    up.add_argument("--summary", default=None, help="write a JSON summary here when stopping")
    up.add_argument("--nodes", type=int, default=None, help="simulated nodes (default 50)")
    up.add_argument("--rate", type=float, default=None, help="pod arrivals per simulated second")
    up.add_argument("--seed", type=int, default=None)
    up.add_argument("--no-view", action="store_true", help="print progress lines instead of the live view")
    up.add_argument("--source", default=None, choices=("simulator", "kubernetes"),
                    help="the cluster: the built-in simulator (default) or the Kubernetes API of --kubeconfig")
    up.add_argument("--cluster", default=None, help="cluster name in the subjects (default: sim; with --source "
                    "kubernetes: default, as deploy/k8s)")
    up.add_argument("--kubeconfig", default=None, help="kubernetes: kubeconfig for every service (default: "
                    "$AGMARL_KUBECONFIG, $KUBECONFIG, ~/.kube/config)")
    up.add_argument("--context", default=None, help="kubernetes: kubeconfig context (default: the current one)")
    up.add_argument("--workload", default=None, help="replay a trace through the services: openb:default | "
                    "openb:<name|csv> (--protocol inflation) | synthetic:<name> (--protocol dynamic)")
    up.add_argument("--protocol", default="inflation", choices=("inflation", "dynamic"),
                    help="with --workload: the protocol the simulated cluster runs (as agmarl eval)")
    up.add_argument("--policy", default=None, help="serve this policy for the whole run (pinned; selections "
                    "from the adaptive-engine are ignored)")
    up.add_argument("--cluster-nodes", default=None, metavar="REF", help="with --workload: openb | openb:all | "
                    "synthetic:<n> | <node csv> (default: openb's GPU nodes for openb)")
    up.add_argument("--in-flight", type=int, default=None, help="inflation replay: pods announced without a "
                    "decision at most (default 1: each pod decided on its predecessors' cluster)")
    up.add_argument("--replay-rate", type=float, default=None, help="inflation replay: pods per second at most")
    up.add_argument("--result", default=None, help="inflation replay: write the result JSON here (default "
                    ".state/replay-<run>.json); the run stops when every pod is decided")
    up.add_argument("--batch-scheduler", default=None, metavar="NAME",
                    help="kubernetes: place and bind the pending pods of this schedulerName in batch mode "
                    "(e.g. agmarl-batch-scheduler; default: off)")

    dec = sub.add_parser("decisions", help="the decision log")
    dsub = dec.add_subparsers(dest="dcmd", required=True)
    tail = dsub.add_parser("tail", help="stream decisions (pod, node, policy, score, trace id)")
    tail.add_argument("--namespace", default=None)
    tail.add_argument("--cluster", default="sim")
    tail.add_argument("--last", type=int, default=20, help="start with the last N decisions")
    tail.add_argument("--follow", type=float, default=None, metavar="S",
                      help="follow for S seconds (default: until Ctrl-C)")

    rt = sub.add_parser("retrain", help="ask the trainer for a new model and print its answer")
    rt.add_argument("--reason", required=True)
    rt.add_argument("--timeout", type=float, default=10.0)
    rt.add_argument("--config", default="", metavar="NAME",
                    help="a fine-tuning config of configs/train/ (default: the trainer's, finetune.yaml)")

    tr = sub.add_parser("trace", help="print a decision's span tree from local trace files")
    tr.add_argument("query", help="trace id, or pod (namespace/name or name)")
    tr.add_argument("--dir", default=None, help="trace directory (default: the latest run's)")

    sub.add_parser("train", help="train a model in the simulator (see `agmarl train --help`)", add_help=False)

    nc = sub.add_parser("nats-creds", help="NATS identities: make, rotate, export as Kubernetes Secrets (docs/security.md)")
    nc.add_argument("--dir", default=None, help="credentials directory (default $AGMARL_NATS_CREDS_DIR, else "
                    "<state>/nats-creds)")
    nc.add_argument("--rotate", action="append", default=[], metavar="NAME", help="new seed for this identity ('routes': a new route password for the NATS cluster)")
    nc.add_argument("--k8s", action="store_true", help="print Kubernetes Secrets (for kubectl apply -f -)")
    nc.add_argument("--namespace", default="agmarl")
    nc.add_argument("--container-readable", action="store_true",
                    help="seeds 0644 in the 0700 directory (bind-mounted into containers by docker-compose)")

    pol = sub.add_parser("policy", help="the active policy")
    psub = pol.add_subparsers(dest="pcmd", required=True)
    psub.add_parser("show", help="the active selection and the recent history")
    pset = psub.add_parser("set", help="select a policy by registry name (kube-resources, model:<version>, ...)")
    pset.add_argument("name")
    pset.add_argument("--mode", default="full", choices=("shadow", "recommend", "canary", "hybrid", "full"))
    pset.add_argument("--reason", default="set from the CLI")
    prb = psub.add_parser("rollback", help="go back to the previous selection in the history")
    prb.add_argument("--reason", default="requested from the CLI")

    ev = sub.add_parser("eval", help="run scheduling policies side by side in the simulator and report")
    ev.add_argument("--protocol", required=True, choices=("inflation", "dynamic"))
    ev.add_argument("--workload", required=True,
                    help="openb:default | openb:<name> | openb:<csv path> | synthetic:<name>")
    ev.add_argument("--policies", required=True, help="comma-separated registry names (and model:<name>)")
    ev.add_argument("--seeds", default="42-51", help="A-B (inclusive) or a comma list (default 42-51)")
    ev.add_argument("--nodes", default="", help="openb | openb:all | synthetic:<n> | <node csv path> "
                    "(default: openb GPU nodes for openb workloads, synthetic:50 otherwise)")
    ev.add_argument("--ratio", type=float, default=1.3, help="inflation: target GPU requests x capacity")
    ev.add_argument("--tie-break", default="node-order", choices=("node-order", "random"),
                    help="inflation: equal scores go to the first node of a per-run random order (the FGD "
                    "paper's simulator, default) or to a uniformly random one (kube-scheduler's selectHost)")
    ev.add_argument("--horizon", type=float, default=3600.0, metavar="S",
                    help="dynamic: simulated seconds (also sizes synthetic workloads)")
    ev.add_argument("--record-every", type=float, default=30.0, metavar="S", help="dynamic: record interval")
    ev.add_argument("--json", default=None, metavar="OUT.json")
    ev.add_argument("--plot", default=None, metavar="OUT.png")
    ev.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")

    fid = sub.add_parser("fidelity", help="agreement with placements recorded from a real scheduler")
    fsub = fid.add_subparsers(dest="fcmd", required=True)
    fk = fsub.add_parser("kube", help="replay a kube-scheduler placement file (../shared/k8s/sim-to-real format)")
    fk.add_argument("--placements", required=True, metavar="FILE", help="placement file (nodes, bound, sequence)")
    fk.add_argument("--policy", default="kube-default", help="registry name (default kube-default)")
    fk.add_argument("--scores", default=None, metavar="FILE",
                    help="the real scheduler's per-plugin scores (scores-*.json): also compare every score")
    fk.add_argument("--json", default=None, metavar="OUT.json")

    keys = sub.add_parser("keys", help="model signing keys: generate, sign model folders, verify (docs/security.md)")
    ksub = keys.add_subparsers(dest="kcmd", required=True)
    kgen = ksub.add_parser("generate", help="a new Ed25519 key pair: <out>/<name>.key (0600) and <name>.pub")
    kgen.add_argument("--out", required=True, metavar="DIR")
    kgen.add_argument("--name", default="model-signing")
    ksign = ksub.add_parser("sign", help="check each model folder's digests, then write its manifest.sig")
    ksign.add_argument("dirs", nargs="+", metavar="MODEL_DIR")
    ksign.add_argument("--key", required=True, metavar="KEY", help="the private key file (never committed)")
    kver = ksub.add_parser("verify", help="load model folders as the services do (signature, digests, allow-list)")
    kver.add_argument("dirs", nargs="+", metavar="MODEL_DIR")
    kver.add_argument("--trusted", default="", metavar="PATHS",
                      help="trusted public keys (files or directories, ':'-separated; default "
                      "AGMARL_TRUSTED_MODEL_KEYS, else models/trusted)")

    bench = sub.add_parser("bench", help="benchmarks")
    bsub = bench.add_subparsers(dest="bcmd", required=True)
    lat = bsub.add_parser("latency", help="p50/p99 of the learned policy scoring pending pods (ONNX Runtime, 1 core)")
    lat.add_argument("--nodes", type=int, default=1523, help="cluster size: openb's 1,523 nodes, fewer, or replicated")
    lat.add_argument("--batch", type=int, default=1, help="pods scored together (1 = one pending pod)")
    lat.add_argument("--model", default="default", help="default | model folder | version on disk")
    lat.add_argument("--steps", type=int, default=300, help="measured decisions")
    lat.add_argument("--warmup", type=int, default=50, help="decisions before measuring")
    lat.add_argument("--fill", type=int, default=-1, help="openb pods bound first (default: 2 per node)")
    lat.add_argument("--seed", type=int, default=0)
    lat.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    lat.add_argument("--objective", default="composite", choices=("composite", "allocation"),
                     help="what the model optimises (composite adds the reward_gain input's cost)")
    lat.add_argument("--json", default=None, metavar="OUT.json")
    ext = bsub.add_parser("extender", help="time the kube-scheduler extender adds per pod, driven as kube-scheduler "
                          "v1.36 drives it (own nats-server + inference)")
    ext.add_argument("--nodes", type=int, default=100)
    ext.add_argument("--pods", type=int, default=2000)
    ext.add_argument("--policy", default="kube-default", help="the policy inference serves (pinned)")
    ext.add_argument("--mode", default="full", help="rollout mode")
    ext.add_argument("--config", default="", help="scheduler configuration whose extender verbs are driven "
                     "(default: deploy/k8s/overlays/full/scheduler-config.yaml)")
    ext.add_argument("--verbs", default="", help="override: e.g. filter,prioritize,bind")
    ext.add_argument("--budget-ms", type=int, default=100)
    ext.add_argument("--watch-ms", type=float, default=50.0, help="the watch reports bindings this often")
    ext.add_argument("--gap-ms", type=float, default=0.0,
                     help="kube-scheduler's own time between two pods' extender calls (slept; default 0)")
    ext.add_argument("--warmup", type=int, default=50)
    ext.add_argument("--seed", type=int, default=0)
    ext.add_argument("--json", default=None, metavar="OUT.json")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:
        # the trainer's own CLI (torch is imported only here, never by the other commands)
        from agmarl_trainer.cli import main as train_main  # noqa: PLC0415
        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.cmd == "up":
        from agmarl_cli.source import UpSource, source_env  # noqa: PLC0415
        from agmarl_cli.up import run_up  # noqa: PLC0415 - keep `agmarl --help` fast
        env, cluster = source_env(UpSource(args.source, args.cluster, args.kubeconfig, args.context,
                                           args.batch_scheduler))
        if args.nodes is not None:
            env["AGMARL_SIM_NODES"] = str(args.nodes)
        if args.rate is not None:
            env["AGMARL_SIM_RATE"] = str(args.rate)
        if args.seed is not None:
            env["AGMARL_SIM_SEED"] = str(args.seed)
        result = replay_env(args, env)
        view = args.duration is None and not args.no_view and sys.stdout.isatty() and result is None
        return asyncio.run(run_up(args.duration, args.summary, view, env, cluster=cluster, result=result))
    if args.cmd == "eval":
        from agmarl_cli.evaluate import EvalSpec, eval_command  # noqa: PLC0415
        spec = EvalSpec(protocol=args.protocol, workload=args.workload, nodes=args.nodes, ratio=args.ratio,
                        horizon_s=args.horizon, record_every_s=args.record_every, tie_break=args.tie_break)
        return eval_command(spec, args.policies, args.seeds, args.json, args.plot, args.workers)
    if args.cmd == "fidelity":
        from agmarl_cli.fidelity import fidelity_command  # noqa: PLC0415
        return fidelity_command(args.placements, args.policy, args.json, args.scores)
    if args.cmd == "bench" and args.bcmd == "extender":
        from agmarl_cli.extender_bench import ExtenderBenchSpec, extender_command  # noqa: PLC0415
        return extender_command(ExtenderBenchSpec(
            nodes=args.nodes, pods=args.pods, policy=args.policy, mode=args.mode, config=args.config,
            verbs=args.verbs, budget_ms=args.budget_ms, watch_ms=args.watch_ms, gap_ms=args.gap_ms, warmup=args.warmup,
            seed=args.seed), args.json)
    if args.cmd == "bench":
        from agmarl_cli.bench import BenchSpec, latency_command  # noqa: PLC0415
        spec = BenchSpec(nodes=args.nodes, batch=args.batch, model=args.model, steps=args.steps, warmup=args.warmup,
                         fill=args.fill, seed=args.seed, pin=not args.no_pin, objective=args.objective)
        return latency_command(spec, args.json)
    if args.cmd == "keys":
        from agmarl_cli import keys as model_keys  # noqa: PLC0415
        if args.kcmd == "generate":
            return model_keys.generate(args.out, args.name)
        if args.kcmd == "sign":
            return model_keys.sign(args.dirs, args.key)
        return model_keys.verify(args.dirs, args.trusted)
    from agmarl_cli import commands  # noqa: PLC0415
    if args.cmd == "decisions":
        try:
            return asyncio.run(commands.decisions_tail(args.namespace, args.cluster, args.last, args.follow))
        except KeyboardInterrupt:
            return 0
    if args.cmd == "retrain":
        return asyncio.run(commands.retrain(args.reason, args.timeout, args.config))
    if args.cmd == "nats-creds":
        from agmarl_cli.natscreds import nats_creds  # noqa: PLC0415
        return nats_creds(args.dir, args.rotate, args.k8s, args.namespace, args.container_readable)
    if args.cmd == "trace":
        return commands.trace(args.query, args.dir)
    if args.cmd == "policy":
        from agmarl_cli import policy  # noqa: PLC0415
        if args.pcmd == "set":
            return asyncio.run(policy.policy_set(args.name, args.mode, args.reason))
        if args.pcmd == "rollback":
            return asyncio.run(policy.policy_rollback(args.reason))
        return asyncio.run(policy.policy_show())
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
