"""Draw mean accepted tokens per target step against γ for several bench_eagle.py results.

    .venv/bin/python experiments/eagle/plot_acceptance.py OUT.png LABEL=acceptance.json [LABEL=...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, runs = Path(argv[0]), [a.split("=", 1) for a in argv[1:]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, workload in zip(axes, ("chat", "code")):
        for label, path in runs:
            result = json.loads(Path(path).read_text())["workloads"][workload]
            mat = result["mean_accepted_tokens"]
            gammas = sorted(int(g) for g in mat)
            ax.plot(gammas, [mat[str(g)] for g in gammas], marker="o", label=label)
            ax.set_title(f"{workload} ({result['prompts']} prompts)")
        ax.axhline(2.0, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("γ (draft length)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean accepted tokens per target step")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
