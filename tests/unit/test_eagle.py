"""The EAGLE-1 head, its training objective and the ``eagle`` drafter over it (the EAGLE-3
head, now the default, is tested in test_eagle3.py).

Fast tests use a random head over the tiny random Llama (hidden 64, SmolLM2's vocab); the
tests marked slow use the real SmolLM2 target and the shipped weights.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from banditspec.drafters.eagle import EAGLE1_WEIGHTS, EagleDrafter, int8_head, load_default_eagle_drafter
from banditspec.eagle.fast_step import FastEagleStep
from banditspec.eagle.head import EagleConfig, EagleHead, load_head, save_head
from banditspec.engine.fast_llama import Int8Linear
from banditspec.errors import BanditSpecValidationError
from banditspec_train.eagle.evaluate import greedy_speculative
from banditspec_train.eagle.features import FeatureSet
from banditspec_train.eagle.objective import unrolled_mask, unrolled_predictions
from banditspec_train.eagle.train import TrainConfig, evaluate_head, loss_function, train_head
from banditspec_train.eagle.vocab import choose_draft_vocab

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    from banditspec.engine.models import load_model

    model, _ = load_model("tiny")
    return model


def make_head(model, draft_vocab: int = 512, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(EagleConfig.for_target(model.config, draft_vocab))
    with torch.no_grad():  # larger weights than the init so that proposals vary with input
        for p in head.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.3)
    head.draft_vocab = torch.randperm(model.config.vocab_size)[:draft_vocab]
    return head.eval()


@pytest.fixture(scope="module")
def drafter(tiny):
    return EagleDrafter(make_head(tiny), tiny.get_input_embeddings().weight)


@torch.inference_mode()
def target_hidden(model, ids) -> np.ndarray:
    """float32 [len(ids), H]: post-norm last hidden state of every position."""
    return model.model(input_ids=torch.tensor([list(ids)])).last_hidden_state[0].numpy()


def random_ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 49152, size=n).tolist()


# --- head -----------------------------------------------------------------------------
def test_config_rejects_bad_shapes():
    with pytest.raises(BanditSpecValidationError, match="num_heads"):
        EagleConfig(hidden_size=576, num_heads=7)
    with pytest.raises(BanditSpecValidationError, match="draft_vocab_size"):
        EagleConfig(draft_vocab_size=0)
    with pytest.raises(BanditSpecValidationError, match="draft_vocab_size"):
        EagleConfig(draft_vocab_size=60000, target_vocab_size=49152)


def test_incremental_steps_equal_full_forward(tiny):
    head = make_head(tiny)
    emb, feats = torch.randn(1, 11, 64), torch.randn(1, 11, 64)
    with torch.no_grad():
        full = head(emb, feats)
        k, v = head.empty_cache()
        parts = []
        for a, b in [(0, 4), (4, 5), (5, 11)]:
            out, k, v = head.step(emb[:, a:b], feats[:, a:b], k, v)
            parts.append(out)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-4, atol=1e-4)


def test_unrolled_mask_matches_chain_drafting_context():
    mask = unrolled_mask(5, 3)  # step 3: real keys <= i-2, step-2 key i-1, itself
    i = 4
    assert mask[i, :5].tolist() == [True, True, True, False, False]
    assert mask[i, 5:10].tolist() == [False, False, False, True, False]
    assert mask[i, 10:].tolist() == [False, False, False, False, True]
    assert mask[:, 10:].diagonal().all()  # a query always sees itself (no empty rows)
    assert torch.equal(unrolled_mask(4, 1), torch.ones(4, 4, dtype=torch.bool).tril())


def test_unrolled_step_two_equals_incremental_drafting(tiny):
    """Training's step 2 at pair i == drafting: real pairs 0..i-1 cached, then (f^_i, x_{i+1})."""
    head = make_head(tiny)
    emb, real = torch.randn(1, 9, 64), torch.randn(1, 9, 64)
    with torch.no_grad():
        step1, step2 = unrolled_predictions(head, emb, real, steps=2)
        i = 6
        _, k, v = head.step(emb[:, :i], real[:, :i], *head.empty_cache())
        drafted, _, _ = head.step(emb[:, i:i + 1], step1[:, i - 1:i], k, v)
    torch.testing.assert_close(drafted[:, 0], step2[:, i], rtol=1e-4, atol=1e-4)


def test_save_load_round_trip(tiny, tmp_path):
    head = make_head(tiny)
    path = tmp_path / "head.safetensors"
    save_head(head, path, {"note": "test"})
    loaded = load_head(path)
    assert json.loads(path.with_suffix(".json").read_text())["note"] == "test"
    assert torch.equal(loaded.draft_vocab, head.draft_vocab)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(b.float(), a.float(), rtol=1e-2, atol=1e-2, msg=name)


