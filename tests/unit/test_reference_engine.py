"""The torch reference engine: losslessness, prefix cache, batching, sampling, validation.

Most tests use a small random Llama with an untied 512-token vocabulary built here
(its greedy output varies from token to token, unlike the cached "tiny" model whose
random tied embeddings make it repeat one token); counting tests use the shared
``tiny_engine``; one slow test uses the real SmolLM2.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from banditspec.engine import panel_kernel
from banditspec.engine.contract import VerifyRequest, VerifyResult
from banditspec.engine.reference import ReferenceEngine
from banditspec.errors import BanditSpecValidationError
from banditspec.text import prompt_ids
from transformers import LlamaConfig, LlamaForCausalLM

# Chi-square critical values at alpha = 0.001, by degrees of freedom (standard tables).
CHI2_CRITICAL_0_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458,
                       7: 24.322, 8: 26.124, 9: 27.877, 10: 29.588, 11: 31.264}

Drafter = Callable[[list[int], list[int], int], list[int]]  # (reference, generated, step) -> draft


def make_llama(vocab_size: int, seed: int, init_std: float = 0.3) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        initializer_range=init_std, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def varied_model() -> LlamaForCausalLM:
    torch.set_num_threads(1)
    return make_llama(512, seed=0)


@pytest.fixture
def engine(varied_model) -> ReferenceEngine:
    return ReferenceEngine(varied_model, max_context=512)


def ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def step(engine: ReferenceEngine, sequence, draft=(), **kwargs) -> VerifyResult:
    return engine.verify([VerifyRequest(ids(sequence), ids(draft), **kwargs)])[0]


def vanilla_greedy(engine: ReferenceEngine, prompt, num_tokens: int) -> list[int]:
    sequence = list(prompt)
    for _ in range(num_tokens):
        sequence += step(engine, sequence).output_ids.tolist()
    return sequence[len(prompt):]


def speculative_greedy(engine, prompt, num_tokens, reference, drafter: Drafter):
    """(generated tokens, num_accepted per step, draft length per step)."""
    sequence, generated, accepted, gammas = list(prompt), [], [], []
    while len(generated) < num_tokens:
        draft = drafter(reference, generated, len(accepted))
        result = step(engine, sequence, draft)
        assert len(result.output_ids) == result.num_accepted + 1
        sequence += result.output_ids.tolist()
        generated += result.output_ids.tolist()
        accepted.append(result.num_accepted)
        gammas.append(len(draft))
    return generated[:num_tokens], accepted, gammas


def random_prompt(rng: np.random.Generator, length: int, vocab: int = 512) -> list[int]:
    return rng.integers(3, vocab, length).tolist()


def right_draft(reference, generated, step_index):
    return reference[len(generated): len(generated) + 1 + step_index % 6]


def wrong_draft(reference, generated, step_index):
    return [(t + 1) % 512 for t in reference[len(generated): len(generated) + 1 + step_index % 6]]


def reject_at_step_index(reference, generated, step_index):
    """gamma = 6, right for (step_index % 6) tokens, then wrong: a rejection at every position."""
    draft = list(reference[len(generated): len(generated) + 6])
    k = step_index % 6
    if k < len(draft):
        draft[k] = (draft[k] + 7) % 512
    return draft


def random_draft(reference, generated, step_index):
    rng = np.random.default_rng(step_index)
    return rng.integers(0, 512, rng.integers(0, 7)).tolist()


# --- greedy losslessness --------------------------------------------------------------


def test_vanilla_matches_hf_generate(engine, varied_model):
    prompt = random_prompt(np.random.default_rng(1), 12)
    ours = vanilla_greedy(engine, prompt, 40)
    with torch.inference_mode():
        theirs = varied_model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                                       pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    assert ours == theirs
    assert len(set(ours)) > 10  # the model's output is varied enough for the tests below


@pytest.mark.parametrize("drafter", [right_draft, wrong_draft, reject_at_step_index, random_draft])
def test_speculative_greedy_equals_vanilla(engine, varied_model, drafter):
    prompt = random_prompt(np.random.default_rng(2), 15)
    reference = vanilla_greedy(ReferenceEngine(varied_model, max_context=512), prompt, 60)
    generated, accepted, gammas = speculative_greedy(engine, prompt, 48, reference, drafter)
    assert generated == reference[:48]
    if drafter is right_draft:
        assert accepted == gammas
    if drafter is wrong_draft:
        assert set(accepted) == {0}
    if drafter is reject_at_step_index:
        assert set(accepted) == set(range(6))


def test_accepted_eos_cuts_the_output(engine, varied_model):
    prompt = random_prompt(np.random.default_rng(3), 10)
    reference = vanilla_greedy(ReferenceEngine(varied_model, max_context=512), prompt, 8)
    k = next(j for j in range(2, 8) if reference[j] not in reference[:j])
    result = step(engine, prompt, reference[:7], end_id=reference[k])
    assert result.output_ids.tolist() == reference[: k + 1]
    assert result.num_accepted == k  # the EOS counts as the target's own token
    # An end_id after the first rejection is not accepted, so nothing is cut.
    draft = reference[:2] + [(reference[2] + 1) % 512, reference[k]]
    result = step(engine, prompt, draft, end_id=reference[k] if k > 2 else -1)
    assert result.output_ids.tolist() == reference[:3]


# --- prefix cache -----------------------------------------------------------------------


def test_prefix_is_not_recomputed(tiny_engine):
    tiny_engine.clear()
    passes, positions = tiny_engine.forward_passes, tiny_engine.positions_computed
    sequence = random_prompt(np.random.default_rng(4), 200, vocab=49152)
    for _ in range(20):
        sequence += step(tiny_engine, sequence).output_ids.tolist()
    assert tiny_engine.forward_passes - passes == 20
    assert tiny_engine.positions_computed - positions == 200 + 19  # not ~20 * 210

    tiny_engine.clear()
    positions = tiny_engine.positions_computed
    for _ in range(10):  # gamma = 4 every step, all rejected: 1 + 4 new tokens per call
        result = step(tiny_engine, sequence, [5, 6, 7, 8])
        sequence += result.output_ids.tolist()
    assert tiny_engine.positions_computed - positions == (len(sequence) - 10 + 4) + 9 * 5
    assert tiny_engine.cached_tokens() == len(sequence) - 1  # the last output is not cached yet


def test_each_result_says_how_much_of_its_input_the_prefix_cache_served(tiny_engine):
    tiny_engine.clear()
    sequence = random_prompt(np.random.default_rng(5), 40, vocab=49152)
    assert step(tiny_engine, sequence).cached_tokens == 0  # nothing cached yet
    first = step(tiny_engine, sequence)  # the same input again: all but the last token (always fed)
    assert first.cached_tokens == len(sequence) - 1
    sequence += first.output_ids.tolist()
    assert step(tiny_engine, sequence).cached_tokens == len(sequence) - 1
    other = sequence[:10] + random_prompt(np.random.default_rng(6), 20, vocab=49152)  # shares 10 tokens
    assert step(tiny_engine, other).cached_tokens == 10


def test_cache_holds_only_confirmed_tokens_after_rejection(engine, varied_model):
    prompt = random_prompt(np.random.default_rng(5), 20)
    reference = vanilla_greedy(ReferenceEngine(varied_model, max_context=512), prompt, 10)
    draft = reference[:2] + [(reference[2] + 1) % 512] + reference[3:6]
    result = step(engine, prompt, draft)
    assert result.num_accepted == 2
    assert engine.cached_tokens() == len(prompt) + 2
    # Continuing from the confirmed sequence computes only the new token and stays exact.
    positions = engine.positions_computed
    sequence = prompt + result.output_ids.tolist()
    assert sequence[len(prompt):] == reference[:3]
    following = step(engine, sequence, reference[3:7])
    assert engine.positions_computed - positions == 1 + 4
    assert following.output_ids.tolist() == reference[3:8]


def test_diverging_and_replayed_sequences_stay_exact(engine, varied_model):
    rng = np.random.default_rng(6)
    prompt = random_prompt(rng, 25)
    cold = ReferenceEngine(varied_model, max_context=512, cache_entries=0)
    reference = vanilla_greedy(engine, prompt, 12)

    branch = prompt + random_prompt(rng, 5)  # shares only the prompt with the cached entry
    positions = engine.positions_computed
    assert step(engine, branch, [1, 2]).output_ids.tolist() == step(cold, branch, [1, 2]).output_ids.tolist()
    assert engine.positions_computed - positions == 5 + 2

    # Back on the first path (its entry survived the branch), and a replayed call.
    on_path = prompt + reference[:6]
    expected = step(cold, on_path, reference[6:9]).output_ids.tolist()
    positions = engine.positions_computed
    assert step(engine, on_path, reference[6:9]).output_ids.tolist() == expected == reference[6:10]
    assert engine.positions_computed - positions == 1 + 3
    assert step(engine, on_path, reference[6:9]).output_ids.tolist() == expected
    assert engine.positions_computed - positions == 2 * (1 + 3)


def test_cache_is_bounded_and_eviction_keeps_outputs_exact(varied_model):
    engine = ReferenceEngine(varied_model, max_context=512, cache_entries=3, cache_tokens_budget=70)
    cold = ReferenceEngine(varied_model, max_context=512, cache_entries=0)
    rng = np.random.default_rng(7)
    sequences = [random_prompt(rng, 30) for _ in range(6)]
    for round_index in range(3):
        for index, sequence in enumerate(sequences):
            draft = [(index * 31 + round_index) % 512]
            result = step(engine, sequence, draft)
            assert result.output_ids.tolist() == step(cold, sequence, draft).output_ids.tolist()
            sequence += result.output_ids.tolist()
            assert len(engine.cache) <= 3
            assert engine.cached_tokens() <= 70
    assert engine.cache.evictions > 0
    assert cold.cached_tokens() == 0
    engine.clear()
    assert engine.cached_tokens() == 0 and len(engine.cache) == 0


# --- batching ---------------------------------------------------------------------------


def _lockstep(engine, prompts, references, drafters, steps, joins_at, hidden=False):
    """Run the sequences in lockstep, one verify call per step; sequence i joins at step joins_at[i]."""
    sequences = [list(p) for p in prompts]
    outputs: list[list[VerifyResult]] = [[] for _ in prompts]
    passes = []
    for step_index in range(steps):
        active = [i for i in range(len(prompts)) if joins_at[i] <= step_index]
        requests = []
        for i in active:
            generated = sequences[i][len(prompts[i]):]
            draft = drafters[i](references[i], generated, step_index)
            hidden_from = (0 if not generated else len(sequences[i]) - 1) if hidden else -1
            requests.append(VerifyRequest(ids(sequences[i]), ids(draft), hidden_from=hidden_from))
        before = engine.forward_passes
        results = engine.verify(requests)
        passes.append(engine.forward_passes - before)
        for i, result in zip(active, results):
            outputs[i].append(result)
            sequences[i] += result.output_ids.tolist()
    return sequences, outputs, passes


@pytest.mark.parametrize("kernels", ["fast", "onednn"])
def test_batched_verify_equals_solo_runs(varied_model, kernels):
    """Packed passes (the panel kernels): each sequence's results bitwise its solo ones, no
    padded row. Padded passes (the other kernels): the same tokens, states within rounding."""
    model = varied_model if kernels == "fast" else make_llama(512, seed=0)  # onednn re-points the weights
    rng = np.random.default_rng(8)
    prompts = [random_prompt(rng, n) for n in (5, 17, 30, 9)]
    cold = ReferenceEngine(model, max_context=512, kernels=kernels)
    references = [vanilla_greedy(cold, p, 60) for p in prompts]
    drafters = [lambda r, g, s: [], right_draft, wrong_draft, reject_at_step_index]
    joins_at = [0, 0, 3, 5]  # late joiners: rows without cache next to cached rows

    batched = ReferenceEngine(model, max_context=512, kernels=kernels)
    packed = batched.packs_rows
    assert packed == (kernels == "fast" and batched.kernel_impl == "panel")
    sequences, outputs, passes = _lockstep(batched, prompts, references, drafters, 10, joins_at, hidden=True)
    assert passes == [1] * 10
    for i in range(len(prompts)):
        solo = ReferenceEngine(model, max_context=512, kernels=kernels)
        solo_sequences, solo_outputs, _ = _lockstep(solo, [prompts[i]], [references[i]], [drafters[i]], 10, [joins_at[i]], hidden=True)
        assert sequences[i] == solo_sequences[0]
        generated = sequences[i][len(prompts[i]):]
        assert generated == references[i][: len(generated)]
        for together, alone in zip(outputs[i], solo_outputs[0]):
            assert together.num_accepted == alone.num_accepted
            if packed:
                np.testing.assert_array_equal(together.hidden_states, alone.hidden_states)
            else:
                np.testing.assert_allclose(together.hidden_states, alone.hidden_states, rtol=1e-4, atol=1e-4)
    assert (batched.padded_positions == 0) if packed else (batched.padded_positions > 0)


def test_a_sampled_packed_pass_gives_each_sequence_its_solo_draw(varied_model):
    """Temperature > 0 in a packed pass: each sequence's logits are bitwise its solo ones, so
    its seeded draw (deterministic drafts, and drafts with the drafter's probabilities) is too."""
    rng = np.random.default_rng(33)
    prompts = [random_prompt(rng, n) for n in (6, 19, 11, 27)]
    probs = rng.random((3, 512)).astype(np.float32)
    requests = [VerifyRequest(ids(prompts[0]), ids([3, 4, 5]), temperature=0.9, seed=1),
                VerifyRequest(ids(prompts[1]), temperature=0.7, seed=2),
                VerifyRequest(ids(prompts[2]), ids([7, 8, 9]), probs / probs.sum(axis=1, keepdims=True),
                              temperature=1.2, seed=3),
                VerifyRequest(ids(prompts[3]), ids([1, 2]), seed=4)]  # greedy beside them
    engine = ReferenceEngine(varied_model, max_context=512)
    assert engine.packs_rows
    together = engine.verify(requests)
    assert engine.padded_positions == 0
    for request, result in zip(requests, together):
        (alone,) = ReferenceEngine(varied_model, max_context=512).verify([request])
        assert result.output_ids.tolist() == alone.output_ids.tolist()
        assert result.num_accepted == alone.num_accepted


def test_a_packed_pass_gives_the_same_prefix_twice_its_own_room(varied_model):
    """Two sequences continuing the same cached prefix in one packed pass (two samples of one
    prompt) must not write their new K/V into the same buffer room: each gets its solo answer,
    and so do later steps reading what they cached."""
    prompt = random_prompt(np.random.default_rng(31), 20)
    reference = vanilla_greedy(ReferenceEngine(varied_model, max_context=512), prompt, 5)
    engine = ReferenceEngine(varied_model, max_context=512)
    engine.verify([VerifyRequest(ids(prompt))])
    prompt = prompt + reference[:1]  # its cached prefix ends where its buffer's frozen room begins
    wrong = [(t + 1) % 512 for t in reference[1:4]]
    # the first keeps its whole (right) draft; the second's longer, wrong one goes later in the
    # pass (fewest rows first) and would overwrite the first's room
    pair = [VerifyRequest(ids(prompt), ids(reference[1:3])), VerifyRequest(ids(prompt), ids(wrong))]
    together = engine.verify(pair)
    nexts = [VerifyRequest(ids(prompt + r.output_ids.tolist()), hidden_from=0) for r in together]
    later = engine.verify(nexts)
    assert together[0].num_accepted == 2 and together[1].num_accepted == 0
    for request, result, after in zip(pair, together, later):
        solo = ReferenceEngine(varied_model, max_context=512)
        (alone,) = solo.verify([request])
        assert result.output_ids.tolist() == alone.output_ids.tolist()
        (alone_after,) = solo.verify([VerifyRequest(ids(prompt + alone.output_ids.tolist()), hidden_from=0)])
        assert after.output_ids.tolist() == alone_after.output_ids.tolist()
        np.testing.assert_array_equal(after.hidden_states, alone_after.hidden_states)


def test_a_long_prefill_in_a_batch_gets_its_own_passes(varied_model):
    """On the panel kernels a prefill of more than 2 x prefill_chunk new tokens leaves the
    batch (its own pass, in passes) and the others are packed into passes of at most
    2 x prefill_chunk rows; every result is bitwise the one-batch result."""
    rng = np.random.default_rng(9)
    prompts = [random_prompt(rng, n) for n in (100, 12, 70, 20, 9)]
    requests = [VerifyRequest(ids(p), ids([3, 4]), hidden_from=0) for p in prompts]
    results = {}
    for chunk in (1000, 16):
        engine = ReferenceEngine(varied_model, max_context=512)
        assert engine._fast is not None
        engine._fast.prefill_chunk = chunk
        passes = engine.forward_passes
        results[chunk] = engine.verify(requests)
        # chunk 16: 102 and 72 new tokens alone; 11 and 14 together (25 rows <= 32), then 22
        assert engine.forward_passes - passes == (1 if chunk == 1000 else 4)
    for together, apart in zip(results[1000], results[16]):
        assert together.output_ids.tolist() == apart.output_ids.tolist()
        assert np.array_equal(together.hidden_states, apart.hidden_states)


def test_concurrent_threads_get_their_solo_results(varied_model):
    engine = ReferenceEngine(varied_model, max_context=512)
    rng = np.random.default_rng(9)
    prompts = [random_prompt(rng, 10 + 3 * i) for i in range(4)]
    references = [vanilla_greedy(ReferenceEngine(varied_model, max_context=512), p, 30) for p in prompts]
    drafters = [right_draft, wrong_draft, reject_at_step_index, random_draft]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(speculative_greedy, engine, p, 30, r, d) for p, r, d in zip(prompts, references, drafters)]
        for future, reference in zip(futures, references):
            assert future.result()[0] == reference


