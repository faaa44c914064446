"""VerifyRequest/VerifyResult <-> the named tensors of the ``tensorrt_llm`` contract.

Both sides of the BLS call use this module: the controller (``banditspec`` model,
through :class:`TensorEngine`) encodes requests and decodes results; the reference
``target`` model decodes requests and encodes results. Nothing here imports Triton:
the transport is a callable injected by the Triton adapter.

Tensor shapes are per request, with the leading batch dimension of 1 that a model with
``max_batch_size > 0`` sees (input_ids: int32 [1, seq_len], output_ids: int32 [1, 1, n]
— batch, beam, tokens — as TensorRT-LLM returns them).
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping, Sequence

import numpy as np

from banditspec.engine.contract import VerifyRequest, VerifyResult
from banditspec.engine.trtllm import TRTLLM_PERF_OUTPUTS, TrtllmVerifyResult, step_seed
from banditspec.errors import BanditSpecValidationError, EngineError

Tensors = dict[str, np.ndarray]
# (model name, input tensors, requested output names) -> output tensors; raises EngineError
InferFn = Callable[[str, Tensors, Sequence[str]], Tensors]


def encode_request(req: VerifyRequest, *, with_reference_extras: bool, tensorrtllm: bool = False) -> Tensors:
    """Tensors the controller sends to ``target`` for one sequence.

    tensorrtllm: the target is a TensorRT-LLM engine (see :mod:`banditspec.engine.trtllm`):
    sampling also sends ``runtime_top_k``/``runtime_top_p`` (else the engine decodes greedily)
    and a per-step ``seed``; every call asks for the per-request KV-cache figures."""
    ids = np.asarray(req.input_ids, dtype=np.int32).reshape(1, -1)
    draft = np.asarray(req.draft_ids, dtype=np.int32).reshape(1, -1)
    tensors: Tensors = {
        "input_ids": ids,
        "input_lengths": np.array([[ids.shape[1]]], dtype=np.int32),
        "request_output_len": np.array([[draft.shape[1] + 1]], dtype=np.int32),
        "end_id": np.array([[req.end_id]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
    }
    if draft.shape[1]:
        tensors["draft_input_ids"] = draft
        if req.draft_probs is not None:
            # TensorRT-LLM takes draft logits; log q is a valid logit vector for q.
            with np.errstate(divide="ignore"):
                tensors["draft_logits"] = np.log(np.asarray(req.draft_probs, dtype=np.float32))[None]
    if req.temperature > 0:
        tensors["temperature"] = np.array([[req.temperature]], dtype=np.float32)
        seed = step_seed(req.seed, ids.shape[1]) if tensorrtllm else req.seed
        tensors["seed"] = np.array([[seed]], dtype=np.uint64)
        if tensorrtllm:
            tensors["runtime_top_k"] = np.array([[0]], dtype=np.int32)  # 0: no top-k cut
            tensors["runtime_top_p"] = np.array([[1.0]], dtype=np.float32)  # the whole distribution
    if tensorrtllm:
        tensors["return_perf_metrics"] = np.array([[True]], dtype=bool)
    if with_reference_extras and req.hidden_from >= 0:
        tensors["hidden_states_from"] = np.array([[req.hidden_from]], dtype=np.int32)
        if req.hidden_layers:
            tensors["hidden_states_layers"] = np.asarray(req.hidden_layers, dtype=np.int32).reshape(1, -1)
    return tensors


def scalar_input(tensors: Mapping[str, np.ndarray], name: str, default, dtype):
    """``dtype`` of the one value of input ``name`` (``default`` when absent); an input with
    more than one value raises BanditSpecValidationError naming it."""
    value = tensors.get(name)
    if value is None:
        return default
    arr = np.asarray(value).reshape(-1)
    if arr.size != 1:
        raise BanditSpecValidationError(name, f"expected one value, got shape {tuple(np.shape(value))}")
    return dtype(arr[0])


def decode_request(tensors: Mapping[str, np.ndarray]) -> VerifyRequest:
    """The reference target's view of one request's tensors (batch dim of 1 removed)."""
    if "input_ids" not in tensors:
        raise BanditSpecValidationError("input_ids", "is required")
    ids = np.asarray(tensors["input_ids"]).reshape(-1).astype(np.int32)
    if "input_lengths" in tensors:
        length = scalar_input(tensors, "input_lengths", ids.size, int)
        if not 0 < length <= ids.size:
            raise BanditSpecValidationError("input_lengths", f"{length} does not fit input_ids of {ids.size} tokens")
        ids = ids[:length]
    draft = np.asarray(tensors.get("draft_input_ids", np.zeros(0, np.int32))).reshape(-1).astype(np.int32)
    probs = None
    if "draft_logits" in tensors and draft.size:
        logits = np.asarray(tensors["draft_logits"], dtype=np.float32).reshape(draft.size, -1)
        logits = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
    return VerifyRequest(
        input_ids=ids,
        draft_ids=draft,
        draft_probs=probs,
        temperature=scalar_input(tensors, "temperature", 0.0, float),
        seed=scalar_input(tensors, "seed", 0, int),
        end_id=scalar_input(tensors, "end_id", -1, int),
        hidden_from=scalar_input(tensors, "hidden_states_from", -1, int),
        hidden_layers=_layer_list(tensors.get("hidden_states_layers")),
    )


def _layer_list(value) -> tuple[int, ...]:
    """``hidden_states_layers``: decoder-layer indices (any integer array, batch dim allowed)."""
    if value is None:
        return ()
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.integer):
        raise BanditSpecValidationError("hidden_states_layers", f"must be integers, got {array.dtype}")
    return tuple(int(a) for a in array.reshape(-1))


def encode_result(result: VerifyResult) -> Tensors:
    out = np.asarray(result.output_ids, dtype=np.int32).reshape(1, 1, -1)
    tensors: Tensors = {
        "output_ids": out,
        "sequence_length": np.array([[out.shape[-1]]], dtype=np.int32),
        "num_accepted_tokens": np.array([[result.num_accepted]], dtype=np.int32),
    }
    if result.hidden_states is not None:
        tensors["hidden_states"] = np.asarray(result.hidden_states, dtype=np.float32)[None]
    return tensors


def decode_result(tensors: Mapping[str, np.ndarray], draft_ids: np.ndarray) -> VerifyResult:
    """The controller's view of ``target``'s answer.

    TensorRT-LLM returns only output_ids; the accepted count is the length of the
    leading run of output tokens that equal the draft (the target's own token at a
    rejection never equals the rejected draft token). The answer may hold more than
    accepted + 1 tokens (TensorRT-LLM decodes on to request_output_len); all are kept.
    With the per-request KV-cache figures present, the result is a TrtllmVerifyResult."""
    out = np.asarray(tensors["output_ids"]).reshape(-1).astype(np.int32)
    if "sequence_length" in tensors:
        out = out[: int(np.asarray(tensors["sequence_length"]).reshape(-1)[0])]
    draft = np.asarray(draft_ids).reshape(-1)
    n = min(out.size, draft.size)
    mismatch = np.nonzero(out[:n] != draft[:n])[0]
    accepted = int(mismatch[0]) if mismatch.size else n
    accepted = min(accepted, max(out.size - 1, 0))  # an accepted EOS is the target's own token
    hidden = tensors.get("hidden_states")
    if hidden is not None:
        hidden = np.asarray(hidden, dtype=np.float32).reshape(-1, np.shape(hidden)[-1])
    if any(name in tensors for name in TRTLLM_PERF_OUTPUTS):
        return TrtllmVerifyResult(
            output_ids=out,
            num_accepted=accepted,
            hidden_states=hidden,
            kv_cache_reused_blocks=_optional_int(tensors, "kv_cache_reused_blocks"),
            kv_cache_alloc_new_blocks=_optional_int(tensors, "kv_cache_alloc_new_blocks"),
        )
    return VerifyResult(output_ids=out, num_accepted=accepted, hidden_states=hidden)


def _optional_int(tensors: Mapping[str, np.ndarray], name: str) -> int | None:
    value = tensors.get(name)
    if value is None or np.asarray(value).size == 0:
        return None
    return int(np.asarray(value).reshape(-1)[0])


def restore_end_id(answer: Mapping[str, np.ndarray], requested: int, end_id: int) -> Tensors:
    """TensorRT-LLM stops at ``end_id`` but leaves it out of ``output_ids`` (NVIDIA/TensorRT-LLM
    issue 2190: "expected behavior"). Its only other stop is ``request_output_len``, so an
    answer shorter than ``requested`` ended at EOS: put the EOS back for the decoding loop."""
    out = np.asarray(answer["output_ids"]).reshape(-1).astype(np.int32)
    if "sequence_length" in answer:
        out = out[: int(np.asarray(answer["sequence_length"]).reshape(-1)[0])]
    if end_id < 0 or out.size >= requested or (out.size and out[-1] == end_id):
        return dict(answer)
    out = np.append(out, np.int32(end_id))
    fixed = dict(answer)
    fixed["output_ids"] = out.reshape(1, 1, -1)
    fixed["sequence_length"] = np.array([[out.size]], dtype=np.int32)
    return fixed


class TensorEngine:
    """An :class:`~banditspec.engine.contract.Engine` that reaches the target through
    named tensors (Triton BLS in production, any callable in tests)."""

    OUTPUTS = ("output_ids", "sequence_length")

    def __init__(
        self,
        infer: InferFn,
        *,
        model_name: str = "target",
        vocab_size: int,
        max_context: int,
        eos_id: int,
        provides_hidden_states: bool = False,
        tensorrtllm: bool = False,
    ):
        """tensorrtllm: the target is a TensorRT-LLM engine (real sampling inputs, per-step
        seed, per-request KV-cache figures; see :mod:`banditspec.engine.trtllm`)."""
        self._infer = infer
        self.tensorrtllm = tensorrtllm
        self._lock = threading.Lock()
        # Running totals of the engine's per-request KV-cache figures (TensorRT-LLM only).
        self.verify_calls = 0
        self.kv_cache_reused_blocks = 0
        self.kv_cache_alloc_new_blocks = 0
        self.model_name = model_name
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.eos_id = eos_id
        self.provides_hidden_states = provides_hidden_states

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        results = []
        for req in requests:
            outputs = list(self.OUTPUTS)
            if self.provides_hidden_states and req.hidden_from >= 0:
                outputs.append("hidden_states")
            if self.tensorrtllm:
                outputs += list(TRTLLM_PERF_OUTPUTS)
            tensors = encode_request(req, with_reference_extras=self.provides_hidden_states, tensorrtllm=self.tensorrtllm)
            answer = self._infer(self.model_name, tensors, outputs)
            if "output_ids" not in answer:
                raise EngineError(f"model {self.model_name!r} returned no output_ids")
            if self.tensorrtllm:
                answer = restore_end_id(answer, len(req.draft_ids) + 1, req.end_id)
            result = decode_result(answer, req.draft_ids)
            if result.output_ids.size > len(req.draft_ids) + 1:
                raise EngineError(
                    f"model {self.model_name!r} returned {result.output_ids.size} tokens for "
                    f"{len(req.draft_ids)} draft tokens (at most {len(req.draft_ids) + 1} were asked for)"
                )
            self._count(result)
            results.append(result)
        return results

    def _count(self, result: VerifyResult) -> None:
        with self._lock:
            self.verify_calls += 1
            self.kv_cache_reused_blocks += getattr(result, "kv_cache_reused_blocks", None) or 0
            self.kv_cache_alloc_new_blocks += getattr(result, "kv_cache_alloc_new_blocks", None) or 0
