"""A conversation's later turn reuses the previous turn's KV in the reference engine (real SmolLM2).

Turn 2 is rendered as the OpenAI API renders it (ChatML: turn 1, the model's own answer decoded to
text, turn 2) and decoded on the same engine right after turn 1. The engine's first call for turn 2
must find turn 1's prompt and answer in its prefix cache (all but the answer's last token, which no
call fed) and feed only the rest; and the answer must be what a cleared cache gives.

The reuse ends where the answer's text, sent back as history, tokenizes differently from the
tokens the model produced (a text API's limit: e.g. a trailing "\n\n" comes back as one token).
"""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.config import GenerationRequest
from banditspec.decoding.session import run_to_completion
from banditspec.engine.prefix_cache import common_prefix_length
from banditspec.engine.reference import ReferenceEngine
from banditspec.serving.runtime import DEFAULT_ARMS
from banditspec.text import render_chat, text_ids
from banditspec_client.bench.workloads import load_conversations

pytestmark = pytest.mark.slow

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def stack():
    from banditspec.decoding.decoder import SpeculativeDecoder
    from banditspec.drafters.registry import build_drafters

    engine = ReferenceEngine.from_name("smollm2", max_context=2048)
    drafters = build_drafters([d for d in DEFAULT_ARMS if d != "eagle"], engine.tokenizer)
    return engine, SpeculativeDecoder.for_engine(engine, drafters, default_arms=list(drafters))


@pytest.mark.parametrize("policy", ["vanilla", "costaware"])
@pytest.mark.parametrize("index", [0, 1, 2])
def test_turn_two_feeds_only_what_turn_one_did_not_leave_in_the_cache(stack, policy, index):
    engine, decoder = stack
    tokenizer = engine.tokenizer
    conversation = load_conversations(3, turns=2, split="tune")[index]
    history = [{"role": "user", "content": conversation.turns[0]}]
    first_ids = text_ids(tokenizer, render_chat(tokenizer, history))
    engine.clear()
    first = run_to_completion(engine, decoder.start(GenerationRequest(first_ids, MAX_TOKENS, policy=policy)))
    answer = first.token_ids[:-1] if first.token_ids[-1] == tokenizer.eos_token_id else first.token_ids
    history += [{"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)},
                {"role": "user", "content": conversation.turns[1]}]
    second_ids = text_ids(tokenizer, render_chat(tokenizer, history))

    hits: list[int] = []
    lookup = engine.cache.lookup

    def recording_lookup(input_ids, *args, **kwargs):
        hit = lookup(input_ids, *args, **kwargs)
        hits.append(hit.length)
        return hit

    engine.cache.lookup = recording_lookup
    try:
        second = run_to_completion(engine, decoder.start(GenerationRequest(second_ids, MAX_TOKENS, policy=policy)))
    finally:
        del engine.cache.lookup
    # the first call of turn 2 reuses turn 1's prompt and answer (all but the token no call fed), as far
    # as the answer's text, sent back as history, tokenizes to the tokens the model produced
    assert second_ids[: len(first_ids)] == first_ids
    round_trip = common_prefix_length(np.asarray(answer), np.asarray(second_ids[len(first_ids):]))
    assert round_trip >= len(answer) // 2  # most of the answer comes back as the same tokens
    assert hits[0] >= len(first_ids) + min(round_trip, len(answer) - 1)
    assert len(second_ids) - hits[0] < len(second_ids) - len(first_ids)  # the history is not prefilled again

    engine.clear()
    cold = run_to_completion(engine, decoder.start(GenerationRequest(second_ids, MAX_TOKENS, policy="vanilla")))
    assert second.token_ids == cold.token_ids
