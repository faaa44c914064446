"""The load sweep's report: results.md (settings, then one table per transport) and one
figure per transport (output tokens/s, time to first token, inter-token latency and
request latency against the number of concurrent streams, a line per method)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from banditspec_client.bench.report import fmt, markdown_table, pyplot, save_png

VANILLA = "vanilla"


def ratios(rows: list[dict]) -> dict[tuple[str, int, str], float | None]:
    """(transport, concurrency, method) -> output tokens/s over plain decoding's there."""
    base = {(r["transport"], r["concurrency"]): r["output_tokens_per_s"] for r in rows if r["method"] == VANILLA}
    out: dict[tuple[str, int, str], float | None] = {}
    for r in rows:
        plain = base.get((r["transport"], r["concurrency"]))
        out[(r["transport"], r["concurrency"], r["method"])] = (
            round(r["output_tokens_per_s"] / plain, 3) if plain else None)
    return out


def _ms(value: float | None) -> str:
    return fmt(None if value is None else 1e3 * value, "{:.0f}")


def _per_level(value: int | dict[Any, int]) -> str:
    """Requests per stream: one number, or {level: number} (a level's streams send more to
    reach the row's minimum)."""
    if isinstance(value, dict):
        return ", ".join(f"{n} at {level}" for level, n in value.items())
    return str(value)


def settings_lines(report: dict) -> list[str]:
    s = report["settings"]
    machine = report["machine"]
    return [
        f"- command: `{report['command']}`",
        f"- machine: {machine['cpu_model']}, {machine['logical_cpus']} logical CPUs; server torch threads: "
        f"{s['torch_threads']}",
        f"- prompts: {s['prompts']} ({s['prompt_source']}); output tokens per request: {s['max_tokens']}; "
        f"L (max_draft_len): {s['max_draft_len']}; temperature: {s['temperature']}",
        f"- concurrency: {', '.join(map(str, s['concurrency']))}; requests per stream per level: "
        f"{_per_level(s['requests_per_stream'])}; methods (interleaved): {', '.join(s['methods'])}; transports: "
        f"{', '.join(s['transports'])}",
        f"- server parameters: {s['server_params'] or 'the model repository defaults'}",
        f"- load generator: one asyncio loop in one process; its CPU time was "
        f"{fmt(report['generator']['mean_cpu_share'] * 100, '{:.1f}')} % of one core on average "
        f"(at most {fmt(report['generator']['max_cpu_share'] * 100, '{:.1f}')} %), "
        f"{fmt(report['generator']['mean_cpu_share'] * 100 / max(1, machine['logical_cpus']), '{:.1f}')} % "
        f"of the machine",
    ]


def markdown(report: dict) -> str:
    rows = report["rows"]
    r = ratios(rows)
    lines = ["# Load sweep", "", *settings_lines(report), ""]
    header = ["streams", "method", "output tok/s", "x plain", "TTFT p50 / p99 (ms)", "ITL p50 / p99 (ms)",
              "latency p50 / p99 (s)", "drafted/step", "requests", "failed", "outputs ≠ plain"]
    for transport in report["settings"]["transports"]:
        table = []
        for row in sorted((x for x in rows if x["transport"] == transport),
                          key=lambda x: (x["concurrency"], report["settings"]["methods"].index(x["method"]))):
            table.append([
                row["concurrency"], row["method"], f"{row['output_tokens_per_s']:.1f}",
                fmt(r[(transport, row["concurrency"], row["method"])], "{:.3f}"),
                f"{_ms(row['ttft_p50_s'])} / {_ms(row['ttft_p99_s'])}",
                f"{_ms(row['itl_p50_s'])} / {_ms(row['itl_p99_s'])}",
                f"{fmt(row['latency_p50_s'])} / {fmt(row['latency_p99_s'])}",
                fmt(row["drafted_per_step"]), row["requests"], row["failed"], fmt(row.get("mismatches"), "{}"),
            ])
        lines += [f"## {transport}", "", markdown_table(header, table, "rlrrrrrrrrr"), ""]
    errors = sorted({e for row in rows for e in row["errors"]})
    if errors:
        lines += ["## Errors (first of each kind)", "", *[f"- `{e}`" for e in errors[:10]], ""]
    return "\n".join(lines)


# plain decoding and the default, drawn thick in colours of their own
BOLD = {"vanilla": "0.55", "default": "black"}


def figure(report: dict, transport: str, path: Path) -> Path | None:
    rows = [x for x in report["rows"] if x["transport"] == transport]
    if not rows:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels: list[tuple[Any, str, list[tuple[str, str]]]] = [
        (axes[0][0], "total output tokens/s", [("output_tokens_per_s", "-")]),
        (axes[0][1], "time to first token (s): p50 solid, p99 dashed", [("ttft_p50_s", "-"), ("ttft_p99_s", "--")]),
        (axes[1][0], "inter-token latency (s): p50 solid, p99 dashed", [("itl_p50_s", "-"), ("itl_p99_s", "--")]),
        (axes[1][1], "request latency (s): p50 solid, p99 dashed", [("latency_p50_s", "-"), ("latency_p99_s", "--")]),
    ]
    methods = report["settings"]["methods"]
    from matplotlib.colors import to_rgb

    palette = [c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"]
               if to_rgb(c) != to_rgb("#7f7f7f")]  # grey is plain decoding's
    others = [m for m in methods if m not in BOLD]
    if len(others) > len(palette):  # no two methods in one colour
        palette = [plt.get_cmap("tab20")(i) for i in range(20)]
    colour = {**BOLD, **{m: palette[i % len(palette)] for i, m in enumerate(others)}}
    for ax, title, series in panels:
        for method in methods:
            mine = sorted((x for x in rows if x["method"] == method), key=lambda x: x["concurrency"])
            for key, style in series:
                points = [(x["concurrency"], x[key]) for x in mine if x[key] is not None]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, style, marker="o", color=colour[method],
                            linewidth=2.5 if method in BOLD else 1.2,
                            label=method if style == "-" else None)
        ax.set_xscale("log", base=2)
        ax.set_xticks(report["settings"]["concurrency"], [str(c) for c in report["settings"]["concurrency"]])
        ax.set_xlabel("concurrent streams")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, ncols=2 if len(methods) > 6 else 1)
    s = report["settings"]
    fig.suptitle(f"{transport}: {s['prompts']} prompts, {s['max_tokens']} tokens, L = {s['max_draft_len']}, "
                 f"temperature {s['temperature']}; {report['machine']['cpu_model']}", fontsize=10)
    return save_png(fig, path)


def write_report(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.md"]
    written[0].write_text(markdown(report) + "\n")
    for transport in report["settings"]["transports"]:
        png = figure(report, transport, out / f"load-{transport}.png")
        if png is not None:
            written.append(png)
    return written
