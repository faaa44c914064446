"""The EAGLE-3 head: multi-layer target features through the engine contract, training-time
test equal to chain drafting, the drafter over it (lossless), checkpoint export.

A random 6-layer Llama (hidden 64, vocabulary 512) stands in for the target; the tests of the
shipped weights on SmolLM2 are in test_eagle.py and tests/slow.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from banditspec.drafters.eagle import EagleDrafter
from banditspec.eagle.head3 import Eagle3Config, Eagle3Head, default_aux_layers, load_head3, save_head3
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.reference import ReferenceEngine
from banditspec.engine.tensor_codec import decode_request, encode_request
from banditspec.errors import BanditSpecValidationError
from banditspec_train.eagle.evaluate import greedy_speculative, simulate_acceptance, target_features
from banditspec_train.eagle.export import export_upstream
from banditspec_train.eagle.features import FeatureSet
from banditspec_train.eagle.objective import Batch, weighted_steps
from banditspec_train.eagle.objective3 import unrolled_loss3, unrolled_states
from banditspec_train.eagle.train import TrainConfig, collate, evaluate_head, loss_function, train_head
from transformers import LlamaConfig, LlamaForCausalLM

torch.set_num_threads(1)
LAYERS = (1, 2, 4)


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.3, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def make_head(model, draft_vocab: int = 128, seed: int = 0, scale: float = 0.3) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config.for_target(model.config, draft_vocab, aux_layers=LAYERS))
    with torch.no_grad():  # larger weights than the init so that proposals vary with input
        for p in head.parameters():
            if p.ndim == 2:
                p.normal_(0, scale)
    head.draft_vocab = torch.randperm(model.config.vocab_size)[:draft_vocab]
    return head.eval()


@torch.inference_mode()
def layer_outputs(model, ids, layers=LAYERS) -> np.ndarray:
    """float32 [len(ids), k * H]: the outputs of decoder layers ``layers`` (transformers)."""
    out = model.model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True)
    return torch.cat([out.hidden_states[a + 1][0] for a in layers], dim=-1).numpy()


def random_ids(n: int, seed: int, vocab: int = 512) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, size=n).tolist()


# --- config and head --------------------------------------------------------------------
def test_config_names_the_bad_field():
    with pytest.raises(BanditSpecValidationError, match="aux_layers"):
        Eagle3Config(aux_layers=(1, 29), target_num_layers=30)  # the last layer's output is no aux state
    with pytest.raises(BanditSpecValidationError, match="aux_layers"):
        Eagle3Config(aux_layers=())
    with pytest.raises(BanditSpecValidationError, match="draft_vocab_size"):
        Eagle3Config(draft_vocab_size=60000)
    assert default_aux_layers(30) == (1, 14, 26)  # TensorRT-LLM's {1, L//2 - 1, L - 4}
    assert Eagle3Config(aux_layers=[1, 14, 26]).feature_size == 3 * 576


def test_training_time_test_equals_chain_drafting(target):
    """Step s of training at pair i == drafting the s-th token after the real pairs 0..i-s+1."""
    head = make_head(target)
    n = 10
    emb = torch.randn(1, n, 64)
    aux = torch.randn(1, n, 3 * 64)
    with torch.no_grad():
        states = unrolled_states(head, emb, aux, steps=3)
        i = 7
        real = i - 2  # the last real pair of a 3-token chain ending at pair i
        s1, k, v = head.step(emb[:, : real + 1], head.project(aux[:, : real + 1]), *head.empty_cache())
        s2, k, v = head.step(emb[:, real + 1: real + 2], s1[:, -1:], k, v)
        s3, _, _ = head.step(emb[:, i: i + 1], s2, k, v)
    torch.testing.assert_close(s1[:, -1], states[0][:, real], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s2[:, 0], states[1][:, real + 1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s3[:, 0], states[2][:, i], rtol=1e-4, atol=1e-4)


def test_save_load_and_upstream_export(target, tmp_path):
    head = make_head(target)
    path = tmp_path / "head3.safetensors"
    save_head3(head, path, {"note": "x"})
    loaded = load_head3(path)
    assert loaded.config == head.config and torch.equal(loaded.draft_vocab, head.draft_vocab)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(b.float(), a.float(), rtol=1e-2, atol=1e-2, msg=name)
    from safetensors.torch import load_file

    folder = export_upstream(head, target.config, tmp_path / "upstream")
    tensors = load_file(str(folder / "model.safetensors"))
    assert tensors["fc.weight"].shape == (64, 3 * 64)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (64, 128)  # attention reads [emb ; hidden]
    assert {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "norm.weight",
            "lm_head.weight"} <= set(tensors)
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    assert torch.equal(torch.arange(len(d2t)) + d2t, head.draft_vocab)  # target id = d + d2t[d]
    assert int(t2d.sum()) == 128 and bool(t2d[head.draft_vocab].all())
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 128
    assert config["eagle_aux_hidden_state_layer_ids"] == [a + 1 for a in LAYERS]  # vLLM: input of layer j


# --- the engine contract ------------------------------------------------------------------
@pytest.mark.parametrize("kernels", ["fast", "transformers"])
def test_engine_returns_the_asked_layers(target, kernels):
    engine = ReferenceEngine(target, max_context=256, kernels=kernels)
    ids = random_ids(20, seed=1)
    expected = layer_outputs(target, ids)
    (first,) = engine.verify([VerifyRequest(np.asarray(ids[:12], np.int32), hidden_from=0, hidden_layers=LAYERS)])
    assert first.hidden_states.shape == (12, 3 * 64)
    np.testing.assert_allclose(first.hidden_states, expected[:12], rtol=1e-4, atol=1e-4)
    # next step, with a draft: rows hidden_from .. len(input)-1+accepted, layers in the order asked
    order = (4, 1)
    (step,) = engine.verify([VerifyRequest(np.asarray(ids[:13], np.int32), np.asarray(ids[13:16], np.int32),
                                           hidden_from=12, hidden_layers=order)])
    rows = 1 + step.num_accepted
    assert step.hidden_states.shape == (rows, 2 * 64)
    reference = layer_outputs(target, ids[:13] + list(step.output_ids[:-1]) or ids[:13], order)
    np.testing.assert_allclose(step.hidden_states, reference[12: 12 + rows], rtol=1e-4, atol=1e-4)
    # absent layers: the last post-norm state, as before
    (plain,) = engine.verify([VerifyRequest(np.asarray(ids[:5], np.int32), hidden_from=0)])
    assert plain.hidden_states.shape == (5, 64)


def test_engine_batches_requests_asking_different_states(target):
    engine = ReferenceEngine(target, max_context=256)
    a, b = random_ids(9, seed=2), random_ids(14, seed=3)
    both = engine.verify([VerifyRequest(np.asarray(a, np.int32), hidden_from=0, hidden_layers=(2,)),
                          VerifyRequest(np.asarray(b, np.int32), hidden_from=0)])
    np.testing.assert_allclose(both[0].hidden_states, layer_outputs(target, a, (2,)), rtol=1e-4, atol=1e-4)
    assert both[1].hidden_states.shape == (14, 64)


def test_engine_rejects_bad_layers_by_name(target):
    engine = ReferenceEngine(target, max_context=256)
    for bad in [(5,), (-1,), (1, 1), (True,)]:  # layer 5 is the last: its output is not a feature
        with pytest.raises(BanditSpecValidationError, match="hidden_states_layers"):
            engine.verify([VerifyRequest(np.asarray([3, 4], np.int32), hidden_from=0, hidden_layers=bad)])


def test_codec_carries_the_layers():
    request = VerifyRequest(np.asarray([5, 6, 7], np.int32), hidden_from=1, hidden_layers=(1, 14, 26))
    tensors = encode_request(request, with_reference_extras=True)
    assert tensors["hidden_states_layers"].tolist() == [[1, 14, 26]]
    decoded = decode_request({k: v[0] for k, v in tensors.items()})
    assert decoded.hidden_layers == (1, 14, 26) and decoded.hidden_from == 1
    assert "hidden_states_layers" not in encode_request(VerifyRequest(np.asarray([5], np.int32), hidden_from=0),
                                                        with_reference_extras=True)
    with pytest.raises(BanditSpecValidationError, match="hidden_states_layers"):
        decode_request({"input_ids": np.asarray([5]), "hidden_states_layers": np.asarray([1.5])})


# --- the drafter --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def drafter(target):
    return EagleDrafter(make_head(target), target.get_input_embeddings().weight)


def test_fast_step_is_the_eagle3_heads_step(target):
    """The drafting runner (torch, fp32 and int8; the one-call C step on the kernel's int8
    weights) computes what Eagle3Head.step computes: q/k/v from both normed inputs, the
    residual over the hidden input, no output norm; over prefills, single steps and a
    speculative tail forgotten by truncate."""
    from banditspec.drafters.eagle import int8_head
    from banditspec.eagle.fast_step import FastEagleStep
    from banditspec.engine import panel_kernel

    from tests.unit.test_eagle import dequantized_head

    head = make_head(target)
    emb, hidden = torch.randn(1, 60, 64), torch.randn(1, 60, 64)
    library = panel_kernel.load()
    runners = [(FastEagleStep(head, False, rope_positions=16, native=False), head),
               (FastEagleStep(head, True, native=False), int8_head(head))]
    if library is not None:
        native = FastEagleStep(head, True, native=True)
        native.native_max_pairs = 1000  # every step natively (served: up to NATIVE_MAX_PAIRS)
        runners.append((native, dequantized_head(head, library)))
    for fast, reference in runners:
        cache = fast.new_cache()
        k, v = reference.empty_cache()
        with torch.inference_mode():
            for a, b in [(0, 7), (7, 8), (8, 12), (12, 13), (13, 60)]:
                expected, k, v = reference.step(emb[:, a:b], hidden[:, a:b], k, v)
                torch.testing.assert_close(fast.step(emb[:, a:b], hidden[:, a:b], cache), expected, rtol=1e-4, atol=1e-4)
                fast.step(emb[:, :1], torch.randn(1, 1, 64), cache)  # speculative, then forgotten
                cache.truncate(b)
        torch.testing.assert_close(cache.k[:, :, :60], k, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cache.v[:, :, :60], v, rtol=1e-4, atol=1e-4)
    assert library is None or runners[-1][0].native


def test_drafter_asks_for_its_layers_and_checks_the_width(drafter):
    assert drafter.feature_layers == LAYERS and drafter.feature_size == 3 * 64
    session = drafter.start(random_ids(8, seed=4))
    with pytest.raises(BanditSpecValidationError, match="hidden_states"):
        session.observe([9], np.zeros((8, 64), dtype=np.float32))  # last-layer width: not this head's


def test_speculative_loop_output_equals_plain_greedy(drafter, target):
    prompt = random_ids(12, seed=6)
    plain = greedy_speculative(target, drafter, prompt, gamma=0, max_new_tokens=24, eos_id=None)
    spec = greedy_speculative(target, drafter, prompt, gamma=4, max_new_tokens=24, eos_id=None)
    assert spec.output_ids == plain.output_ids and len(plain.output_ids) == 24
    assert max(spec.proposed) == 4


def test_int8_drafter_keeps_the_given_head_for_other_drafters(target):
    """An int8 drafter holds the head as given (tune_confidence builds drafters from
    ``base.head``): a drafter built from it drafts the same tokens."""
    head = make_head(target)
    base = EagleDrafter(head, target.get_input_embeddings().weight, int8=True)
    assert base.head is head
    again = EagleDrafter(base.head, base.embedding, int8=True)
    prompt = random_ids(12, seed=11)
    runs = [greedy_speculative(target, d, prompt, gamma=4, max_new_tokens=16, eos_id=None) for d in (base, again)]
    assert runs[0].output_ids == runs[1].output_ids and runs[0].proposed == runs[1].proposed


def test_int8_drafter_projects_the_layers_in_fp32(target):
    """Drafting in int8 keeps the head's fc in fp32: the captured layers differ ~500x in scale
    (SmolLM2: layer 1 ~0.8, layer 26's outlier channels ~480), and one 7-bit activation scale
    over [low ; mid ; high], what an int8 fc would use, rounds the low layer away."""
    from banditspec.drafters.eagle import _Int8Module

    head = make_head(target)
    drafter = EagleDrafter(head, target.get_input_embeddings().weight, int8=True)
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(1, 5, 3 * 64, generator=gen)
    features[..., :64] *= 0.8  # layer 1's scale
    features[..., 128:] *= 50.0
    features[..., 130] = 480.0  # an outlier channel of the high layer
    without_low = features.clone()
    without_low[..., :64] = 0.0
    with torch.inference_mode():
        projected = drafter.real_input(features)
        torch.testing.assert_close(projected, head.fc(features), rtol=0, atol=0)
        kept = (projected - drafter.real_input(without_low)).abs().mean()  # the low layer's part
        assert kept > 0.05
        int8 = _Int8Module(head.fc)  # for contrast: the low layer barely moves its output
        lost = (int8(features) - int8(without_low)).abs().mean()
        assert lost < 0.2 * kept


def test_decoding_loop_with_eagle3_is_lossless_and_feeds_the_head(target, drafter):
    from banditspec.config import GenerationRequest
    from banditspec.decoding.decoder import SpeculativeDecoder
    from banditspec.decoding.session import run_to_completion

    engine = ReferenceEngine(target, max_context=256)
    decoder = SpeculativeDecoder.for_engine(engine, {"eagle": drafter})
    prompt = random_ids(10, seed=8)

    def run(policy: str):
        request = GenerationRequest(prompt, max_tokens=20, policy=policy, arms=["eagle@3"], max_draft_len=3)
        return run_to_completion(engine, decoder.start(request))

    plain, spec = run("vanilla"), run("fixed:eagle@3")
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 20
    assert sum(spec.stats.drafted) > 0  # the head got its features and proposed


# --- training -----------------------------------------------------------------------------
def feature_set(model, n_seqs: int, length: int, seed: int) -> FeatureSet:
    """Rows [layers LAYERS ; last post-norm] like selfdistill with aux_layers."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(3, 512, size=30)  # a repetitive source: something to learn in a few steps
    seqs = [pool[rng.integers(0, 30, size=length)] for _ in range(n_seqs)]
    rows = []
    for s in seqs:
        with torch.inference_mode():
            out = model.model(input_ids=torch.tensor([s.tolist()]), output_hidden_states=True)
        rows.append(torch.cat([out.hidden_states[a + 1][0] for a in LAYERS] + [out.last_hidden_state[0]], -1))
    return FeatureSet(
        tokens=np.concatenate(seqs).astype(np.int32),
        features=torch.cat(rows).to(torch.float16).numpy(),
        offsets=np.arange(0, (n_seqs + 1) * length, length, dtype=np.int64),
        loss_from=np.zeros(n_seqs, dtype=np.int32),
        kinds=np.array(["chat"] * n_seqs),
    )


def test_tiny_training_reduces_loss_on_every_step(target):
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target.config, 512, aux_layers=LAYERS))
    embedding = target.get_input_embeddings().weight.detach()
    lm_rows = target.lm_head.weight.detach()[head.draft_vocab]
    train_set = feature_set(target, 16, 24, seed=7)
    cfg = TrainConfig(epochs=6, batch_tokens=96, lr=3e-3, warmup=3, unroll_steps=2, label_temperature=1.0)
    loss_fn = loss_function(head, embedding, lm_rows, cfg)
    before, top1_before, _ = evaluate_head(loss_fn, train_set, cfg)
    result = train_head(head, loss_fn, train_set, None, cfg, progress=False)
    after, top1_after, _ = evaluate_head(loss_fn, train_set, cfg)
    assert result.steps == len(result.losses) >= 20
    # the soft-label cross-entropy has the (random) teacher's entropy as its floor, ~5.5 nats
    # here: it fell 0.42 / 0.40 nats and top-1 agreement rose from 0 to 0.14 / 0.13 when written
    assert after[0] < before[0] - 0.25 and after[1] < before[1] - 0.25
    assert top1_after[0] > top1_before[0] + 0.08 and top1_after[1] > top1_before[1] + 0.08
    batch = Batch(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, 4 * 64), torch.ones(1, 2, dtype=torch.bool))
    assert len(unrolled_loss3(head, embedding, lm_rows, batch, steps=2).per_step_loss) == 2