def test_choose_draft_vocab_keeps_forced_ids_and_frequency_order():
    counts = np.array([5, 0, 9, 7, 1, 3])
    chosen = choose_draft_vocab(counts, 4, always=[1, 1]).tolist()
    assert chosen == [1, 2, 3, 0]


# --- drafter ----------------------------------------------------------------------------
def started(drafter, model, ids, prompt_len):
    """A session that saw prompt ids[:prompt_len] and then, step by step, one token at a time."""
    hidden = target_hidden(model, ids)
    session = drafter.start(ids[:prompt_len])
    session.observe([ids[prompt_len]], hidden[:prompt_len])
    return session, hidden


def test_proposals_are_deterministic(drafter, tiny):
    ids = random_ids(20, seed=1)
    a, _ = started(drafter, tiny, ids, 12)
    b, _ = started(drafter, tiny, ids, 12)
    first = a.propose(4).token_ids
    assert first.dtype == np.int32 and len(first) == 4
    assert np.array_equal(first, b.propose(4).token_ids)
    assert np.array_equal(first, a.propose(4).token_ids)  # proposing leaves the state alone
    assert set(first.tolist()) <= set(drafter.draft_vocab.tolist())


def test_rollback_after_rejection_equals_fresh_session(drafter, tiny):
    prompt = random_ids(10, seed=2)
    session, _ = started(drafter, tiny, prompt + random_ids(1, seed=3), 10)
    draft = session.propose(4).token_ids.tolist()
    # the target accepts two draft tokens and then corrects the third
    correction = (draft[2] + 1) % 49152
    sequence = prompt + random_ids(1, seed=3) + draft[:2] + [correction]
    hidden = target_hidden(tiny, sequence)
    session.observe(draft[:2] + [correction], hidden[-4:-1])
    after = session.propose(4).token_ids

    fresh = drafter.start(sequence[:10])
    fresh.observe(sequence[10:], hidden[:-1])
    assert np.array_equal(after, fresh.propose(4).token_ids)
    assert session.committed == fresh.committed == len(sequence) - 1
    torch.testing.assert_close(session.cache_k, fresh.cache_k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(session.cache_v, fresh.cache_v, rtol=1e-4, atol=1e-4)


def test_max_len_and_stop_ids_respected(drafter, tiny):
    ids = random_ids(16, seed=4)
    session, _ = started(drafter, tiny, ids, 12)
    for max_len in range(7):
        assert len(session.propose(max_len)) == max_len
    first = int(session.propose(1).token_ids[0])
    stopping = EagleDrafter(drafter.head, drafter.embedding, stop_ids=[first])
    session, _ = started(stopping, tiny, ids, 12)
    assert session.propose(5).token_ids.tolist() == [first]


def test_min_confidence_cuts_the_draft_to_a_prefix(drafter, tiny):
    """A threshold only shortens drafts (never changes a token); a high one leaves none; the
    cut is where the head's probability of its own token falls below the threshold."""
    ids = random_ids(18, seed=9)
    full, _ = started(drafter, tiny, ids, 12)
    proposal = full.propose(6).token_ids.tolist()
    lengths = []
    for threshold in (0.0, 0.001, 0.01, 0.05, 0.2, 0.999):
        cautious = EagleDrafter(drafter.head, drafter.embedding, min_confidence=threshold)
        session, _ = started(cautious, tiny, ids, 12)
        cut = session.propose(6).token_ids.tolist()
        assert cut == proposal[: len(cut)]
        lengths.append(len(cut))
    assert lengths == sorted(lengths, reverse=True) and lengths[0] == 6 and lengths[-1] == 0
    assert len(set(lengths)) > 2, "the thresholds should cut at different places"
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(BanditSpecValidationError, match="min_confidence"):
            EagleDrafter(drafter.head, drafter.embedding, min_confidence=bad)


def test_prompt_window_reads_only_the_latest_positions(drafter, tiny):
    """With a window of w, the head reads only the prompt's last w positions (earlier rows are
    dropped on arrival, and a target asked for those rows alone serves it the same): it drafts
    exactly what a session started on those positions alone drafts (rope is relative), and
    later calls feed everything new. The window cuts the head's work; it never changes the
    output (drafts are verified)."""
    ids = random_ids(40, seed=11)
    hidden = target_hidden(tiny, ids)
    window = 8
    windowed = EagleDrafter(drafter.head, drafter.embedding, prompt_window=window)
    session = windowed.start(ids[:30])
    session.observe([ids[30]], hidden[:30])
    draft = session.propose(4).token_ids
    assert session.cache_k.shape[2] == window  # only the last w pairs were fed
    asked = windowed.start(ids[:30])  # the decoding loop asks the target for rows 22.. only
    asked.observe([ids[30]], hidden[30 - window:30])
    assert np.array_equal(draft, asked.propose(4).token_ids)

    # the same w pairs (positions 22..29, each with its next token) as a fresh session's whole context
    tail = ids[30 - window:31]
    fresh = drafter.start(tail[:1])
    fresh.observe(tail[1:], hidden[30 - window:30])
    assert np.array_equal(draft, fresh.propose(4).token_ids)
    whole, _ = started(drafter, tiny, ids, 30)
    assert whole.propose(4).token_ids.tolist() != [] and whole.cache_k.shape[2] == 30

    session.observe(ids[31:33], hidden[30:32])  # later calls: every new pair
    session.propose(2)
    assert session.cache_k.shape[2] == window + 2
    for bad in (0, -1, True, 2.5):
        with pytest.raises(BanditSpecValidationError, match="prompt_window"):
            EagleDrafter(drafter.head, drafter.embedding, prompt_window=bad)


def test_catchup_window_restarts_the_cache_on_the_latest_pairs(drafter, tiny):
    """With a catch-up window of w, a session asked to draft with more than w real pairs
    pending drafts exactly what a fresh session holding only the latest w pairs drafts (its
    cache restarted on them); with w or fewer pending it feeds them all on top of its cache.
    The first catch-up is the prompt's: it feeds the prompt window (every pair without one)."""
    ids = random_ids(48, seed=13)
    hidden = target_hidden(tiny, ids)
    window = 6
    windowed = EagleDrafter(drafter.head, drafter.embedding, catchup_window=window)
    session = windowed.start(ids[:10])
    session.observe([ids[10]], hidden[:10])
    assert session.catchup_limit is None  # no prompt window: the whole prompt
    session.propose(3)  # the prompt's 10 pairs: more than w, all fed all the same
    assert session.cache_k.shape[2] == 10 and session.catchup_limit == window
    session.observe(ids[11:15], hidden[10:14])  # 4 pending: all fed on top
    session.propose(3)
    assert session.cache_k.shape[2] == 14
    session.observe(ids[15:30], hidden[14:29])  # 15 pending: a restart on the latest 6
    draft = session.propose(4).token_ids
    assert session.cache_k.shape[2] == window

    tail = ids[29 - window:30]  # positions 23..28, each with its next token
    fresh = drafter.start(tail[:1])
    fresh.observe(tail[1:], hidden[29 - window:29])
    assert np.array_equal(draft, fresh.propose(4).token_ids)
    whole, _ = started(drafter, tiny, ids, 30)
    whole.propose(4)
    assert whole.cache_k.shape[2] == 30  # without the window: every pair

    # with a prompt window p > w the first catch-up feeds p pairs; a session first asked to
    # draft late (the prompt's p pairs and 10 generated since pending) feeds the latest p
    both = EagleDrafter(drafter.head, drafter.embedding, prompt_window=8, catchup_window=window)
    session = both.start(ids[:20])
    session.observe([ids[20]], hidden[12:20])
    session.propose(2)
    assert session.cache_k.shape[2] == 8
    late = both.start(ids[:20])
    late.observe(ids[20:31], hidden[12:30])
    late_draft = late.propose(4).token_ids
    assert late.cache_k.shape[2] == 8
    tail = ids[22:31]  # positions 22..29, each with its next token
    fresh = drafter.start(tail[:1])
    fresh.observe(tail[1:], hidden[22:30])
    assert np.array_equal(late_draft, fresh.propose(4).token_ids)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(BanditSpecValidationError, match="catchup_window"):
            EagleDrafter(drafter.head, drafter.embedding, catchup_window=bad)


def test_missing_features_mean_no_draft(drafter, tiny):
    ids = random_ids(16, seed=5)
    session = drafter.start(ids[:8])
    assert len(session.propose(4)) == 0  # no hidden states yet
    session.observe([ids[8]], None)  # a step without hidden states leaves a gap
    session.observe([ids[9]], target_hidden(tiny, ids[:10])[-1:])
    assert len(session.propose(4)) == 0
    with pytest.raises(BanditSpecValidationError, match="hidden_states"):
        drafter.start(ids[:8]).observe([ids[8]], np.zeros((3, 5), dtype=np.float32))
    with pytest.raises(BanditSpecValidationError, match="prompt_ids"):
        drafter.start([49152])


def test_int8_drafting_keeps_the_heads_choices_close_and_the_loop_lossless(tiny):
    """int8 weights (every linear layer and, for EAGLE-1, the LM-head rows) change the
    proposals a little, never the output: drafts are verified."""
    head = make_head(tiny)
    fp32 = EagleDrafter(head, tiny.get_input_embeddings().weight)
    int8 = EagleDrafter(head, tiny.get_input_embeddings().weight, int8=True)
    runner = int8.stepper  # EAGLE-1 drafts through the fused runner's own int8 weights
    assert isinstance(runner, FastEagleStep) and isinstance(runner.qkv, Int8Linear) and runner.native
    assert isinstance(int8._lm_int8, Int8Linear) and fp32._lm_int8 is None and not fp32.stepper.native
    assert any(isinstance(m, torch.nn.Linear) for m in head.modules())  # the given head is not changed
    prompt = random_ids(16, seed=7)
    hidden = target_hidden(tiny, prompt)
    agree, cosines = 0, []
    for cut in range(6, 16):
        sessions = [d.start(prompt[:cut]) for d in (fp32, int8)]
        for session in sessions:
            session.observe([], hidden[: cut - 1])
        states = [s._commit_pending() for s in sessions]
        logits = [d.logits(st) for d, st in zip((fp32, int8), states)]
        cosines.append(float(torch.nn.functional.cosine_similarity(states[0].reshape(-1), states[1].reshape(-1), dim=0)))
        agree += int(logits[0].argmax() == logits[1].argmax())
    # a random head with large weights amplifies the error; the real head's acceptance in int8
    # is benchmarked (experiments/eagle/bench_eagle.py --precision)
    assert float(np.median(cosines)) > 0.99 and agree >= 5
    plain = greedy_speculative(tiny, int8, prompt, gamma=0, max_new_tokens=24, eos_id=None)
    spec = greedy_speculative(tiny, int8, prompt, gamma=4, max_new_tokens=24, eos_id=None)
    assert spec.output_ids == plain.output_ids


def test_fast_step_is_the_heads_step(tiny):
    """The drafting runner (fused projections, a cache written in place, rope from a table)
    computes what EagleHead.step computes, over prefills, single steps, a speculative tail
    forgotten by truncate, and a cache that outgrows its first allocation."""
    from banditspec.eagle.fast_step import FastEagleStep

    head = make_head(tiny)
    emb, feats = torch.randn(1, 200, 64), torch.randn(1, 200, 64)
    for int8 in (False, True):
        reference = int8_head(head) if int8 else head
        fast = FastEagleStep(head, int8, rope_positions=16, native=False)  # the rope table grows too
        cache = fast.new_cache()
        k, v = reference.empty_cache()
        with torch.inference_mode():
            for a, b in [(0, 7), (7, 8), (8, 12), (12, 140), (140, 141), (141, 200)]:
                expected, k, v = reference.step(emb[:, a:b], feats[:, a:b], k, v)
                got = fast.step(emb[:, a:b], feats[:, a:b], cache)
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
                # a speculative step past the real pairs, then forgotten
                fast.step(emb[:, :1], torch.randn(1, 1, 64), cache)
                cache.truncate(b)
            assert cache.length == 200 and cache.k.shape[2] >= 200
            torch.testing.assert_close(cache.k[:, :, :200], k, rtol=1e-4, atol=1e-4)


def dequantized_head(head, library):
    """A copy of ``head`` whose linear weights are what the int8 C kernel multiplies by."""
    import copy

    from banditspec.engine.panel_kernel import PanelInt8Linear

    twin = copy.deepcopy(head)
    for module in twin.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.data = PanelInt8Linear(module.weight, library).dequantized()
    return twin


def test_int8_kernel_linear_multiplies_by_its_dequantized_weight():
    """bs_i8_gemm: any row count (blocks of 16), widths off the 64-column groups, K off its blocks."""
    from banditspec.engine import panel_kernel

    library = panel_kernel.load()
    if library is None:
        pytest.skip(f"C kernels unavailable: {panel_kernel.unavailable_reason()}")
    torch.manual_seed(3)
    for out_features, in_features in [(70, 100), (576, 1152), (8, 8)]:
        weight = torch.randn(out_features, in_features)
        linear = panel_kernel.PanelInt8Linear(weight, library)
        deq = linear.dequantized()
        assert (deq - weight).abs().max() <= weight.abs().amax(dim=1).max() / 127 / 2 + 1e-6  # per-row rounding
        for rows in (1, 5, 16, 17, 40):
            x = torch.randn(rows, in_features)
            torch.testing.assert_close(linear(x), x @ deq.T, rtol=1e-4, atol=1e-4)


def test_native_step_is_the_heads_step_on_the_kernels_weights(tiny):
    """The one-call C step (int8) computes what the head computes with the kernel's
    dequantized weights in fp32: prefills past 16 rows, single steps, a speculative tail
    forgotten by truncate; and it stays close to the fp32 head itself."""
    from banditspec.eagle.fast_step import NATIVE_MAX_PAIRS, FastEagleStep
    from banditspec.engine import panel_kernel

    library = panel_kernel.load()
    if library is None:
        pytest.skip(f"C kernels unavailable: {panel_kernel.unavailable_reason()}")
    head = make_head(tiny)
    native = FastEagleStep(head, True, rope_positions=16, native=True)
    assert native.native and not FastEagleStep(head, True, native=False).native
    native.native_max_pairs = 1000  # served: longer steps go through torch
    twin = FastEagleStep(dequantized_head(head, library), False, rope_positions=16)
    exact = FastEagleStep(head, False)
    emb, feats = torch.randn(1, 120, 64), torch.randn(1, 120, 64)
    caches = [r.new_cache() for r in (native, twin, exact)]
    with torch.inference_mode():
        for a, b in [(0, 7), (7, 8), (8, 40), (40, 41), (41, 120)]:
            got, expected, fp32 = (r.step(emb[:, a:b], feats[:, a:b], c) for r, c in zip((native, twin, exact), caches))
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            # int8 rounding of this random head's large weights: ~9 %; a mispacked weight is ~100 %
            assert float((got - fp32).norm() / fp32.norm()) < 0.2
            native.step(emb[:, :1], torch.randn(1, 1, 64), caches[0])  # speculative, then forgotten
            caches[0].truncate(b)
        assert caches[0].length == 120
        torch.testing.assert_close(caches[0].k[:, :, :120], caches[1].k[:, :, :120], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(caches[0].v[:, :, :120], caches[1].v[:, :, :120], rtol=1e-4, atol=1e-4)
        # as served: a long step through torch (fbgemm), then short ones natively, on one cache
        native.native_max_pairs = NATIVE_MAX_PAIRS
        served, cache = FastEagleStep(head, True, native=False), native.new_cache()
        reference = served.new_cache()
        torch.testing.assert_close(native.step(emb[:, :30], feats[:, :30], cache),
                                   served.step(emb[:, :30], feats[:, :30], reference), rtol=1e-5, atol=1e-5)
        mirror = twin.new_cache()
        mirror.reserve(30)
        mirror.k[:, :, :30], mirror.v[:, :, :30], mirror.length = cache.k[:, :, :30], cache.v[:, :, :30], 30
        for a, b in [(30, 33), (33, 34)]:
            torch.testing.assert_close(native.step(emb[:, a:b], feats[:, a:b], cache),
                                       twin.step(emb[:, a:b], feats[:, a:b], mirror), rtol=1e-4, atol=1e-4)


def test_preview_is_the_first_token_of_the_next_proposal_and_its_probability(drafter, tiny):
    ids = random_ids(24, seed=13)
    session, hidden = started(drafter, tiny, ids, 12)
    assert drafter.start(ids[:12]).preview() is None  # no features yet: nothing to preview
    first = session.preview()
    proposal = session.propose(4).token_ids.tolist()
    assert first.token == proposal[0] and first.cut_off == drafter.min_confidence == 0.0
    logits = drafter.logits(session._commit_pending())
    assert first.confidence == pytest.approx(float(torch.softmax(logits, -1).max()), rel=1e-5)
    assert session.preview() == first and session.propose(4).token_ids.tolist() == proposal  # nothing moved
    session.observe(ids[13:15], hidden[12:14])  # the target spoke: a new preview, as a fresh session's
    fresh, _ = started(drafter, tiny, ids, 14)
    now, expected = session.preview(), fresh.preview()
    assert now.token == expected.token and now.confidence == pytest.approx(expected.confidence, abs=1e-4)
    assert now.token == session.propose(1).token_ids.tolist()[0]
    cautious = EagleDrafter(drafter.head, drafter.embedding, min_confidence=0.999)
    doubtful, _ = started(cautious, tiny, ids, 12)
    assert doubtful.preview().declines and len(doubtful.propose(4)) == 0
    doubtful.close(finished=True)
    assert doubtful.preview() is None


def test_speculative_loop_output_equals_plain_greedy(drafter, tiny):
    prompt = random_ids(12, seed=6)
    plain = greedy_speculative(tiny, drafter, prompt, gamma=0, max_new_tokens=24, eos_id=None)
    spec = greedy_speculative(tiny, drafter, prompt, gamma=4, max_new_tokens=24, eos_id=None)
    assert spec.output_ids == plain.output_ids and len(plain.output_ids) == 24
    assert max(spec.proposed) == 4 and sum(spec.accepted) <= sum(spec.proposed)


# --- training ---------------------------------------------------------------------------
def tiny_feature_set(model, n_seqs: int, length: int, seed: int) -> FeatureSet:
    rng = np.random.default_rng(seed)
    # a repetitive token source so that there is something to learn in a few steps
    pool = rng.integers(3, 49152, size=40)
    seqs = [pool[rng.integers(0, 40, size=length)] for _ in range(n_seqs)]
    feats = [target_hidden(model, s).astype(np.float16) for s in seqs]
    return FeatureSet(
        tokens=np.concatenate(seqs).astype(np.int32),
        features=np.concatenate(feats),
        offsets=np.arange(0, (n_seqs + 1) * length, length, dtype=np.int64),
        loss_from=np.zeros(n_seqs, dtype=np.int32),
        kinds=np.array(["chat"] * n_seqs),
    )


def test_tiny_training_reduces_loss(tiny):
    torch.manual_seed(0)
    head = EagleHead(EagleConfig.for_target(tiny.config, 256))
    embedding = tiny.get_input_embeddings().weight.detach()
    train_set = tiny_feature_set(tiny, 16, 24, seed=7)
    cfg = TrainConfig(epochs=6, batch_tokens=96, lr=3e-3, warmup=3, unroll_steps=2, noise=0.05)
    loss_fn = loss_function(head, embedding, None, cfg)
    before, _, _ = evaluate_head(loss_fn, train_set, cfg)
    result = train_head(head, loss_fn, train_set, None, cfg, progress=False)
    after, _, _ = evaluate_head(loss_fn, train_set, cfg)
    assert len(result.losses) >= 20
    assert after[0] < 0.8 * before[0] and after[1] < 0.8 * before[1]
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5])


