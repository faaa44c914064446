"""TensorRT-LLM request compatibility for the ``banditspec`` model.

Upstream's ``ensemble`` and ``tensorrt_llm_bls`` Triton models (TensorRT-LLM's Triton backend,
``all_models/inflight_batcher_llm``) take many more inputs than BanditSpec needs, and Triton
refuses an input a model does not declare. ``banditspec`` therefore declares the union of their
inputs (tensorrtllm_backend 0.18 and the current ones; the GPU path pins TensorRT-LLM 1.2.1, between the two: ``seed`` next to
``random_seed``, ``min_tokens`` next to ``min_length``, ``return_perf_metrics``, guided decoding).

Each input is either honoured or refused with a message that names it and says what is
supported (:func:`resolve`). An input is never dropped when it would change the output.
The table :data:`RULES` is what docs/trtllm_compat.md documents.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from banditspec.config import fresh_seed
from banditspec.errors import BanditSpecValidationError

# name -> (Triton data type, dims) as upstream declares it (dims without the batch dimension).
UPSTREAM_INPUTS: dict[str, tuple[str, list[int]]] = {
    "text_input": ("TYPE_STRING", [1]),
    "decoder_text_input": ("TYPE_STRING", [1]),
    "image_input": ("TYPE_FP16", [-1, 3, -1, -1]),
    "image_bytes_input": ("TYPE_UINT8", [-1, -1, -1, -1]),
    "image_url_input": ("TYPE_STRING", [1]),
    "video_bytes_input": ("TYPE_UINT8", [-1, -1, -1, -1]),
    "max_tokens": ("TYPE_INT32", [1]),
    "bad_words": ("TYPE_STRING", [-1]),
    "stop_words": ("TYPE_STRING", [-1]),
    "exclude_input_in_output": ("TYPE_BOOL", [1]),
    "end_id": ("TYPE_INT32", [1]),
    "pad_id": ("TYPE_INT32", [1]),
    "top_k": ("TYPE_INT32", [1]),
    "top_p": ("TYPE_FP32", [1]),
    "temperature": ("TYPE_FP32", [1]),
    "length_penalty": ("TYPE_FP32", [1]),
    "repetition_penalty": ("TYPE_FP32", [1]),
    "min_length": ("TYPE_INT32", [1]),  # 0.18
    "min_tokens": ("TYPE_INT32", [1]),  # current
    "presence_penalty": ("TYPE_FP32", [1]),
    "frequency_penalty": ("TYPE_FP32", [1]),
    "random_seed": ("TYPE_UINT64", [1]),  # 0.18
    "seed": ("TYPE_UINT64", [1]),  # current
    "return_log_probs": ("TYPE_BOOL", [1]),
    "return_context_logits": ("TYPE_BOOL", [1]),
    "return_generation_logits": ("TYPE_BOOL", [1]),
    "return_kv_cache_reuse_stats": ("TYPE_BOOL", [1]),  # 0.18
    "return_perf_metrics": ("TYPE_BOOL", [1]),  # current
    "return_num_input_tokens": ("TYPE_BOOL", [1]),  # current
    "return_num_output_tokens": ("TYPE_BOOL", [1]),  # current
    "num_return_sequences": ("TYPE_INT32", [1]),
    "beam_width": ("TYPE_INT32", [1]),
    "stream": ("TYPE_BOOL", [1]),
    "prompt_embedding_table": ("TYPE_FP16", [-1, -1]),
    "prompt_vocab_size": ("TYPE_INT32", [1]),
    "prompt_table_extra_id": ("TYPE_UINT64", [1]),
    "embedding_bias_words": ("TYPE_STRING", [-1]),
    "embedding_bias_weights": ("TYPE_FP32", [-1]),
    "num_draft_tokens": ("TYPE_INT32", [1]),
    "use_draft_logits": ("TYPE_BOOL", [1]),
    "lora_task_id": ("TYPE_UINT64", [1]),
    "lora_weights": ("TYPE_FP16", [-1, -1]),
    "lora_config": ("TYPE_INT32", [-1, 3]),
    "guided_decoding_guide_type": ("TYPE_STRING", [1]),
    "guided_decoding_guide": ("TYPE_STRING", [1]),
}

UPSTREAM_OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "text_output": ("TYPE_STRING", [-1]),
    "cum_log_probs": ("TYPE_FP32", [-1]),
    "output_log_probs": ("TYPE_FP32", [-1, -1]),
    "context_logits": ("TYPE_FP32", [-1, -1]),
    "generation_logits": ("TYPE_FP32", [-1, -1, -1]),
    "batch_index": ("TYPE_INT32", [1]),
    "sequence_index": ("TYPE_INT32", [1]),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", [1]),
    "kv_cache_reused_blocks": ("TYPE_INT32", [1]),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", [1]),
    "arrival_time_ns": ("TYPE_INT64", [1]),
    "first_scheduled_time_ns": ("TYPE_INT64", [1]),
    "first_token_time_ns": ("TYPE_INT64", [1]),
    "last_token_time_ns": ("TYPE_INT64", [1]),
    "acceptance_rate": ("TYPE_FP32", [1]),
    "total_accepted_draft_tokens": ("TYPE_INT32", [1]),
    "total_draft_tokens": ("TYPE_INT32", [1]),
    "num_input_tokens": ("TYPE_INT32", [1]),
    "num_output_tokens": ("TYPE_INT32", [1]),
}

# BanditSpec's own optional inputs (not upstream's). ``trtllm_temperature`` is ``temperature``
# with TensorRT-LLM's meaning (it samples only when top_k > 1 or top_p > 0; otherwise it decodes
# greedily); the ``ensemble`` and ``tensorrt_llm_bls`` aliases map their ``temperature`` to it.
OWN_INPUTS: dict[str, tuple[str, list[int]]] = {
    "policy": ("TYPE_STRING", [1]),
    "arms": ("TYPE_STRING", [-1]),
    "max_draft_len": ("TYPE_INT32", [1]),
    "reward": ("TYPE_STRING", [1]),
    "trtllm_temperature": ("TYPE_FP32", [1]),
    "apply_chat_template": ("TYPE_BOOL", [1]),
}
OWN_OUTPUTS: dict[str, tuple[str, list[int]]] = {"speculation_stats": ("TYPE_STRING", [1])}

# How the request parser reads each input (banditspec.serving.controller.parse_inputs kinds); "tensor"
# inputs are only checked for presence (they are refused whenever they are sent).
_KIND_OF_TYPE = {"TYPE_BOOL": "bool", "TYPE_FP32": "float", "TYPE_INT32": "int", "TYPE_UINT64": "int"}
TENSOR_INPUTS = (
    "image_input", "image_bytes_input", "video_bytes_input", "prompt_embedding_table", "lora_weights",
    "lora_config", "embedding_bias_weights",
)


def input_kinds() -> dict[str, str]:
    """Parser kind of every upstream input that banditspec's own table does not already have."""
    kinds: dict[str, str] = {}
    for name, (dtype, dims) in UPSTREAM_INPUTS.items():
        if name in TENSOR_INPUTS:
            kinds[name] = "tensor"
        elif dtype == "TYPE_STRING":
            kinds[name] = "text_list" if dims == [-1] else "text"
        else:
            kinds[name] = _KIND_OF_TYPE[dtype]
    kinds["trtllm_temperature"] = "float"
    kinds["apply_chat_template"] = "bool"
    return kinds