def test_loss_on_counted_pairs_only_equals_the_full_grid_loss(target):
    """unrolled_loss3 computes logits only for the pairs in the loss: same loss, gradients and
    agreement as scoring every position of the grid and masking it."""
    torch.manual_seed(1)
    head = Eagle3Head(Eagle3Config.for_target(target.config, 512, aux_layers=LAYERS))
    embedding = target.get_input_embeddings().weight.detach()
    lm_rows = target.lm_head.weight.detach()[head.draft_vocab]
    fs = feature_set(target, 3, 12, seed=3)
    batch = collate(fs, [0, 1, 2])
    batch.counted[0, :5] = False  # a prompt not in the loss
    batch.counted[2, 9:] = False  # padding
    steps = 3
    fast = unrolled_loss3(head, embedding, lm_rows, batch, steps)
    fast.loss.backward()
    fast_grads = [p.grad.clone() for p in head.parameters()]
    head.zero_grad()

    hidden = head.config.hidden_size
    final = batch.features[:, 1:, -hidden:]
    teacher = (final @ lm_rows.T).softmax(-1)
    states = unrolled_states(head, embedding[batch.tokens[:, 1:]], batch.features[:, :-1, :-hidden], steps)

    def full_grid(state, mask):  # every position scored, then masked
        logits = head.logits(state).float()
        loss = -(teacher * logits.log_softmax(-1)).sum(-1)
        return loss[mask], (logits.argmax(-1) == (final @ lm_rows.T).argmax(-1))[mask]

    full = weighted_steps(states, full_grid, batch.counted, 0.8)
    full.loss.backward()
    assert float(fast.loss.detach()) == pytest.approx(float(full.loss.detach()), rel=1e-5)
    assert fast.per_step_loss == pytest.approx(full.per_step_loss, rel=1e-5)
    assert fast.per_step_top1 == pytest.approx(full.per_step_top1)
    for a, p in zip(fast_grads, head.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


def small_vocab_batch(target, head: Eagle3Head, n_seqs: int, length: int, seed: int) -> Batch:
    """Sequences drawn from the head's draft ids alone (a vocabulary of three), so that
    chained drafts hit often, with the target's features (rows as feature_set's)."""
    rng = np.random.default_rng(seed)
    pool = head.draft_vocab.numpy()
    seqs = [pool[rng.integers(0, len(pool), size=length)] for _ in range(n_seqs)]
    rows = []
    for ids in seqs:
        with torch.inference_mode():
            out = target.model(input_ids=torch.tensor([ids.tolist()]), output_hidden_states=True)
        rows.append(torch.cat([out.hidden_states[a + 1][0] for a in LAYERS] + [out.last_hidden_state[0]], -1))
    batch = Batch(torch.tensor(np.stack(seqs), dtype=torch.int64), torch.stack(rows).float(),
                  torch.ones(n_seqs, length - 1, dtype=torch.bool))
    batch.counted[0, :4] = False  # a prompt
    batch.counted[1, 11:] = False  # padding
    return batch


def chained_accepts(head: Eagle3Head, embedding: torch.Tensor, batch: Batch, steps: int) -> list[int]:
    """Draft tokens accepted from each counted pair, by drafting the chain with head.step."""
    hidden = head.config.hidden_size
    accepted = []
    with torch.no_grad():
        for row in range(batch.tokens.shape[0]):
            tokens = batch.tokens[row]
            emb = embedding[tokens[1:]][None]  # pair i: E[x_{i+1}]
            aux = batch.features[row, :-1, :-hidden][None]
            for origin in torch.nonzero(batch.counted[row]).flatten().tolist():
                state, k, v = head.step(emb[:, : origin + 1], head.project(aux[:, : origin + 1]), *head.empty_cache())
                state, count = state[:, -1:], 0
                for step in range(1, steps + 1):
                    pair = origin + step - 1  # this draft's pair; it predicts x_{pair + 2}
                    if pair + 2 >= len(tokens) or not batch.counted[row, pair]:
                        break
                    drafted = int(head.draft_vocab[head.logits(state[:, -1]).argmax(-1)])
                    if drafted != int(tokens[pair + 2]):
                        break
                    count += 1
                    state, k, v = head.step(emb[:, pair + 1: pair + 2], state, k, v)
                accepted.append(count)
    return accepted


def test_replay_and_reach_weighting_follow_chain_drafting(target):
    """The objective's replay counts the steps and accepted tokens of the real speculative loop
    replayed by the drafter (evaluate.simulate_acceptance, what bench_eagle runs), and reach
    weighting keeps step s's loss only on the pairs whose chain reaches step s."""
    head = make_head(target, draft_vocab=3, seed=3)
    head.draft_vocab = torch.tensor([7, 40, 300])
    embedding = target.get_input_embeddings().weight.detach()
    lm_rows = target.lm_head.weight.detach()[head.draft_vocab]
    batch = small_vocab_batch(target, head, 3, 16, seed=4)
    steps = 3
    with torch.no_grad():
        plain = unrolled_loss3(head, embedding, lm_rows, batch, steps, step_decay=1.0)
        weighted = unrolled_loss3(head, embedding, lm_rows, batch, steps, step_decay=1.0, reach=True)
    accepts = chained_accepts(head, embedding, batch, steps)
    assert sum(a >= 2 for a in accepts) >= 3  # chains do reach the later steps
    drafter = EagleDrafter(head, embedding)
    loop_steps = loop_tokens = 0
    for row in range(batch.tokens.shape[0]):
        pairs = torch.nonzero(batch.counted[row]).flatten()
        ids = batch.tokens[row, : int(pairs[-1]) + 2].tolist()  # pair i reads x_{i+1}, predicts x_{i+2}
        prompt, answer = ids[: int(pairs[0]) + 1], ids[int(pairs[0]) + 1:]
        loop = simulate_acceptance(drafter, prompt, answer, target_features(target, ids, drafter), steps)
        loop_steps, loop_tokens = loop_steps + len(loop.accepted), loop_tokens + sum(loop.accepted)
    assert loop_tokens >= 5
    assert plain.replay == (loop_steps, loop_tokens)
    assert weighted.replay == plain.replay
    assert weighted.per_step_top1 == plain.per_step_top1  # agreement is still over every pair

    hidden = head.config.hidden_size
    teacher = (batch.features[:, 1:, -hidden:] @ lm_rows.T).softmax(-1)
    with torch.no_grad():
        states = unrolled_states(head, embedding[batch.tokens[:, 1:]], batch.features[:, :-1, :-hidden], steps)
    counted_pairs = torch.nonzero(batch.counted).tolist()
    for step in range(1, steps + 1):  # by hand: origin o's chain reaches step s at pair o + s - 1
        mask = batch.counted.clone()
        mask[:, : step - 1] = False
        reach = torch.zeros_like(mask)
        for (row, origin), a in zip(counted_pairs, accepts):
            if a >= step - 1 and origin + step - 1 < mask.shape[1]:
                reach[row, origin + step - 1] = True
        with torch.no_grad():
            pair_loss = -(teacher * head.logits(states[step - 1]).float().log_softmax(-1)).sum(-1)
        expected = float((pair_loss * (reach & mask)).sum()) / int(mask.sum())
        assert weighted.per_step_loss[step - 1] == pytest.approx(expected, rel=1e-5)
        if step == 1:
            assert weighted.per_step_loss[0] == pytest.approx(plain.per_step_loss[0], rel=1e-6)
        else:
            assert weighted.per_step_loss[step - 1] < plain.per_step_loss[step - 1]
    with pytest.raises(BanditSpecValidationError, match="step_decay"):
        TrainConfig(step_decay=0.0)


def test_soft_cross_entropy_matches_autograd_of_the_textbook_form():
    """The fused loss: values and gradients of -(p * log_softmax(z)).sum(-1), one-hot rows too."""
    from banditspec_train.eagle.objective3 import soft_cross_entropy, teacher_distribution

    torch.manual_seed(0)
    teacher = torch.randn(6, 40)
    for probs in (teacher_distribution(teacher, 0.5), teacher_distribution(teacher, 0.0)):
        z1 = (torch.randn(6, 40) * 3).requires_grad_()
        z2 = z1.detach().clone().requires_grad_()
        weights = torch.rand(6)
        fused = soft_cross_entropy(z1, probs)
        textbook = -(probs * z2.log_softmax(-1)).sum(-1)
        torch.testing.assert_close(fused, textbook)
        (fused * weights).sum().backward()
        (textbook * weights).sum().backward()
        torch.testing.assert_close(z1.grad, z2.grad)


def test_training_skips_the_agreement_but_not_the_loss(target):
    torch.manual_seed(2)
    head = Eagle3Head(Eagle3Config.for_target(target.config, 512, aux_layers=LAYERS))
    embedding = target.get_input_embeddings().weight.detach()
    lm_rows = target.lm_head.weight.detach()[head.draft_vocab]
    batch = collate(feature_set(target, 2, 10, seed=5), [0, 1])
    measured = unrolled_loss3(head, embedding, lm_rows, batch, 2)
    skipped = unrolled_loss3(head, embedding, lm_rows, batch, 2, top1=False)
    assert skipped.per_step_top1 == [] and len(measured.per_step_top1) == 2
    assert skipped.per_step_loss == pytest.approx(measured.per_step_loss, rel=1e-6)


def test_build_keeps_freed_memory_on_glibc():
    import subprocess
    import sys

    # in a child: the setting would hold for the rest of this test process
    code = "from banditspec_train.eagle.allocator import keep_freed_memory as k; print(k())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"  # Linux/glibc, where CI and the build run


def test_label_temperature_sharpens_the_teacher_and_zero_is_its_argmax():
    from banditspec_train.eagle.objective3 import teacher_distribution
    from banditspec_train.eagle.train import TrainConfig

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 2.9, 0.0]])
    torch.testing.assert_close(teacher_distribution(logits, 1.0), logits.softmax(-1))
    sharp = teacher_distribution(logits, 0.5)
    torch.testing.assert_close(sharp, (2 * logits).softmax(-1))
    assert bool((sharp.max(-1).values > logits.softmax(-1).max(-1).values).all())
    hard = teacher_distribution(logits, 0.0)
    assert hard.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    with pytest.raises(BanditSpecValidationError, match="label_temperature"):
        TrainConfig(label_temperature=-0.5)


