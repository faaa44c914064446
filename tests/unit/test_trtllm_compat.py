"""TensorRT-LLM request compatibility: every upstream input is declared, honoured or refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from banditspec.serving import trtllm_compat
from banditspec_server import model_aliases
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.unit.test_serving import RecordingSink, expected_text, inputs, make_controller

REPO = Path(__file__).resolve().parents[2]


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _table(entries) -> dict:
    return {e.name: (model_config_pb2.DataType.Name(e.data_type), list(e.dims)) for e in entries}


@pytest.mark.parametrize("repository", ["model_repository", "model_repository_trtllm"])
def test_banditspec_declares_every_upstream_input_and_output_with_upstream_types(repository):
    config = _config(REPO / repository / "banditspec" / "config.pbtxt")
    declared_in, declared_out = _table(config.input), _table(config.output)
    for name, spec in {**trtllm_compat.UPSTREAM_INPUTS, **trtllm_compat.OWN_INPUTS}.items():
        assert declared_in.get(name) == spec, name
    for name, spec in {**trtllm_compat.UPSTREAM_OUTPUTS, **trtllm_compat.OWN_OUTPUTS}.items():
        assert declared_out.get(name) == spec, name
    required = {e.name for e in config.input if not e.optional}
    assert required == {"text_input", "max_tokens"}


def test_every_declared_input_is_read_by_the_model():
    from banditspec.serving.controller import INPUT_KINDS

    config = _config(REPO / "model_repository" / "banditspec" / "config.pbtxt")
    assert {e.name for e in config.input} == set(INPUT_KINDS)


def test_alias_configs_are_up_to_date_and_map_temperature_to_trtllm_temperature():
    assert model_aliases.main(["--check"]) == 0
    for repository in model_aliases.REPOSITORIES:
        for alias in model_aliases.ALIASES:
            config = _config(REPO / repository / alias / "config.pbtxt")
            assert config.name == alias and config.platform == "ensemble"
            (step,) = config.ensemble_scheduling.step
            assert step.model_name == "banditspec"
            assert step.input_map["trtllm_temperature"] == "temperature"
            assert set(step.input_map.values()) == {e.name for e in config.input}
            assert set(step.output_map) == {e.name for e in config.output}


def _run(**extra):
    controller, engine = make_controller()
    sink = RecordingSink()
    controller.handle(inputs(**{"extra_" + k: v for k, v in extra.items()}), sink)
    return sink, engine


def i32(v):
    return np.array([[v]], dtype=np.int32)


def f32(v):
    return np.array([[v]], dtype=np.float32)


def b(v):
    return np.array([[v]], dtype=bool)


def u64(v):
    return np.array([[v]], dtype=np.uint64)


def words(*items):
    return np.array([[w.encode() for w in items]], dtype=object)


HONOURED_AS_GREEDY = [
    dict(beam_width=i32(1), num_return_sequences=i32(1)),
    dict(end_id=i32(256), pad_id=i32(0)),  # MockEngine's eos is 256
    dict(top_k=i32(1), temperature=f32(1.0)),  # top_k 1: greedy
    dict(top_k=i32(0), top_p=f32(0.0)),
    dict(trtllm_temperature=f32(1.0)),  # TensorRT-LLM: no top_k/top_p -> greedy
    dict(repetition_penalty=f32(1.0), presence_penalty=f32(0.0), frequency_penalty=f32(0.0)),
    dict(length_penalty=f32(0.7), min_length=i32(1), min_tokens=i32(0)),
    dict(bad_words=words(""), embedding_bias_words=words("")),
    dict(return_log_probs=b(False), return_context_logits=b(False), return_generation_logits=b(False),
         return_kv_cache_reuse_stats=b(False)),
    dict(num_draft_tokens=i32(3), use_draft_logits=b(True)),
    dict(num_draft_tokens=i32(0)),
    dict(seed=u64(7), random_seed=u64(7)),
    dict(exclude_input_in_output=b(True), guided_decoding_guide_type=words(""), decoder_text_input=words("")),
]


@pytest.mark.parametrize("extra", HONOURED_AS_GREEDY)
def test_inputs_that_do_not_change_greedy_output_are_honoured(extra):
    sink, engine = _run(**extra)
    assert not sink.errors, sink.errors
    assert sink.text == expected_text(engine, "hello world", 40)


def test_exclude_input_in_output_false_prepends_the_prompt_unless_streaming():
    sink, engine = _run(exclude_input_in_output=b(False))
    assert sink.text == "hello world" + expected_text(engine, "hello world", 40)
    sink, engine = _run(exclude_input_in_output=b(False), stream=b(True))
    assert sink.text == expected_text(engine, "hello world", 40)


def test_num_draft_tokens_sets_l_and_zero_means_plain_decoding():
    sink, _ = _run(num_draft_tokens=i32(2), policy=np.array([[b"fixed:right"]], dtype=object))
    assert max(sink.sent[-1][1]["drafted"]) == 2
    sink, _ = _run(num_draft_tokens=i32(0))
    assert set(sink.sent[-1][1]["arms"]) == {"vanilla"}


@pytest.mark.parametrize(
    "extra, temperature",
    [
        (dict(trtllm_temperature=f32(0.8)), 0.0),  # TensorRT-LLM: neither top_k nor top_p -> greedy
        (dict(trtllm_temperature=f32(0.8), top_k=i32(0), top_p=f32(0.0)), 0.0),
        (dict(trtllm_temperature=f32(0.8), top_p=f32(1.0)), 0.8),
        (dict(trtllm_temperature=f32(0.8), top_k=i32(1 << 20)), 0.8),
        (dict(trtllm_temperature=f32(0.8), top_k=i32(1), top_p=f32(0.5)), 0.0),  # top_k 1 wins: greedy
        (dict(temperature=f32(0.8)), 0.8),  # banditspec's own meaning: samples
        (dict(temperature=f32(0.8), top_p=f32(1.0), top_k=i32(0)), 0.8),
        (dict(temperature=f32(0.8), top_k=i32(1)), 0.0),
    ],
)
def test_sampling_knobs_resolve_to_the_temperature_the_decoder_gets(extra, temperature):
    controller, _ = make_controller()
    request, _ = controller.build_request(inputs(**extra))
    assert request.temperature == pytest.approx(temperature)


def test_seed_and_random_seed_are_the_same_knob():
    controller, _ = make_controller()
    assert controller.build_request(inputs(seed=u64(11)))[0].seed == 11
    assert controller.build_request(inputs(random_seed=u64(11)))[0].seed == 11


@pytest.mark.parametrize(
    "extra, field",
    [
        (dict(beam_width=i32(2)), "beam_width"),
        (dict(beam_width=i32(0)), "beam_width"),
        (dict(num_return_sequences=i32(3)), "num_return_sequences"),
        (dict(top_k=i32(40)), "top_k"),
        (dict(top_k=i32(-1)), "top_k"),
        (dict(top_p=f32(0.9)), "top_p"),
        (dict(top_p=f32(1.5)), "top_p"),
        (dict(repetition_penalty=f32(1.2)), "repetition_penalty"),
        (dict(presence_penalty=f32(0.5)), "presence_penalty"),
        (dict(frequency_penalty=f32(-0.5)), "frequency_penalty"),
        (dict(min_tokens=i32(5)), "min_tokens"),
        (dict(min_length=i32(5)), "min_length"),
        (dict(end_id=i32(3)), "end_id"),
        (dict(embedding_bias_words=words("foo"), embedding_bias_weights=np.array([[1.0]], dtype=np.float32)),
         "embedding_bias_words"),
        (dict(return_log_probs=b(True)), "return_log_probs"),
        (dict(return_context_logits=b(True)), "return_context_logits"),
        (dict(return_generation_logits=b(True)), "return_generation_logits"),
        (dict(return_kv_cache_reuse_stats=b(True)), "return_kv_cache_reuse_stats"),
        (dict(lora_task_id=u64(1)), "lora_task_id"),
        (dict(lora_weights=np.zeros((1, 2, 4), dtype=np.float16)), "lora_weights"),
        (dict(prompt_embedding_table=np.zeros((1, 2, 4), dtype=np.float16)), "prompt_embedding_table"),
        (dict(guided_decoding_guide_type=words("json")), "guided_decoding_guide_type"),
        (dict(decoder_text_input=words("hi")), "decoder_text_input"),
        (dict(image_input=np.zeros((1, 1, 3, 2, 2), dtype=np.float16)), "image_input"),
        (dict(seed=u64(1), random_seed=u64(2)), "seed"),
        (dict(temperature=f32(1.0), trtllm_temperature=f32(1.0)), "trtllm_temperature"),
        (dict(num_draft_tokens=i32(-1)), "num_draft_tokens"),
        (dict(num_draft_tokens=i32(99)), "num_draft_tokens"),
        (dict(beam_width=np.array([[1.0]], dtype=np.float32)), "beam_width"),
    ],
)
def test_inputs_that_would_change_the_output_are_refused_by_name(extra, field):
    sink, engine = _run(**extra)
    assert sink.sent == []
    assert len(sink.errors) == 1
    kind, message = sink.errors[0]
    assert kind == "invalid" and message.startswith(field + ":"), message


def test_rules_cover_every_upstream_input():
    documented = {name.strip() for key in trtllm_compat.RULES for name in key.split(",")}
    assert set(trtllm_compat.UPSTREAM_INPUTS) | {"trtllm_temperature"} <= documented


def test_bad_words_are_tokenized_one_by_one_and_reach_the_request():
    controller, _ = make_controller()
    request, _ = controller.build_request(inputs(extra_bad_words=words("lo", "", "wor")))
    assert [list(w) for w in request.bad_words] == [list(b"lo"), list(b"wor")]  # "" skipped, as upstream
    request, _ = controller.build_request(inputs())
    assert list(request.bad_words) == []


def test_a_request_without_a_seed_draws_a_fresh_one_and_reports_it():
    seeds = {trtllm_compat.resolve({}, vocab_size=257, eos_id=256).seed for _ in range(8)}
    assert len(seeds) == 8 and all(0 <= s < 2**53 for s in seeds)
    assert trtllm_compat.resolve({"seed": 7}, vocab_size=257, eos_id=256).seed == 7
    assert trtllm_compat.resolve({"random_seed": 7}, vocab_size=257, eos_id=256).seed == 7
    sink, _ = _run(seed=u64(11))
    assert sink.sent[-1][1]["seed"] == 11
    sink, _ = _run()
    first = sink.sent[-1][1]["seed"]
    sink, _ = _run()
    assert sink.sent[-1][1]["seed"] != first
