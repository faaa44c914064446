"""Does a fresh server serve its first request at speed? For each method and round, a fresh
tritonserver (SmolLM2, the repository's defaults, started and warmed as `banditspec serve` does it)
answers one request and then N more, one at a time, through Triton's streaming gRPC; the first
request's time to first token is compared with the median of the others'.

Time to first token is mostly the prompt's prefill, so every request of the run uses a prompt of
(nearly) the same token count: the N + 1 held-out `chat` prompts whose lengths sit closest to the
median length. Each round puts a different prompt first, so no one prompt decides the ratio.

    .venv/bin/python experiments/first_request_ttft.py [N] [OUT.json] [ROUNDS]   (N 8, ROUNDS 3)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from banditspec.paths import cache_dir
from banditspec_client.bench.workloads import load_workload
from banditspec_client.triton_client import GenerationOptions, generate_grpc
from banditspec_server.openai_api.server import load_tokenizer
from banditspec_server.serve import TritonServer
from tqdm import tqdm

METHODS = {"vanilla": "vanilla", "default": None}


def ttft(url: str, prompt: str, policy: str | None) -> float:
    began = time.monotonic()
    first: list[float] = []
    generate_grpc(url, prompt, GenerationOptions(max_tokens=32, stream=True, policy=policy),
                  on_text=lambda _: first or first.append(time.monotonic()))
    return first[0] - began


def same_length_prompts(count: int) -> tuple[list[str], list[int]]:
    """The ``count`` held-out chat prompts whose token counts are closest to the median's."""
    tokenizer = load_tokenizer("smollm2")
    prompts = [p.text for p in load_workload("chat", split="heldout")]
    by_length = sorted((len(tokenizer.encode(text)), text) for text in prompts)
    middle = len(by_length) // 2
    start = max(0, min(middle - count // 2, len(by_length) - count))
    window = by_length[start:start + count]
    return [text for _, text in window], [n for n, _ in window]


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    prompts, lengths = same_length_prompts(n + 1)
    rows: dict[str, dict] = {}
    for name, policy in METHODS.items():
        runs = []
        for r in range(rounds):
            order = prompts[r:] + prompts[:r]  # a different prompt first each round
            with TritonServer(model="smollm2", http_port=0, grpc_port=0, metrics_port=0,
                              log_path=cache_dir() / "first-request-tritonserver.log") as server:
                times = [ttft(server.grpc_url, p, policy) for p in tqdm(order, desc=f"{name} round {r + 1}")]
            later = statistics.median(times[1:])
            runs.append({"first_s": times[0], "later_median_s": later, "ratio": times[0] / later, "later_s": times[1:]})
            print(f"{name:>8} round {r + 1}: first {times[0]:.3f} s, median of the next {n} {later:.3f} s, "
                  f"ratio {times[0] / later:.2f}", flush=True)
        ratios = [run["ratio"] for run in runs]
        rows[name] = {"rounds": runs, "median_ratio": statistics.median(ratios), "max_ratio": max(ratios)}
        print(f"{name:>8}: first / later, median over {rounds} rounds {statistics.median(ratios):.2f}, "
              f"worst {max(ratios):.2f}")
    if out is not None:
        out.write_text(json.dumps({"prompts": f"held-out chat, {n + 1} prompts of {min(lengths)}-{max(lengths)} tokens",
                                   "max_tokens": 32, "rounds": rounds, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
