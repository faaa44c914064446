"""The EAGLE-3 training variants of experiments/eagle/variant_study.py do what the README says
they did: dropout off is the served objective, the 4th fused feature is the only difference in
the last-state loss, and installing a variant patches only what it names. The build's warm start
(``--warm-start-layer``) copies the named target layer and starts g at the highest captured layer.

The random 6-layer Llama of test_eagle3.py stands in for the target."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch
from banditspec.eagle.head3 import Eagle3Config, Eagle3Head
from banditspec.errors import BanditSpecValidationError
from banditspec_train.eagle import objective3, train
from banditspec_train.eagle.objective3 import unrolled_loss3, unrolled_states
from banditspec_train.eagle.train import collate

from .test_eagle3 import LAYERS, feature_set, target  # noqa: F401  (the fixture)

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("variant_study", REPO / "experiments" / "eagle" / "variant_study.py")
assert _spec is not None and _spec.loader is not None
variant_study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(variant_study)


def new_head(model, seed: int = 0, aux=LAYERS) -> Eagle3Head:
    torch.manual_seed(seed)
    return Eagle3Head(Eagle3Config.for_target(model.config, 512, aux_layers=aux))


def inputs(model, head, seed: int = 3):
    fs = feature_set(model, 2, 10, seed=seed)
    batch = collate(fs, [0, 1])
    hidden = head.config.hidden_size
    embedding = model.get_input_embeddings().weight.detach()
    return batch, embedding, embedding[batch.tokens[:, 1:]], batch.features[:, :-1, :-hidden]


def test_dropout_off_or_in_eval_is_the_served_objective(target):  # noqa: F811
    head = new_head(target)
    batch, _, emb, aux = inputs(target, head)
    head.train()
    served = unrolled_states(head, emb, aux, 3)
    for state, same in zip(variant_study.dropout_states(0.0)(head, emb, aux, 3), served):
        assert torch.equal(state, same)
    dropped = variant_study.dropout_states(0.5)(head, emb, aux, 3)
    assert not torch.allclose(dropped[0], served[0])  # on while training
    head.eval()
    for state, same in zip(variant_study.dropout_states(0.5)(head, emb, aux, 3), unrolled_states(head, emb, aux, 3)):
        assert torch.equal(state, same)  # off in evaluation


def test_last_state_loss_differs_only_by_the_fourth_block(target):  # noqa: F811
    """With fc's 4th block zero, the 4-block head is the 3-block head: the same loss, so the
    variant's teacher is still the post-norm last state and its input adds only that block."""
    head3 = new_head(target)
    head4 = new_head(target, aux=(*LAYERS, 4))
    hidden = head3.config.hidden_size
    head4.load_state_dict({k: v for k, v in head3.state_dict().items() if k != "fc.weight"}, strict=False)
    with torch.no_grad():
        head4.fc.weight.zero_()
        head4.fc.weight[:, : 3 * hidden].copy_(head3.fc.weight)
    batch, embedding, _, _ = inputs(target, head3)
    lm_rows = target.lm_head.weight.detach()[head3.draft_vocab]
    served = unrolled_loss3(head3, embedding, lm_rows, batch, 2)
    variant = variant_study.last_state_loss()(head4, embedding, lm_rows, batch, 2)
    assert variant.per_step_loss == pytest.approx(served.per_step_loss, rel=1e-5)
    with torch.no_grad():
        head4.fc.weight[:, 3 * hidden:].normal_(0, 0.3)  # now the last state reaches the head
    moved = variant_study.last_state_loss()(head4, embedding, lm_rows, batch, 2)
    assert abs(moved.per_step_loss[0] - served.per_step_loss[0]) > 1e-3  # equal to 1e-5 above


def test_warm_start_copies_the_target_layer_and_starts_g_at_the_highest_layer(target):  # noqa: F811
    head = new_head(target)
    assert train.warm_start_layer(None, head.config) == 5  # the layer after the highest captured (4)
    assert train.warm_start_layer(-1, head.config) is None and train.warm_start_layer(3, head.config) == 3
    with pytest.raises(BanditSpecValidationError, match="warm_start_layer"):
        train.warm_start(head, target, 6, fc_noise=0.0)  # the tiny target has layers 0-5
    for asked, head_format in ((6, "eagle3"), (-2, "eagle3"), (3, "eagle1")):  # checked before any data is made
        with pytest.raises(BanditSpecValidationError, match="warm_start_layer"):
            train.check_warm_start(asked, head_format, 6)
    for asked, head_format in ((None, "eagle1"), (-1, "eagle1"), (5, "eagle3")):
        train.check_warm_start(asked, head_format, 6)
    train.warm_start(head, target, 5, fc_noise=0.0)
    layer, m, hidden = target.model.layers[5], head.midlayer, head.config.hidden_size
    assert torch.equal(m.mlp.down_proj.weight, layer.mlp.down_proj.weight)
    assert torch.equal(m.self_attn.o_proj.weight, layer.self_attn.o_proj.weight)
    assert torch.equal(m.self_attn.q_proj.weight[:, hidden:], layer.self_attn.q_proj.weight)
    assert torch.equal(m.hidden_norm.weight, layer.input_layernorm.weight)
    assert torch.equal(m.input_layernorm.weight, target.model.layers[0].input_layernorm.weight)
    assert m.self_attn.q_proj.weight[:, :hidden].abs().max() > 0  # the embedding half keeps its init
    _, _, _, aux = inputs(target, head)
    assert torch.allclose(head.project(aux), aux[..., 2 * hidden:], atol=1e-6)  # g = the highest layer