# --- shipped weights --------------------------------------------------------------------
def test_shipped_weights_load():
    assert EAGLE1_WEIGHTS.exists() and EAGLE1_WEIGHTS.stat().st_size < 20 * 2**20
    head = load_head(EAGLE1_WEIGHTS)
    assert head.config.hidden_size == 576 and head.config.target_vocab_size == 49152
    vocab = head.draft_vocab
    assert len(vocab) == head.config.draft_vocab_size == len(set(vocab.tolist()))
    assert int(vocab.min()) >= 0 and int(vocab.max()) < 49152
    info = json.loads(EAGLE1_WEIGHTS.with_suffix(".json").read_text())
    assert info["distill"]["chat_prompts"] > 0 and len(info["metrics"]["val_top1_per_step"]) >= 1
    from banditspec.drafters.eagle import DEFAULT_INT8

    assert load_default_eagle_drafter(tiny_smollm2_shape(), EAGLE1_WEIGHTS).int8 == DEFAULT_INT8


def tiny_smollm2_shape():
    """A stand-in target with SmolLM2's embedding shape (what the loader checks and reads)."""
    from types import SimpleNamespace

    embedding = torch.nn.Embedding(49152, 576)
    config = SimpleNamespace(hidden_size=576, vocab_size=49152, eos_token_id=2)
    return SimpleNamespace(config=config, get_input_embeddings=lambda: embedding)


