"""Time of one Eagle head call: the head's own ``step``, the fused drafting runner in torch,
and the same runner as one native call (``bs_eagle_step``, int8, when the C kernels load).

The shipped EAGLE-1 head (int8, as served), a cache of P real pairs, T new pairs fed (T = 1:
one drafted token; T = 2-5: a round's catch-up), both runners interleaved, median of
--repeats. "cold": 600 MB are streamed through the caches before each call, as a target
forward does between two of the head's calls in serving (the head's weights are then read
from memory again). Same outputs either way (tests/unit/test_eagle.py).

    .venv/bin/python experiments/eagle/bench_step.py [--repeats 40] [--pairs 1 4 16]
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
    parser.add_argument("--pairs", type=int, nargs="+", default=[1, 4, 16], help="new pairs T per call")
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
    fast = FastEagleStep(head, DEFAULT_INT8, native=False)
    native = FastEagleStep(head, DEFAULT_INT8) if DEFAULT_INT8 else None
    if native is not None and native.native:
        native.native_max_pairs = 1 << 20  # every size natively here (served: up to NATIVE_MAX_PAIRS)
    else:
        native = None
    hidden = head.config.hidden_size
    sweep = torch.zeros(150_000_000)  # 600 MB, more than any cache here
    runners = {"head": None, "fused": fast} | ({"native": native} if native is not None else {})
    lines = ["| P | T | state | head.step (ms) | fused (ms) | ratio |" + (" native (ms) | ratio |" if native else ""),
             "|---:|---:|---|---:|---:|---:|" + ("---:|---:|" if native else "")]
    with torch.inference_mode():
        for past in (64, 192):
            k, v = reference.empty_cache()
            prefix_e, prefix_f = torch.randn(1, past, hidden), torch.randn(1, past, hidden)
            _, k, v = reference.step(prefix_e, prefix_f, k, v)
            caches = {}
            for name, runner in runners.items():
                if runner is not None:
                    caches[name] = runner.new_cache()
                    runner.step(prefix_e, prefix_f, caches[name])
            for new in args.pairs:
                e, f = torch.randn(1, new, hidden), torch.randn(1, new, hidden)
                for state in ("warm", "cold"):
                    times: dict[str, list[float]] = {name: [] for name in runners}
                    for _ in range(args.repeats):
                        for name, runner in runners.items():
                            if state == "cold":
                                sweep.add_(1.0)
                            began = time.perf_counter()
                            if runner is None:
                                reference.step(e, f, k, v)
                            else:
                                caches[name].truncate(past)
                                began = time.perf_counter()
                                runner.step(e, f, caches[name])
                            times[name].append(time.perf_counter() - began)
                    ms = {n: float(np.median(t)) * 1e3 for n, t in times.items()}
                    row = f"| {past} | {new} | {state} | {ms['head']:.2f} | {ms['fused']:.2f} | {ms['fused'] / ms['head']:.2f} |"
                    if "native" in ms:
                        row += f" {ms['native']:.2f} | {ms['native'] / ms['head']:.2f} |"
                    lines.append(row)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
