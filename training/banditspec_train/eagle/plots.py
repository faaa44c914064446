"""The loss-curve PNG of a training run."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_losses(losses: list[float], path: Path, title: str,
                ylabel: str = "loss (smooth-L1 + w * CE, unrolled)") -> None:
    """Per-step training loss (light) and its 25-step moving average (dark); ``ylabel`` names
    the objective (the default is EAGLE-1's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = np.arange(1, len(losses) + 1)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="per step")
    window = min(25, len(losses))
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, color="tab:blue", linewidth=1.6, label=f"mean of {window}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
