"""Build the serving controller from ``config.pbtxt`` parameters (strings).

Paths and models come only from here, never from a request."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from banditspec.batching import make_gamma_budget
from banditspec.batching.uniform_inputs import with_empty_drafts
from banditspec.config import DEFAULT_POLICY, Limits
from banditspec.decoding import SpeculativeDecoder
from banditspec.drafters.registry import build_drafters
from banditspec.engine.tensor_codec import InferFn, TensorEngine
from banditspec.errors import BanditSpecValidationError
from banditspec.serving import Controller, ServingDefaults

TARGET_KINDS = ("reference", "tensorrtllm")


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def _int(params: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(params.get(key, default))
    except ValueError:
        raise BanditSpecValidationError(key, f"parameter must be an integer, got {params.get(key)!r}") from None


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def load_serving_tokenizer(params: Mapping[str, str]):
    from transformers import AutoTokenizer

    from banditspec.engine.models import model_dir

    folder = params.get("tokenizer_dir", "")
    return AutoTokenizer.from_pretrained(folder or model_dir(params.get("target_model", "smollm2")))


def _drafters(params: Mapping[str, str], kind: str, tokenizer, infer: InferFn) -> dict:
    """The served drafters by name (banditspec.drafters.registry). ``eagle`` drafts from the
    target's hidden states, which only the reference target returns; it runs in the
    ``eagle_model`` Triton model, or in this process when that parameter is empty; with a
    TensorRT-LLM target, ``eagle_model`` names a TensorRT-LLM Eagle engine."""
    datastore = params.get("rest_datastore", "default")
    target_name = params.get("target_model", "smollm2")

    def load_target():  # the target checkpoint, for the in-process head's embedding / LM head
        from banditspec.engine.models import load_model

        return load_model(target_name)[0]

    return build_drafters(
        _csv(params.get("drafters", "pld,suffix,rest")),
        tokenizer,
        load_target_model=load_target,
        target_name=target_name,
        rest_datastore=None if datastore in ("", "default") else Path(datastore),
        infer=infer,
        draft_model_name=params.get("draft_name", "draft"),
        eagle_model=params.get("eagle_model", "").strip(),
        eagle_engine=kind == "tensorrtllm",
    )


def build_controller(params: Mapping[str, str], infer: InferFn) -> Controller:
    kind = params.get("target_kind", "reference")
    if kind not in TARGET_KINDS:
        raise BanditSpecValidationError("target_kind", f"must be one of {TARGET_KINDS}")
    tokenizer = load_serving_tokenizer(params)
    drafters = _drafters(params, kind, tokenizer, infer)
    engine = TensorEngine(
        with_empty_drafts(infer) if kind == "reference" else infer,  # so that gamma = 0 steps batch with drafting ones
        model_name=params.get("target_name", "target"),
        vocab_size=len(tokenizer),
        max_context=_int(params, "max_context", 2048),
        eos_id=int(tokenizer.eos_token_id),
        provides_hidden_states="eagle" in drafters,  # what the eagle arm drafts from
        tensorrtllm=kind == "tensorrtllm",  # real sampling inputs, per-step seed, KV-reuse figures
    )
    limits = Limits(
        max_tokens=_int(params, "max_tokens_limit", 1024),
        max_prompt_tokens=_int(params, "max_prompt_tokens", 1536),
        max_stop_words=_int(params, "max_stop_words", 16),
        max_draft_len=_int(params, "max_draft_len_limit", 16),
    )
    default_arms = _csv(params.get("default_arms", "")) or None
    budget = make_gamma_budget(params.get("gamma_controller", "off"), _int(params, "gamma_controller_max", 4))
    decoder = SpeculativeDecoder.for_engine(
        engine,
        drafters,
        default_arms=default_arms,
        limits=limits,
        drafter_deadline_s=_int(params, "drafter_deadline_ms", 500) / 1000.0,
        budget=budget,
    )
    defaults = ServingDefaults(
        policy=params.get("default_policy", DEFAULT_POLICY),
        arms=None,
        max_draft_len=_int(params, "default_max_draft_len", 4),
        reward=params.get("default_reward", "accepted"),
        chat_template=_flag(params.get("chat_template", "true")),
        max_concurrent_sequences=_int(params, "max_concurrent_sequences", 8),
    )
    controller = Controller(decoder, engine, tokenizer, defaults)
    if hasattr(budget, "bind_active_sequences"):  # the server's exact count of sequences in flight
        budget.bind_active_sequences(lambda: controller.active_sequences)
    return controller