@pytest.mark.slow
def test_shipped_head_drafts_accepted_tokens_on_smollm2():
    from banditspec.datasets import sharegpt_split
    from banditspec.engine.models import load_model
    from banditspec.text import prompt_ids

    model, tokenizer = load_model("smollm2")
    drafter = load_default_eagle_drafter(model, EAGLE1_WEIGHTS, min_confidence=0.0)  # the head itself, full-length drafts
    question = sharegpt_split("eval")[3][0][1][:400]
    ids = prompt_ids(tokenizer, question, chat=True)
    plain = greedy_speculative(model, drafter, ids, 0, 40, tokenizer.eos_token_id)
    spec = greedy_speculative(model, drafter, ids, 4, 40, tokenizer.eos_token_id)
    assert spec.output_ids == plain.output_ids
    assert spec.mean_accepted_tokens > 1.3  # a random head gets ~1.0


def test_feature_extraction_resumes_from_shards(tiny, tmp_path):
    from banditspec_train.eagle.corpus import TrainingSequence
    from banditspec_train.eagle.features import extract_features

    seqs = [TrainingSequence(random_ids(n, seed=n), loss_from=1, kind="chat") for n in (9, 14, 5, 20)]
    first = extract_features(tiny, seqs, batch_tokens=32, progress=False, bf16=False,
                             shard_dir=tmp_path, shard_tokens=10)
    assert len(list(tmp_path.glob("shard-*.npz"))) >= 2
    np.testing.assert_allclose(first.sequence(1)[1].astype(np.float32),
                               target_hidden(tiny, seqs[1].token_ids), rtol=1e-2, atol=2e-3)

    class NoTarget:  # every sequence is in a shard: the target must not run again
        def __getattr__(self, name):
            raise AssertionError("target called")

    again = extract_features(NoTarget(), seqs, progress=False, shard_dir=tmp_path)
    assert np.array_equal(again.features, first.features) and np.array_equal(again.tokens, first.tokens)


