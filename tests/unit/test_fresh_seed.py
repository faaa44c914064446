"""Seeds through the serving controller on the "tiny" model (real tokenizer, reference engine):
a request without a seed draws a fresh one and reports it; the same seed gives the same
sampled text under every policy, and the reported seed reproduces an unseeded answer."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.serving.controller import Controller, ServingDefaults

from tests.unit.test_decoding import ScriptedDrafter
from tests.unit.test_serving import RecordingSink

PROMPT = "Tell me a short story about a robot."
MAX_TOKENS = 12


def tensors(policy: str | None = None, seed: int | None = None, temperature: float = 0.8) -> dict:
    out = {
        "text_input": np.array([[PROMPT.encode()]], dtype=object),
        "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
    }
    if policy is not None:
        out["policy"] = np.array([[policy.encode()]], dtype=object)
    if seed is not None:
        out["random_seed"] = np.array([[seed]], dtype=np.uint64)
    return out


@pytest.fixture(scope="module")
def served(tiny_engine):
    """A controller over the tiny engine; its "known" drafter proposes the seed-5 text (so the
    seeded runs accept drafts), "wrong" never is right."""
    known: list[int] = []

    def propose_known(context, max_len):
        done = len(context) - known_prompt[0]
        return known[done: done + max_len] if known else []

    known_prompt = [0]
    drafters = {
        "known": ScriptedDrafter("known", propose_known),
        "wrong": ScriptedDrafter("wrong", lambda context, max_len: [(context[-1] + 7) % 49152] * max_len),
    }
    decoder = SpeculativeDecoder.for_engine(tiny_engine, drafters)
    controller = Controller(decoder, tiny_engine, tiny_engine.tokenizer, ServingDefaults())
    request, _ = controller.build_request(tensors(seed=5))
    known_prompt[0] = len(request.prompt_ids)
    first = ask(controller, tensors(policy="vanilla", seed=5))
    known.extend(tiny_engine.tokenizer(first[0], add_special_tokens=False)["input_ids"])
    return controller


def ask(controller, inputs) -> tuple[str, dict]:
    sink = RecordingSink()
    controller.handle(inputs, sink)
    assert not sink.errors, sink.errors
    return sink.text, sink.sent[-1][1]


def test_two_requests_without_a_seed_draw_different_text_and_report_their_seeds(served):
    (text_a, stats_a), (text_b, stats_b) = ask(served, tensors()), ask(served, tensors())
    assert stats_a["seed"] != stats_b["seed"]
    assert text_a != text_b
    # the reported seed reproduces the answer
    assert ask(served, tensors(seed=stats_a["seed"]))[0] == text_a


@pytest.mark.parametrize("seed", [5, 123456789])
def test_the_same_seed_gives_the_same_text_under_every_policy(served, seed):
    texts = {}
    for policy in ("vanilla", "fixed:known", "fixed:wrong", "ucbspec", "exp3spec", "costaware"):
        text, stats = ask(served, tensors(policy=policy, seed=seed))
        assert stats["seed"] == seed
        texts[policy] = text
        if policy == "fixed:known" and seed == 5:
            assert sum(stats["accepted"]) > 0  # drafts were accepted, and the text is still the same
    assert len(set(texts.values())) == 1, texts
    assert texts["vanilla"] != ask(served, tensors(policy="vanilla", seed=seed + 1))[0]
