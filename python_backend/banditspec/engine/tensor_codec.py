"""VerifyRequest/VerifyResult <-> the named tensors of the ``tensorrt_llm`` contract.

Both sides of the BLS call use this module: the controller (``banditspec`` model,
through :class:`TensorEngine`) encodes requests and decodes results; the reference
``target`` model decodes requests and encodes results. Nothing here imports Triton:
the transport is a callable injected by the Triton adapter.

Tensor shapes are per request, with the leading batch dimension that a model with
``max_batch_size > 0`` sees: 1 for one sequence (input_ids: int32 [1, seq_len], output_ids:
int32 [1, 1, n] — batch, beam, tokens — as TensorRT-LLM returns them), N when one request
carries N sequences' steps (the reference target only: rows padded to the longest, see
:func:`encode_requests` / :func:`encode_results`; :mod:`banditspec.engine.gather` sends them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from banditspec.engine.bad_words import from_word_list, to_word_list
from banditspec.engine.contract import VERIFY_PASS_FIELDS, VerifyPass, VerifyRequest, VerifyResult
from banditspec.engine.trtllm import TRTLLM_PERF_OUTPUTS, TrtllmVerifyResult, step_seed
from banditspec.errors import BanditSpecValidationError, EngineError

Tensors = dict[str, np.ndarray]
# (model name, input tensors, requested output names) -> output tensors; raises EngineError
InferFn = Callable[[str, Tensors, Sequence[str]], Tensors]


_T = TypeVar("_T")

DRAFT_PAD = -1  # pads the draft rows of a call that verifies several sequences (ids are >= 0)


def encode_requests(reqs: Sequence[VerifyRequest], *, with_reference_extras: bool, tensorrtllm: bool = False) -> Tensors:
    """Tensors of ONE call that verifies ``reqs``, one row each ([N, ...]; N = 1: one sequence).

    Rows are padded to the longest: ``input_ids`` (its ``input_lengths`` say how far),
    ``draft_input_ids`` with :data:`DRAFT_PAD` (a row's draft is its ids before the padding).
    Optional inputs travel when a row needs them: ``temperature``/``seed`` (0 on greedy rows),
    ``hidden_states_from`` (-1 on rows that want no states). All rows must agree on whether
    they carry draft probabilities and on ``hidden_layers`` (:func:`call_key`).

    tensorrtllm: the target is a TensorRT-LLM engine (see :mod:`banditspec.engine.trtllm`):
    sampling also sends ``runtime_top_k``/``runtime_top_p`` (else the engine decodes greedily)
    and a per-step ``seed``; every call asks for the per-request KV-cache figures."""
    if not reqs:
        raise ValueError("no request to encode")
    if len({call_key(r) for r in reqs}) > 1:
        raise ValueError("requests of one call must agree on draft probabilities and hidden_layers")
    n = len(reqs)
    ids_rows = [np.asarray(r.input_ids, dtype=np.int32).reshape(-1) for r in reqs]
    drafts = [np.asarray(r.draft_ids, dtype=np.int32).reshape(-1) for r in reqs]
    ids = _padded(ids_rows, 0)
    tensors: Tensors = {
        "input_ids": ids,
        "input_lengths": np.array([[row.size] for row in ids_rows], dtype=np.int32),
        "request_output_len": np.array([[d.size + 1] for d in drafts], dtype=np.int32),
        "end_id": np.array([[r.end_id] for r in reqs], dtype=np.int32),
        "exclude_input_in_output": np.ones((n, 1), dtype=bool),
    }
    if max(d.size for d in drafts):
        tensors["draft_input_ids"] = _padded(drafts, DRAFT_PAD)
        if reqs[0].draft_probs is not None:
            # TensorRT-LLM takes draft logits; log q is a valid logit vector for q.
            probs = [np.asarray(r.draft_probs, dtype=np.float32).reshape(d.size, -1) for r, d in zip(reqs, drafts)]
            logits = np.zeros((n, max(d.size for d in drafts), probs[0].shape[1]), dtype=np.float32)
            with np.errstate(divide="ignore"):
                for i, q in enumerate(probs):
                    logits[i, : q.shape[0]] = np.log(q)
            tensors["draft_logits"] = logits
    if any(r.temperature > 0 for r in reqs):
        tensors["temperature"] = np.array([[max(r.temperature, 0.0)] for r in reqs], dtype=np.float32)
        seeds = [step_seed(r.seed, row.size) if tensorrtllm else r.seed for r, row in zip(reqs, ids_rows)]
        tensors["seed"] = np.array([[s] for s in seeds], dtype=np.uint64)
        if tensorrtllm:
            tensors["runtime_top_k"] = np.zeros((n, 1), dtype=np.int32)  # 0: no top-k cut
            tensors["runtime_top_p"] = np.ones((n, 1), dtype=np.float32)  # the whole distribution
    if tensorrtllm:
        tensors["return_perf_metrics"] = np.ones((n, 1), dtype=bool)
    if with_reference_extras and any(r.hidden_from >= 0 for r in reqs):
        tensors["hidden_states_from"] = np.array([[r.hidden_from] for r in reqs], dtype=np.int32)
        if reqs[0].hidden_layers:
            tensors["hidden_states_layers"] = np.tile(np.asarray(reqs[0].hidden_layers, dtype=np.int32), (n, 1))
    tensors.update(encode_bad_words(reqs))
    return tensors


def encode_request(req: VerifyRequest, *, with_reference_extras: bool, tensorrtllm: bool = False) -> Tensors:
    """Tensors the controller sends to ``target`` for one sequence (:func:`encode_requests`)."""
    return encode_requests([req], with_reference_extras=with_reference_extras, tensorrtllm=tensorrtllm)


def call_key(req: VerifyRequest) -> tuple[bool, tuple[int, ...]]:
    """Requests with equal keys can share one call (:func:`encode_requests`)."""
    return req.draft_probs is not None and np.size(req.draft_ids) > 0, tuple(req.hidden_layers)


def _padded(rows: Sequence[np.ndarray], pad: int) -> np.ndarray:
    out = np.full((len(rows), max(row.size for row in rows)), pad, dtype=np.int32)
    for i, row in enumerate(rows):
        out[i, : row.size] = row
    return out


def scalar_input(tensors: Mapping[str, np.ndarray], name: str, default: _T, dtype: Callable[[Any], _T]) -> _T:
    """``dtype`` of the one value of input ``name`` (``default`` when absent); an input with
    more than one value raises BanditSpecValidationError naming it."""
    value = tensors.get(name)
    if value is None:
        return default
    arr = np.asarray(value).reshape(-1)
    if arr.size != 1:
        raise BanditSpecValidationError(name, f"expected one value, got shape {tuple(np.shape(value))}")
    return dtype(arr[0])


def _row_values(tensors: Mapping[str, np.ndarray], name: str, rows: int, default: _T, dtype: Callable[[Any], _T]) -> list[_T]:
    """One ``dtype`` value of input ``name`` per row (``default`` each when absent)."""
    if rows == 1:
        return [scalar_input(tensors, name, default, dtype)]
    value = tensors.get(name)
    if value is None:
        return [default] * rows
    arr = np.asarray(value).reshape(-1)
    if arr.size != rows:
        raise BanditSpecValidationError(name, f"expected one value per sequence ({rows}), got shape {tuple(np.shape(value))}")
    return [dtype(a) for a in arr]


def decode_requests(tensors: Mapping[str, np.ndarray]) -> list[VerifyRequest]:
    """The reference target's view of one call's tensors: one request per row (a 1-D
    ``input_ids`` is one sequence). Errors name the field, and the row when there are several."""
    if "input_ids" not in tensors:
        raise BanditSpecValidationError("input_ids", "is required")
    ids = np.asarray(tensors["input_ids"])
    ids = ids.reshape(ids.shape[0], -1) if ids.ndim >= 2 else ids.reshape(1, -1)
    n = ids.shape[0]
    lengths = _row_values(tensors, "input_lengths", n, ids.shape[1], int)
    temperatures = _row_values(tensors, "temperature", n, 0.0, float)
    seeds = _row_values(tensors, "seed", n, 0, int)
    end_ids = _row_values(tensors, "end_id", n, -1, int)
    hidden_from = _row_values(tensors, "hidden_states_from", n, -1, int)
    draft = _rows(tensors.get("draft_input_ids"), "draft_input_ids", n)
    logits = tensors.get("draft_logits")
    layers = tensors.get("hidden_states_layers")
    layer_rows = None  # one list for every row, unless a row each was sent
    if layers is not None and n > 1 and np.ndim(layers) >= 2 and np.shape(layers)[0] == n:
        layer_rows = np.asarray(layers).reshape(n, -1)
    out = []
    for i in range(n):
        where = f" (sequence {i})" if n > 1 else ""
        row = ids[i].astype(np.int32)
        if not 0 < lengths[i] <= row.size:
            raise BanditSpecValidationError("input_lengths", f"{lengths[i]} does not fit input_ids of {row.size} tokens{where}")
        row_draft = draft[i].astype(np.int32)
        if n > 1:
            kept = np.nonzero(row_draft != DRAFT_PAD)[0]
            row_draft = row_draft[: kept[-1] + 1] if kept.size else row_draft[:0]
        probs = None
        if logits is not None and row_draft.size:
            row_logits = np.asarray(logits, dtype=np.float32).reshape(n, -1, np.shape(logits)[-1])[i, : row_draft.size]
            row_logits = row_logits - row_logits.max(axis=-1, keepdims=True)
            probs = np.exp(row_logits)
            probs /= probs.sum(axis=-1, keepdims=True)
        out.append(VerifyRequest(
            input_ids=row[: lengths[i]],
            draft_ids=row_draft,
            draft_probs=probs,
            temperature=temperatures[i],
            seed=seeds[i],
            end_id=end_ids[i],
            hidden_from=hidden_from[i],
            hidden_layers=_layer_list(layers if layer_rows is None else layer_rows[i]),
        ))
    for request, words in zip(out, decode_bad_words(tensors, n)):
        request.bad_words = words
    return out


# --- bad_words_list: passed through unchanged (TensorRT-LLM's own input on GPU) ----------------


def encode_bad_words(reqs: Sequence[VerifyRequest]) -> Tensors:
    """``bad_words_list`` int32 [N, 2, W] when a row bans anything (upstream's offsets form, each
    row padded to the widest; banditspec.engine.bad_words), else nothing. A TensorRT-LLM target
    takes it as its own input, so the ban acts inside the engine, as on the reference target."""
    if not any(r.bad_words for r in reqs):
        return {}
    width = max(sum(len(word) for word in r.bad_words) for r in reqs)
    return {"bad_words_list": np.stack([to_word_list(r.bad_words, width) for r in reqs])}


def decode_bad_words(tensors: Mapping[str, np.ndarray], n: int) -> list[tuple[tuple[int, ...], ...]]:
    """Each of ``n`` rows' banned words from ``bad_words_list`` (absent: none)."""
    value = tensors.get("bad_words_list")
    if value is None or np.size(value) == 0:
        return [()] * n
    array = np.asarray(value)
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3 or array.shape[0] != n:
        raise BanditSpecValidationError(
            "bad_words_list", f"expected [{n}, 2, N] (one list per sequence), got shape {list(np.shape(value))}")
    return [from_word_list(array[i], where=f" (sequence {i})" if n > 1 else "") for i in range(n)]


def _rows(value: np.ndarray | None, name: str, n: int) -> np.ndarray:
    """``value`` as ``n`` rows (absent or empty: ``n`` empty rows)."""
    if value is None or np.size(value) == 0:
        return np.zeros((n, 0), dtype=np.int32)
    array = np.asarray(value)
    if n > 1 and (array.ndim < 2 or array.shape[0] != n):
        raise BanditSpecValidationError(name, f"expected one row per sequence ({n}), got shape {array.shape}")
    return array.reshape(n, -1)


def decode_request(tensors: Mapping[str, np.ndarray]) -> VerifyRequest:
    """The reference target's view of one request's tensors (batch dim of 1 removed)."""
    requests = decode_requests(tensors)
    if len(requests) != 1:
        raise BanditSpecValidationError("input_ids", f"expected one sequence, got {len(requests)}")
    return requests[0]


def _layer_list(value: np.ndarray | None) -> tuple[int, ...]:
    """``hidden_states_layers``: decoder-layer indices (any integer array, batch dim allowed)."""
    if value is None:
        return ()
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.integer):
        raise BanditSpecValidationError("hidden_states_layers", f"must be integers, got {array.dtype}")
    return tuple(int(a) for a in array.reshape(-1))


