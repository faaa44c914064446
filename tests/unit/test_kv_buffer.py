"""The growable KV buffer: a step appends in place only where nothing stored can be
overwritten, and the engine's outputs are bitwise those of the concatenating path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from banditspec.engine import reference
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.kv_buffer import GROWTH, KVBuffer
from banditspec.engine.reference import ReferenceEngine

from tests.unit.test_reference_engine import make_llama


def kv(length: int, value: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((1, 2, length, 8), value), torch.full((1, 2, length, 8), -value)) for _ in range(3)]


def test_for_step_reuses_only_at_the_frozen_end_with_room():
    first = KVBuffer.for_step(None, None, 0, 5, 3, 2, 8)
    assert first.capacity == 5 + GROWTH and first.frozen == 0
    for layer in range(3):
        first.append(layer, 0, *kv(5, 1.0)[layer])
    first.freeze(4)  # a draft position rejected: 4 kept
    assert KVBuffer.for_step(first, None, 4, 3, 3, 2, 8) is first  # appends at the frozen end
    views = [(k[:, :, :4], v[:, :, :4]) for k, v in zip(first.keys, first.values)]
    shorter = KVBuffer.for_step(first, [(k[:, :, :3], v[:, :, :3]) for k, v in views], 3, 2, 3, 2, 8)
    assert shorter is not first and shorter.frozen == 0  # a prefix shorter than the frozen part: a copy
    assert torch.equal(shorter.keys[1][:, :, :3], torch.ones(1, 2, 3, 8))
    assert torch.equal(shorter.values[2][:, :, :3], -torch.ones(1, 2, 3, 8))
    full = KVBuffer.for_step(first, views, 4, GROWTH + 2, 3, 2, 8)  # no room left: a bigger copy
    assert full is not first and full.capacity == 4 + GROWTH + 2 + GROWTH
    assert torch.equal(full.keys[0][:, :, :4], torch.ones(1, 2, 4, 8))


def test_append_never_writes_below_the_frozen_length():
    buffer = KVBuffer(1, 2, 8, 10)
    k, v = buffer.append(0, 0, *kv(6, 2.0)[0])
    assert k.shape == (1, 2, 6, 8) and k.data_ptr() == buffer.keys[0].data_ptr()  # a view, no copy
    buffer.freeze(6)
    with pytest.raises(RuntimeError, match="outside the free room"):
        buffer.append(0, 5, *kv(2, 3.0)[0])
    with pytest.raises(RuntimeError, match="outside the free room"):
        buffer.append(0, 6, *kv(5, 3.0)[0])  # past the capacity
    buffer.freeze(3)  # freezing never shrinks
    assert buffer.frozen == 6
    assert torch.equal(buffer.keys[0][:, :, :6], torch.full((1, 2, 6, 8), 2.0))


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return make_llama(512, seed=3)


def run_steps(engine: ReferenceEngine, steps):
    """steps: (sequence, draft) pairs; returns (output ids, hidden states) per step."""
    out = []
    for sequence, draft in steps:
        (result,) = engine.verify([VerifyRequest(np.asarray(sequence, np.int32), np.asarray(draft, np.int32),
                                                 hidden_from=max(0, len(sequence) - 2))])
        out.append((result.output_ids.tolist(), result.hidden_states))
    return out


def test_engine_outputs_bitwise_equal_to_concatenation(model, monkeypatch):
    """A chain with rejected drafts, then a second request diverging from the shared prefix
    after the first has appended past it, then the first continuing: same tokens and hidden
    states bitwise as the concatenating path, and the chain ran in one buffer."""
    engine = ReferenceEngine(model, max_context=512)
    if engine.kernel_impl != "panel":
        pytest.skip("the panel kernels are unavailable here")
    prompt = list(range(3, 40))
    steps = [(prompt, []), (prompt + [7], [8, 9, 10]), (prompt + [7, 11], [12]), (prompt + [5], [6, 7]),
             (prompt + [7, 11, 13], [14, 15]), (prompt + [5, 6], [])]
    buffers = []
    real = KVBuffer.for_step

    def spy(*args, **kwargs):
        buffer = real(*args, **kwargs)
        buffers.append(buffer)
        return buffer

    monkeypatch.setattr(reference.KVBuffer, "for_step", spy)
    with_buffer = run_steps(engine, steps)
    monkeypatch.setattr(reference.KVBuffer, "for_step", lambda *args, **kwargs: None)
    concatenated = run_steps(ReferenceEngine(model, max_context=512), steps)
    for (ids_a, states_a), (ids_b, states_b) in zip(with_buffer, concatenated):
        assert ids_a == ids_b
        assert np.array_equal(states_a, states_b)
    # steps 1-2 appended in place; step 3 (diverging at the prompt) copied; step 4 went back to
    # the first chain's buffer (its entry ends where that buffer is frozen)
    assert buffers[1] is buffers[0] and buffers[2] is buffers[0]
    assert buffers[3] is not buffers[0]
    assert buffers[4] is buffers[0]
