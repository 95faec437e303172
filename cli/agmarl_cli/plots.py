"""PNG figures of an `agmarl eval` report (matplotlib, Agg backend: no display needed).

- inflation: GPU allocation and fragmentation (% of GPU capacity) against arrived workload
  (% of GPU capacity, 0..130), one line per policy with a +-1 std band over seeds;
- dynamic: cpu and GPU utilisation, pending pods and the composite reward over simulated time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _band(ax, x: np.ndarray, cell: dict[str, Any], label: str) -> None:
    mean = np.array([np.nan if v is None else v for v in cell["mean"]], dtype=np.float64)
    std = np.array([np.nan if v is None else v for v in cell["std"]], dtype=np.float64)
    (line,) = ax.plot(x, mean, label=label, linewidth=1.4)
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.15, linewidth=0)


def _inflation(report: dict[str, Any]):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.asarray(report["arrived_pct"], dtype=np.float64)
    for name, entry in report["policies"].items():
        _band(ax1, x, entry["curves"]["allocation"], name)
        _band(ax2, x, entry["curves"]["frag"], name)
    ax1.plot(x, np.minimum(x, 100), color="grey", linestyle=":", linewidth=1, label="ideal")
    ax1.set(xlabel="arrived workload (% of GPU capacity)", ylabel="GPU allocation (% of capacity)",
            title="GPU allocation")
    ax2.set(xlabel="arrived workload (% of GPU capacity)", ylabel="fragmented GPU (% of capacity)",
            title="GPU fragmentation")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _dynamic(report: dict[str, Any]):
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    panels = (("util_cpu", "cpu utilisation (requested / capacity)"),
              ("util_gpu", "GPU utilisation (requested / capacity)"),
              ("pending", "pending pods"), ("reward", "composite reward (per record window)"))
    for ax, (key, title) in zip(axes.flat, panels):
        for name, entry in report["policies"].items():
            t = np.asarray(entry["series"]["time"], dtype=np.float64) / 60.0
            _band(ax, t, entry["series"][key], name)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("simulated time (min)")
    axes[0, 0].legend(fontsize=8)
    return fig


def plot_report(report: dict[str, Any], path: str | Path) -> None:
    """Write the protocol's figure for ``report`` (as built by ``evaluate.aggregate``) to ``path``."""
    fig = _inflation(report) if report["protocol"] == "inflation" else _dynamic(report)
    seeds = report["seeds"]
    fig.suptitle(f"{report['protocol']} · {report['workload']} · {report['n_nodes']} nodes · "
                 f"{len(seeds)} seeds (mean ± std)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
