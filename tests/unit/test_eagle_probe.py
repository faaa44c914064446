"""banditspec.eagle.probe: the Eagle head's first-token probe, the sessions' hint() built on it
(in process and through the ``eagle`` model), RequestDrafters.hint, and the fit's own maths
(engine_build/eagle/fit_probe.py)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from banditspec.decoding.drafting import RequestDrafters
from banditspec.drafters.base import DrafterTraits
from banditspec.drafters.eagle import EAGLE1_WEIGHTS, EagleDrafter, load_default_eagle_drafter
from banditspec.drafters.eagle_remote import RemoteEagleDrafter
from banditspec.drafters.eagle_service import EagleService
from banditspec.eagle import EAGLE3_WEIGHTS
from banditspec.eagle.probe import PROBE_KEY, FirstTokenProbe, head_probe
from banditspec.errors import BanditSpecValidationError

from tests.unit.test_eagle import make_head, random_ids, target_hidden, tiny_smollm2_shape
from tests.unit.test_eagle_service import CountingInfer

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    from banditspec.engine.models import load_model

    model, _ = load_model("tiny")
    return model


def random_probe(width: int, seed: int = 0) -> FirstTokenProbe:
    rng = np.random.default_rng(seed)
    return FirstTokenProbe(rng.normal(0, 0.05, width).astype(np.float32), -0.5)


def test_the_probe_is_a_logistic_regression_on_one_row():
    probe = FirstTokenProbe(np.array([1.0, -2.0, 0.5], dtype=np.float32), 0.25)
    row = np.array([0.3, 0.1, -1.0], dtype=np.float32)
    z = 0.3 - 0.2 - 0.5 + 0.25
    assert probe(row) == pytest.approx(1 / (1 + math.exp(-z)), rel=1e-6)
    assert probe(np.full(3, -1e4, dtype=np.float32)) == pytest.approx(1.0) and probe(np.full(3, 1e4, dtype=np.float32)) < 1e-30
    with pytest.raises(BanditSpecValidationError, match="hidden_states"):
        probe(np.zeros(4, dtype=np.float32))
    again = FirstTokenProbe.from_json(json.loads(json.dumps(probe.as_json(note="x"))))
    assert again(row) == pytest.approx(probe(row), rel=1e-6)


@pytest.mark.parametrize("data", [{}, {"weights": [1.0]}, {"weights": [], "bias": 0.0},
                                  {"weights": [float("nan")], "bias": 0.0}, {"weights": "abc", "bias": 0.0}])
def test_a_malformed_probe_is_refused_by_name(data):
    with pytest.raises(BanditSpecValidationError, match=PROBE_KEY):
        FirstTokenProbe.from_json(data)


def test_the_shipped_default_head_carries_its_probe_and_how_well_it_did():
    probe = head_probe(EAGLE1_WEIGHTS)
    assert probe is not None and probe.feature_size == 576
    info = json.loads(EAGLE1_WEIGHTS.with_suffix(".json").read_text())[PROBE_KEY]
    assert info["held_out"]["held_out_auc"] > 0.7 and info["data"]["prompts_per_workload"] < 125
    probe3 = head_probe(EAGLE3_WEIGHTS)  # the EAGLE-3 head's probe reads its three captured layers
    assert probe3 is not None and probe3.feature_size == 3 * 576
    assert load_default_eagle_drafter(tiny_smollm2_shape(), EAGLE1_WEIGHTS).probe is not None
    assert load_default_eagle_drafter(tiny_smollm2_shape(), EAGLE1_WEIGHTS, probe=False).probe is None


def test_a_probe_of_another_width_is_refused(tiny):
    with pytest.raises(BanditSpecValidationError, match="first_token_probe"):
        EagleDrafter(make_head(tiny), tiny.get_input_embeddings().weight, probe=random_probe(7))


def steps(tiny, prompt, chunks):
    """(tokens, feature rows) per step as the decoding loop observes them (first step: prompt rows too)."""
    sequence, out = list(prompt), []
    for i, chunk in enumerate(chunks):
        sequence += chunk
        hidden = target_hidden(tiny, sequence)
        out.append((chunk, hidden[:-1] if i == 0 else hidden[-len(chunk) - 1:-1]))
    return out


def test_hints_read_the_latest_feature_row_in_process_and_remotely_and_cost_no_call(tiny):
    probe = random_probe(tiny.config.hidden_size, seed=3)
    local = EagleDrafter(make_head(tiny), tiny.get_input_embeddings().weight, probe=probe)
    infer = CountingInfer(EagleService(EagleDrafter(make_head(tiny), tiny.get_input_embeddings().weight)))
    prompt = random_ids(7, seed=4)
    sessions = [local.start(prompt), RemoteEagleDrafter(infer, probe=probe).start(prompt)]
    assert [s.hint() for s in sessions] == [0.0, 0.0]  # no features yet: a pull would decline
    for chunk, rows in steps(tiny, prompt, [[5], [6, 7, 8], [9]]):
        for session in sessions:
            session.observe(chunk, rows)
        expected = probe(rows[-1])  # the row that produced the latest token
        assert 0.0 < expected < 1.0
        assert [s.hint() for s in sessions] == [pytest.approx(expected, rel=1e-6)] * 2
    assert infer.calls == []
    for session in sessions:
        session.observe([3], None)  # a step without features: the head can no longer follow
        assert session.hint() == 0.0
    blind = [EagleDrafter(make_head(tiny), tiny.get_input_embeddings().weight).start(prompt),
             RemoteEagleDrafter(infer).start(prompt)]
    assert [s.hint() for s in blind] == [None, None]


def test_a_closed_session_hints_nothing_to_pull(tiny):
    probe = random_probe(tiny.config.hidden_size)
    infer = CountingInfer(EagleService(EagleDrafter(make_head(tiny), tiny.get_input_embeddings().weight)))
    session = RemoteEagleDrafter(infer, probe=probe).start(random_ids(5, seed=1))
    (chunk, rows), = steps(tiny, random_ids(5, seed=1), [[4]])
    session.observe(chunk, rows)
    assert session.hint() > 0.0
    session.close(finished=True)
    assert session.hint() == 0.0


class Hinting:
    """A drafter whose sessions hint ``value`` (or raise it when it is an exception)."""

    name = "e"
    traits = DrafterTraits()

    def __init__(self, value):
        self.value = value

    def start(self, prompt_ids):
        value = self.value

        class Session:
            def propose(self, max_len):
                raise AssertionError("not asked")

            def observe(self, new_tokens, hidden_states=None):
                pass

            def close(self, finished):
                pass

            def hint(self):
                if isinstance(value, Exception):
                    raise value
                return value

        return Session()


@pytest.mark.parametrize("value, expected, dropped", [(0.25, 0.25, None), (None, None, None),
                                                      (1.5, None, "hint failed: ValueError"),
                                                      (RuntimeError("boom"), None, "hint failed: RuntimeError")])
def test_request_drafters_pass_hints_on_and_drop_a_drafter_whose_hint_fails(value, expected, dropped):
    drops = []
    drafters = RequestDrafters({"e": Hinting(value)}, ["e"], [1, 2], vocab_size=100, deadline_s=None,
                               on_drop=lambda name, reason: drops.append((name, reason)))
    assert drafters.hint("e") == expected
    assert drops == ([] if dropped is None else [("e", dropped)])
    assert drafters.hint("missing") is None


def load_fit_script():
    spec = importlib.util.spec_from_file_location("fit_probe", REPO / "engine_build" / "eagle" / "fit_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fit_recovers_a_known_separator_with_its_standardisation_folded_in():
    fit = load_fit_script()
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 3.0, (4000, 4)).astype(np.float32)  # far from standardised
    truth = 1 / (1 + np.exp(-(1.5 * (x[:, 0] - 5) / 3 - (x[:, 2] - 5) / 3)))
    y = rng.random(4000) < truth
    probe = fit.fitted(x, y, l2=1.0)
    predicted = np.array([probe(row) for row in x])
    assert np.abs(predicted - truth).mean() < 0.03
    assert fit.auc(predicted, y) > 0.8 and fit.auc(-predicted, y) < 0.2
    assert fit.auc(np.arange(6.0), np.array([0, 0, 0, 1, 1, 1], bool)) == 1.0