def test_target_argmax_counts_count_greedy_choices(tiny):
    from banditspec_train.eagle.vocab import target_argmax_counts

    fs = tiny_feature_set(tiny, 3, 10, seed=8)
    embedding = tiny.get_input_embeddings().weight.detach()
    counts = target_argmax_counts(embedding, fs, sample=30, seed=0)
    assert counts.sum() == 30
    greedy = (torch.from_numpy(fs.features.astype(np.float32)) @ embedding.T).argmax(-1)
    assert counts[np.bincount(greedy.numpy()).argmax()] > 0


def test_batched_greedy_features_match_a_plain_forward(tiny):
    from banditspec_train.eagle.selfdistill import greedy_with_features

    prompts = [random_ids(n, seed=n) for n in (5, 9, 3)]
    eos = 7
    outputs = greedy_with_features(tiny, prompts, max_new_tokens=6, eos_id=eos, pad_id=0, bf16=False)
    embedding = tiny.get_input_embeddings().weight.detach()
    for prompt, (tokens, feats) in zip(prompts, outputs):
        assert tokens[: len(prompt)] == prompt and len(prompt) < len(tokens) <= len(prompt) + 6
        assert feats.shape == (len(tokens), 64)
        expected = target_hidden(tiny, tokens)
        np.testing.assert_allclose(feats.astype(np.float32), expected, rtol=1e-2, atol=5e-3)
        greedy = (torch.from_numpy(expected) @ embedding.T).argmax(-1).tolist()
        assert tokens[len(prompt):] == greedy[len(prompt) - 1: -1]  # each answer token is greedy


