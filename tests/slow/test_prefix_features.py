"""The prefix cache serves the target's states (Eagle's features) with the real SmolLM2.

Two code prompts share a 48-token template prefix (system turn + instructions). A request
asking for states from position 0 (or from Eagle's window on the prompt, as the decoder's
first step does whenever Eagle is in the arm set) feeds only what follows the cached prefix, and gets the states, tokens and
rollback of the same request on a cleared cache: bitwise with the "fast" (panel) kernels,
to float rounding with the "transformers" ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.config import GenerationRequest
from banditspec.datasets import humaneval_problems
from banditspec.decoding.session import run_to_completion
from banditspec.drafters.base import first_feature
from banditspec.drafters.eagle import DEFAULT_PROMPT_WINDOW
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.prefix_cache import common_prefix_length
from banditspec.engine.reference import ReferenceEngine
from banditspec.text import prompt_ids

pytestmark = pytest.mark.slow

EAGLE3 = (1, 14, 26)  # the shipped EAGLE-3 head's layers
TEMPLATE = ("Complete the Python function below. Keep its signature and docstring, write only the body, "
            "and do not explain it:\n\n")


def ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def shared_length(a: list[int], b: list[int]) -> int:
    return common_prefix_length(ids(a), ids(b))


def code_prompts(tokenizer) -> tuple[list[int], list[int], list[int], int]:
    """Three chat prompts (181, 136 and 174 tokens) on one template; the first two share their first 48 tokens."""
    problems = humaneval_problems()
    first, second, third = (prompt_ids(tokenizer, TEMPLATE + problems[i]["prompt"], chat=True) for i in (0, 2, 4))
    assert shared_length(first, second) == 48
    return first, second, third, 48


@pytest.fixture(scope="module")
def transformers_engine() -> ReferenceEngine:
    from banditspec.engine.models import load_model

    model, tokenizer = load_model("smollm2")
    engine = ReferenceEngine(model, max_context=1024, kernels="transformers")
    engine.tokenizer = tokenizer
    return engine


@pytest.fixture(scope="module")
def second_reference(smollm2_stack) -> list[int]:
    """The greedy continuation (4 tokens) of the second prompt."""
    engine = smollm2_stack.engine
    engine.clear()
    return greedy(engine, code_prompts(engine.tokenizer)[1], 4)


@pytest.fixture(params=["fast", "transformers"])
def engine(request, smollm2_stack) -> ReferenceEngine:
    if request.param == "fast":
        return smollm2_stack.engine
    return request.getfixturevalue("transformers_engine")


def assert_same_states(engine: ReferenceEngine, actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    if engine.kernels == "fast":
        assert engine.kernel_impl == "panel"
        assert np.array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def greedy(engine: ReferenceEngine, prompt: list[int], num_tokens: int) -> list[int]:
    sequence = list(prompt)
    for _ in range(num_tokens):
        sequence += engine.verify([VerifyRequest(ids(sequence))])[0].output_ids.tolist()
    return sequence[len(prompt):]


@pytest.mark.parametrize("kind", [(), EAGLE3], ids=["post-norm", "eagle3-layers"])
def test_a_request_from_position_zero_reuses_a_shared_prefix(engine, kind, second_reference):
    first, second, _, shared = code_prompts(engine.tokenizer)
    reference = second_reference
    draft = reference[:2] + [(reference[2] + 1) % engine.vocab_size, reference[3]]  # rejected at 3rd token
    request = VerifyRequest(ids(second), ids(draft), hidden_from=0, hidden_layers=kind)
    engine.clear()
    (cold,) = engine.verify([request])

    engine.clear()
    engine.verify([VerifyRequest(ids(first), hidden_from=0, hidden_layers=kind)])
    positions = engine.positions_computed
    (warm,) = engine.verify([request])
    assert engine.positions_computed - positions == len(second) - shared + len(draft)  # not len(second) + 4
    assert warm.num_accepted == cold.num_accepted == 2
    assert warm.output_ids.tolist() == cold.output_ids.tolist() == reference[:3]
    assert warm.hidden_states.shape == (len(second) + 2, (len(kind) or 1) * 576)
    assert_same_states(engine, warm.hidden_states, cold.hidden_states)

    # The rejected draft's states were not kept: the next turn (the conversation so far and
    # more) feeds only its new tokens and gets the states of a cleared cache.
    follow_up = second + warm.output_ids.tolist() + first[shared: shared + 20]
    request = VerifyRequest(ids(follow_up), hidden_from=0, hidden_layers=kind)
    positions = engine.positions_computed
    (warm,) = engine.verify([request])
    assert engine.positions_computed - positions == len(follow_up) - (len(second) + 2)
    engine.clear()
    (cold,) = engine.verify([request])
    assert warm.output_ids.tolist() == cold.output_ids.tolist()
    assert_same_states(engine, warm.hidden_states, cold.hidden_states)


def test_a_ragged_batch_gets_each_rows_solo_states(smollm2_stack):
    engine = smollm2_stack.engine
    first, second, third, shared = code_prompts(engine.tokenizer)
    requests = [VerifyRequest(ids(second), ids([198, 262]), hidden_from=0, hidden_layers=EAGLE3),
                VerifyRequest(ids(third), hidden_from=0),
                VerifyRequest(ids(first[:60]), ids([11]))]
    solo = []
    for request in requests:
        engine.clear()
        solo += engine.verify([request])
    engine.clear()
    engine.verify([VerifyRequest(ids(first), hidden_from=0, hidden_layers=EAGLE3)])
    positions = engine.positions_computed
    together = engine.verify(requests)
    # the third row reuses the template too: an EAGLE-3 request's entry holds the post-norm states as well
    expected = (len(second) - shared + 2) + (len(third) - shared_length(first, third)) + 1 + 1
    assert engine.positions_computed - positions == expected
    for a, b in zip(together, solo):
        assert a.output_ids.tolist() == b.output_ids.tolist()
    for a, b in zip(together[:2], solo[:2]):
        assert_same_states(engine, a.hidden_states, b.hidden_states)


class RecordingEngine:
    """An engine that passes every call on and keeps, per call, the requests and the positions fed."""

    def __init__(self, engine: ReferenceEngine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def verify(self, requests):
        before = self.engine.positions_computed
        results = self.engine.verify(requests)
        self.calls.append((list(requests), self.engine.positions_computed - before))
        return results


def test_the_default_arms_reuse_a_prompt_prefix_they_share(smollm2_stack):
    engine, decoder = smollm2_stack.engine, smollm2_stack.decoder
    first, second, _, shared = code_prompts(smollm2_stack.tokenizer)
    engine.clear()
    plain = run_to_completion(engine, decoder.start(GenerationRequest(second, 12, policy="vanilla"))).token_ids
    engine.clear()
    run_to_completion(engine, decoder.start(GenerationRequest(first, 12)))
    recording = RecordingEngine(engine)
    result = run_to_completion(recording, decoder.start(GenerationRequest(second, 12)))
    assert result.token_ids == plain
    (request,), positions = recording.calls[0]
    # Eagle is in the arm set: its features from the start of its window on the prompt
    assert request.hidden_from == first_feature(len(second), DEFAULT_PROMPT_WINDOW) > 0
    assert positions == len(second) - shared + len(request.draft_ids)


def test_a_windowed_request_reuses_what_a_request_without_layer_states_cached(smollm2_stack):
    """A head with a window on the prompt asks for layer states from h > 0. Its entries hold
    them from h on (not from 0), and once a kind has been asked for, every sequence's entry
    holds it: a conversation's next turn and a prompt a plain request cached are reused, not
    the window recomputed, with the states of a cleared cache."""
    engine = smollm2_stack.engine
    _, second, third, _ = code_prompts(engine.tokenizer)
    window = DEFAULT_PROMPT_WINDOW
    kept = engine._kept_kinds
    engine._kept_kinds = []  # as a fresh server: no kind asked for yet
    try:
        engine.clear()
        engine.verify([VerifyRequest(ids(second))])  # plain decoding cached the prompt, without layer states
        turn = VerifyRequest(ids(second), hidden_from=first_feature(len(second), window), hidden_layers=EAGLE3)
        positions = engine.positions_computed
        (first_turn,) = engine.verify([turn])
        assert engine.positions_computed - positions == len(second) - turn.hidden_from  # the window, once
        # the next turn: its window starts after the last one's, inside what that turn stored
        follow_up = second + first_turn.output_ids.tolist() + third[-20:]
        request = VerifyRequest(ids(follow_up), hidden_from=first_feature(len(follow_up), window), hidden_layers=EAGLE3)
        positions = engine.positions_computed
        (warm,) = engine.verify([request])
        # its new tokens only (the last turn's output token was not verified yet: not cached)
        assert engine.positions_computed - positions == len(follow_up) - len(second)
        engine.clear()
        (cold,) = engine.verify([request])
        assert warm.output_ids.tolist() == cold.output_ids.tolist()
        assert_same_states(engine, warm.hidden_states, cold.hidden_states)

        # the kind is kept now: a prompt cached by plain decoding serves a windowed request whole
        engine.clear()
        engine.verify([VerifyRequest(ids(third))])
        request = VerifyRequest(ids(third), hidden_from=first_feature(len(third), window), hidden_layers=EAGLE3)
        positions = engine.positions_computed
        (warm,) = engine.verify([request])
        assert engine.positions_computed - positions == 1  # the last prompt token, fed as always
        engine.clear()
        (cold,) = engine.verify([request])
        assert warm.output_ids.tolist() == cold.output_ids.tolist()
        assert_same_states(engine, warm.hidden_states, cold.hidden_states)
    finally:
        engine._kept_kinds = kept