def test_install_patches_only_what_the_variant_names(target, monkeypatch):  # noqa: F811
    served_states, served_loss, served_new_head = objective3.unrolled_states, train.unrolled_loss3, train._new_head
    monkeypatch.setattr(objective3, "unrolled_states", served_states)  # restored after the test
    monkeypatch.setattr(train, "unrolled_loss3", served_loss)
    monkeypatch.setattr(train, "_new_head", served_new_head)
    served_for_target = vars(Eagle3Config)["for_target"]
    try:
        variant_study.install(argparse.Namespace(variant="mlp-width", intermediate_size=256))
        assert Eagle3Config.for_target(target.config, 128, aux_layers=LAYERS).intermediate_size == 256
        assert (objective3.unrolled_states, train.unrolled_loss3, train._new_head) == (
            served_states, served_loss, served_new_head)
    finally:
        Eagle3Config.for_target = served_for_target  # type: ignore[method-assign]
    assert Eagle3Config.for_target(target.config, 128, aux_layers=LAYERS).intermediate_size == 128
    variant_study.install(argparse.Namespace(variant="frozen-output"))
    assert train._new_head is not served_new_head and objective3.unrolled_states is served_states
    variant_study.install(argparse.Namespace(variant="dropout", dropout=0.2))
    assert objective3.unrolled_states is not served_states and train.unrolled_loss3 is served_loss


def test_a_second_layer_starts_as_the_identity_or_as_the_next_target_layer(target):  # noqa: F811
    """two-layers: without a warm start depth_study's second layer adds nothing (its output
    projections are zero), so the states are the one-layer head's at every draft step; warm-started
    from layer 4 it is the target's layer 5 and changes them."""
    states = variant_study._depth_study().unrolled_states
    head = new_head(target)
    _, _, emb, aux = inputs(target, head)
    served = unrolled_states(head, emb, aux, 3)
    same = variant_study.deeper_head(head, target, None)
    for state, one in zip(states(same, emb, aux, 3), served):
        assert torch.equal(state, one)
    warm = variant_study.deeper_head(head, target, 4)
    layer = target.model.layers[5]
    assert torch.equal(warm.extra[0].k_proj.weight, layer.self_attn.k_proj.weight)
    assert torch.equal(warm.extra[0].mlp.down_proj.weight, layer.mlp.down_proj.weight)
    assert torch.equal(warm.midlayer.mlp.up_proj.weight, head.midlayer.mlp.up_proj.weight)  # the rest is the head's
    moved = states(warm, emb, aux, 3)
    assert all(not torch.allclose(m, s) for m, s in zip(moved, served))
    assert variant_study.deeper_head(head, target, 5).extra[0].o_proj.weight.abs().max() == 0  # no layer after 5


def test_main_installs_the_variant_before_training(monkeypatch, tmp_path):
    """The command line patches the trainer before train.run builds the head (it once did not,
    and every variant ran the build's own recipe); importing depth_study patches nothing."""
    variant_study._depth_study()
    monkeypatch.setattr(objective3, "unrolled_states", objective3.unrolled_states)  # restored after the test
    monkeypatch.setattr(train, "_new_head", train._new_head)
    served_new_head = train._new_head
    seen = {}
    monkeypatch.setattr(train, "run", lambda args: seen.setdefault("patched", train._new_head is not served_new_head) and 0)
    assert variant_study.main(["--variant", "frozen-output", "--out", str(tmp_path / "head.safetensors")]) == 0
    assert seen == {"patched": True}
    assert objective3.unrolled_states is variant_study.served_states


def test_depth_study_reads_back_a_saved_two_layer_head(target, tmp_path):  # noqa: F811
    """depth_study.py --mat --heads: a head saved with save_head3 comes back with its extra layer
    (and a one-layer head without one), weights equal."""
    from banditspec.eagle.head3 import save_head3

    depth_study = variant_study._depth_study()
    head = new_head(target)
    for extra, warm in ((1, variant_study.deeper_head(head, target, 4)), (0, head)):
        path = tmp_path / f"{extra}.safetensors"
        save_head3(warm, path)
        back = depth_study.load_study_head(path)
        assert len(getattr(back, "extra", [])) == extra
        for name, tensor in warm.state_dict().items():
            assert torch.allclose(back.state_dict()[name].float(), tensor.float(), atol=1e-2, rtol=1e-2), name  # bf16 files