# --- hidden states ----------------------------------------------------------------------


def test_hidden_states_follow_the_contract(engine, varied_model):
    prompt = random_prompt(np.random.default_rng(10), 12)
    reference = vanilla_greedy(ReferenceEngine(varied_model, max_context=512), prompt, 10)
    first = step(engine, prompt, reference[:3], hidden_from=0)
    assert first.num_accepted == 3
    second_input = prompt + first.output_ids.tolist()
    draft = reference[4:6] + [(reference[6] + 1) % 512]
    second = step(engine, second_input, draft, hidden_from=len(second_input) - 1)
    assert second.num_accepted == 2
    with torch.inference_mode():
        full = varied_model.model(input_ids=torch.tensor([second_input + draft[:2]])).last_hidden_state[0].numpy()
    assert first.hidden_states.shape == (len(prompt) + 3, 64)
    np.testing.assert_allclose(first.hidden_states, full[: len(prompt) + 3], atol=1e-5)
    assert second.hidden_states.shape == (1 + 2, 64)
    np.testing.assert_allclose(second.hidden_states, full[len(second_input) - 1:], atol=1e-5)
    assert step(engine, prompt).hidden_states is None

    # Positions the cache already holds: their (post-norm) states come from the cache too.
    positions = engine.positions_computed
    again = step(engine, second_input, draft, hidden_from=5)
    assert engine.positions_computed - positions == 1 + len(draft)
    np.testing.assert_allclose(again.hidden_states, full[5:], atol=1e-5)
    # States of a kind no entry holds (a decoder layer's output) are recomputed from hidden_from.
    positions = engine.positions_computed
    layer = step(engine, second_input, draft, hidden_from=5, hidden_layers=(0,))
    assert engine.positions_computed - positions == len(second_input) - 5 + len(draft)
    assert layer.hidden_states.shape == again.hidden_states.shape


