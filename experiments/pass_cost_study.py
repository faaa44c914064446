"""What does one batched pass of the reference target cost: is it the tokens fed (a packed
batch), or what the engine pads (every sequence to the longest draft and the deepest context,
plus a cost per sequence)? Times ReferenceEngine.verify on random passes of 1-8 sequences, each
feeding 1-9 tokens after one of 8 prompts of 30-900 tokens held in the prefix cache, then fits
on two thirds of the passes and predicts the rest with

- padded: a + s*B + r*B*N + x*B*C/1000 (bandits/pass_cost.py; N the longest run fed, C the
  deepest context), what the controller prices a draft by under load;
- summed rows: a + r*R + x*R*C_mean/1000 (R the tokens fed), what it priced by before.

    .venv/bin/python experiments/pass_cost_study.py OUT_DIR [PASSES] [THREADS]   (400, 1)

Writes OUT_DIR/pass_cost.{json,md,png}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from banditspec.bandits.pass_cost import PassCost, PassShape
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.models import load_model
from banditspec.engine.reference import ReferenceEngine
from banditspec_client.bench.report import markdown_table, pyplot, save_png
from tqdm import tqdm


def summed_rows_fit(rows: list[dict]) -> np.ndarray:
    x = np.asarray([[1.0, r["rows"], r["rows"] * r["context"] / 1000.0] for r in rows])
    coef, *_ = np.linalg.lstsq(x, np.asarray([r["seconds"] for r in rows]), rcond=None)
    return coef


def main() -> int:
    out = Path(sys.argv[1])
    n_passes = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    model, _ = load_model("smollm2")
    engine = ReferenceEngine(model, max_context=2048, kernels="fast", cache_entries=64)
    lengths = [30, 60, 120, 200, 300, 450, 650, 900]
    prompts = [rng.integers(100, 20000, size=n).astype(np.int32) for n in lengths]
    for p in prompts:  # prefill once: every pass below feeds only its new tokens
        engine.verify([VerifyRequest(p, np.zeros(0, np.int32))])
    rows: list[dict] = []
    for _ in tqdm(range(n_passes), desc="passes"):
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
        began = time.perf_counter()
        engine.verify(batch)
        seconds = time.perf_counter() - began
        contexts = [len(prompts[i]) + 1 for i in members]
        rows.append({"sequences": b, "fed": fed, "rows": sum(fed), "longest": max(fed), "deepest": max(contexts),
                     "context": sum(k * c for k, c in zip(fed, contexts)) / sum(fed), "seconds": seconds})
    cut = 2 * len(rows) // 3
    fit_rows, test_rows = rows[:cut], rows[cut:]
    padded = PassCost(window=len(rows), min_passes=4)
    for r in fit_rows:
        padded.observe(PassShape(r["sequences"], r["longest"], r["deepest"]), r["seconds"])
    summed = summed_rows_fit(fit_rows)
    measured = np.asarray([r["seconds"] for r in test_rows])
    pred_padded = np.asarray([padded.seconds(PassShape(r["sequences"], r["longest"], r["deepest"])) for r in test_rows])
    pred_summed = np.asarray([summed @ [1.0, r["rows"], r["rows"] * r["context"] / 1000.0] for r in test_rows])
    err = {name: float(np.mean(np.abs(pred - measured) / measured))
           for name, pred in (("padded", pred_padded), ("summed rows", pred_summed))}
    summary = {"passes": len(rows), "threads": threads, "fit_passes": cut, "test_passes": len(test_rows),
               "mean_abs_relative_error": err, "padded_fit_ms": padded.as_dict()["ms"],
               "summed_rows_fit_ms": {"base": 1000 * summed[0], "per_row": 1000 * summed[1],
                                      "per_row_kilo_context": 1000 * summed[2]}, "rows": rows}
    (out / "pass_cost.json").write_text(json.dumps(summary, indent=1))
    table = markdown_table(["model", "mean |error| on held-out passes"],
                           [[name, f"{100 * e:.1f} %"] for name, e in err.items()])
    coefs = markdown_table(["padded term", "ms"], [[k, f"{v:.3f}"] for k, v in summary["padded_fit_ms"].items()])
    (out / "pass_cost.md").write_text(
        f"# One pass of the reference target: padded or summed rows\n\n{len(rows)} random passes "
        f"(1-8 sequences, 1-9 tokens each, contexts 30-900), {threads} thread(s); fit on {cut}, "
        f"tested on {len(test_rows)}.\n\n{table}\n\n{coefs}\n\n![predicted against measured](pass_cost.png)\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.scatter(1000 * measured, 1000 * pred_summed, s=10, label="summed rows", alpha=0.6)
    ax.scatter(1000 * measured, 1000 * pred_padded, s=10, label="padded", alpha=0.6)
    top = 1000 * float(max(measured.max(), pred_summed.max(), pred_padded.max()))
    ax.plot([0, top], [0, top], color="gray", lw=0.8)
    ax.set_xlabel("measured pass (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.legend()
    save_png(fig, out / "pass_cost.png")
    for name, e in err.items():
        print(f"{name}: mean |error| {100 * e:.1f} %")
    print("padded fit (ms):", summary["padded_fit_ms"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
