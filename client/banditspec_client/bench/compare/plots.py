"""PNG plots of ``banditspec bench`` (drawn with :mod:`banditspec_client.bench.report`).

* ``tokens_per_second.png``: tokens/s per method, grouped by workload (bars); a second
  panel in tokens per CPU-second when CPU times were measured;
* ``speedup_sorted.png``: per prompt, each method's speedup over vanilla, sorted
  ascending, one panel per workload (like Figure 3 of the BanditSpec paper);
* ``arms_per_step.png``: the arm each adaptive method chose at every step, for a few
  prompts (marker size = accepted draft tokens at that step).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from banditspec_client.bench.compare.summary import WorkloadSummary, by_prompt, is_adaptive
from banditspec_client.bench.methods import VANILLA, RunRecord
from banditspec_client.bench.report import pyplot, save_png


def _bars(ax: Any, summaries: Sequence[WorkloadSummary], methods: list[str], ylabel: str) -> None:
    width = 0.8 / max(1, len(methods))
    for j, method in enumerate(methods):
        xs, ys = [], []
        for i, s in enumerate(summaries):
            m = s.get(method)
            if m is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(m.tokens_per_second)
        ax.bar(xs, ys, width=width, label=method)
    ax.set_xticks(range(len(summaries)), [s.workload for s in summaries])
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def plot_tokens_per_second(summaries: Sequence[WorkloadSummary], path: Path,
                           cpu_summaries: Sequence[WorkloadSummary] | None = None) -> Path:
    """Bars per workload and method; a second panel by CPU time when ``cpu_summaries``."""
    plt = pyplot()
    methods = list(dict.fromkeys(m.method for s in summaries for m in s.methods))
    panels = [(summaries, "tokens / s (wall clock)")]
    if cpu_summaries:
        panels.append((cpu_summaries, "tokens / CPU-second"))
    width = max(6.0, 1.6 * len(summaries) + 0.25 * len(methods))
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 4.0), squeeze=False)
    for ax, (panel, label) in zip(axes[0], panels):
        _bars(ax, panel, methods, label)
    axes[0][0].set_title("Decoding speed per method and workload")
    axes[0][-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_png(fig, path)


def plot_speedup_sorted(summaries: Sequence[WorkloadSummary], records: Sequence[RunRecord], path: Path) -> Path:
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(summaries), figsize=(4.2 * len(summaries), 3.6), squeeze=False)
    for ax, s in zip(axes[0], summaries):
        prompts = by_prompt(r for r in records if r.workload == s.workload)
        for m in s.methods:
            if m.method == VANILLA:
                continue
            ratios = sorted(
                runs[m.method].tokens_per_second / runs[VANILLA].tokens_per_second
                for pid, runs in prompts.items()
                if pid in s.prompt_ids and VANILLA in runs and runs[VANILLA].tokens_per_second > 0
            )
            if ratios:
                style = "-" if is_adaptive(m.method) else "--"
                ax.plot(range(1, len(ratios) + 1), ratios, style, marker=".", label=m.method)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(s.workload)
        ax.set_xlabel("prompts, sorted by speedup")
        ax.set_ylabel("speedup over vanilla")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize="small")
    return save_png(fig, path)


def plot_arms_per_step(records: Sequence[RunRecord], path: Path, *, prompts_shown: int = 3) -> Path:
    """Up to ``prompts_shown`` prompts (the first of each kind first), one row per
    (prompt, adaptive method)."""
    plt = pyplot()
    adaptive = [r for r in records if is_adaptive(r.method) and r.arms]
    chosen: list[str] = []
    for kind in dict.fromkeys(r.kind for r in adaptive):
        pid = next(r.prompt_id for r in adaptive if r.kind == kind)
        if pid not in chosen:
            chosen.append(pid)
    for r in adaptive:
        if r.prompt_id not in chosen:
            chosen.append(r.prompt_id)
    chosen = chosen[:prompts_shown]
    rows = [r for pid in chosen for r in adaptive if r.prompt_id == pid]
    arm_names = sorted({a for r in rows for a in r.arms})
    fig, axes = plt.subplots(max(1, len(rows)), 1, figsize=(9, 1.0 + 1.2 * max(1, len(rows))), squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        ys = [arm_names.index(a) for a in r.arms]
        sizes = [12 + 18 * a for a in r.accepted]
        ax.scatter(range(len(ys)), ys, s=sizes, c=r.accepted, cmap="viridis", vmin=0, vmax=max(1, max(r.drafted or [1])))
        ax.set_yticks(range(len(arm_names)), arm_names, fontsize="small")
        ax.set_ylim(-0.5, len(arm_names) - 0.5)
        ax.set_title(f"{r.method} on {r.prompt_id} ({r.kind}), MAT {r.mean_accepted_tokens:.2f}", fontsize="small")
    axes[-1, 0].set_xlabel("step (marker size and colour = accepted draft tokens)")
    return save_png(fig, path)


def write_plots(summaries: Sequence[WorkloadSummary], records: Sequence[RunRecord], out_dir: Path,
                *, prompts_shown: int = 3, cpu_summaries: Sequence[WorkloadSummary] | None = None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        plot_tokens_per_second(summaries, out_dir / "tokens_per_second.png", cpu_summaries),
        plot_speedup_sorted(summaries, records, out_dir / "speedup_sorted.png"),
    ]
    if any(is_adaptive(r.method) and r.arms for r in records):
        paths.append(plot_arms_per_step(records, out_dir / "arms_per_step.png", prompts_shown=prompts_shown))
    return paths