# --- states from the prefix cache -------------------------------------------------------


def _shared_prefix_prompts(seed: int) -> tuple[list[int], list[int], int]:
    """Two prompts (29 and 26 tokens) sharing their first 20 tokens."""
    rng = np.random.default_rng(seed)
    shared = random_prompt(rng, 20)
    return shared + random_prompt(rng, 9), shared + random_prompt(rng, 6), 20


def _assert_same_states(kernels: str, actual: np.ndarray, expected: np.ndarray) -> None:
    """Bitwise with the panel kernels (a row's values do not depend on the call), else to rounding."""
    if kernels == "fast":
        assert np.array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [(), (0,)], ids=["post-norm", "layer-0"])
@pytest.mark.parametrize("kernels", ["fast", "transformers"])
def test_cached_states_serve_a_request_from_position_zero(kernels, kind):
    engine = ReferenceEngine(make_llama(512, seed=0), max_context=512, kernels=kernels)
    first, second, shared = _shared_prefix_prompts(22)
    step(engine, first, hidden_from=0, hidden_layers=kind)
    positions = engine.positions_computed
    warm = step(engine, second, [5, 6], hidden_from=0, hidden_layers=kind)
    assert engine.positions_computed - positions == len(second) - shared + 2
    engine.clear()
    cold = step(engine, second, [5, 6], hidden_from=0, hidden_layers=kind)
    assert warm.output_ids.tolist() == cold.output_ids.tolist() and warm.num_accepted == cold.num_accepted
    assert warm.hidden_states.shape == cold.hidden_states.shape == (len(second) + cold.num_accepted, 64)
    _assert_same_states(kernels, warm.hidden_states, cold.hidden_states)