def encode_results(results: Sequence[VerifyResult]) -> Tensors:
    """One call's answer, a row per sequence ([N, ...], padded to the longest; N = 1: as
    TensorRT-LLM answers one request). ``sequence_length`` says how many of a row's
    ``output_ids`` count; a row's ``hidden_states`` are its first
    ``len(input_ids) - hidden_from + num_accepted`` (the contract's count)."""
    outs = [np.asarray(r.output_ids, dtype=np.int32).reshape(-1) for r in results]
    width = max(o.size for o in outs)
    output_ids = np.zeros((len(outs), 1, width), dtype=np.int32)
    for i, o in enumerate(outs):
        output_ids[i, 0, : o.size] = o
    tensors: Tensors = {
        "output_ids": output_ids,
        "sequence_length": np.array([[o.size] for o in outs], dtype=np.int32),
        "num_accepted_tokens": np.array([[r.num_accepted] for r in results], dtype=np.int32),
    }
    states = [None if r.hidden_states is None else np.asarray(r.hidden_states, dtype=np.float32) for r in results]
    present = [s for s in states if s is not None]
    if present:
        hidden = np.zeros((len(states), max(s.shape[0] for s in present), present[0].shape[-1]), dtype=np.float32)
        for i, s in enumerate(states):
            if s is not None:
                hidden[i, : s.shape[0]] = s
        tensors["hidden_states"] = hidden
    cached = [r.cached_tokens for r in results]
    if all(c is not None for c in cached):
        tensors["cached_tokens"] = np.array([[c] for c in cached], dtype=np.int32)
    passes = [r.verified_in for r in results]
    if all(p is not None for p in passes):
        tensors["verify_pass"] = np.array([[float(getattr(p, f)) for f in VERIFY_PASS_FIELDS] for p in passes],
                                          dtype=np.float64)
    return tensors


