"""Tables and the figure of the concurrency sweep (from its results JSON).

The figure follows the paper's Figure 3: per concurrency, the throughput improvement of
each setting over gamma = 0 (plain decoding), with the oracle-best and the worst fixed
gamma drawn as a band; a second panel shows the latency (seconds per generated token of
the completed requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from banditspec_client.bench.report import markdown_table, pyplot, save_png

GOAL_OF_BEST = 0.95  # adaptive >= 95% of the best fixed gamma
GOAL_OF_VANILLA = 0.95  # adaptive >= 95% of gamma = 0


@dataclass(frozen=True)
class LevelSummary:
    """One concurrency level; throughputs in tokens/s."""

    concurrency: int
    vanilla: float
    best_label: str
    best: float
    worst_label: str
    worst: float
    adaptive: float | None

    def gain(self, value: float) -> float:
        """Throughput improvement over gamma = 0, in percent."""
        return 100.0 * (value / self.vanilla - 1.0) if self.vanilla > 0 else 0.0

    @property
    def meets_goal(self) -> bool | None:
        if self.adaptive is None or self.best <= 0 or self.vanilla <= 0:
            return None
        return self.adaptive >= GOAL_OF_BEST * self.best and self.adaptive >= GOAL_OF_VANILLA * self.vanilla


def summarize(report: dict) -> list[LevelSummary]:
    by_level: dict[int, dict[str, float]] = {}
    for row in report["rows"]:
        by_level.setdefault(row["concurrency"], {})[row["setting"]] = row["tokens_per_second"]
    out = []
    for level, values in sorted(by_level.items()):
        fixed = {k: v for k, v in values.items() if k != "adaptive"}
        if "gamma=0" not in fixed:
            continue
        best = max(fixed, key=fixed.get)
        worst = min(fixed, key=fixed.get)
        out.append(LevelSummary(level, fixed["gamma=0"], best, fixed[best], worst, fixed[worst], values.get("adaptive")))
    return out


def markdown(report: dict) -> str:
    summaries = summarize(report)
    settings = sorted({row["setting"] for row in report["rows"]}, key=lambda s: (s == "adaptive", s))
    cells = {(row["concurrency"], row["setting"]): row for row in report["rows"]}
    throughput = []
    for s in summaries:
        row = [f"{cells[(s.concurrency, name)]['tokens_per_second']:.1f}" if (s.concurrency, name) in cells else "" for name in settings]
        ratio_best = f"{s.adaptive / s.best:.3f}" if s.adaptive is not None and s.best > 0 else ""
        ratio_vanilla = f"{s.adaptive / s.vanilla:.3f}" if s.adaptive is not None and s.vanilla > 0 else ""
        goal = {True: "met", False: "missed", None: ""}[s.meets_goal]
        throughput.append([s.concurrency, *row, s.best_label, ratio_best, ratio_vanilla, goal])
    latency = []
    for s in summaries:
        row = []
        for name in settings:
            cell = cells.get((s.concurrency, name))
            if cell is None or "mean_s_per_token" not in cell["latency"]:
                row.append("")
                continue
            lat = cell["latency"]
            full = f"{lat['mean_s']:.1f} s ({lat['requests']})" if lat.get("requests") else "-"
            row.append(f"{lat['mean_s_per_token']:.3f}; {full}; {cell['mean_drafted_per_step']:.2f}")
        latency.append([s.concurrency, *row])
    lines = [
        "# Concurrency sweep: fixed speculation length vs. the server-wide controller",
        "",
        f"Command: `{report['command']}`  ",
        f"Started {report['started']}, finished {report.get('finished', '(incomplete)')}; "
        f"machine: {report['machine']['platform']}, {report['machine']['cpus']} CPUs.",
        "",
        "## Total throughput (generated tokens/s, server-side counter over the measured window)",
        "",
        markdown_table(["streams", *settings, "best fixed", "adaptive / best", "adaptive / gamma=0", "goal"], throughput,
                       "r" * (len(settings) + 1) + "lrrc"),
        "",
        "## Latency: seconds per generated token (all completed requests), full-request mean latency in s (requests), mean draft tokens per step",
        "",
        markdown_table(["streams", *settings], latency, "r" * (len(settings) + 1)),
        "",
        "Mean target batch (sequences per verify call) per setting: "
        + "; ".join(f"{row['concurrency']}/{row['setting']}: {row['mean_batch']:.2f}" for row in report["rows"] if row["setting"] in ("gamma=0", "adaptive")),
        "",
    ]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    summaries = summarize(report)
    levels = [s.concurrency for s in summaries]
    x = list(range(len(levels)))
    by = {(row["concurrency"], row["setting"]): row for row in report["rows"]}
    fixed = sorted({row["setting"] for row in report["rows"] if row["setting"] != "adaptive"})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.fill_between(x, [s.gain(s.worst) for s in summaries], [s.gain(s.best) for s in summaries], color="0.88", label="worst .. best fixed")
    left.plot(x, [s.gain(s.best) for s in summaries], "--", color="tab:green", label="oracle-best fixed gamma")
    left.plot(x, [s.gain(s.worst) for s in summaries], ":", color="tab:red", label="worst fixed gamma")
    for name in fixed:
        if name == "gamma=0":
            continue
        left.plot(x, [s.gain(by[(s.concurrency, name)]["tokens_per_second"]) for s in summaries], "-", lw=0.8, alpha=0.6, label=name)
    if all(s.adaptive is not None for s in summaries):
        left.plot(x, [s.gain(s.adaptive) for s in summaries], "o-", color="black", lw=2, label="adaptive (UCB over gamma)")
    left.axhline(0, color="0.4", lw=0.8)
    left.set_xticks(x, [str(v) for v in levels])
    left.set_xlabel("concurrent streams")
    left.set_ylabel("throughput improvement over gamma = 0 (%)")
    left.legend(fontsize=7)
    for name in fixed + ["adaptive"]:
        ys = [by.get((s.concurrency, name), {}).get("latency", {}).get("mean_s_per_token") for s in summaries]
        if any(y is not None for y in ys):
            style = {"lw": 2, "color": "black", "marker": "o"} if name == "adaptive" else {"lw": 0.9}
            right.plot(x, [y if y is not None else float("nan") for y in ys], label=name, **style)
    right.set_xticks(x, [str(v) for v in levels])
    right.set_xlabel("concurrent streams")
    right.set_ylabel("latency: seconds per generated token")
    right.set_yscale("log")
    right.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M on CPU behind Triton: fixed gamma vs. throughput-driven controller", fontsize=10)
    save_png(fig, path, dpi=120)


def write_report(report: dict, json_path: Path) -> list[Path]:
    md, png = json_path.with_suffix(".md"), json_path.with_suffix(".png")
    md.write_text(markdown(report))
    plot(report, png)
    return [md, png]