def test_states_of_another_kind_cap_reuse_until_computed_from_zero(varied_model):
    engine = ReferenceEngine(varied_model, max_context=512)
    first, second, shared = _shared_prefix_prompts(23)
    step(engine, first)  # no states asked: the entry holds the post-norm ones only
    positions = engine.positions_computed
    step(engine, second, hidden_from=0, hidden_layers=(0,))
    assert engine.positions_computed - positions == len(second)  # layer 0's outputs: none cached
    positions = engine.positions_computed
    third = second[:-1] + [(second[-1] + 1) % 512, 7]
    warm = step(engine, third, hidden_from=0, hidden_layers=(0,))
    assert engine.positions_computed - positions == 2  # the second request cached them from 0
    engine.clear()
    cold = step(engine, third, hidden_from=0, hidden_layers=(0,))
    np.testing.assert_array_equal(warm.hidden_states, cold.hidden_states)


@pytest.mark.parametrize("kind", [(), (0,)], ids=["post-norm", "layer-0"])
def test_a_long_prefill_in_passes_is_bitwise_one_pass(varied_model, kind):
    """The panel kernels feed a prefill of more than 2 x ``prefill_chunk`` tokens in passes
    (FastLlama._chunked); outputs, states and the KV later steps read are bitwise those of
    one pass, from position 0 and after a cached prefix."""
    rng = np.random.default_rng(31)
    prompt = random_prompt(rng, 100)
    longer = prompt + random_prompt(rng, 50)
    runs = {}
    for chunk in (1000, 16):
        engine = ReferenceEngine(varied_model, max_context=512)
        assert engine.kernel_impl == "panel", panel_kernel.unavailable_reason()
        assert engine._fast is not None
        engine._fast.prefill_chunk = chunk
        passes = []
        inner = engine._fast.forward_capture

        def counted(input_ids, *args, inner=inner, passes=passes, **kwargs):
            passes.append(input_ids.shape[1])
            return inner(input_ids, *args, **kwargs)

        engine._fast.forward_capture = counted  # type: ignore[method-assign]
        first = step(engine, prompt, [5, 6, 7], hidden_from=0, hidden_layers=kind)
        decoded = vanilla_greedy(engine, prompt, 6)
        second = step(engine, longer, [9], hidden_from=0, hidden_layers=kind)  # 100 cached, 50 new
        runs[chunk] = (first, decoded, second, passes)
    (one_first, one_decoded, one_second, one_passes), (first, decoded, second, passes) = runs[1000], runs[16]
    # a call, then its passes: more than 2 x 16 new tokens go in equal passes of <= 16
    assert one_passes[0] == 103 and passes[:8] == [103, 15, 15, 15, 15, 15, 15, 13]
    assert passes[-5:] == [51, 13, 13, 13, 12]  # the longer prompt: its 51 uncached tokens
    assert decoded == one_decoded
    for got, want in ((first, one_first), (second, one_second)):
        assert got.output_ids.tolist() == want.output_ids.tolist() and got.num_accepted == want.num_accepted
        assert np.array_equal(got.hidden_states, want.hidden_states)


