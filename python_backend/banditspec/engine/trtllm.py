"""What the controller adds to the verify contract when ``target`` is a TensorRT-LLM engine.

The pinned version is TensorRT-LLM 1.2.1 (NGC ``tritonserver:26.07-trtllm-python-py3``, the
newest Triton image that still ships the TensorRT engine flow and the C++ ``tensorrtllm``
backend). Facts of its ``tensorrt_llm`` Triton model that the controller must respect (the
upstream table is written down in ``tests/trtllm_standin/contract.json``):

* ``temperature`` alone does not sample: with neither ``runtime_top_k`` nor ``runtime_top_p``
  set, the engine decodes greedily. The controller sends ``runtime_top_k = 0`` (no top-k
  cut) and ``runtime_top_p = 1.0`` (the whole distribution), so the target samples from
  softmax(logits / temperature), the distribution speculative sampling is lossless against.
* The random state restarts for every request from ``seed`` (UINT64; ``random_seed`` was the
  0.18 backend's name). Every verify call is a new request, so one seed for all calls would
  replay the same draws at every step. The controller sends :func:`step_seed` of the
  request's seed and the sequence length, which is reproducible and stateless.
* After a draft the engine keeps decoding until ``request_output_len`` tokens (or EOS), so an
  answer may hold more than accepted + 1 tokens (see ``VerifyResult``).
* With ``return_perf_metrics`` the backend writes ten per-request figures, requested or not
  (so the target's config declares all ten); the controller reads the KV-cache blocks and the
  first/last token times (how long the decode-on after the verify iteration took).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from banditspec.engine.contract import VerifyResult

TENSORRT_LLM_VERSION = "1.2.1"

# name -> (Triton dtype, dims without the batch dimension), as upstream declares them.
TRTLLM_EXTRA_INPUTS: dict[str, tuple[str, list[int]]] = {
    "runtime_top_k": ("TYPE_INT32", [1]),
    "runtime_top_p": ("TYPE_FP32", [1]),
    "return_perf_metrics": ("TYPE_BOOL", [1]),
}
TRTLLM_PERF_OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "kv_cache_reused_blocks": ("TYPE_INT32", [1]),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", [1]),
    # ns since the epoch: the first token ends the verify iteration, the last the decode-on
    "first_token_time_ns": ("TYPE_INT64", [1]),
    "last_token_time_ns": ("TYPE_INT64", [1]),
}


def step_seed(seed: int, sequence_length: int) -> int:
    """The seed of one verify call: a uint64 mixed from the request's seed and the length of
    the sequence the call extends (different at every step, the same on a replay)."""
    mixed = np.random.SeedSequence([int(seed) & (2**64 - 1), int(sequence_length)])
    return int(mixed.generate_state(1, dtype=np.uint64)[0])


@dataclass
class TrtllmVerifyResult(VerifyResult):
    """A VerifyResult with the engine's per-request KV-cache figures (None when not returned).

    kv_cache_reused_blocks:    blocks of this call's input found in the KV cache (not recomputed)
    kv_cache_alloc_new_blocks: blocks the call had to allocate (and compute)
    decode_on_seconds:         engine time of the tokens after the verify iteration
    """

    kv_cache_reused_blocks: int | None = None
    kv_cache_alloc_new_blocks: int | None = None
    # engine time after the verify iteration (last_token_time_ns - first_token_time_ns): the
    # plain steps that produced the tokens past accepted + 1; None when not returned
    decode_on_seconds: float | None = None
