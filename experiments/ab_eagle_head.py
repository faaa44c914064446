"""Wall clock A/B in process: the served Eagle head against another head file, the two (and, in
``fixed`` mode, plain decoding) interleaved per prompt (order alternating), every output compared.
``fixed``: the fixed ``eagle`` arm with each head (+ ``vanilla``); ``costaware``: costaware over its
default arms, its ``eagle`` arm drafting with each head. SmolLM2-135M fp32, 1 torch thread, 64
tokens, default settings otherwise (each head with its own tuned cut-off and probe, from its JSON).
Prompts: each workload's prompts SKIP .. SKIP + N - 1 in the benchmark's order.

    .venv/bin/python experiments/ab_eagle_head.py fixed|costaware N SKIP WEIGHTS OUT.json [WORKLOADS]
"""

import dataclasses
import sys
from pathlib import Path

import torch
from ab_common import held_out, interleaved, report
from banditspec.drafters.eagle import load_default_eagle_drafter
from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings

mode, n, skip, weights, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
torch.set_num_threads(1)
if mode == "fixed":
    vanilla, base = parse_methods("vanilla,eagle")
    methods = [vanilla, base, dataclasses.replace(base, name="eagle-new")]
    workloads = ("chat", "code")
elif mode == "costaware":
    base = parse_methods("costaware")[0]
    methods = [base, dataclasses.replace(base, name="costaware-new")]
    workloads = ("code", "code-edit", "chat")
else:
    raise SystemExit(f"mode must be fixed or costaware, got {mode!r}")
workloads = tuple(sys.argv[6].split(",")) if len(sys.argv) > 6 else workloads


class Runner(InProcessRunner):
    """A method named ``*-new`` gets a decoder whose ``eagle`` drafter has the other head."""

    def _decoder(self, method):
        if not method.name.endswith("-new") or method.name in self._decoders:
            return super()._decoder(method)
        served = self.shared_drafters["eagle"]
        self.shared_drafters["eagle"] = load_default_eagle_drafter(self.engine.model, weights)
        try:
            return super()._decoder(method)
        finally:
            self.shared_drafters["eagle"] = served


runner = Runner(RunSettings())
assert "eagle" in runner.adaptive_arms, runner.unavailable
rows = interleaved(held_out(workloads, n, skip), methods, lambda p, m: runner.run(p, m, 64))
new = methods[-1].name
pairs = [(new, methods[-2].name)] + ([(new, "vanilla"), ("eagle", "vanilla")] if mode == "fixed" else [])
for first, second in pairs:  # each prints its ratios; the rows are saved to OUT.json (the same each time)
    report(rows, first, second, out, workloads)
