"""`agmarl eval`: run scheduling policies side by side in the simulator and report.

Two protocols over the same policy registry:
- ``inflation``: the FGD paper's workload-inflation experiment (``sim.inflation.run_inflation``):
  GPU allocation and fragmentation against arrived workload, 0..130 % of GPU capacity;
- ``dynamic``: the time-driven simulator (arrivals, durations, pending queue); utilisation,
  balance, pending times, SLA and hard-constraint violations, and the composite reward of
  ``agmarl_common.core.reward`` averaged over the record points of the run.

Every (policy, seed) pair is one job; a job depends on nothing but its arguments, so a seed
replays exactly whatever the number of worker processes. Results are aggregated per policy as
mean and population std over seeds. Bad input is an ``EvalError`` (a ``ValueError``) whose
message names the problem; the command prints it on one line and exits 2.
The spec and its inputs live in ``eval_spec``, the jobs in ``eval_jobs``, the report in
``eval_report``; every name is re-exported here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agmarl_cli.eval_jobs import (  # noqa: F401  (re-exported, part of this module's API)
    dynamic_job, inflation_job, run_all, run_dynamic_with_reward, run_job, window_reward)
from agmarl_cli.eval_report import (  # noqa: F401  (re-exported, part of this module's API)
    TABLE_COLUMNS, _clean, _fmt, _mean_std, aggregate, markdown_table, write_json)
from agmarl_cli.eval_spec import (  # noqa: F401  (re-exported, part of this module's API)
    DYNAMIC_SERIES, INFLATION_CURVES, MAX_SEEDS, MODEL_PREFIX, PROTOCOLS, SYNTHETIC_CLUSTER_SEED, EvalError,
    EvalSpec, _nodes, _openb_pods, _openb_workload_path, check_spec, compress_times, known_policy_names,
    load_nodes, load_workload, parse_policies, parse_seeds, replace_time, resolve_policy)


# ---------------------------------------------------------------------------------------------
# The command


def _check_output(path: str | None, flag: str, suffix: str) -> None:
    if path is None:
        return
    p = Path(path)
    if not p.parent.is_dir():
        raise EvalError(f"{flag} {path}: directory {p.parent} does not exist")
    if p.suffix.lower() != suffix:
        raise EvalError(f"{flag} {path}: expected a {suffix} file")


def eval_command(spec: EvalSpec, policies: str, seeds: str, json_path: str | None = None,
                 plot_path: str | None = None, workers: int = 1) -> int:
    """Validate, run, write JSON / PNG, print the Markdown table; 2 on bad input (one line on stderr)."""
    try:
        seed_list = parse_seeds(seeds)
        if workers < 1:
            raise EvalError(f"--workers must be >= 1, got {workers}")
        _check_output(json_path, "--json", ".json")
        _check_output(plot_path, "--plot", ".png")
        check_spec(spec)
        names = parse_policies(policies)
        runs = run_all(spec, names, seed_list, workers)
    except (EvalError, ValueError, KeyError, OSError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"agmarl eval: error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2
    report = aggregate(spec, runs, names, seed_list, len(load_nodes(spec)))
    if json_path:
        write_json(report, json_path)
    if plot_path:
        from agmarl_cli.plots import plot_report  # noqa: PLC0415 - matplotlib only when asked
        plot_report(report, plot_path)
    print(f"{spec.protocol} · {spec.workload} · {report['n_nodes']} nodes · seeds {seeds} "
          f"({len(seed_list)}) · mean ± std\n")
    print(markdown_table(report))
    return 0
