"""Wall clock A/B in process: costaware with its cost model calibrated and fitted as at commit
REF (default f4038ac: calibration steps that diverged from the engine's cache, so that every
timed call also copied the cache; a running maximum over k) against the current code
(calibration steps as the decoding loop makes them; a weighted isotonic fit over k).
Two decoders, each with its own cost model and server-wide statistics, interleaved per
prompt (order alternating), every output compared. SmolLM2-135M fp32, 1 torch thread,
default settings otherwise.

    .venv/bin/python scripts/ab_cost_calibration.py PROMPTS.jsonl TOKENS OUT.json [REF]
"""

import dataclasses
import subprocess
import sys
import types

import torch

from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_prompts_file

from ab_common import report, row


def module_at(ref: str, path: str, name: str) -> types.ModuleType:
    """The module ``path`` as it was at commit ``ref`` (imported under ``name``)."""
    source = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True, check=True).stdout
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)
    return module


torch.set_num_threads(1)
path, tokens, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ref = sys.argv[4] if len(sys.argv) > 4 else "f4038ac"
old_model = module_at(ref, "python_backend/banditspec/bandits/cost_model.py", "old_cost_model")
old_runtime = module_at(ref, "python_backend/banditspec/runtime.py", "old_runtime")
runner = InProcessRunner(RunSettings())
base = parse_methods("costaware")[0]
new, old = dataclasses.replace(base, name="costaware-new"), dataclasses.replace(base, name="costaware-old")
runner._decoder(new)  # built and calibrated as the bench builds it (the current calibration)
decoder = runner._decoder(old)
decoder.cost_model = old_model.CostModel(decoder.cost_model.max_tokens)
old_runtime.calibrate_cost_model(decoder, runner.engine)
runner.engine.clear()
rows = []
prompts = load_prompts_file(path)
for i, p in enumerate(prompts):
    for method in ((new, old) if i % 2 == 0 else (old, new)):
        rows.append(row(p.kind, i, method.name, runner.run(p, method, tokens)))
for name, method in (("new", new), ("old", old)):
    print(name, "cost model relative at 300:", runner._decoder(method).cost_model.relative(300)[:9])
report(rows, "costaware-new", "costaware-old", out, tuple(sorted({r[0] for r in rows})))