# The documented rule per input: (honoured | refused when ..., what is supported).
RULES: dict[str, str] = {
    "text_input, max_tokens, stream, stop_words": "honoured (as before)",
    "apply_chat_template": "banditspec's own: false sends text_input to the model as it is (no chat template; default: the model's chat_template parameter)",
    "temperature": "honoured: > 0 samples from the full distribution (speculative sampling, lossless in distribution)",
    "trtllm_temperature": "temperature with TensorRT-LLM's meaning: sampling only with top_k > 1 or top_p > 0, greedy otherwise",
    "top_k": "0 (off), 1 (greedy) or >= the vocabulary size (off) are honoured; other values are refused",
    "top_p": "0 (off) or 1.0 (the full distribution) are honoured; other values are refused",
    "random_seed, seed": "honoured (the same seed, the same text under every policy); both at once must agree; without either a fresh seed is drawn, reported as speculation_stats.seed",
    "end_id": "honoured when it is the model's end token; another end token is refused",
    "pad_id": "accepted: text output has no padding",
    "exclude_input_in_output": "honoured: false prepends text_input to a non-streamed text_output (streamed responses carry new text only, as upstream)",
    "beam_width": "1 is honoured; > 1 (beam search) is refused",
    "num_return_sequences": "1 is honoured; > 1 is refused (send separate requests)",
    "length_penalty": "accepted: it only acts in beam search, and beam_width is 1",
    "min_length, min_tokens": "0 or 1 are honoured (every request yields >= 1 token); larger values are refused",
    "repetition_penalty": "1.0 (off) is honoured; other values are refused",
    "presence_penalty, frequency_penalty": "0.0 (off) is honoured; other values are refused",
    "bad_words": "honoured: each word is tokenized on its own (no special tokens, empty words skipped, as upstream's preprocessing); the token that would complete a banned sequence gets probability 0, in plain and speculative decoding alike (a draft token completing one is rejected)",
    "embedding_bias_words, embedding_bias_weights": "refused when sent non-empty",
    "return_log_probs, return_context_logits, return_generation_logits, return_kv_cache_reuse_stats":
        "false is honoured; true is refused (the verify contract returns no log-probs, logits or KV-block counts)",
    "return_perf_metrics": "honoured: arrival_time_ns, first_scheduled_time_ns, first_token_time_ns, last_token_time_ns, acceptance_rate, total_accepted_draft_tokens, total_draft_tokens on the final response; kv_cache_* blocks are -1 (not available: no paged KV cache behind the verify contract)",
    "return_num_input_tokens, return_num_output_tokens": "honoured: num_input_tokens, num_output_tokens",
    "num_draft_tokens": "honoured: > 0 sets max_draft_len (L); 0 means plain decoding (policy vanilla)",
    "use_draft_logits": "accepted: no effect on the output (verification is lossless with or without draft logits)",
    "prompt_embedding_table, prompt_vocab_size, prompt_table_extra_id": "refused (prompt tuning is not supported)",
    "lora_task_id, lora_weights, lora_config": "refused (LoRA is not supported)",
    "guided_decoding_guide_type, guided_decoding_guide": "refused when non-empty (guided decoding is not supported)",
    "decoder_text_input": "refused when non-empty (encoder-decoder models are not supported)",
    "image_input, image_bytes_input, image_url_input, video_bytes_input": "refused (multimodal input is not supported)",
}