def _verify_pass(value: np.ndarray | None) -> VerifyPass | None:
    """A row of ``verify_pass`` (VERIFY_PASS_FIELDS) as a VerifyPass; None when absent or
    malformed (the pass only informs the cost model; it never fails a result)."""
    if value is None:
        return None
    row = np.asarray(value, dtype=np.float64).reshape(-1)
    if row.size != len(VERIFY_PASS_FIELDS) or not np.all(np.isfinite(row)):
        return None
    serial, prefill, sequences, rows, produced, context, seconds, longest, runner_up, deepest = row.tolist()
    return VerifyPass(serial=int(serial), prefill=bool(prefill), sequences=int(sequences), rows=int(rows),
                      produced=int(produced), context=float(context), seconds=float(seconds),
                      longest=int(longest), runner_up=int(runner_up), deepest=int(deepest))


def encode_result(result: VerifyResult) -> Tensors:
    return encode_results([result])


def decode_results(tensors: Mapping[str, np.ndarray], reqs: Sequence[VerifyRequest]) -> list[VerifyResult]:
    """The controller's view of the answer to one call for ``reqs`` (:func:`decode_result` per row)."""
    if len(reqs) == 1:
        (result,) = [decode_result(tensors, reqs[0].draft_ids)]
        result.verified_in = _verify_pass(tensors.get("verify_pass"))
        result.cached_tokens = _optional_int(tensors, "cached_tokens")
        return [result]
    n = len(reqs)
    output_ids = np.asarray(tensors["output_ids"])
    if output_ids.shape[0] != n:
        raise EngineError(f"the target answered {output_ids.shape[0]} sequences for {n}")
    lengths = np.asarray(tensors.get("sequence_length", np.full(n, output_ids[0].size))).reshape(n, -1)
    hidden = tensors.get("hidden_states")
    passes = tensors.get("verify_pass")
    pass_rows = None if passes is None or np.asarray(passes).size != n * len(VERIFY_PASS_FIELDS) else np.asarray(passes).reshape(n, -1)
    cached = tensors.get("cached_tokens")
    cached_rows = None if cached is None or np.asarray(cached).size != n else np.asarray(cached).reshape(-1)
    # (a malformed cached_tokens informs the stats only: it never fails a result)
    results = []
    for i, req in enumerate(reqs):
        row: Tensors = {"output_ids": output_ids[i], "sequence_length": lengths[i]}
        for name in TRTLLM_PERF_OUTPUTS:
            if name in tensors:
                row[name] = np.asarray(tensors[name]).reshape(n, -1)[i]
        result = decode_result(row, req.draft_ids)
        if hidden is not None and req.hidden_from >= 0:
            count = len(req.input_ids) - req.hidden_from + result.num_accepted
            states = np.asarray(hidden, dtype=np.float32)[i]
            if count > states.shape[0]:
                raise EngineError(f"the target returned {states.shape[0]} hidden states for sequence {i}, {count} expected")
            result.hidden_states = states[:count]
        if pass_rows is not None:
            result.verified_in = _verify_pass(pass_rows[i])
        if cached_rows is not None:
            result.cached_tokens = int(cached_rows[i])
        results.append(result)
    return results


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
            decode_on_seconds=decode_on_seconds(tensors),
        )
    return VerifyResult(output_ids=out, num_accepted=accepted, hidden_states=hidden)


