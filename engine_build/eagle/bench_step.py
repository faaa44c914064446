"""Time of one Eagle head call: the head's own ``step`` against the fused drafting runner.

The shipped EAGLE-1 head (int8, as served), a cache of P real pairs, T new pairs fed (T = 1:
one drafted token; T = 2-5: a round's catch-up), both runners interleaved, median of
--repeats. "cold": 600 MB are streamed through the caches before each call, as a target
forward does between two of the head's calls in serving (the head's weights are then read
from memory again). Same outputs either way (tests/unit/test_eagle.py).

    .venv/bin/python engine_build/eagle/bench_step.py [--repeats 40]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from banditspec.drafters.eagle import DEFAULT_INT8, DEFAULT_WEIGHTS, int8_head, load_eagle_head
    from banditspec.eagle.fast_step import FastEagleStep
    from banditspec.eagle.head import EagleHead

    head = load_eagle_head(DEFAULT_WEIGHTS)
    if not isinstance(head, EagleHead):
        print("the default head is not EAGLE-1: the fused runner serves EAGLE-1 only")
        return 1
    reference = int8_head(head) if DEFAULT_INT8 else head
    fast = FastEagleStep(head, DEFAULT_INT8)
    hidden = head.config.hidden_size
    sweep = torch.zeros(150_000_000)  # 600 MB, more than any cache here
    lines = ["| P | T | state | head.step (ms) | fused (ms) | ratio |", "|---:|---:|---|---:|---:|---:|"]
    with torch.inference_mode():
        for past in (64, 192):
            k, v = reference.empty_cache()
            prefix_e, prefix_f = torch.randn(1, past, hidden), torch.randn(1, past, hidden)
            _, k, v = reference.step(prefix_e, prefix_f, k, v)
            cache = fast.new_cache()
            fast.step(prefix_e, prefix_f, cache)
            for new in (1, 4, 16):
                e, f = torch.randn(1, new, hidden), torch.randn(1, new, hidden)
                for state in ("warm", "cold"):
                    times: dict[str, list[float]] = {"head": [], "fused": []}
                    for _ in range(args.repeats):
                        for name in ("head", "fused"):
                            if state == "cold":
                                sweep.add_(1.0)
                            cache.truncate(past)
                            began = time.perf_counter()
                            if name == "head":
                                reference.step(e, f, k, v)
                            else:
                                fast.step(e, f, cache)
                            times[name].append(time.perf_counter() - began)
                    a, b = (float(np.median(times[n])) * 1e3 for n in ("head", "fused"))
                    lines.append(f"| {past} | {new} | {state} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
