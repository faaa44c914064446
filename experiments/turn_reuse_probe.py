"""Does the reference target reuse a conversation's history, and what does a later turn's first
call cost against a first turn's? In process, one thread, held-out `multiturn` conversations:
turn 1 is decoded greedily (plain decoding, a verify call per token, so the prefix cache holds what
a server's would), its answer is rendered back into the chat as the OpenAI API does, and turn 2's
first call is timed; then the same user turn sent alone (a first turn; the system prompt cached).
For each, the positions the target computed (``ReferenceEngine.positions_computed``) and how much
of the cached sequence the re-tokenised history still matches (the model's own tokens may
tokenise differently once decoded to text: the target then recomputes from the first difference).

    .venv/bin/python experiments/turn_reuse_probe.py [CONVERSATIONS] [OUT.json]   (24)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.prefix_cache import common_prefix_length
from banditspec.engine.reference import ReferenceEngine
from banditspec.text import render_chat, text_ids
from banditspec_client.bench.workloads import load_conversations
from banditspec_server.openai_api.server import load_tokenizer
from tqdm import tqdm

ANSWER_TOKENS = 64


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    torch.set_num_threads(1)
    tokenizer = load_tokenizer("smollm2")
    engine = ReferenceEngine.from_name("smollm2", cache_entries=16)

    def first_call(ids: list[int]) -> tuple[float, int]:
        before = engine.positions_computed
        began = time.perf_counter()
        engine.verify([VerifyRequest(input_ids=np.asarray(ids, dtype=np.int32))])
        return 1e3 * (time.perf_counter() - began), engine.positions_computed - before

    rows = []
    for conversation in tqdm(load_conversations(n, split="heldout"), desc="conversations"):
        engine.clear()
        messages = [{"role": "user", "content": conversation.turns[0]}]
        sequence = list(text_ids(tokenizer, render_chat(tokenizer, messages)))
        for _ in range(ANSWER_TOKENS):
            result = engine.verify([VerifyRequest(input_ids=np.asarray(sequence, dtype=np.int32))])[0]
            sequence.append(int(result.output_ids[-1]))
        answer = tokenizer.decode(sequence[-ANSWER_TOKENS:], skip_special_tokens=True)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": conversation.turns[1]}]
        turn = text_ids(tokenizer, render_chat(tokenizer, messages))
        cached = sequence[:-1]  # the last token is an output, never fed
        matched = common_prefix_length(np.asarray(cached, dtype=np.int64), np.asarray(turn, dtype=np.int64))
        turn_ms, turn_computed = first_call(turn)
        alone_ms, alone_computed = first_call(text_ids(tokenizer, render_chat(
            tokenizer, [{"role": "user", "content": conversation.turns[1]}])))
        rows.append({"conversation": conversation.conversation_id, "turn_tokens": len(turn), "cached": len(cached),
                     "matched": matched, "turn_computed": turn_computed, "turn_ms": turn_ms,
                     "alone_computed": alone_computed, "alone_ms": alone_ms})
    whole = [r for r in rows if r["matched"] == r["cached"]]
    for label, picked in (("all", rows), ("history matched whole", whole)):
        if not picked:
            continue
        ratio = statistics.median(r["turn_ms"] / r["alone_ms"] for r in picked)
        per_position = statistics.median((r["turn_ms"] / r["turn_computed"]) / (r["alone_ms"] / r["alone_computed"])
                                         for r in picked)
        extra = statistics.median(r["turn_computed"] - r["alone_computed"] for r in picked)
        print(f"{label} ({len(picked)}): turn 2 / alone, first call {ratio:.2f}; per computed position "
              f"{per_position:.2f}; turn 2 computed {extra:.0f} positions more")
    print(f"history re-tokenised differently from the generated tokens: {len(rows) - len(whole)} of {len(rows)}")
    if out is not None:
        out.write_text(json.dumps({"answer_tokens": ANSWER_TOKENS, "threads": 1, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
