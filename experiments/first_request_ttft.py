"""Does a fresh server serve its first request at speed? For each method, a fresh tritonserver
(SmolLM2, the repository's defaults, started and warmed as `banditspec serve` does it) answers one
request and then N more, one at a time, through Triton's streaming gRPC; the first request's time
to first token is compared with the median of the others'.

    .venv/bin/python experiments/first_request_ttft.py [N] [OUT.json]   (N default 8)
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
from banditspec_server.serve import TritonServer
from tqdm import tqdm

METHODS = {"vanilla": "vanilla", "default": None}


def ttft(url: str, prompt: str, policy: str | None) -> float:
    began = time.monotonic()
    first: list[float] = []
    generate_grpc(url, prompt, GenerationOptions(max_tokens=32, stream=True, policy=policy),
                  on_text=lambda _: first or first.append(time.monotonic()))
    return first[0] - began


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    prompts = [p.text for p in load_workload("mixed", n + 1)]
    rows = {}
    for name, policy in METHODS.items():
        with TritonServer(model="smollm2", http_port=0, grpc_port=0, metrics_port=0,
                          log_path=cache_dir() / "first-request-tritonserver.log") as server:
            times = [ttft(server.grpc_url, p, policy) for p in tqdm(prompts, desc=name)]
        later = statistics.median(times[1:])
        rows[name] = {"first_s": times[0], "later_median_s": later, "ratio": times[0] / later, "later_s": times[1:]}
        print(f"{name:>8}: first {times[0]:.3f} s, median of the next {n} {later:.3f} s, ratio {times[0] / later:.2f}")
    if out is not None:
        out.write_text(json.dumps({"prompts": "mixed, held-out split, first N+1", "max_tokens": 32, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
