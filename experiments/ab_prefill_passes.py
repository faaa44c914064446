"""A prefill in one pass against the engine's passes (FastLlama._chunked), side by side.

For each prompt length, the reference engine ("fast": panel kernels) prefills the same
random prompt from an empty cache with chunking off (one pass) and on (the default:
passes of at most PREFILL_CHUNK rows above 2 x PREFILL_CHUNK), interleaved, ``--reps``
times each; the first token and the hidden state of the last position must be bitwise
equal. Prints and writes a table (markdown + JSON) and a plot of time to first token.

    .venv/bin/python experiments/ab_prefill_passes.py --threads 1 --out docs/benchmarks/engine/prefill-passes
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from time import perf_counter

import numpy as np
import torch
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.fast_llama import PREFILL_CHUNK
from banditspec.engine.reference import ReferenceEngine
from tqdm import tqdm

ONE_PASS = 1 << 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="128,256,384,512,768,1024,1536,2000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = ReferenceEngine.from_name("smollm2", kernels="fast")
    assert engine._fast is not None and engine.kernel_impl == "panel", "needs the panel kernels"
    lengths = [int(x) for x in args.lengths.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    for n in tqdm(lengths, desc="prompt lengths"):
        ids = rng.integers(100, 40000, n).astype(np.int32)
        times: dict[str, list[float]] = {"one pass": [], "passes": []}
        seen: dict[str, tuple] = {}
        for rep in range(args.reps):
            order = ("one pass", "passes") if rep % 2 == 0 else ("passes", "one pass")
            for setting in order:
                engine._fast.prefill_chunk = ONE_PASS if setting == "one pass" else PREFILL_CHUNK
                engine.clear()
                start = perf_counter()
                result = engine.verify([VerifyRequest(ids, hidden_from=n - 1)])[0]
                times[setting].append(perf_counter() - start)
                seen[setting] = (result.output_ids.tolist(), result.hidden_states.tobytes())
        one, passes = float(np.median(times["one pass"])), float(np.median(times["passes"]))
        rows.append({"tokens": n, "one_pass_ms": one * 1e3, "passes_ms": passes * 1e3, "speedup": one / passes,
                     "bitwise_equal": seen["one pass"] == seen["passes"]})
    engine._fast.prefill_chunk = PREFILL_CHUNK
    lines = [f"Prefill from an empty cache, SmolLM2-135M fp32 panel kernels, {args.threads} thread(s), median of "
             f"{args.reps} (interleaved); passes of <= {PREFILL_CHUNK} rows above {2 * PREFILL_CHUNK}; "
             f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}", "",
             "| prompt tokens | one pass (ms) | passes (ms) | speed-up | tokens/s one pass / passes | bitwise equal |",
             "|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['one_pass_ms']:.0f} | {r['passes_ms']:.0f} | {r['speedup']:.2f}x | "
                     f"{r['tokens'] / r['one_pass_ms'] * 1e3:.0f} / {r['tokens'] / r['passes_ms'] * 1e3:.0f} | "
                     f"{'yes' if r['bitwise_equal'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"threads{args.threads}"
    (args.out / f"prefill-{suffix}.md").write_text(text)
    (args.out / f"prefill-{suffix}.json").write_text(json.dumps({"threads": args.threads, "reps": args.reps,
                                                                 "prefill_chunk": PREFILL_CHUNK, "rows": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["tokens"] for r in rows]
    ax.plot(xs, [r["one_pass_ms"] / 1e3 for r in rows], "o-", label="one pass")
    ax.plot(xs, [r["passes_ms"] / 1e3 for r in rows], "s-", label=f"passes of <= {PREFILL_CHUNK}")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token (s)")
    ax.set_title(f"Prefill, SmolLM2-135M, {args.threads} thread(s)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / f"prefill-{suffix}.png", dpi=110)


if __name__ == "__main__":
    main()
