"""The target engine's verification cost curve: one forward over k new tokens, k = 1..9.

Speculation pays only when verifying 1 + gamma tokens costs about what one token costs.
This command measures, for each engine kernel set side by side in one run (the
variants interleaved within every repetition, so machine noise hits them alike):

* ``verify(k)``: a ReferenceEngine.verify call that feeds k new tokens (1 input token +
  k - 1 draft tokens) after ``--cached`` tokens held in the prefix cache; min over
  ``--reps`` repetitions, and its ratio to k = 1 of the same kernels;
* the one-token decode rate: plain greedy decoding of ``--decode-tokens`` tokens;
* exactness: whether greedy tokens of a 5-token verify equal one-token decoding at
  every position of the decoded stretch (fp32: expected yes).
* bitwise rows: whether the hidden states of 8 tokens verified in one step, alone and
  batched with a sequence of another length, are bitwise those of one-token decoding
  (true of the "fast" panel kernels by construction; then greedy speculative output
  cannot differ from plain decoding, not even on a near-tie).

Writes ``engine_cost.md`` (table), ``engine_cost.json`` and ``engine_cost.png`` into
``--out``. Threads: ``--threads`` (the issue's figures use 1).

``--contexts 64,300,700,1024`` measures instead the verify-cost SURFACE of the first
kernel set: verify(k) after each number of cached tokens (attention reads every cached
position for every token fed, so the curve steepens with context), into
``engine_surface.{md,json,png}``; ``banditspec replay --costs surface`` replays on it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from banditspec_client.bench.report import markdown_table, pyplot, save_png

if TYPE_CHECKING:
    from banditspec.engine.reference import ReferenceEngine

DEFAULT_KS = "1,2,3,4,5,7,9"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--kernels", default="fast,transformers", help="engine kernel sets to compare")
    parser.add_argument("--ks", default=DEFAULT_KS, help="new tokens per verify call")
    parser.add_argument("--cached", type=int, default=300, help="tokens already in the prefix cache")
    parser.add_argument("--contexts", default=None,
                        help="comma-separated cached-token counts: measure the verify-cost surface instead")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/engine"))


def _engine(model_name: str, kernels: str, cache_entries: int = 8) -> ReferenceEngine:
    from banditspec.engine.models import load_model
    from banditspec.engine.reference import ReferenceEngine

    model, _ = load_model(model_name)  # a fresh copy per engine: kernels re-lay weights
    return ReferenceEngine(model, max_context=2048, kernels=kernels, cache_entries=cache_entries)


def _impl(engine: ReferenceEngine) -> str:
    """What an engine's kernels run on: "panel, avx512" / "panel, avx2" for the panel kernel."""
    if engine.kernel_impl != "panel":
        return engine.kernel_impl
    from banditspec.engine import panel_kernel

    return f"panel, {panel_kernel.describe()}"


def _verify_once(engine: ReferenceEngine, prefix: np.ndarray, k: int, rng: np.random.Generator) -> float:
    from banditspec.engine.contract import VerifyRequest

    tail = rng.integers(100, 20000, size=k).astype(np.int32)  # 1 input token + k - 1 draft tokens
    request = VerifyRequest(np.concatenate([prefix, tail[:1]]), tail[1:])
    start = time.perf_counter()
    engine.verify([request])
    return time.perf_counter() - start


def decode_greedy(engine: ReferenceEngine, prompt: np.ndarray, tokens: int) -> tuple[list[int], float]:
    """``tokens`` greedy tokens after ``prompt``, one verify call each from a cleared engine;
    (the tokens, seconds taken)."""
    from banditspec.engine.contract import VerifyRequest

    engine.clear()
    sequence = list(prompt)
    start = time.perf_counter()
    for _ in range(tokens):
        (result,) = engine.verify([VerifyRequest(np.asarray(sequence, dtype=np.int32), np.zeros(0, np.int32))])
        sequence += result.output_ids.tolist()
    return sequence[len(prompt):], time.perf_counter() - start


def _exact_in_blocks(engine: ReferenceEngine, prompt: np.ndarray, greedy: list[int], block: int = 5) -> tuple[int, int]:
    """(positions where a 5-token verify's argmax equals one-token decoding, positions checked).

    The one-token greedy tokens are drafted 5 at a time; a verify accepts them up to the
    first position whose argmax differs; decoding then resumes after that position, fed
    the one-token greedy tokens (teacher forcing), so every position is checked once."""
    from banditspec.engine.contract import VerifyRequest

    engine.clear()
    agree = total = 0
    start = 0
    while start + block <= len(greedy):
        draft = np.asarray(greedy[start : start + block], dtype=np.int32)
        sequence = np.asarray(list(prompt) + greedy[:start], dtype=np.int32)
        (result,) = engine.verify([VerifyRequest(sequence, draft)])
        checked = min(block, result.num_accepted + 1)
        agree += result.num_accepted
        total += checked
        start += checked
    return agree, total


