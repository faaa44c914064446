"""Draw A/B runs (the JSON files experiments/ab_common.report writes): for each run, tokens/s of
FIRST over SECOND per workload and pooled, as grouped bars around 1.0.

    .venv/bin/python experiments/plot_ab.py FIRST SECOND OUT.png LABEL=RUN.json [LABEL=RUN.json ...]
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from ab_common import COLUMNS, tokens_per_second  # noqa: E402


def ratios(path: str, first: str, second: str) -> dict[str, float]:
    with open(path) as f:
        data = json.load(f)
    assert data["columns"] == COLUMNS, f"{path}: not an ab_common.report file"
    rows = data["rows"]
    return {workload: tokens_per_second(rows, first, workload) / tokens_per_second(rows, second, workload)
            for workload in [*dict.fromkeys(r[0] for r in rows), "all"]}


def main() -> int:
    first, second, out, *runs = sys.argv[1:]
    series = [(label, ratios(path, first, second)) for label, path in (run.split("=", 1) for run in runs)]
    workloads = list(dict.fromkeys(w for _, r in series for w in r))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, (label, r) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(workloads))]
        ax.bar(xs, [r.get(w, float("nan")) - 1 for w in workloads], width, bottom=1, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel(f"tokens/s, {first} / {second}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
