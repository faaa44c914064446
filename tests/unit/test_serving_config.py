"""The Triton models' config.pbtxt parameters, read once into typed configurations whose
errors name the parameter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from banditspec.errors import BanditSpecValidationError
from banditspec.serving.config import EagleModelConfig, ServingConfig, TargetModelConfig, model_parameters

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"


def shipped(model: str) -> dict[str, str]:
    text = (REPOSITORY / model / "config.pbtxt").read_text()
    return dict(re.findall(r'parameters\s*{\s*key:\s*"([^"]+)"\s*value:\s*{\s*string_value:\s*"([^"]*)"', text))


def test_the_shipped_parameters_read_into_their_types():
    config = ServingConfig.from_parameters(shipped("banditspec"))
    assert config.drafters == ("pld", "suffix", "rest", "eagle", "copy") and config.eagle_model == "eagle"
    assert config.defaults.policy == "costaware" and config.defaults.arms is None and config.rest_datastore is None
    assert (config.limits.max_tokens, config.limits.max_prompt_tokens, config.limits.max_draft_len) == (1024, 1536, 16)
    assert config.drafter_deadline_s == 0.5 and config.metrics and config.metrics_log_interval_s == 60.0
    assert ServingConfig.from_parameters({}) == ServingConfig()  # a missing parameter means its default
    target = TargetModelConfig.from_parameters(shipped("target"))
    assert (target.max_context, target.cache_entries, target.kernels) == (2048, 16, "fast")
    eagle = EagleModelConfig.from_parameters(shipped("eagle"))
    assert (eagle.max_sequences, eagle.min_confidence, eagle.torch_threads) == (64, None, 1)  # "": the head's own
    args = {"model_config": json.dumps({"parameters": {"max_context": {"string_value": "64"}}})}
    assert model_parameters(args) == {"max_context": "64"}


@pytest.mark.parametrize("build, params, field", [
    (ServingConfig, {"max_context": "lots"}, "max_context"),
    (ServingConfig, {"max_tokens_limit": "1e3"}, "max_tokens_limit"),
    (ServingConfig, {"target_kind": "vllm"}, "target_kind"),
    (ServingConfig, {"default_policy": "best"}, "default_policy"),
    (ServingConfig, {"default_reward": "speed"}, "default_reward"),
    (ServingConfig, {"max_concurrent_sequences": "0"}, "max_concurrent_sequences"),
    (ServingConfig, {"metrics_log_interval_s": "-1"}, "metrics_log_interval_s"),
    (TargetModelConfig, {"cache_entries": "many"}, "cache_entries"),
    (EagleModelConfig, {"min_confidence": "high"}, "min_confidence"),
])
def test_a_bad_parameter_is_named(build, params, field):
    with pytest.raises(BanditSpecValidationError) as error:
        build.from_parameters(params)
    assert error.value.field == field and str(error.value).startswith(field)


def test_eagle_head_is_checked_by_name():
    assert ServingConfig.from_parameters({"eagle_head": "eagle3"}).eagle_head == "eagle3"
    assert EagleModelConfig.from_parameters({"eagle_head": " "}).eagle_head == ""
    for make in (ServingConfig.from_parameters, EagleModelConfig.from_parameters):
        with pytest.raises(BanditSpecValidationError, match="eagle_head"):
            make({"eagle_head": "eagle2"})


def test_gc_freeze_is_a_flag_on_by_default_in_every_model():
    from banditspec.serving.config import EagleModelConfig, TargetModelConfig

    for config in (ServingConfig, TargetModelConfig, EagleModelConfig):
        assert config.from_parameters({}).gc_freeze is True
        assert config.from_parameters({"gc_freeze": "false"}).gc_freeze is False
        with pytest.raises(BanditSpecValidationError, match="gc_freeze"):
            config.from_parameters({"gc_freeze": "sometimes"})


def test_eagle_probe_is_a_flag_on_by_default():
    assert ServingConfig.from_parameters({}).eagle_probe is True
    assert ServingConfig.from_parameters({"eagle_probe": "false"}).eagle_probe is False
    with pytest.raises(BanditSpecValidationError, match="eagle_probe"):
        ServingConfig.from_parameters({"eagle_probe": "maybe"})
