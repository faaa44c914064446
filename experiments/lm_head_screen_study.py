"""Would an int8 screen make the target's LM head cheaper without changing a greedy token?

Greedy verification needs only the argmax of each row's logits. Screen: logits from the LM
head quantized per output row to int8 (the engine's C int8 GEMM, ``PanelInt8Linear``), with
a bound on each logit's error (|w - q s| <= s / 2 per weight, so |error| <= s_n / 2 * sum |x|,
plus a float margin); every vocabulary entry whose screened logit plus its bound reaches the
best screened logit minus its bound is a candidate, and only the candidates get an exact fp32
logit. This script measures, on real decoding states of SmolLM2 (each prompt's greedy decode,
1 torch thread, weights cold after a target forward as in serving): the fp32 LM head's time
per row as the engine runs it, the screen's time, how many candidates the bound leaves, and
whether the candidates' argmax equals the full head's on every row. A measurement for
planning, not a kernel: the exact recheck must reproduce the full GEMV's arithmetic bitwise.

    .venv/bin/python experiments/lm_head_screen_study.py [PROMPTS]
"""

import sys
import time

import numpy as np
import torch
from banditspec.engine import panel_kernel
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.models import load_model
from banditspec.engine.reference import ReferenceEngine
from banditspec.text import prompt_ids
from banditspec_client.bench.workloads import load_workload

torch.set_num_threads(1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
model, tokenizer = load_model("smollm2")
engine = ReferenceEngine(model, max_context=2048)
weight = model.lm_head.weight.detach().float()
library = panel_kernel.load()
assert library is not None, panel_kernel.unavailable_reason()
screen = panel_kernel.PanelInt8Linear(weight, library)
scale = screen.scale[: weight.shape[0]]
states: list[torch.Tensor] = []
original = engine._lm_head


def capture(hidden: torch.Tensor) -> torch.Tensor:
    states.append(hidden[-1:].clone())
    return original(hidden)


engine._lm_head = capture  # type: ignore[method-assign]
full_s, screen_s, candidates, agree = [], [], [], 0
prompts = [p for w in ("code", "chat") for p in load_workload(w, 40 + n)[40:40 + n]]
for prompt in prompts:
    ids = list(prompt_ids(tokenizer, prompt.text, chat=True))
    engine.clear()
    for _ in range(32):
        (result,) = engine.verify([VerifyRequest(np.asarray(ids, dtype=np.int32))])
        ids.append(int(result.output_ids[0]))
        x = states[-1]  # [1, H], the post-norm state of the last position
        # the target forward just ran: both heads' weights are as cold as in serving
        t0 = time.perf_counter()
        logits = original(x)
        full_s.append(time.perf_counter() - t0)
        engine.verify([VerifyRequest(np.asarray(ids[:-1], dtype=np.int32))])  # evict again
        t3 = time.perf_counter()
        screened = screen(x)
        screen_s.append(time.perf_counter() - t3)
        bound = scale * 0.5 * float(x.abs().sum()) * 1.001 + 1e-4
        best = float((screened[0] - bound).max())
        keep = torch.nonzero(screened[0] + bound >= best).reshape(-1)
        candidates.append(len(keep))
        exact = x[0] @ weight[keep].T
        agree += int(keep[int(exact.argmax())]) == int(logits[0].argmax())
print(f"{len(full_s)} decoding states from {len(prompts)} prompts (code, chat), 1 thread, cold weights")
print(f"fp32 LM head as the engine runs it: median {np.median(full_s) * 1e3:.2f} ms a row")
print(f"int8 screen (C kernel):              median {np.median(screen_s) * 1e3:.2f} ms a row")
print(f"candidates after the bound: median {np.median(candidates):.0f}, 90th percentile "
      f"{np.percentile(candidates, 90):.0f}, max {max(candidates)} of {weight.shape[0]}")
print(f"argmax over the candidates = the full head's: {agree} of {len(full_s)}")
