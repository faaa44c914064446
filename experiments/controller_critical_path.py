"""The controller's time on the path between two target calls, per decoding step, without the
target's noise: each recorded trace is decoded again by the real drafters and the real
controller against a replayed target that answers from the trace and then sleeps like a BLS
call (releasing the GIL, the CPU idle meanwhile, as the controller's stub is while the target
computes). Per step: (the request's wall time - the target's sleeps) / steps. Settings are
interleaved per trace (order alternating), each with its own decoder (own server-wide
statistics and cost model).

    .venv/bin/python experiments/controller_critical_path.py TRACES.jsonl N [WAIT_MS] [SETTING ...]

TRACES.jsonl: `banditspec replay`'s recorded traces (the cache's traces/ folder); N: how many;
WAIT_MS: the target's simulated call (default 25); SETTING: POLICY[/BOOKKEEPING], e.g.
costaware/now costaware/background fixed:suffix@8 (default: costaware/now costaware/background).
Drafters pld, suffix, rest, copy (Eagle needs the target's features: not here).
"""

import json
import sys
import time
from pathlib import Path

from banditspec.bandits.cost_model import CostModel
from banditspec.config import GenerationRequest, Limits
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import run_to_completion
from banditspec.drafters.registry import build_drafters
from banditspec.engine.models import load_tokenizer
from banditspec.evaluation.replay import ReplayEngine, Trace, VirtualClock

DRAFTERS = ["pld", "suffix", "rest", "copy"]

path, n = sys.argv[1], int(sys.argv[2])
wait = (float(sys.argv[3]) if len(sys.argv) > 3 else 25.0) / 1000
settings = sys.argv[4:] or ["costaware/now", "costaware/background"]
traces = [Trace.from_dict(json.loads(line)) for line in Path(path).read_text().splitlines()][:n]
tokenizer = load_tokenizer("smollm2")
eos = int(tokenizer.eos_token_id)
platform = CostModel.fixed([1.0 + 0.02 * k for k in range(9)], wait)


class SleepingTarget(ReplayEngine):
    def verify(self, requests):
        results = super().verify(requests)
        time.sleep(wait)
        return results


runs = {}
for setting in settings:
    policy, _, bookkeeping = setting.partition("/")
    decoder = SpeculativeDecoder(drafters=build_drafters(DRAFTERS, tokenizer), vocab_size=len(tokenizer),
                                 max_context=1 << 20, eos_id=eos, default_arms=[f"{d}@8" for d in DRAFTERS],
                                 limits=Limits(max_tokens=1 << 20, max_prompt_tokens=1 << 20),
                                 bookkeeping=bookkeeping or "now")
    runs[setting] = (SleepingTarget(traces, platform, VirtualClock(), eos_id=eos), decoder, policy, [0.0, 0])
for i, trace in enumerate(traces):
    max_tokens = len(trace.target) - (1 if trace.target and trace.target[-1] == eos else 0)
    if max_tokens < 2:
        continue
    for setting in settings if i % 2 == 0 else settings[::-1]:
        engine, decoder, policy, total = runs[setting]
        session = decoder.start(GenerationRequest(prompt_ids=trace.prompt_ids, max_tokens=max_tokens, policy=policy,
                                                  max_draft_len=8))
        began = time.perf_counter()
        result = run_to_completion(engine, session)
        total[0] += time.perf_counter() - began - wait * result.stats.steps
        total[1] += result.stats.steps
        assert result.token_ids == trace.target[:max_tokens]
for setting, (_, _, _, (seconds, steps)) in runs.items():
    print(f"{setting:24s} {steps:6d} steps  {1000 * seconds / steps:.3f} ms a step on the path between target calls")
