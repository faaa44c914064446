"""Wall clock A/B in process: costaware over its default arms (pld, suffix, rest, eagle) against
the same without the Eagle arm, the two interleaved per prompt (order alternating), every output
compared. SmolLM2-135M fp32, 1 torch thread, 64 tokens, default settings otherwise. Prompts:
each workload's prompts SKIP .. SKIP + N - 1 in the benchmark's order (the first 40 are the
ones every setting was tuned on).

    .venv/bin/python experiments/ab_eagle_arm.py PROMPTS_PER_WORKLOAD SKIP OUT.json
"""

import dataclasses
import sys

import torch
from ab_common import held_out, interleaved, report
from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings

torch.set_num_threads(1)
n, skip, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
base = parse_methods("costaware")[0]
methods = [dataclasses.replace(base, name="with-eagle"), dataclasses.replace(base, name="no-eagle")]


class Runner(InProcessRunner):
    """The "no-eagle" method gets a decoder and requests without the Eagle drafter."""

    def run(self, prompt, method, max_tokens):
        if method.name != "no-eagle":
            return super().run(prompt, method, max_tokens)
        settings, drafters = self.settings, self.shared_drafters
        self.settings = dataclasses.replace(settings, adaptive_drafters=tuple(
            d for d in settings.adaptive_drafters if d != "eagle"))
        self.shared_drafters = {k: v for k, v in drafters.items() if k != "eagle"}
        try:
            return super().run(prompt, method, max_tokens)
        finally:
            self.settings, self.shared_drafters = settings, drafters


runner = Runner(RunSettings())
assert "eagle" in runner.adaptive_arms, runner.unavailable
prompts = held_out(("code", "code-edit", "chat"), n, skip)
report(interleaved(prompts, methods, lambda p, m: runner.run(p, m, 64)), "no-eagle", "with-eagle", out)