@dataclass(frozen=True)
class Resolved:
    """What the upstream inputs of one request amount to."""

    temperature: float = 0.0
    seed: int = 0  # the request's seed, or a fresh one when it names none
    bad_words: tuple[str, ...] = ()  # non-empty words, as sent
    max_draft_len: int | None = None  # None: not set by num_draft_tokens
    policy: str | None = None  # "vanilla" when num_draft_tokens is 0
    echo_prompt: bool = False  # exclude_input_in_output false, not streaming
    prompt_text: str = ""  # text_input, for echo_prompt
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False


def _refuse(name: str, message: str) -> None:
    raise BanditSpecValidationError(name, message)


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        _refuse(name, "must be a finite number")
    return value


def resolve(values: Mapping[str, Any], *, vocab_size: int, eos_id: int) -> Resolved:
    """Check every upstream input of a parsed request (see :data:`RULES`); raise
    BanditSpecValidationError naming the first one that cannot be honoured."""
    get = values.get
    for name in ("image_input", "image_bytes_input", "video_bytes_input", "image_url_input"):
        if name in values:
            _refuse(name, "multimodal input is not supported by this server")
    for name in ("prompt_embedding_table", "prompt_vocab_size", "prompt_table_extra_id"):
        if name in values:
            _refuse(name, "prompt tuning (prompt embedding tables) is not supported by this server")
    for name in ("lora_task_id", "lora_weights", "lora_config"):
        if name in values:
            _refuse(name, "LoRA adapters are not supported by this server")
    for name in ("guided_decoding_guide_type", "guided_decoding_guide", "decoder_text_input"):
        if get(name):
            what = "encoder-decoder models are" if name == "decoder_text_input" else "guided decoding is"
            _refuse(name, f"{what} not supported by this server (send it empty or leave it out)")
    if any(get("embedding_bias_words") or []):
        _refuse("embedding_bias_words", "embedding bias is not supported by this server")
    if "embedding_bias_weights" in values and len(values["embedding_bias_weights"].reshape(-1)) and bool(
        (values["embedding_bias_weights"] != 0).any()
    ):
        _refuse("embedding_bias_weights", "embedding bias is not supported by this server")

    beam_width = get("beam_width", 1)
    if beam_width != 1:
        _refuse("beam_width", f"only 1 is supported (no beam search), got {beam_width}")
    n = get("num_return_sequences", 1)
    if n != 1:
        _refuse("num_return_sequences", f"only 1 is supported, got {n}; send separate requests for more samples")
    for name in ("min_length", "min_tokens"):
        if name in values and not 0 <= values[name] <= 1:
            _refuse(name, f"only 0 or 1 is supported (a request always yields at least one token), got {values[name]}")
    if "repetition_penalty" in values and _finite("repetition_penalty", values["repetition_penalty"]) != 1.0:
        _refuse("repetition_penalty", f"only 1.0 (no penalty) is supported, got {values['repetition_penalty']}")
    for name in ("presence_penalty", "frequency_penalty"):
        if name in values and _finite(name, values[name]) != 0.0:
            _refuse(name, f"only 0.0 (no penalty) is supported, got {values[name]}")
    if "length_penalty" in values:
        _finite("length_penalty", values["length_penalty"])
    for name in ("return_log_probs", "return_context_logits", "return_generation_logits", "return_kv_cache_reuse_stats"):
        if get(name):
            _refuse(name, "is not supported by this server (only false): the verify contract returns no "
                          "log-probs, logits or KV-cache block counts")
    if "end_id" in values and values["end_id"] != eos_id:
        _refuse("end_id", f"only this model's end token {eos_id} is supported, got {values['end_id']}")

    # Sampling: temperature (BanditSpec: > 0 samples) or trtllm_temperature (TensorRT-LLM: samples
    # only with top_k > 1 or top_p > 0), each narrowed by top_k / top_p where that is lossless.
    if "temperature" in values and "trtllm_temperature" in values:
        _refuse("trtllm_temperature", "send either temperature or trtllm_temperature, not both")
    top_k = get("top_k", 0)
    if top_k < 0:
        _refuse("top_k", f"must be >= 0, got {top_k}")
    top_p = _finite("top_p", get("top_p", 0.0))
    if not 0.0 <= top_p <= 1.0:
        _refuse("top_p", f"must be in [0, 1], got {top_p}")
    greedy_by_k = top_k == 1
    if 1 < top_k < vocab_size:
        _refuse("top_k", f"top-k sampling is not supported: send 0 (off), 1 (greedy) or >= {vocab_size}, got {top_k}")
    if not greedy_by_k and 0.0 < top_p < 1.0:
        _refuse("top_p", f"top-p (nucleus) sampling is not supported: send 0 (off) or 1.0, got {top_p}")
    if "trtllm_temperature" in values:
        temperature = values["trtllm_temperature"]
        sampling = top_k > 1 or top_p > 0.0
        temperature = temperature if sampling else 0.0
    else:
        temperature = get("temperature", 0.0)
    if greedy_by_k:
        temperature = 0.0

    seeds = {name: values[name] for name in ("random_seed", "seed") if name in values}
    if len(set(seeds.values())) > 1:
        _refuse("seed", "random_seed and seed differ; send one of them")
    seed = next(iter(seeds.values())) if seeds else fresh_seed()

    max_draft_len = policy = None
    if "num_draft_tokens" in values:
        k = values["num_draft_tokens"]
        if k < 0:
            _refuse("num_draft_tokens", f"must be >= 0, got {k}")
        if k == 0:
            policy = "vanilla"
        elif "max_draft_len" in values and values["max_draft_len"] != k:
            _refuse("num_draft_tokens", "differs from max_draft_len; send one of them")
        else:
            max_draft_len = k
    echo = "exclude_input_in_output" in values and not values["exclude_input_in_output"] and not get("stream", False)
    return Resolved(
        temperature=temperature,
        seed=seed,
        bad_words=tuple(word for word in get("bad_words") or () if word),
        max_draft_len=max_draft_len,
        policy=policy,
        echo_prompt=echo,
        prompt_text=str(get("text_input", "")) if echo else "",
        return_perf_metrics=bool(get("return_perf_metrics", False)),
        return_num_input_tokens=bool(get("return_num_input_tokens", False)),
        return_num_output_tokens=bool(get("return_num_output_tokens", False)),
    )
