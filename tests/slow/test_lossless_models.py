"""Losslessness on real prompts: greedy output of every policy and every single arm is
token-identical to plain decoding (``--policy vanilla``), prompt by prompt, with the real
SmolLM2 weights and with the tiny random model. Exact match; the first differing prompt
is named in the failure."""

from __future__ import annotations

import pytest
from banditspec.config import GenerationRequest
from banditspec.datasets import humaneval_problems, sharegpt_split
from banditspec.decoding.session import run_to_completion
from banditspec.text import prompt_ids

pytestmark = pytest.mark.slow

MAX_TOKENS = 32


def lossless_prompts() -> list[tuple[str, str]]:
    """34 prompts: code, chat and code editing (where the output copies the input)."""
    problems = humaneval_problems()
    code = [("code", p["prompt"]) for p in problems[:12]]
    edit = [
        ("code-edit", "Rewrite this function with clearer variable names, keeping its behaviour:\n\n" + p["prompt"] + p["canonical_solution"])
        for p in problems[12:24]
    ]
    chat = []
    for conv in sharegpt_split("eval"):
        role, text = conv[0]
        if role == "human" and 20 <= len(text) <= 600:
            chat.append(("chat", text))
        if len(chat) == 10:
            break
    return code + edit + chat


def methods(stack) -> list[str]:
    arms = [a for a in stack.decoder.drafters]
    return ["costaware", "ucbspec", "exp3spec", *[f"fixed:{a}" for a in arms]]  # gamma 1 / 8: tests/unit/test_decoding.py


def check_all(stack, prompts: list[tuple[str, str]], max_draft_len: int = 4) -> int:
    """Compares every method on every prompt; returns how many comparisons were made."""
    assert {kind for kind, _ in prompts} == {"code", "code-edit", "chat"}
    compared = 0
    for kind, text in prompts:
        ids = prompt_ids(stack.tokenizer, text, chat=True)
        reference = run_to_completion(stack.engine, stack.decoder.start(GenerationRequest(ids, MAX_TOKENS, policy="vanilla"))).token_ids
        for method in methods(stack):
            request = GenerationRequest(ids, MAX_TOKENS, policy=method, max_draft_len=max_draft_len, seed=7)
            result = run_to_completion(stack.engine, stack.decoder.start(request))
            assert result.token_ids == reference, f"{method} differs from vanilla on the {kind} prompt {text[:80]!r}"
            compared += 1
    return compared


@pytest.fixture(scope="module")
def tiny_stack():
    from banditspec.serving.runtime import load_local

    return load_local("tiny", arms=("pld", "suffix", "rest", "copy"))


def test_every_policy_and_arm_is_lossless_on_smollm2(smollm2_stack):
    """Every third prompt (12: four of each kind); the long form runs all 34."""
    assert set(smollm2_stack.decoder.drafters) == {"pld", "suffix", "rest", "eagle", "copy"}
    prompts = lossless_prompts()[::3]
    assert check_all(smollm2_stack, prompts) == len(prompts) * len(methods(smollm2_stack))


@pytest.mark.long
def test_every_policy_and_arm_is_lossless_on_smollm2_on_every_prompt(smollm2_stack):
    prompts = lossless_prompts()
    assert len(prompts) >= 30
    assert check_all(smollm2_stack, prompts) == len(prompts) * len(methods(smollm2_stack))


def test_every_policy_and_arm_is_lossless_on_the_tiny_model(tiny_stack):
    assert set(tiny_stack.decoder.drafters) == {"pld", "suffix", "rest", "copy"}
    prompts = lossless_prompts()
    assert check_all(tiny_stack, prompts) == len(prompts) * len(methods(tiny_stack))


def test_fast_kernels_compute_a_row_bitwise_alike_in_any_step(smollm2_stack):
    """Stronger than equal tokens: with the default "fast" (panel) kernels a token's hidden
    state, the LM head's input, is bitwise the same whether it is decoded alone, verified
    among 2..9 tokens, or verified in a batch beside a sequence of another length. So
    greedy speculative output cannot differ from plain decoding, whatever the drafts."""
    import numpy as np
    from banditspec.engine.contract import VerifyRequest

    engine = smollm2_stack.engine
    assert engine.kernel_impl == "panel"
    none = np.zeros(0, np.int32)
    for kind, text in lossless_prompts()[::11]:
        prompt = list(prompt_ids(smollm2_stack.tokenizer, text, chat=True))
        engine.clear()
        tokens, alone = [], []
        engine.verify([VerifyRequest(np.asarray(prompt, np.int32), none)])
        for _ in range(9):
            sequence = np.asarray(prompt + tokens, np.int32) if tokens else np.asarray(prompt, np.int32)
            (result,) = engine.verify([VerifyRequest(sequence, none, hidden_from=len(sequence) - 1)])
            alone.append(result.hidden_states[-1])
            tokens.append(int(result.output_ids[0]))
        # alone[i]: the hidden state at the position of prompt + tokens[:i]'s last token
        for k in (2, 5, 9):
            engine.clear()
            engine.verify([VerifyRequest(np.asarray(prompt[:-1], np.int32), none)])
            request = VerifyRequest(np.asarray(prompt, np.int32), np.asarray(tokens[: k - 1], np.int32), hidden_from=len(prompt) - 1)
            other = VerifyRequest(np.asarray(prompt[: len(prompt) // 3], np.int32), np.asarray(tokens[:2], np.int32))
            for batch in ([request], [request, other]):
                result = engine.verify(batch)[0]
                assert result.num_accepted == k - 1, (kind, k, len(batch))
                assert np.array_equal(result.hidden_states[:k], np.stack(alone[:k])), (kind, k, len(batch))