def test_batched_greedy_drops_ended_answers_and_keeps_the_rest_exact(tiny):
    """An answer that ends (EOS) leaves the batch; the others keep their cache rows and positions."""
    from banditspec_train.eagle.selfdistill import greedy_with_features

    prompts = [random_ids(n, seed=n + 20) for n in (6, 4, 8, 5)]
    free = greedy_with_features(tiny, prompts, max_new_tokens=8, eos_id=-1, pad_id=0, bf16=False)
    eos = free[1][0][len(prompts[1]) + 1]  # prompt 1's second answer token ends it early
    outputs = greedy_with_features(tiny, prompts, max_new_tokens=8, eos_id=eos, pad_id=0, bf16=False)
    lengths = [len(t) - len(p) for p, (t, _) in zip(prompts, outputs)]
    assert lengths[1] <= 2 and max(lengths) == 8, lengths  # one ended early, one ran to the cap
    embedding = tiny.get_input_embeddings().weight.detach()
    for prompt, (tokens, feats), (free_tokens, _) in zip(prompts, outputs, free):
        n = len(tokens)
        assert tokens == free_tokens[:n]  # the same answer, cut at its first EOS
        assert eos not in tokens[len(prompt):-1] and (n - len(prompt) == 8 or tokens[-1] == eos)
        expected = target_hidden(tiny, tokens)
        np.testing.assert_allclose(feats.astype(np.float32), expected, rtol=1e-2, atol=5e-3)
        greedy = (torch.from_numpy(expected) @ embedding.T).argmax(-1).tolist()
        assert tokens[len(prompt):] == greedy[len(prompt) - 1: -1]


