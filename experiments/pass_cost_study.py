"""What does one batched pass of the reference target cost, packed or padded? Times the same
random passes (1-8 sequences, each feeding 1-9 tokens after one of 8 prompts of 30-900 tokens
held in the prefix cache) on the engine as it runs (panel kernels: packed passes, every
sequence's rows side by side, its K/V in its own buffer) and on the same kernels padded (every
sequence's rows to the longest draft, its cached K/V to the deepest context, gathered into one
batch), interleaved pass by pass; then fits each on two thirds of its passes and predicts the rest with

- padded: a + s*B + r*B*N + x*B*C/1000 (bandits/pass_cost.py; N the longest run fed, C the
  deepest context), the `padded` batch pricing;
- summed rows: a + r*R + x*R*C_mean/1000 (R the tokens fed), the `rows` pricing (the default);
- rows and sequences: a + s*B + r*R + x*R*C_mean/1000, a row's cost apart from a sequence's (under
  load rows and sequences grow together, so a fit by rows alone charges a row for both).

    .venv/bin/python experiments/pass_cost_study.py OUT_DIR [PASSES] [THREADS]   (400, 1)

Writes OUT_DIR/pass_cost.{json,md,png}.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from banditspec.bandits.pass_cost import PassCost, PassShape
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.models import load_model
from banditspec.engine.reference import ReferenceEngine
from banditspec_client.bench.report import markdown_table, pyplot, save_png
from tqdm import tqdm


class PaddedEngine(ReferenceEngine):
    """The reference engine on the same kernels, its passes padded (the path of the other kernels)."""

    @property
    def packs_rows(self) -> bool:
        return False


def summed_terms(r: dict) -> list[float]:
    return [1.0, r["rows"], r["rows"] * r["context"] / 1000.0]


def sequence_terms(r: dict) -> list[float]:
    return [1.0, r["sequences"], r["rows"], r["rows"] * r["context"] / 1000.0]


def least_squares(rows: list[dict], terms: Callable[[dict], list[float]]) -> np.ndarray:
    x = np.asarray([terms(r) for r in rows])
    coef, *_ = np.linalg.lstsq(x, np.asarray([r["seconds"] for r in rows]), rcond=None)
    return coef


def errors(rows: list[dict]) -> tuple[dict, dict, np.ndarray, np.ndarray, np.ndarray]:
    """The fits on the first two thirds of ``rows``; their mean |relative error| on the rest,
    the fitted terms (ms), and (measured, predicted padded, predicted summed) on the rest."""
    cut = 2 * len(rows) // 3
    fit_rows, test_rows = rows[:cut], rows[cut:]
    padded = PassCost(window=len(rows), min_passes=4)
    for r in fit_rows:
        padded.observe(PassShape(r["sequences"], r["longest"], r["deepest"]), r["seconds"])
    summed = least_squares(fit_rows, summed_terms)
    both = least_squares(fit_rows, sequence_terms)
    measured = np.asarray([r["seconds"] for r in test_rows])
    pred_padded = np.asarray([padded.seconds(PassShape(r["sequences"], r["longest"], r["deepest"])) for r in test_rows])
    pred_summed = np.asarray([summed @ summed_terms(r) for r in test_rows])
    pred_both = np.asarray([both @ sequence_terms(r) for r in test_rows])
    err = {name: float(np.mean(np.abs(pred - measured) / measured))
           for name, pred in (("padded", pred_padded), ("summed rows", pred_summed),
                              ("rows and sequences", pred_both))}
    terms = {"padded": padded.as_dict()["ms"],
             "summed rows": dict(zip(("base", "per_row", "per_row_kilo_context"), (1000 * summed).tolist())),
             "rows and sequences": dict(zip(("base", "per_sequence", "per_row", "per_row_kilo_context"),
                                            (1000 * both).tolist()))}
    return err, terms, measured, pred_padded, pred_summed


def main() -> int:
    out = Path(sys.argv[1])
    n_passes = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    model, _ = load_model("smollm2")
    engines = {"packed": ReferenceEngine(model, max_context=2048, kernels="fast", cache_entries=64),
               "padded": PaddedEngine(model, max_context=2048, kernels="fast", cache_entries=64)}
    if not engines["packed"].packs_rows:
        raise SystemExit(f"the panel kernels do not run here ({engines['packed'].kernel_impl}): nothing to compare")
    lengths = [30, 60, 120, 200, 300, 450, 650, 900]
    prompts = [rng.integers(100, 20000, size=n).astype(np.int32) for n in lengths]
    for engine in engines.values():
        for p in prompts:  # prefill once: every pass below feeds only its new tokens
            engine.verify([VerifyRequest(p, np.zeros(0, np.int32))])
    rows: dict[str, list[dict]] = {name: [] for name in engines}
    for index in tqdm(range(n_passes), desc="passes"):
        b = int(rng.integers(1, 9))
        members = rng.choice(len(prompts), size=b, replace=False)
        if rng.random() < 0.5:  # one long draft among short ones (what a lone long drafter does)
            fed = [int(rng.integers(1, 10))] + [int(rng.integers(1, 3)) for _ in range(b - 1)]
        else:
            fed = [int(rng.integers(1, 10)) for _ in range(b)]
        batch = []
        for i, k in zip(members, fed):
            tail = rng.integers(100, 20000, size=k).astype(np.int32)
            batch.append(VerifyRequest(np.concatenate([prompts[i], tail[:1]]), tail[1:]))
        contexts = [len(prompts[i]) + 1 for i in members]
        order = list(engines) if index % 2 == 0 else list(reversed(engines))  # neither always goes first
        for name in order:
            began = time.perf_counter()
            engines[name].verify(batch)
            seconds = time.perf_counter() - began
            rows[name].append({"sequences": b, "fed": fed, "rows": sum(fed), "longest": max(fed),
                               "deepest": max(contexts), "context": sum(k * c for k, c in zip(fed, contexts)) / sum(fed),
                               "seconds": seconds})
    fits = {name: errors(r) for name, r in rows.items()}
    ratios = np.asarray([p["seconds"] / q["seconds"] for p, q in zip(rows["padded"], rows["packed"])])
    shared = [i for i, r in enumerate(rows["packed"]) if r["sequences"] >= 2]
    summary = {"passes": n_passes, "threads": threads, "fit_passes": 2 * n_passes // 3,
               "padded_over_packed_seconds": {"median": float(np.median(ratios)),
                                              "median_two_or_more_sequences": float(np.median(ratios[shared]))},
               "mean_abs_relative_error": {name: f[0] for name, f in fits.items()},
               "fit_ms": {name: f[1] for name, f in fits.items()}, "rows": rows}
    (out / "pass_cost.json").write_text(json.dumps(summary, indent=1))
    table = markdown_table(
        ["passes", "median ms", "summed-rows fit: mean error", "rows-and-sequences fit", "padded fit"],
        [[name, f"{1000 * float(np.median([r['seconds'] for r in rows[name]])):.1f}",
          f"{100 * fits[name][0]['summed rows']:.1f} %", f"{100 * fits[name][0]['rows and sequences']:.1f} %",
          f"{100 * fits[name][0]['padded']:.1f} %"] for name in engines])
    terms = markdown_table(
        ["passes", "fit", "terms (ms)"],
        [[name, fit, ", ".join(f"{k} {v:.2f}" for k, v in fits[name][1][fit].items())]
         for name in engines for fit in ("summed rows", "rows and sequences")])
    (out / "pass_cost.md").write_text(
        f"# One pass of the reference target: packed or padded\n\n{n_passes} random passes (1-8 sequences, "
        f"1-9 tokens each, contexts 30-900), each timed on both engines (panel kernels, {threads} thread(s)); "
        f"each fit on {2 * n_passes // 3} of them, tested on the rest.\n\n{table}\n\n{terms}\n\n"
        f"A padded pass took {np.median(ratios):.2f}x the packed one (median over passes; "
        f"{np.median(ratios[shared]):.2f}x over passes of two or more sequences).\n\n"
        f"`.venv/bin/python experiments/pass_cost_study.py OUT_DIR {n_passes} {threads}`\n\n"
        f"![predicted against measured](pass_cost.png)\n")
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, name in zip(axes, engines):
        _, _, measured, pred_padded, pred_summed = fits[name]
        ax.scatter(1000 * measured, 1000 * pred_summed, s=10, label="summed rows", alpha=0.6)
        ax.scatter(1000 * measured, 1000 * pred_padded, s=10, label="padded", alpha=0.6)
        top = 1000 * float(max(measured.max(), pred_summed.max(), pred_padded.max()))
        ax.plot([0, top], [0, top], color="gray", lw=0.8)
        ax.set_title(f"{name} passes")
        ax.set_xlabel("measured pass (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.legend()
    save_png(fig, out / "pass_cost.png")
    print((out / "pass_cost.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
