"""The panel GEMM on AVX-512 against AVX2, side by side in one process (the same engine, the
kernel's width switched step by step in the decoding loop and round by round for prefills,
so the machine's drift hits both alike).

    .venv/bin/python experiments/panel_isa_study.py OUT_DIR [--threads N] [--rounds R]

Measures, on SmolLM2-135M with the default "fast" kernels:
- verify cost in a decoding loop: a 300-token prompt, then steps feeding k new tokens
  (1 input token + k - 1 random draft tokens, rejected, so the sequence grows one token a
  step and every step writes its KV in place as real decoding does), the width switched
  every step; median ms a step and the median of the paired (consecutive) step ratios;
- prefill of 150 / 300 / 600 / 1200 random tokens (min over rounds);
- exactness: 32 greedy tokens and the hidden state of every position decoded under each
  width, compared bitwise.
Writes results.json, results.md and results.png into OUT_DIR. Needs a CPU with AVX-512F.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from banditspec.engine import panel_kernel
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.reference import ReferenceEngine
from banditspec_client.bench.engine import decode_greedy
from banditspec_client.bench.report import markdown_table, pyplot, save_png
from tqdm import tqdm

KS = (1, 2, 3, 5, 9, 17)
PREFILLS = (150, 300, 600, 1200)
WIDTHS = ("avx2", "avx512")


def _none() -> np.ndarray:
    return np.zeros(0, np.int32)


def loop_steps(engine: ReferenceEngine, library, prompt: np.ndarray, k: int, steps: int,
               rng: np.random.Generator) -> dict[str, list[float]]:
    """Seconds of each decoding step feeding k new tokens, the width alternated step by step
    (the pairs see the same context length and the same machine state)."""
    engine.clear()
    sequence = list(prompt)
    (result,) = engine.verify([VerifyRequest(np.asarray(sequence, np.int32), _none())])
    sequence += list(result.output_ids)
    times: dict[str, list[float]] = {w: [] for w in WIDTHS}
    for step in range(2 * steps):
        width = WIDTHS[step % 2]
        panel_kernel.set_isa(library, width)
        draft = rng.integers(100, 20000, size=k - 1).astype(np.int32)
        start = time.perf_counter()
        (result,) = engine.verify([VerifyRequest(np.asarray(sequence, np.int32), draft)])
        times[width].append(time.perf_counter() - start)
        sequence += list(result.output_ids)
    return times


def prefill_ms(engine: ReferenceEngine, tokens: np.ndarray) -> float:
    engine.clear()
    start = time.perf_counter()
    engine.verify([VerifyRequest(tokens, _none())])
    return 1e3 * (time.perf_counter() - start)


def greedy_states(engine: ReferenceEngine, prompt: np.ndarray, tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens one at a time, then the post-norm states of every decoded position in one call."""
    greedy, _ = decode_greedy(engine, prompt, tokens)
    engine.clear()
    sequence = np.asarray(list(prompt) + greedy, np.int32)
    (result,) = engine.verify([VerifyRequest(sequence, _none(), hidden_from=len(prompt))])
    return greedy, torch.as_tensor(np.asarray(result.hidden_states)).clone()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    library = panel_kernel.load()
    if library is None or not library.bs_panel_avx512_ok():
        print(f"needs the panel kernel on a CPU with AVX-512F ({panel_kernel.unavailable_reason() or 'no AVX-512F'})")
        return 1
    engine = ReferenceEngine.from_name("smollm2")
    assert engine.kernel_impl == "panel"
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 20000, size=300).astype(np.int32)
    prefills = {n: rng.integers(100, 20000, size=n).astype(np.int32) for n in PREFILLS}
    loop: dict[str, dict[int, list[float]]] = {w: {k: [] for k in KS} for w in WIDTHS}
    paired: dict[int, list[float]] = {k: [] for k in KS}  # AVX2 / AVX-512, step pair by step pair
    pre: dict[str, dict[int, list[float]]] = {w: {n: [] for n in PREFILLS} for w in WIDTHS}
    with torch.inference_mode():
        for _ in tqdm(range(args.rounds), desc="rounds (both widths)"):
            for k in KS:
                times = loop_steps(engine, library, prompt, k, args.steps, rng)
                for width in WIDTHS:
                    loop[width][k] += times[width]
                paired[k] += [a / b for a, b in zip(times["avx2"], times["avx512"])]
            for width in WIDTHS:
                panel_kernel.set_isa(library, width)
                for n, tokens in prefills.items():
                    pre[width][n].append(prefill_ms(engine, tokens))
        exact = {}
        for width in WIDTHS:
            panel_kernel.set_isa(library, width)
            exact[width] = greedy_states(engine, prompt[:64], 32)
    panel_kernel.set_isa(library, "avx512")
    same_tokens = exact["avx2"][0] == exact["avx512"][0]
    same_states = bool(torch.equal(exact["avx2"][1], exact["avx512"][1]))
    step = {w: {k: 1e3 * statistics.median(v) for k, v in loop[w].items()} for w in WIDTHS}
    ratio = {k: statistics.median(v) for k, v in paired.items()}
    fill = {w: {n: min(v) for n, v in pre[w].items()} for w in WIDTHS}
    result = {"threads": args.threads, "rounds": args.rounds, "steps": args.steps, "prompt_tokens": 300,
              "ks": list(KS), "step_ms": step, "paired_avx2_over_avx512": ratio, "prefill_ms": fill, "same_greedy_tokens": same_tokens,
              "same_hidden_states_bitwise": same_states, "command": " ".join(sys.argv)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = [[f"k = {k}", *(f"{step[w][k]:.1f} ({step[w][k] / step[w][1]:.2f})" for w in WIDTHS),
             f"{ratio[k]:.3f}x"] for k in KS]
    prefill_rows = [[f"{n} tokens", *(f"{fill[w][n]:.0f}" for w in WIDTHS), f"{fill['avx2'][n] / fill['avx512'][n]:.2f}x"]
                    for n in PREFILLS]
    text = "\n".join([
        "# The panel GEMM on AVX-512 against AVX2 (one process: widths alternated step by step in the loop, round by round for prefills)",
        "",
        f"Command: `{result['command']}`; SmolLM2-135M fp32, default \"fast\" kernels, {args.threads} torch thread(s), "
        f"{args.rounds} rounds.",
        "",
        f"Decoding-loop step over k new tokens after a 300-token prompt (per round {2 * args.steps} steps of "
        "rejected drafts, the width alternated step by step; median over all rounds' steps, in brackets the "
        "ratio to k = 1 of the same width; last column: median of the paired step ratios):",
        "",
        markdown_table(["new tokens", "AVX2 ms", "AVX-512 ms", "AVX-512 faster by (paired)"], rows),
        "",
        "Prefill of random tokens (ms, min of rounds):",
        "",
        markdown_table(["prompt", "AVX2 ms", "AVX-512 ms", "AVX-512 faster by"], prefill_rows),
        "",
        f"Exactness: 32 greedy tokens identical under both widths: {same_tokens}; hidden states of every "
        f"decoded position bitwise equal: {same_states}.",
        "",
    ])
    (args.out / "results.md").write_text(text)
    print(text)
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(10, 4))
    for width in WIDTHS:
        left.plot(KS, [step[width][k] for k in KS], marker="o", label=width)
        right.plot(PREFILLS, [fill[width][n] for n in PREFILLS], marker="o", label=width)
    left.set_xlabel("new tokens per verify step")
    left.set_ylabel("ms per step")
    left.set_title("verify step after 300 tokens")
    right.set_xlabel("prompt tokens")
    right.set_ylabel("ms")
    right.set_title("prefill")
    for ax in (left, right):
        ax.legend()
    save_png(fig, args.out / "results.png")
    return 0 if same_tokens and same_states else 1


if __name__ == "__main__":
    raise SystemExit(main())