def test_distilled_loss_starts_at_the_first_draftable_answer_token():
    from banditspec_train.eagle.selfdistill import DistillSpec, loss_starts

    # prompt of P tokens: x_P (the answer's first token) comes from the prefill; pair P - 1 =
    # (E[x_P], g_{P-1}) predicts x_{P+1}, the first token a drafter is asked for
    assert loss_starts(DistillSpec(loss_on="answers"), [7, 12], prefix=3).tolist() == [6, 11]
    assert loss_starts(DistillSpec(), [7, 12], prefix=3).tolist() == [3, 3]  # the prompt too, after the system turn
    with pytest.raises(BanditSpecValidationError, match="loss_on"):
        DistillSpec(loss_on="prompt")


# --- the shipped head ---------------------------------------------------------------------
def test_shipped_head_is_eagle3_and_fits_smollm2():
    from banditspec.drafters.eagle import DEFAULT_WEIGHTS, EAGLE3_WEIGHTS, head_feature_layers, head_min_confidence

    assert EAGLE3_WEIGHTS.exists() and EAGLE3_WEIGHTS.stat().st_size < 20 * 2**20
    head = load_head3(EAGLE3_WEIGHTS)
    c = head.config
    assert (c.hidden_size, c.target_vocab_size, c.target_num_layers) == (576, 49152, 30)
    assert c.aux_layers == (1, 14, 26) == head_feature_layers(EAGLE3_WEIGHTS)
    assert DEFAULT_WEIGHTS == EAGLE3_WEIGHTS  # the served head
    vocab = head.draft_vocab
    assert len(vocab) == c.draft_vocab_size == len(set(vocab.tolist()))
    info = json.loads(EAGLE3_WEIGHTS.with_suffix(".json").read_text())
    assert info["format"] == "eagle3" and info["distill"]["aux_layers"] == [1, 14, 26]
    assert head_min_confidence(EAGLE3_WEIGHTS) == info["min_confidence"] == 0.3
    assert info["train"]["unroll_steps"] == 4 and info["metrics"]["val_top1_per_step"][0] > 0.575
    assert info["init"]["warm_start_layer"] == 27  # the build's default for SmolLM2 (train.warm_start_layer)
    assert info["data"]["distill_parts"] == 2 and info["data"]["kinds"] == {"chat": 6000, "code": 600}  # twice the prompts