def _bitwise_rows(engine: ReferenceEngine, prompt: np.ndarray, greedy: list[int], block: int = 8) -> bool:
    """Whether the hidden states (the LM head's input) of ``block`` tokens computed in one
    verify step are bitwise those of one-token decoding, and also inside a batch of two
    sequences with different cached lengths (ragged, left-padded)."""
    from banditspec.engine.contract import VerifyRequest

    tokens = [int(t) for t in greedy[:block]]
    engine.clear()
    engine.verify([VerifyRequest(np.asarray(prompt, dtype=np.int32), np.zeros(0, np.int32))])
    rows: list[np.ndarray] = []
    for i in range(block):
        sequence = np.asarray(list(prompt) + tokens[: i + 1], dtype=np.int32)
        (result,) = engine.verify([VerifyRequest(sequence, np.zeros(0, np.int32), hidden_from=len(sequence) - 1)])
        assert result.hidden_states is not None  # asked for by hidden_from
        rows.append(result.hidden_states[:1])
    one = np.concatenate(rows)
    engine.clear()
    engine.verify([VerifyRequest(np.asarray(prompt, dtype=np.int32), np.zeros(0, np.int32))])
    start = len(prompt)
    request = VerifyRequest(np.asarray(list(prompt) + tokens[:1], dtype=np.int32), np.asarray(tokens[1:], np.int32), hidden_from=start)
    (solo,) = engine.verify([request])
    engine.clear()
    other = VerifyRequest(np.asarray(list(prompt[: len(prompt) // 2]), dtype=np.int32), np.asarray(tokens[:3], np.int32))
    engine.verify([VerifyRequest(np.asarray(prompt, dtype=np.int32), np.zeros(0, np.int32))])
    batched, _ = engine.verify([request, other])
    assert solo.hidden_states is not None and batched.hidden_states is not None  # asked for by hidden_from
    same_solo = solo.num_accepted == block - 1 and np.array_equal(solo.hidden_states[:block], one)
    same_batched = batched.num_accepted == block - 1 and np.array_equal(batched.hidden_states[:block], one)
    return bool(same_solo and same_batched)


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    torch.set_num_threads(max(1, args.threads))
    kernel_sets = [k.strip() for k in args.kernels.split(",") if k.strip()]
    ks = [int(k) for k in args.ks.split(",")]
    rng = np.random.default_rng(args.seed)
    if args.contexts:
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
        # every (context, k) call leaves an entry: room for all, so no prefix is evicted
        engine = _engine(args.model, kernel_sets[0], cache_entries=len(contexts) * (len(ks) + 2))
        return _surface(engine, kernel_sets[0], contexts, ks, args, rng)
    engines = {name: _engine(args.model, name) for name in tqdm(kernel_sets, desc="loading engines")}
    prefix = rng.integers(100, 20000, size=args.cached).astype(np.int32)
    times: dict[str, dict[int, list[float]]] = {name: {k: [] for k in ks} for name in kernel_sets}
    with torch.inference_mode():
        for engine in engines.values():
            engine.clear()
            _verify_once(engine, prefix[:-1], 1, rng)  # caches the prefix
            for k in ks:
                _verify_once(engine, prefix, k, rng)  # warm-up
        for _ in tqdm(range(args.reps), desc="verify curve"):
            for k in ks:
                for name, engine in engines.items():
                    times[name][k].append(_verify_once(engine, prefix, k, rng))
        decode, exact, bitwise = {}, {}, {}
        prompt = prefix[:64]
        for name, engine in tqdm(engines.items(), desc="decode rate"):
            greedy, seconds = decode_greedy(engine, prompt, args.decode_tokens)
            decode[name] = {"tokens_per_second": args.decode_tokens / seconds, "tokens": greedy}
            exact[name] = _exact_in_blocks(engine, prompt, greedy)
            bitwise[name] = _bitwise_rows(engine, prompt, greedy)
    result = {
        "model": args.model, "threads": args.threads, "cached": args.cached, "reps": args.reps, "ks": ks,
        "verify_ms": {n: {k: 1e3 * min(v) for k, v in t.items()} for n, t in times.items()},
        "decode_tokens_per_second": {n: d["tokens_per_second"] for n, d in decode.items()},
        "same_greedy_tokens": {n: decode[n]["tokens"] == decode[kernel_sets[0]]["tokens"] for n in kernel_sets},
        "block5_agreement": {n: list(v) for n, v in exact.items()},
        "bitwise_rows": bitwise,
        "kernel_impl": {n: _impl(e) for n, e in engines.items()},
    }
    _write(result, kernel_sets, ks, args.out)
    return 0


def _surface(engine: ReferenceEngine, kernels: str, contexts: list[int], ks: list[int], args: argparse.Namespace, rng: np.random.Generator) -> int:
    """verify(k) after each of ``contexts`` cached tokens; min over reps, the contexts and
    ks interleaved within every repetition (the machine's drift hits them alike: each
    prefix stays in the engine's prefix cache, one entry per context)."""
    import torch
    from tqdm import tqdm

    prefixes = {c: rng.integers(100, 20000, size=c).astype(np.int32) for c in contexts}
    times: dict[int, dict[int, list[float]]] = {c: {k: [] for k in ks} for c in contexts}
    with torch.inference_mode():
        engine.clear()
        for prefix in prefixes.values():
            _verify_once(engine, prefix[:-1], 1, rng)  # caches the prefix
            for k in ks:
                _verify_once(engine, prefix, k, rng)  # warm-up
        for _ in tqdm(range(args.reps), desc="verify surface"):
            for cached, prefix in prefixes.items():
                for k in ks:
                    times[cached][k].append(_verify_once(engine, prefix, k, rng))
    surface = {c: {k: 1e3 * min(v) for k, v in t.items()} for c, t in times.items()}
    slowest = max(max(v) for t in times.values() for v in t.values())
    if slowest > 20 * min(surface[c][ks[0]] for c in contexts) / 1e3:
        print(f"warning: a call took {1e3 * slowest:.0f} ms (a prefix fell out of the cache?)")
    impl = _impl(engine)
    result = {"model": args.model, "kernels": kernels, "kernel_impl": impl, "threads": args.threads,
              "reps": args.reps, "ks": ks, "contexts": contexts, "verify_ms": surface}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_surface.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = [[str(c), *(f"{surface[c][k]:.1f} ({surface[c][k] / surface[c][ks[0]]:.2f})" for k in ks)] for c in contexts]
    table = (f"Verify cost over k new tokens after C cached tokens: {args.model}, {kernels} kernels ({impl}), "
             f"{args.threads} thread(s), min of {args.reps}; ms (ratio to k = {ks[0]} at the same C).\n\n"
             + markdown_table(["C cached", *(f"k = {k}" for k in ks)], rows) + "\n")
    (out / "engine_surface.md").write_text(table)
    print(table)
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for c in contexts:
        ax.plot(ks, [surface[c][k] for k in ks], marker="o", label=f"C = {c}")
    ax.set_xlabel("new tokens per verify (1 + gamma)")
    ax.set_ylabel("ms per verify call")
    ax.set_title(f"{args.model}: verify cost by context, {args.threads} thread(s)")
    ax.legend()
    save_png(fig, out / "engine_surface.png")
    return 0


def _table(result: dict, kernel_sets: list[str], ks: list[int]) -> str:
    ms = result["verify_ms"]
    rows = []
    for name in kernel_sets:
        base = ms[name][ks[0]]
        cells = [f"{base:.1f} ms (1.00)"] + [f"{ms[name][k]:.1f} ({ms[name][k] / base:.2f})" for k in ks[1:]]
        agree, total = result["block5_agreement"][name]
        impl = result["kernel_impl"][name]
        label = name if impl == name else f"{name} ({impl})"
        rows.append([label, *cells, f"{result['decode_tokens_per_second'][name]:.1f}", f"{agree}/{total}",
                     "yes" if result["bitwise_rows"][name] else "no"])
    header = ["kernels", *(f"k = {k}" for k in ks), "decode tok/s", "5-token verify = 1-token argmax",
              "rows bitwise equal (verify, batch)"]
    lines = [
        f"Verify cost over k new tokens: {result['model']}, {result['cached']} cached tokens, "
        f"{result['threads']} thread(s), min of {result['reps']} (ratio to k = 1 of the same kernels).",
        "",
        markdown_table(header, rows),
    ]
    if len(kernel_sets) > 1:
        first, other = kernel_sets[0], kernel_sets[1]
        lines += [
            "",
            f"{first} vs {other}: one-token decode {result['decode_tokens_per_second'][first] / result['decode_tokens_per_second'][other]:.2f}x, "
            f"verify(k=5) {ms[other][5] / ms[first][5]:.2f}x faster; same greedy tokens: {result['same_greedy_tokens'][other]}."
            if 5 in ks else "",
        ]
    return "\n".join(lines) + "\n"


def _write(result: dict, kernel_sets: list[str], ks: list[int], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    table = _table(result, kernel_sets, ks)
    (out / "engine_cost.md").write_text(table)
    print(table)
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for name in kernel_sets:
        base = result["verify_ms"][name][ks[0]]
        ax.plot(ks, [result["verify_ms"][name][k] / base for k in ks], marker="o", label=f"{name} (k=1: {base:.0f} ms)")
    ax.axhline(1.2, color="grey", linestyle=":", label="1.2x")
    ax.set_xlabel("new tokens per verify (1 + gamma)")
    ax.set_ylabel("cost / cost of one token")
    ax.set_title(f"{result['model']}: verify cost, {result['threads']} thread(s), {result['cached']} cached")
    ax.legend()
    save_png(fig, out / "engine_cost.png")
