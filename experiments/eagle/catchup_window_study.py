"""Choose the Eagle session's catch-up window: what a pull of the head costs and drafts when
the head is pulled every G tokens, for each window W.

costaware pulls the head in a few rounds out of many, so each pull first feeds the head every
real pair since the last one (the "catch-up"; up to 7 pairs run natively, more through torch).
With a window W, a pull with more than W pairs pending restarts the head's cache on the latest
W alone. For each prompt the target's greedy output is recorded once (banditspec replay's
traces, cached) and its states at every position are read in one forward; the served session
(int8 head, its tuned cut-off, prompt window 64) is then fed one token and state per position,
as decoding feeds it, and asked for a draft of gamma tokens every G positions (G drawn at
random around the mean gap, the same draws for every W). Reported per (G, W): the mean
accepted tokens per pull (a declined pull counts 0), the share of pulls declined, and the
median and mean milliseconds of a pull (catch-up + drafting), on 1 thread.

    .venv/bin/python experiments/eagle/catchup_window_study.py \\
        --prompts-file docs/benchmarks/prompts/heldout-mixed-128.jsonl --max-tokens 128 \\
        --gaps 4,16,48 --windows none,7,16,32 --out docs/eagle/catchup-window
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from banditspec.drafters.eagle import load_default_eagle_drafter
from banditspec.engine.contract import VerifyRequest
from tqdm import tqdm


def _window(text: str) -> int | None:
    return None if text.strip().lower() == "none" else int(text)


def pulls(trace, features: np.ndarray, drafter, gap: int, gamma: int, rng: np.random.Generator) -> list[tuple[int, float]]:
    """(accepted tokens, seconds) of each pull of ``drafter`` fed ``trace`` position by position."""
    prompt, target = len(trace.prompt_ids), trace.target
    session = drafter.start(trace.prompt_ids)
    out: list[tuple[int, float]] = []
    next_pull = 1 + int(rng.integers(0, max(1, gap)))
    for i, token in enumerate(target):
        if i == next_pull:
            t0 = time.perf_counter()
            draft = session.propose(gamma).token_ids.tolist()
            seconds = time.perf_counter() - t0
            accepted = 0
            for proposed, actual in zip(draft, target[i:]):
                if proposed != actual:
                    break
                accepted += 1
            out.append((accepted, seconds))
            next_pull = i + max(1, int(rng.geometric(1.0 / gap)))
        rows = features[:prompt] if i == 0 else features[prompt + i - 1: prompt + i]
        session.observe([token], rows)
    session.close(finished=True)
    return out


def main() -> int:
    from banditspec_client.replay import _prompts, record

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-file", type=Path, default=None)
    parser.add_argument("--workloads", default="code,code-edit,chat")
    parser.add_argument("--prompts", type=int, default=40, help="prompts per workload (without --prompts-file)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--gaps", default="4,16,48", help="mean tokens between pulls")
    parser.add_argument("--windows", default="none,7,16,32")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="passes per (G, W), the fastest pull time kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gaps = [int(g) for g in args.gaps.split(",")]
    windows = [_window(w) for w in args.windows.split(",")]

    record_args = argparse.Namespace(prompts_file=args.prompts_file, workloads=args.workloads, prompts=args.prompts,
                                     skip=0, model="smollm2", max_tokens=args.max_tokens, record_len=8,
                                     drafters="suffix", batch=8, threads=2)
    traces, _ = record(record_args, _prompts(record_args))
    from banditspec.engine.reference import ReferenceEngine

    engine = ReferenceEngine.from_name("smollm2", max_context=2048, cache_entries=1)
    drafters = {w: load_default_eagle_drafter(engine.model, catchup_window=w) for w in windows}
    features = []
    with torch.inference_mode():
        for trace in tqdm(traces, desc="target states"):
            engine.clear()
            sequence = np.asarray(trace.prompt_ids + trace.target[:-1], dtype=np.int32)
            (result,) = engine.verify([VerifyRequest(sequence, np.zeros(0, dtype=np.int32), hidden_from=0)])
            features.append(np.asarray(result.hidden_states, dtype=np.float32))

    rows = []
    for gap in gaps:
        for w in windows:
            accepted: list[int] = []
            best: list[float] | None = None
            for _ in range(args.repeats):
                rng = np.random.default_rng(args.seed + gap)  # the same pull positions for every W
                got = [p for t, f in zip(traces, features) for p in pulls(t, f, drafters[w], gap, args.gamma, rng)]
                accepted = [a for a, _ in got]
                seconds = [s for _, s in got]
                best = seconds if best is None else [min(a, b) for a, b in zip(best, seconds)]
            assert best is not None
            row = {"gap": gap, "window": w, "pulls": len(accepted), "accepted_mean": float(np.mean(accepted)),
                   "declined": float(np.mean([a == 0 for a in accepted])),
                   "ms_median": 1e3 * float(np.median(best)), "ms_mean": 1e3 * float(np.mean(best))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = ["| mean gap (tokens) | window | pulls | accepted / pull | zero accepted | ms / pull, median | mean |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['gap']} | {r['window'] if r['window'] is not None else 'none'} | {r['pulls']} | "
              f"{r['accepted_mean']:.3f} | {r['declined']:.3f} | {r['ms_median']:.2f} | {r['ms_mean']:.2f} |"
              for r in rows]
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                            "traces": len(traces), "rows": rows}, indent=1))
        (args.out / "results.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