@pytest.mark.slow
def test_shipped_head_drafts_accepted_tokens_on_smollm2():
    from banditspec.datasets import sharegpt_split
    from banditspec.drafters.eagle import EAGLE3_WEIGHTS, load_default_eagle_drafter
    from banditspec.engine.models import load_model
    from banditspec.text import prompt_ids

    model, tokenizer = load_model("smollm2")
    drafter = load_default_eagle_drafter(model, EAGLE3_WEIGHTS, min_confidence=0.0)  # full-length drafts
    assert drafter.feature_layers == (1, 14, 26)
    question = sharegpt_split("eval")[3][0][1][:400]  # held out: the head trains on the train split
    ids = prompt_ids(tokenizer, question, chat=True)
    plain = greedy_speculative(model, drafter, ids, 0, 40, tokenizer.eos_token_id)
    spec = greedy_speculative(model, drafter, ids, 4, 40, tokenizer.eos_token_id)
    assert spec.output_ids == plain.output_ids
    assert spec.mean_accepted_tokens > 1.5  # a random head gets ~1.0


def test_build_puts_big_buffers_on_huge_pages_when_asked_first():
    import subprocess
    import sys

    code = ("import logging, torch; logging.basicConfig(); {first}"
            "from banditspec_train.eagle.allocator import use_huge_pages as u; print(u())")
    env = {k: v for k, v in __import__("os").environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    first = subprocess.run([sys.executable, "-c", code.format(first="")], capture_output=True, text=True,
                           check=True, env=env)
    assert first.stdout.strip() == "True"
    # PyTorch decides at its first buffer of >= 2 MB: asked too late, it says so
    late = subprocess.run([sys.executable, "-c", code.format(first="x = torch.ones(1 << 22); ")],
                          capture_output=True, text=True, check=True, env=env)
    assert late.stdout.strip() == "False" and "huge pages not in effect" in late.stderr



# --- fixed text beside the self-distilled answers ------------------------------------------
def _feature_set(lengths: list[int], kind: str, start: int = 0, width: int = 4) -> FeatureSet:
    n = sum(lengths)
    tokens = np.arange(start, start + n, dtype=np.int32)  # distinct per sequence: membership is checkable
    return FeatureSet(tokens=tokens, features=np.tile(tokens[:, None], (1, width)).astype(np.float16),
                      offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                      loss_from=np.ones(len(lengths), dtype=np.int32), kinds=np.asarray([kind] * len(lengths)))


def _first_tokens(fs: FeatureSet) -> set[int]:
    return {int(fs.sequence(s)[0][0]) for s in range(len(fs))}


def test_validation_is_drawn_from_the_answers_and_fixed_text_only_trains():
    from banditspec_train.eagle.train import split_validation

    answers = _feature_set([5, 7, 6, 9, 4, 8, 5, 6, 7, 5], "chat")
    text = _feature_set([12, 10, 11], "chat", start=1000)
    alone_val, alone_train = split_validation(answers, None, 0.2, seed=3)
    val, train = split_validation(answers, text, 0.2, seed=3)
    # the answers split exactly as without fixed text (the split the shipped heads were measured on)
    assert np.array_equal(val.tokens, alone_val.tokens) and len(val) == 2
    assert _first_tokens(train) == _first_tokens(alone_train) | _first_tokens(text)
    assert not _first_tokens(val) & _first_tokens(train)
    first = np.concatenate([alone_train.tokens, text.tokens])
    assert np.array_equal(train.tokens, first) and np.array_equal(train.features[:, 0], first.astype(np.float16))
    # fixed text alone (an EAGLE-1 text build): its own sequences are held out
    text_val, text_train = split_validation(None, text, 0.34, seed=0)
    assert len(text_val) == 1 and len(text_train) == 2


def test_fixed_text_carries_the_heads_layers(target, tmp_path, monkeypatch):
    """``banditspec build eagle --text-chat-tokens N`` for an EAGLE-3 head: the text's rows are
    [the captured layers ; last post-norm state], as the self-distilled answers' are."""
    from banditspec_train.eagle import dataset
    from banditspec_train.eagle.corpus import CorpusSpec, TrainingSequence
    from banditspec_train.eagle.selfdistill import DistillSpec

    sequences = [TrainingSequence(random_ids(n, seed=n), loss_from=1, kind="chat") for n in (9, 14)]
    monkeypatch.setenv("BANDITSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(dataset, "build_corpus", lambda tokenizer, spec: sequences)
    distilled, more, text = dataset.training_parts(target, None, "tiny", DistillSpec(chat_prompts=0, code_prompts=0),
                                                   CorpusSpec(chat_tokens=20, aux_layers=LAYERS), progress=False)
    assert distilled is None and more is None and text is not None and len(text) == 2
    hidden = target.config.hidden_size
    assert text.features.shape == (23, (len(LAYERS) + 1) * hidden)
    got, want = text.sequence(1)[1][:, :-hidden].astype(np.float32), layer_outputs(target, sequences[1].token_ids)
    assert np.linalg.norm(got - want) < 0.03 * np.linalg.norm(want)  # one bf16-autocast pass
    with pytest.raises(BanditSpecValidationError, match="aux_layers"):
        CorpusSpec(aux_layers=(-1,))