def test_a_rejected_drafts_states_are_not_kept(varied_model):
    engine = ReferenceEngine(varied_model, max_context=512)
    prompt = random_prompt(np.random.default_rng(24), 15)
    reference = vanilla_greedy(ReferenceEngine(varied_model, max_context=512), prompt, 8)
    draft = reference[:2] + [(reference[2] + 1) % 512, reference[3]]
    result = step(engine, prompt, draft, hidden_from=0)
    assert result.num_accepted == 2
    hit = engine.cache.lookup(ids(prompt + reference), len(prompt) + len(reference))
    assert hit.length == len(prompt) + 2 and hit.features[()].shape == (len(prompt) + 2, 64)  # cut like the KV
    np.testing.assert_array_equal(hit.features[()].numpy(), result.hidden_states)
    sequence = prompt + result.output_ids.tolist()
    positions = engine.positions_computed
    warm = step(engine, sequence, reference[3:5], hidden_from=0)
    assert engine.positions_computed - positions == 1 + 2
    engine.clear()
    cold = step(engine, sequence, reference[3:5], hidden_from=0)
    assert warm.output_ids.tolist() == cold.output_ids.tolist() == reference[3:6]
    np.testing.assert_array_equal(warm.hidden_states, cold.hidden_states)


def test_a_ragged_batch_takes_each_rows_states_from_the_cache(varied_model):
    engine = ReferenceEngine(varied_model, max_context=512)
    first, second, shared = _shared_prefix_prompts(25)
    other_first, other, other_shared = _shared_prefix_prompts(26)
    other = other + random_prompt(np.random.default_rng(27), 7)
    fresh = random_prompt(np.random.default_rng(28), 11)
    engine.verify([VerifyRequest(ids(first)), VerifyRequest(ids(other_first), hidden_from=0, hidden_layers=(0,))])
    requests = [VerifyRequest(ids(second), ids([4, 5]), hidden_from=0),
                VerifyRequest(ids(other), ids([6]), hidden_from=3, hidden_layers=(0,)),
                VerifyRequest(ids(fresh), hidden_from=0)]
    positions = engine.positions_computed
    warm = engine.verify(requests)
    assert engine.positions_computed - positions == (len(second) - shared + 2) + (len(other) - other_shared + 1) + len(fresh)
    for request, together in zip(requests, warm):
        engine.clear()
        (alone,) = engine.verify([request])
        assert together.output_ids.tolist() == alone.output_ids.tolist()
        np.testing.assert_allclose(together.hidden_states, alone.hidden_states, rtol=1e-4, atol=1e-4)