def test_reserved_cache_gives_the_dynamic_caches_values(tiny):
    """Batched decoding over the reserved cache (room for 3 positions: it grows twice, and
    rows leave the batch) equals transformers' concatenating cache, bit for bit."""
    from banditspec_train.eagle.kvcache import reserved_cache
    from transformers import DynamicCache

    torch.manual_seed(0)
    ids = torch.randint(3, 49152, (3, 9))
    caches = [DynamicCache(config=tiny.config), reserved_cache(tiny.config, capacity=3)]
    outs = []
    with torch.inference_mode():
        for cache in caches:
            steps = [tiny.model(input_ids=ids[:, :5], cache=cache, use_cache=True).last_hidden_state]
            for t in range(5, 9):
                if t == 7:
                    cache.batch_select_indices(torch.tensor([0, 2]))
                rows = [0, 1, 2] if t < 7 else [0, 2]
                steps.append(tiny.model(input_ids=ids[rows, t:t + 1], cache=cache, use_cache=True,
                                        position_ids=torch.full((len(rows), 1), t)).last_hidden_state)
            outs.append(steps)
            assert cache.get_seq_length() == 9
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_bf16_distillation_answers_with_the_bf16_copy_and_features_of_the_target(tiny):
    """precision "bf16": a bf16 copy of the target writes the answers (its own greedy ones,
    EOS ends them as in one pass), and one autocast pass of the fp32 target gives features
    close to its fp32 ones at every position, prompt and answer."""
    from banditspec_train.eagle.selfdistill import DistillSpec, answer_batch, bf16_copy, greedy_answers

    prompts = [random_ids(n, seed=n + 40) for n in (5, 9, 3)]
    generator = bf16_copy(tiny)
    assert next(generator.parameters()).dtype == torch.bfloat16
    assert next(tiny.parameters()).dtype == torch.float32  # the copy leaves the target alone
    free = greedy_answers(generator, prompts, 6, eos_id=-1, pad_id=0)
    eos = free[0][len(prompts[0]) + 2]  # prompt 0's third answer token ends it
    out = answer_batch(tiny, generator, DistillSpec(max_new_tokens=6, precision="bf16"), prompts, eos, 0)
    for prompt, (tokens, feats), free_tokens in zip(prompts, out, free):
        n = len(tokens)
        assert tokens[: len(prompt)] == prompt and tokens == free_tokens[:n]
        assert n - len(prompt) == 6 or tokens[-1] == eos
        expected = target_hidden(tiny, tokens)
        assert feats.dtype == np.float16 and feats.shape == expected.shape
        error = np.linalg.norm(feats.astype(np.float32) - expected, axis=-1) / np.linalg.norm(expected, axis=-1)
        assert error.max() < 0.05, error.max()
    assert len(out[0][0]) <= len(prompts[0]) + 3


