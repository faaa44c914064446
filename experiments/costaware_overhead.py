"""Where costaware's time outside the target goes: the decoding loop's, the controller's and
each drafter's calls timed with perf_counter wrappers (inclusive times: a caller's figure
contains its callees'), in process, default settings, 64 tokens, 1 torch thread.

    .venv/bin/python experiments/costaware_overhead.py PROMPTS_PER_WORKLOAD SKIP OUT.md [WORKLOADS]

Prompts: each workload's SKIP .. SKIP + N - 1 (WORKLOADS, comma-separated; default
code,code-edit,chat). The wrappers add
~1 µs a call; the first request (a warm-up of 16 tokens) is not counted.
"""

import collections
import functools
import inspect
import sys
import time

import banditspec.bandits.cost_model as cost_model
import banditspec.bandits.costaware as costaware
import banditspec.decoding.costaware_rounds as rounds
import banditspec.decoding.drafting as drafting
import banditspec.decoding.session as decoding
import banditspec.drafters.copy_pointer as copy_pointer
import banditspec.drafters.eagle as eagle
import banditspec.drafters.pld as pld
import banditspec.drafters.rest as rest
import banditspec.drafters.suffix_tree as suffix_tree
import torch
from banditspec_client.bench.in_process import InProcessRunner
from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import load_workload

seconds: dict[str, float] = collections.defaultdict(float)
calls: collections.Counter = collections.Counter()


def timed(owner, name: str) -> None:
    inner, label = getattr(owner, name), f"{owner.__name__}.{name}"

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - began
            calls[label] += 1

    setattr(owner, name, wrapper)


for owner, names in ((decoding.DecodingSession, ("next_verify", "apply")), (rounds.CostAwareRounds, ("choose", "score")),
                     (drafting.RequestDrafters, ("observe",)),
                     (eagle.EagleSession, ("propose", "observe", "_commit_pending", "_argmax")),
                     (eagle.EagleDrafter, ("step",)),
                     (costaware.CostAwarePolicy, ("choose", "best", "utility_bound", "record")),
                     (cost_model.CostModel, ("observe", "observe_overhead", "draft_costs"))):
    for name in names:
        timed(owner, name)
for module in (pld, suffix_tree, rest, copy_pointer):
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ == module.__name__ and cls.__name__.endswith("Session") and hasattr(cls, "propose"):
            timed(cls, "propose")
            timed(cls, "observe")

n, skip, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
workloads = sys.argv[4].split(",") if len(sys.argv) > 4 else ["code", "code-edit", "chat"]
torch.set_num_threads(1)
runner = InProcessRunner(RunSettings())
method = parse_methods("costaware")[0]
prompts = [p for w in workloads for p in load_workload(w, skip + n)[skip:]]
runner.run(prompts[0], method, 16)
seconds.clear()
calls.clear()
steps, outside = 0, 0.0
for prompt in prompts:
    record = runner.run(prompt, method, 64)
    steps += len(record.step_ms)
    outside += sum(s - v for s, v in zip(record.step_ms, record.verify_ms))
lines = [f"costaware, in process, {len(prompts)} prompts ({n} per workload from the {skip + 1}th), 64 tokens, 1 thread: "
         f"{steps} steps, **{outside / steps:.2f} ms a step outside the target** (step minus verify).", "",
         "| call (inclusive) | ms a step | calls | ms a call |", "|---|---:|---:|---:|"]
for label, total in sorted(seconds.items(), key=lambda item: -item[1]):
    lines.append(f"| `{label}` | {total * 1000 / steps:.3f} | {calls[label]} | {total * 1000 / calls[label]:.3f} |")
print("\n".join(lines))
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