def _optional_int(tensors: Mapping[str, np.ndarray], name: str) -> int | None:
    value = tensors.get(name)
    if value is None or np.asarray(value).size == 0:
        return None
    return int(np.asarray(value).reshape(-1)[0])


def decode_on_seconds(tensors: Mapping[str, np.ndarray]) -> float | None:
    """Engine time after the verify iteration (first to last token, from the backend's own
    INT64 timing points); None when either is missing or they are out of order."""
    first, last = _optional_int(tensors, "first_token_time_ns"), _optional_int(tensors, "last_token_time_ns")
    if first is None or last is None or first <= 0 or last < first:
        return None
    return (last - first) / 1e9


def restore_end_id(answer: Mapping[str, np.ndarray], requested: int, end_id: int) -> Tensors:
    """TensorRT-LLM stops at ``end_id`` but leaves it out of ``output_ids`` (upstream calls it
    expected behavior: github.com/NVIDIA/TensorRT-LLM/issues/2190). Its only other stop is ``request_output_len``, so an
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
        max_rows: int = 1,
        reports_passes: bool = False,
    ):
        """tensorrtllm: the target is a TensorRT-LLM engine (real sampling inputs, per-step
        seed, per-request KV-cache figures; see :mod:`banditspec.engine.trtllm`); it takes
        one sequence a request. max_rows: most sequences one call may carry (the reference
        target's ``max_batch_size``); 1: a call per sequence. reports_passes: the target
        answers ``verify_pass`` and ``cached_tokens`` (the reference target: each result's
        :class:`~banditspec.engine.contract.VerifyPass` and prefix-cache reuse)."""
        self._infer = infer
        self.tensorrtllm = tensorrtllm
        self.max_rows = 1 if tensorrtllm else max(1, int(max_rows))
        self.reports_passes = reports_passes and not tensorrtllm
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
        """One call per request; with ``max_rows`` > 1, one call per group of up to
        ``max_rows`` requests that can share one (:func:`call_key`). Results in request order."""
        results: list[VerifyResult | None] = [None] * len(requests)
        for group in self._groups(requests):
            for i, result in zip(group, self._call([requests[i] for i in group])):
                results[i] = result
        return [r for r in results if r is not None]

    def _groups(self, requests: Sequence[VerifyRequest]) -> list[list[int]]:
        if self.max_rows <= 1:
            return [[i] for i in range(len(requests))]
        by_key: dict[tuple, list[int]] = {}
        for i, req in enumerate(requests):
            by_key.setdefault(call_key(req), []).append(i)
        return [g[k: k + self.max_rows] for g in by_key.values() for k in range(0, len(g), self.max_rows)]

    def _call(self, reqs: list[VerifyRequest]) -> list[VerifyResult]:
        outputs = list(self.OUTPUTS)
        if self.provides_hidden_states and any(r.hidden_from >= 0 for r in reqs):
            outputs.append("hidden_states")
        if self.tensorrtllm:
            outputs += list(TRTLLM_PERF_OUTPUTS)
        if self.reports_passes:
            outputs += ["verify_pass", "cached_tokens"]
        tensors = encode_requests(reqs, with_reference_extras=self.provides_hidden_states, tensorrtllm=self.tensorrtllm)
        answer = self._infer(self.model_name, tensors, outputs)
        if "output_ids" not in answer:
            raise EngineError(f"model {self.model_name!r} returned no output_ids")
        if self.tensorrtllm:  # one request a call (max_rows is 1)
            answer = restore_end_id(answer, len(reqs[0].draft_ids) + 1, reqs[0].end_id)
        results = decode_results(answer, reqs)
        for req, result in zip(reqs, results):
            if result.output_ids.size > len(req.draft_ids) + 1:
                raise EngineError(
                    f"model {self.model_name!r} returned {result.output_ids.size} tokens for "
                    f"{len(req.draft_ids)} draft tokens (at most {len(req.draft_ids) + 1} were asked for)"
                )
            self._count(result)
        return results

    def _count(self, result: VerifyResult) -> None:
        with self._lock:
            self.verify_calls += 1
            self.kv_cache_reused_blocks += getattr(result, "kv_cache_reused_blocks", None) or 0
            self.kv_cache_alloc_new_blocks += getattr(result, "kv_cache_alloc_new_blocks", None) or 0
