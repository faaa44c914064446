"""Two `banditspec bench-load` runs of the same command side by side (e.g. before and after an
engine change): output tokens/s and TTFT p50 per level and method, the second over the first.

    .venv/bin/python experiments/compare_load_runs.py RUN_A RUN_B OUT_PREFIX [--labels A,B]

RUN_A, RUN_B: folders holding results.json. Writes OUT_PREFIX.md (the table) and OUT_PREFIX.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from banditspec_client.bench.report import markdown_table, pyplot, save_png


def load(folder: str) -> dict[tuple[str, int, str], dict]:
    rows = json.loads((Path(folder) / "results.json").read_text())["rows"]
    return {(r["transport"], r["concurrency"], r["method"]): r for r in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("out_prefix")
    parser.add_argument("--labels", default="A,B")
    args = parser.parse_args()
    label_a, label_b = args.labels.split(",")
    a, b = load(args.run_a), load(args.run_b)
    keys = sorted(set(a) & set(b), key=lambda k: (k[0], k[1], k[2]))
    if not keys:
        raise SystemExit("the runs share no (transport, concurrency, method) row")
    table = markdown_table(
        ["transport", "streams", "method", f"tok/s {label_a}", f"tok/s {label_b}", f"{label_b} / {label_a}",
         f"TTFT p50 ms {label_a}", f"TTFT p50 ms {label_b}"],
        [[t, str(c), m, f"{a[(t, c, m)]['output_tokens_per_s']:.1f}", f"{b[(t, c, m)]['output_tokens_per_s']:.1f}",
          f"{b[(t, c, m)]['output_tokens_per_s'] / a[(t, c, m)]['output_tokens_per_s']:.2f}",
          f"{1000 * a[(t, c, m)]['ttft_p50_s']:.0f}", f"{1000 * b[(t, c, m)]['ttft_p50_s']:.0f}"] for t, c, m in keys])
    out = Path(args.out_prefix)
    out.with_suffix(".md").write_text(f"{label_a}: {args.run_a}; {label_b}: {args.run_b}\n\n{table}\n")
    plt = pyplot()
    methods = sorted({m for _, _, m in keys})
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 4), squeeze=False)
    for ax, method in zip(axes[0], methods):
        levels = sorted({c for t, c, m in keys if m == method})
        transport = next(t for t, _, m in keys if m == method)
        for run, label, style in ((a, label_a, "--"), (b, label_b, "-")):
            ax.plot(levels, [run[(transport, c, method)]["output_tokens_per_s"] for c in levels], style, marker="o",
                    label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_title(method)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("output tokens/s")
        ax.legend()
    save_png(fig, out.with_suffix(".png"))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
