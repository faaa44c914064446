"""Banned words: their tensor form, and the target's banned distribution, the same in plain and
speculative decoding (greedy: token-identical; sampling: the same draws for a seed and the
banned distribution), whatever the drafter proposes, the banned sequence itself included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import run_to_completion
from banditspec.engine.bad_words import banned_at, from_word_list, mask_banned, to_word_list
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.reference import ReferenceEngine
from banditspec.engine.tensor_codec import decode_requests, encode_requests
from banditspec.errors import BanditSpecValidationError

from tests.unit.test_decoding import ScriptedDrafter
from tests.unit.test_reference_engine import (
    CHI2_CRITICAL_0_001,
    _pooled_chi_square,
    ids,
    make_llama,
    random_prompt,
    step,
)

# --- the offsets form -------------------------------------------------------------------


def test_word_list_is_upstreams_offsets_form_and_round_trips():
    words = ((5, 6), (7,), (8, 9, 10))
    array = to_word_list(words)
    assert array.dtype == np.int32
    assert array.tolist() == [[5, 6, 7, 8, 9, 10], [2, 3, 6, -1, -1, -1]]
    assert from_word_list(array) == words
    assert from_word_list(array[None]) == words  # with the batch dimension
    assert to_word_list((), 3).tolist() == [[0, 0, 0], [-1, -1, -1]]
    assert from_word_list(to_word_list(())) == ()
    assert to_word_list([[4], []]).tolist() == [[4], [1]]  # an empty word is dropped


@pytest.mark.parametrize(
    "value",
    [
        np.array([[1, 2], [3, -1]], dtype=np.int32),  # an offset past the ids
        np.array([[1, 2], [2, 1]], dtype=np.int32),  # offsets not increasing
        np.array([[1, 2], [-1, 2]], dtype=np.int32),  # an offset after the padding
        np.array([[1, 2, 3]], dtype=np.int32),  # not [2, N]
        np.array([[1.0], [1.0]]),  # not integers
    ],
)
def test_a_malformed_word_list_is_refused_by_name(value):
    with pytest.raises(BanditSpecValidationError) as error:
        from_word_list(value)
    assert error.value.field == "bad_words_list"


def test_banned_tokens_follow_the_context():
    words = ((4,), (1, 2), (1, 2, 3))
    assert banned_at([9], words) == [4]
    assert sorted(banned_at([5, 1], words)) == [2, 4]
    assert sorted(banned_at([1, 2], words)) == [3, 4]
    logits = torch.zeros(3, 6)
    masked = mask_banned(logits, np.array([7, 1]), np.array([2, 5]), words)
    assert torch.isinf(masked).nonzero().tolist() == [[0, 2], [0, 4], [1, 3], [1, 4], [2, 4]]
    assert mask_banned(logits, np.array([7]), np.array([]), ()) is logits


def test_the_verify_contract_carries_bad_words_per_row():
    reqs = [VerifyRequest(ids([1, 2, 3]), ids([4]), bad_words=((5, 6), (7,))), VerifyRequest(ids([1, 2]))]
    tensors = encode_requests(reqs, with_reference_extras=True)
    assert tensors["bad_words_list"].shape == (2, 2, 3)
    assert [r.bad_words for r in decode_requests(tensors)] == [((5, 6), (7,)), ()]
    one = encode_requests(reqs[:1], with_reference_extras=False, tensorrtllm=True)
    assert one["bad_words_list"].tolist() == [[[5, 6, 7], [2, 3, -1]]]  # TensorRT-LLM's own input, as is
    assert "bad_words_list" not in encode_requests(reqs[1:], with_reference_extras=True)


def test_the_engine_refuses_bans_outside_the_vocabulary_or_of_every_token():
    engine = ReferenceEngine(make_llama(12, seed=3), max_context=64)
    for words in (((12,),), tuple((t,) for t in range(12))):
        with pytest.raises(BanditSpecValidationError) as error:
            engine.verify([VerifyRequest(ids([1, 2]), bad_words=words)])
        assert error.value.field == "bad_words_list"


# --- greedy: speculative == plain, with the ban -----------------------------------------


@pytest.fixture(scope="module")
def varied_engine():
    torch.set_num_threads(1)
    return ReferenceEngine(make_llama(512, seed=0), max_context=512)


def plain(engine, prompt, n, bad_words=(), temperature=0.0, seed=0):
    sequence = list(prompt)
    while len(sequence) - len(prompt) < n:
        result = step(engine, sequence, temperature=temperature, seed=seed, bad_words=bad_words)
        sequence += result.output_ids.tolist()
        if sequence[-1] == engine.eos_id:
            break
    return sequence[len(prompt):][:n]


def positional(reference, prompt):
    """Proposes ``reference``'s tokens after the context's length: always right when the
    context follows ``reference``; once the output leaves it, wrong (never re-aligned)."""

    def propose(context, max_len):
        done = len(context) - len(prompt)
        return reference[done: done + max_len]

    return propose


def _ban_cases(engine, prompt, n):
    free = plain(engine, prompt, n)
    return free, {
        "one token": ((free[4],),),
        "two tokens": ((free[5], free[6]),),
        "three tokens, two of them in another word": ((free[2], free[3], free[4]), (free[3], 511)),
        "starting in the prompt": ((prompt[-1], free[0]),),
    }


POLICIES = ["vanilla", "fixed:unbanned", "fixed:banned", "fixed:wrong", "ucbspec", "exp3spec", "costaware"]


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_output_with_a_ban_equals_plain_decoding_with_the_ban(varied_engine, policy):
    engine, n = varied_engine, 24
    prompt = random_prompt(np.random.default_rng(5), 9)
    free, cases = _ban_cases(engine, prompt, n)
    for name, words in cases.items():
        banned = plain(engine, prompt, n, words)
        assert banned != free, name  # the ban changes the output where the word would have appeared
        assert not any(_completes(prompt, banned, w) for w in words), name
        drafters = {
            # always right about the unbanned target: proposes the banned sequence itself
            "unbanned": ScriptedDrafter("unbanned", positional(free, prompt)),
            "banned": ScriptedDrafter("banned", positional(banned, prompt)),  # always right
            "wrong": ScriptedDrafter("wrong", lambda context, max_len: [(context[-1] + 1) % 512] * max_len),
        }
        decoder = SpeculativeDecoder.for_engine(engine, drafters)
        request = GenerationRequest(prompt_ids=prompt, max_tokens=n, policy=policy, max_draft_len=4, bad_words=words)
        result = run_to_completion(engine, decoder.start(request))
        assert result.token_ids == banned, (name, policy)
        if policy == "fixed:unbanned" and free[0] == banned[0]:  # right until the banned sequence
            assert sum(result.stats.accepted) > 0, name


def _completes(prompt, generated, word):
    """Whether a generated token completes ``word``."""
    sequence = list(prompt) + list(generated)
    return any(tuple(sequence[end - len(word): end]) == word
               for end in range(max(len(prompt) + 1, len(word)), len(sequence) + 1))


def test_a_drafted_banned_sequence_is_rejected_at_its_last_token(varied_engine):
    engine = varied_engine
    prompt = random_prompt(np.random.default_rng(7), 8)
    free = plain(engine, prompt, 6)
    word = (free[1], free[2])
    result = step(engine, prompt, free[:5], bad_words=(word,))
    assert result.num_accepted == 2  # free[0], free[1] accepted; free[2] would complete the word
    assert result.output_ids[2] != free[2]
    assert not _completes(prompt, result.output_ids.tolist(), word)
    assert step(engine, prompt, free[:5]).num_accepted == 5  # without the ban the draft is right


# --- sampling: the banned distribution, the same draws for a seed -----------------------


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_speculative_sampling_with_a_ban_draws_from_the_banned_target(with_draft_probs):
    vocab, temperature, samples, batch = 12, 0.9, 3000, 500
    model = make_llama(vocab, seed=3, init_std=0.1)
    engine = ReferenceEngine(model, max_context=64)
    context = [3, 7, 1, 10, 4]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([context])).logits[0, -1].double()
    target = torch.softmax(logits / temperature, dim=-1).numpy()
    order = np.argsort(-target)
    # the most likely token everywhere, and the second one after this context's last token
    words = ((int(order[0]),), (context[-1], int(order[1])))
    banned_target = target.copy()
    banned_target[order[:2]] = 0.0
    banned_target /= banned_target.sum()

    rng = np.random.default_rng(12)
    q = rng.dirichlet(np.ones(vocab), size=2) if with_draft_probs else None
    counts = np.zeros(vocab, dtype=np.int64)
    for start in range(0, samples, batch):
        requests = []
        for seed in range(start, start + batch):
            if with_draft_probs:
                draft = [int(rng.choice(vocab, p=q[0])), int(rng.choice(vocab, p=q[1]))]
            else:  # the draft proposes a banned token: it must never be accepted
                draft = [int(order[seed % 2]), 0]
            requests.append(VerifyRequest(ids(context), ids(draft), draft_probs=q, temperature=temperature,
                                          seed=seed, bad_words=words))
        for result in engine.verify(requests):
            counts[result.output_ids[0]] += 1
    assert counts[order[0]] == counts[order[1]] == 0
    kept = banned_target > 0
    statistic, dof = _pooled_chi_square(counts[kept], banned_target[kept])
    assert statistic < CHI2_CRITICAL_0_001[dof], (counts, banned_target * samples, statistic)
    # power: the unbanned target (what ignoring the ban would draw) is far from these counts
    statistic, dof = _pooled_chi_square(counts, target)
    assert statistic > CHI2_CRITICAL_0_001[dof]


def test_seeded_sampling_with_a_ban_gives_plain_decodings_text_whatever_was_drafted(varied_engine):
    engine, n = varied_engine, 24
    prompt = random_prompt(np.random.default_rng(21), 7)
    free = plain(engine, prompt, n, temperature=0.9, seed=5)
    words = ((free[3], free[4]), (free[10],))
    banned = plain(engine, prompt, n, words, temperature=0.9, seed=5)
    assert banned != free
    assert not any(_completes(prompt, banned, w) for w in words)
    for policy in ("vanilla", "fixed:unbanned", "fixed:banned", "ucbspec", "costaware"):
        drafters = {"unbanned": ScriptedDrafter("unbanned", positional(free, prompt)),
                    "banned": ScriptedDrafter("banned", positional(banned, prompt))}
        decoder = SpeculativeDecoder.for_engine(engine, drafters)
        request = GenerationRequest(prompt_ids=prompt, max_tokens=n, policy=policy, max_draft_len=4,
                                    temperature=0.9, seed=5, bad_words=words)
        assert run_to_completion(engine, decoder.start(request)).token_ids == banned, policy