def test_fp32_distillation_is_the_one_pass_answer(tiny):
    from banditspec_train.eagle.selfdistill import DistillSpec, answer_batch, greedy_with_features

    prompts = [random_ids(n, seed=n + 50) for n in (4, 7)]
    spec = DistillSpec(max_new_tokens=5, precision="fp32")
    got = answer_batch(tiny, None, spec, prompts, eos_id=-1, pad_id=0)
    want = greedy_with_features(tiny, prompts, 5, eos_id=-1, pad_id=0)
    for (tokens, feats), (tokens2, feats2) in zip(got, want):
        assert tokens == tokens2 and np.array_equal(feats, feats2)
    with pytest.raises(BanditSpecValidationError, match="precision"):
        DistillSpec(precision="fp16")


@pytest.mark.long  # training data tooling, not the serving path
def test_code_prompts_come_from_stdlib_docstrings():
    from banditspec_train.eagle.selfdistill import code_prompts

    prompts = code_prompts(5, seed=0)
    assert len(prompts) == 5 and all("def " in p and '"""' in p or "'''" in p for p in prompts)
    assert prompts == code_prompts(5, seed=0)


def test_batch_queue_hands_out_each_batch_once_longest_first():
    import multiprocessing

    from banditspec_train.eagle.selfdistill import BatchQueue

    queue = BatchQueue(4, multiprocessing.get_context("spawn"))
    claimed = [queue.claim() for _ in range(6)]
    assert claimed == [3, 2, 1, 0, None, None]  # batches are sorted by prompt length: longest first
    assert queue.finished == 0
    queue.finish()
    assert queue.finished == 1


@pytest.mark.long  # training tooling, not the serving path
def test_two_distillation_workers_give_the_one_process_data(tmp_path):
    """Two processes claiming batches from one queue write every batch once, into shards, and
    the set equals what one process makes; a second call resumes from the shards alone."""
    from banditspec.engine.models import load_model
    from banditspec_train.eagle.selfdistill import DistillSpec, distill

    model, tokenizer = load_model("tiny")
    spec = DistillSpec(chat_prompts=5, code_prompts=2, max_new_tokens=3, batch_size=2, aux_layers=(0,))
    two = distill(model, tokenizer, spec, tmp_path / "two", progress=False, workers=2, model_name="tiny")
    assert len(list((tmp_path / "two").glob("batch-*.npz"))) == 4  # 7 prompts in batches of 2
    one = distill(model, tokenizer, spec, tmp_path / "one", progress=False, workers=1)
    for name in ("tokens", "features", "offsets", "loss_from", "kinds"):
        assert np.array_equal(getattr(two, name), getattr(one, name)), name

    class NoTarget:  # every batch is in a shard: the target must not run again
        def __getattr__(self, name):
            raise AssertionError("the target ran again")

    again = distill(NoTarget(), tokenizer, spec, tmp_path / "two", progress=False, workers=1)
    assert np.array_equal(again.features, two.features)