def test_returned_states_do_not_alias_the_cache(varied_model):
    engine = ReferenceEngine(varied_model, max_context=512)
    first, _, _ = _shared_prefix_prompts(29)
    expected = step(engine, first, hidden_from=0).hidden_states.copy()
    step(engine, first, hidden_from=0).hidden_states[:] = np.nan  # a caller writing to its array
    positions = engine.positions_computed
    again = step(engine, first, hidden_from=0)
    assert engine.positions_computed - positions == 1  # the states came from the cache
    np.testing.assert_array_equal(again.hidden_states, expected)


# --- sampling ---------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_stateless(engine):
    prompt = random_prompt(np.random.default_rng(11), 15)
    draft = [7, 8, 9]
    first = step(engine, prompt, draft, temperature=0.8, seed=5)
    assert step(engine, prompt, draft, temperature=0.8, seed=5).output_ids.tolist() == first.output_ids.tolist()
    engine.clear()
    assert step(engine, prompt, draft, temperature=0.8, seed=5).output_ids.tolist() == first.output_ids.tolist()
    outputs = {tuple(step(engine, prompt, draft, temperature=1.5, seed=s).output_ids) for s in range(10)}
    assert len(outputs) > 1


def _pooled_chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom, pooling bins expected below 5 into one."""
    expected = probs * counts.sum()
    small = expected < 5
    observed_bins = list(counts[~small]) + ([counts[small].sum()] if small.any() else [])
    expected_bins = list(expected[~small]) + ([expected[small].sum()] if small.any() else [])
    observed_bins, expected_bins = np.array(observed_bins), np.array(expected_bins)
    statistic = float(((observed_bins - expected_bins) ** 2 / expected_bins).sum())
    return statistic, len(expected_bins) - 1


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_speculative_sampling_draws_from_the_target(with_draft_probs):
    vocab, temperature, samples, batch = 12, 0.9, 3000, 500
    model = make_llama(vocab, seed=3, init_std=0.1)
    engine = ReferenceEngine(model, max_context=64)
    context = [3, 7, 1, 10, 4]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([context])).logits[0, -1].double()
    target = torch.softmax(logits / temperature, dim=-1).numpy()

    rng = np.random.default_rng(12)
    q = rng.dirichlet(np.ones(vocab), size=2) if with_draft_probs else None
    counts = np.zeros(vocab, dtype=np.int64)
    for start in range(0, samples, batch):
        requests = []
        for seed in range(start, start + batch):
            if with_draft_probs:  # the draft tokens are drawn from q, as a drafter would
                draft = [int(rng.choice(vocab, p=q[0])), int(rng.choice(vocab, p=q[1]))]
            else:  # a fixed bad draft: the target's least likely token, then any token
                draft = [int(np.argmin(target)), 0]
            requests.append(VerifyRequest(ids(context), ids(draft), draft_probs=q, temperature=temperature, seed=seed))
        for result in engine.verify(requests):
            counts[result.output_ids[0]] += 1
    statistic, dof = _pooled_chi_square(counts, target)
    assert statistic < CHI2_CRITICAL_0_001[dof], (counts, target * samples, statistic)
    # The test has power: plain (non-speculative) mistakes such as emitting the draft
    # token or sampling at temperature 1 are far from these counts.
    untempered = torch.softmax(logits, dim=-1).numpy()
    assert _pooled_chi_square(counts, untempered)[0] > CHI2_CRITICAL_0_001[dof]


# --- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(input_ids=ids([])), "input_ids"),
        (dict(input_ids=ids([1, 600])), "input_ids"),
        (dict(input_ids=ids([1, -1])), "input_ids"),
        (dict(input_ids=np.array([1.0, 2.0])), "input_ids"),
        (dict(input_ids=ids([[1, 2]])), "input_ids"),
        (dict(input_ids=ids(range(1, 65))), "input_ids"),
        (dict(input_ids=ids(range(1, 60)), draft_ids=ids([1, 2, 3, 4, 5])), "draft_input_ids"),
        (dict(input_ids=ids([1, 2]), draft_ids=ids([512])), "draft_input_ids"),
        (dict(input_ids=ids([1, 2]), temperature=-1.0), "temperature"),
        (dict(input_ids=ids([1, 2]), temperature=float("nan")), "temperature"),
        (dict(input_ids=ids([1, 2]), hidden_from=2), "hidden_from"),
        (dict(input_ids=ids([1, 2]), hidden_from=-2), "hidden_from"),
        (dict(input_ids=ids([1, 2]), draft_ids=ids([3]), temperature=1.0, draft_probs=np.ones((2, 512))), "draft_probs"),
        (dict(input_ids=ids([1, 2]), draft_ids=ids([3]), temperature=1.0, draft_probs=-np.ones((1, 512))), "draft_probs"),
    ],
)
def test_bad_requests_name_the_field(varied_model, kwargs, field):
    engine = ReferenceEngine(varied_model, max_context=64)
    good = VerifyRequest(ids([1, 2, 3]))
    with pytest.raises(BanditSpecValidationError) as error:
        engine.verify([good, VerifyRequest(**kwargs)])
    assert error.value.field == field
    assert str(error.value).startswith(field)
    assert engine.forward_passes == 0  # nothing ran
    assert len(engine.verify([good])[0].output_ids) == 1  # and the engine still serves


def test_bad_engine_arguments(varied_model):
    with pytest.raises(BanditSpecValidationError, match="max_context"):
        ReferenceEngine(varied_model, max_context=4096)
    with pytest.raises(BanditSpecValidationError, match="cache_entries"):
        ReferenceEngine(varied_model, cache_entries=-1)
    assert ReferenceEngine(varied_model).verify([]) == []


def test_fast_kernels_keep_values_and_match_transformers_forward():
    plain_model, fast_model = make_llama(512, seed=0), make_llama(512, seed=0)
    plain = ReferenceEngine(plain_model, kernels="transformers")
    fast = ReferenceEngine(fast_model)
    onednn_model = make_llama(512, seed=0)
    onednn = ReferenceEngine(onednn_model, kernels="onednn")
    assert fast.kernels == "fast" and plain.kernels == "transformers"
    assert fast.kernel_impl == "panel", panel_kernel.unavailable_reason()
    # "onednn": the transformers modules view the fused column-major copies: same values
    weight = onednn_model.model.layers[0].mlp.up_proj.weight
    fused = onednn._fast.layers[0].gate_up.weight_t
    assert weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    assert torch.equal(weight, plain_model.model.layers[0].mlp.up_proj.weight)
    # "fast" (panel): the transformers modules keep their own weights, unchanged
    assert torch.equal(fast_model.model.layers[0].mlp.up_proj.weight, plain_model.model.layers[0].mlp.up_proj.weight)
    prompt = random_prompt(np.random.default_rng(13), 9)
    expected = vanilla_greedy(plain, prompt, 20)
    assert vanilla_greedy(fast, prompt, 20) == expected
    assert vanilla_greedy(onednn, prompt, 20) == expected
    # one verify over a draft: hidden states and decisions agree with transformers' forward
    sequence = prompt + vanilla_greedy(ReferenceEngine(make_llama(512, seed=0)), prompt, 6)
    for engine in (plain, fast, onednn):
        engine.clear()
    a = step(plain, sequence[:-5], sequence[-5:], hidden_from=0)
    for engine in (fast, onednn):
        b = step(engine, sequence[:-5], sequence[-5:], hidden_from=0)
        assert a.output_ids.tolist() == b.output_ids.tolist() and a.num_accepted == b.num_accepted == 5
        np.testing.assert_allclose(a.hidden_states, b.hidden_states, rtol=1e-4, atol=1e-4)
    with pytest.raises(BanditSpecValidationError, match="kernels"):
        ReferenceEngine(make_llama(512, seed=0), kernels="bf16-maybe")


def test_engine_attributes(tiny_engine):
    assert tiny_engine.vocab_size == 49152
    assert tiny_engine.max_context == 512
    assert tiny_engine.eos_id == 2
    assert tiny_engine.provides_hidden_states is True
    assert tiny_engine.tokenizer is not None


# --- the real model -----------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_speculative_and_batched_greedy_equal_generate():
    torch.set_num_threads(2)
    engine = ReferenceEngine.from_name("smollm2", max_context=1024)
    tokenizer = engine.tokenizer
    prompts = [  # chat-templated by the server's own function
        prompt_ids(tokenizer, text, chat=True)
        for text in ("Write a Python function that reverses a string.", "What is the capital of France?")
    ]
    with torch.inference_mode():
        references = [
            engine.model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                                  pad_token_id=engine.eos_id)[0, len(p):].tolist()
            for p in prompts
        ]
    assert vanilla_greedy(engine, prompts[0], 24) == references[0]
    generated, accepted, _ = speculative_greedy(engine, prompts[1], 24, references[1], reject_at_step_index)
    assert generated == references[1]
    assert max(accepted) == 5  # the drafter is right up to 5 tokens at some steps
    engine.clear()
    drafters = [reject_at_step_index, right_draft]
    sequences, _, passes = _lockstep(engine, prompts, references, drafters, 6, [0, 2])
    assert passes == [1] * 6
    for sequence, prompt, reference in zip(sequences, prompts, references):
        generated = sequence[len(prompt):]
        assert generated == reference[: len(generated)]


def test_seeded_sampling_gives_the_same_text_whatever_was_drafted(varied_model):
    """A deterministic draft is verified with plain decoding's own per-position draws, so a
    seed's output does not depend on the policy (drafts right, wrong or partly right)."""
    engine = ReferenceEngine(varied_model, max_context=512)
    prompt = random_prompt(np.random.default_rng(21), 7)
    sequence = list(prompt)
    for _ in range(24):
        sequence += step(engine, sequence, temperature=0.9, seed=5).output_ids.tolist()
    plain = sequence[len(prompt):]
    other_seed = list(prompt)
    for _ in range(24):
        other_seed += step(engine, other_seed, temperature=0.9, seed=6).output_ids.tolist()
    assert other_seed[len(prompt):] != plain  # the seed matters
    rng = np.random.default_rng(3)
    for policy in ("right", "wrong", "mixed"):
        engine.clear()
        sequence = list(prompt)
        while len(sequence) - len(prompt) < 24:
            done = len(sequence) - len(prompt)
            truth = plain[done : done + 4]
            if policy == "wrong":
                draft = [(t + 1) % 50 for t in truth]
            elif policy == "mixed":
                draft = truth[:2] + [int(rng.integers(0, 50))] * 2
            else:
                draft = truth
            sequence += step(engine, sequence, draft, temperature=0.9, seed=5).output_ids.tolist()
        assert sequence[len(prompt): len(prompt) + 24] == plain, policy
