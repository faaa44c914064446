"""A CPU stand-in for TensorRT-LLM's Triton model ``tensorrt_llm`` (engine flow, 1.2.1).

It speaks the upstream contract written down in ``contract.json`` (every input and output
with upstream's name, dtype and dims; :func:`render_config` declares all of them) and
behaves as that model does where the BanditSpec controller can tell:

* ``request_output_len`` new tokens are generated; after verifying ``draft_input_ids`` the
  engine keeps decoding, so an answer can hold more than accepted + 1 tokens;
* generation stops at ``end_id``, which is left out of ``output_ids``;
* greedy unless ``runtime_top_k > 1`` or ``runtime_top_p > 0`` (``temperature`` alone does
  not sample); the random state restarts from ``seed`` (default 0) for every request;
* streaming (decoupled model): one response per engine iteration, the draft-verifying
  iteration first;
* ``return_perf_metrics``: ALL ten per-request figures are written, requested or not (KV-cache
  blocks of a block-reuse cache, INT64 timing points in ns since the epoch, draft acceptance);
  the Triton glue lets the core's output check see every one of them (``model.py``);
* the engine's limits (``max_input_len``, ``max_seq_len``, ``max_draft_len``, read from the
  engine folder's ``config.json`` as the backend reads its engine): a too-long prompt or draft
  is refused, and ``request_output_len`` is silently cut so that prompt + output + the
  per-step draft length fits ``max_seq_len`` (:func:`new_token_cap`);
* declared inputs it does not implement are ignored, as the C++ backend ignores what it
  does not use; :data:`IMPLEMENTED_INPUTS` lists what it honours.

``behaviour.json`` beside this file lists each behaviour with the upstream source it comes from.

Greedy tokens come from the project's torch reference engine
(:class:`banditspec.engine.reference.ReferenceEngine`); sampled ones from the same model's
logits with a per-request ``torch.Generator``. Pure Python: the Triton glue is ``model.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CONTRACT = json.loads((HERE / "contract.json").read_text())

IMPLEMENTED_INPUTS = frozenset({
    "input_ids", "input_lengths", "request_output_len", "draft_input_ids", "draft_logits", "end_id",
    "pad_id", "beam_width", "num_return_sequences", "temperature", "runtime_top_k", "runtime_top_p",
    "seed", "exclude_input_in_output", "streaming", "return_perf_metrics", "return_num_input_tokens",
    "return_num_output_tokens", "return_log_probs", "return_context_logits", "return_generation_logits",
})
NUMPY_DTYPES = {
    "TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_UINT64": np.uint64, "TYPE_UINT8": np.uint8,
    "TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_BOOL": np.bool_, "TYPE_STRING": np.object_,
}


def _resolve(dtype: str) -> str:
    if dtype.startswith("${"):
        return CONTRACT["template_values"][dtype[2:-1]]
    return dtype


def contract_inputs() -> dict[str, dict]:
    """name -> {data_type (template filled), dims, optional, reshape_scalar}."""
    return {t["name"]: {**t, "data_type": _resolve(t["data_type"])} for t in CONTRACT["inputs"]}


def contract_outputs() -> dict[str, dict]:
    return {t["name"]: {**t, "data_type": _resolve(t["data_type"])} for t in CONTRACT["outputs"]}


def render_config(name: str, *, decoupled: bool, parameters: Mapping[str, str], max_batch_size: int = 8) -> str:
    """A config.pbtxt declaring upstream's whole interface (served by the stand-in as backend ``tensorrtllm``)."""
    lines = [
        f'name: "{name}"', 'backend: "tensorrtllm"', f"max_batch_size: {max_batch_size}",
        f"model_transaction_policy {{ decoupled: {'true' if decoupled else 'false'} }}",
        "dynamic_batching { }", "input [",
    ]
    entries = []
    for t in contract_inputs().values():
        dims = ", ".join(str(d) for d in t["dims"])
        extra = " reshape: { shape: [ ] }" if t["reshape_scalar"] else ""
        extra += " optional: true" if t["optional"] else ""
        extra += " allow_ragged_batch: true" if -1 in t["dims"] else ""
        entries.append(f'  {{ name: "{t["name"]}" data_type: {t["data_type"]} dims: [ {dims} ]{extra} }}')
    lines += [",\n".join(entries), "]", "output ["]
    entries = []
    for t in contract_outputs().values():
        dims = ", ".join(str(d) for d in t["dims"])
        entries.append(f'  {{ name: "{t["name"]}" data_type: {t["data_type"]} dims: [ {dims} ] }}')
    lines += [",\n".join(entries), "]", "instance_group [ { count: 1 kind: KIND_CPU } ]"]
    for key, value in parameters.items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n"


class StandInError(ValueError):
    """A request the real backend would refuse (it answers with an INTERNAL error)."""


@dataclass(frozen=True)
class EngineLimits:
    """What a built engine fixes (trtllm-build's --max_input_len, --max_seq_len, --max_draft_len;
    0 for an engine without a speculative mode) and the KV cache's block size."""

    max_input_len: int = 1 << 20
    max_seq_len: int = 1 << 20
    max_draft_len: int = 16
    tokens_per_block: int = 32


PERF_OUTPUTS: dict[str, type] = {
    # written together whenever return_perf_metrics is set (fillTritonResponse, behaviour.json)
    "kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32, "kv_cache_alloc_total_blocks": np.int32,
    "arrival_time_ns": np.int64, "first_scheduled_time_ns": np.int64, "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64,
    "acceptance_rate": np.float32, "total_accepted_draft_tokens": np.int32, "total_draft_tokens": np.int32,
}


def new_token_cap(prompt_len: int, requested: int, draft_len: int, limits: EngineLimits) -> int:
    """request_output_len as the executor keeps it (LlmRequest::validate): prompt + output +
    the draft tokens per engine step (the request's draft, or the engine's max_draft_len when
    it sends none) must fit max_seq_len, else the output length is cut, with a log warning only."""
    per_step = draft_len if draft_len else limits.max_draft_len
    if prompt_len + requested + per_step > limits.max_seq_len:
        return limits.max_seq_len - prompt_len - per_step
    return requested


@dataclass
class Call:
    input_ids: list[int]
    output_len: int
    draft: list[int]
    draft_logits: np.ndarray | None
    end_id: int
    sampling: bool
    temperature: float
    top_k: int
    top_p: float
    seed: int
    exclude_input: bool
    streaming: bool
    perf_metrics: bool
    num_input_tokens: bool
    num_output_tokens: bool


def _scalar(tensors: Mapping[str, np.ndarray], name: str, default, kind):
    value = tensors.get(name)
    if value is None:
        return default
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise StandInError(f"{name}: expected one value per request, got shape {tuple(np.shape(value))}")
    return kind(flat[0])


def parse_call(tensors: Mapping[str, np.ndarray], *, exclude_input_default: bool, max_draft_len: int,
               vocab_size: int, limits: EngineLimits | None = None) -> Call:
    limits = limits or EngineLimits(max_draft_len=max_draft_len)
    if tensors.get("input_ids") is None:
        raise StandInError("input_ids or encoder_input_features is not present in the request.")
    # One sequence a request: the backend takes the whole input_ids row; input_lengths is
    # read only to split a batch of several (splitBatchInputsTensors).
    ids = np.asarray(tensors["input_ids"]).reshape(-1).astype(np.int64)
    output_len = _scalar(tensors, "request_output_len", None, int)
    if output_len is None:
        raise StandInError("request_output_len is not present in the request")
    if output_len < 1:
        raise StandInError(f"request_output_len: must be >= 1, got {output_len}")
    if ids.size > limits.max_input_len:
        raise StandInError(f"Prompt length ({ids.size}) exceeds maximum input length ({limits.max_input_len}).")
    draft = np.asarray(tensors.get("draft_input_ids", np.zeros(0))).reshape(-1).astype(np.int64)
    if draft.size > limits.max_draft_len:
        raise StandInError(f"Draft tokens length ({draft.size}) exceeds maximum draft tokens length ({limits.max_draft_len}).")
    if draft.size and ids.size + draft.size > limits.max_input_len:
        draft = draft[: limits.max_input_len - ids.size]  # cut with a warning only
    output_len = new_token_cap(ids.size, output_len, draft.size, limits)
    if output_len < 1:
        raise StandInError(f"request_output_len: no room left in max_seq_len={limits.max_seq_len} "
                           f"for a prompt of {ids.size} tokens and {draft.size or limits.max_draft_len} draft tokens a step")
    for name, values in (("input_ids", ids), ("draft_input_ids", draft)):
        if values.size and (values.min() < 0 or values.max() >= vocab_size):
            raise StandInError(f"{name}: token ids must be in [0, {vocab_size})")
    logits = tensors.get("draft_logits")
    if logits is not None and draft.size:
        logits = np.asarray(logits, dtype=np.float64).reshape(-1, np.shape(logits)[-1])
        if logits.shape != (draft.size, vocab_size):
            raise StandInError(f"draft_logits: expected [{draft.size}, {vocab_size}], got {list(logits.shape)}")
    else:
        logits = None
    if _scalar(tensors, "beam_width", 1, int) != 1:
        raise StandInError("beam_width: the engine was built with max_beam_width 1")
    if _scalar(tensors, "num_return_sequences", 1, int) != 1:
        raise StandInError("num_return_sequences: only 1 is supported with beam width 1 here")
    top_k = _scalar(tensors, "runtime_top_k", 0, int)
    top_p = max(_scalar(tensors, "runtime_top_p", 0.0, float), 0.0)  # <= 0: unset
    temperature = _scalar(tensors, "temperature", 1.0, float)
    sampling = top_k > 1 or (top_p > 0.0 and top_k != 1)
    if sampling and not temperature > 0:
        raise StandInError(f"temperature: must be > 0 when sampling, got {temperature}")
    return Call(
        input_ids=[int(t) for t in ids],
        output_len=output_len,
        draft=[int(t) for t in draft],
        draft_logits=logits,
        end_id=_scalar(tensors, "end_id", -1, int),
        sampling=sampling,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=_scalar(tensors, "seed", 0, int),
        exclude_input=_scalar(tensors, "exclude_input_in_output", exclude_input_default, bool),
        streaming=_scalar(tensors, "streaming", False, bool),
        perf_metrics=_scalar(tensors, "return_perf_metrics", False, bool),
        num_input_tokens=_scalar(tensors, "return_num_input_tokens", False, bool),
        num_output_tokens=_scalar(tensors, "return_num_output_tokens", False, bool),
    )


class BlockCache:
    """Which full KV blocks (chains of ``tokens_per_block`` tokens) a cache with block reuse
    holds; least recently used blocks go first."""

    def __init__(self, tokens_per_block: int, max_blocks: int):
        self.tokens_per_block = tokens_per_block
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[tuple, None] = OrderedDict()

    def _keys(self, tokens: list[int]) -> list[tuple]:
        n = len(tokens) // self.tokens_per_block
        return [tuple(tokens[: (i + 1) * self.tokens_per_block]) for i in range(n)]

    def reused(self, tokens: list[int]) -> int:
        """Leading full blocks of ``tokens`` found in the cache (prompt reuse needs at least one
        token left to compute, so a prompt that is all full blocks reuses one block less)."""
        count = 0
        for key in self._keys(tokens[:-1]):
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            count += 1
        return count

    def store(self, tokens: list[int]) -> None:
        for key in self._keys(tokens):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)


def _blocks(tokens: int, per_block: int) -> int:
    return -(-tokens // per_block)


class StandIn:
    """The engine behind the stand-in model: ``respond(tensors)`` yields the responses
    (tensor dicts with the batch dimension) the real model would send for one request."""

    def __init__(self, engine, model, *, tokens_per_block: int = 32, max_draft_len: int = 16,
                 exclude_input_in_output: bool = True, max_blocks: int = 4096, limits: EngineLimits | None = None):
        self.engine = engine  # ReferenceEngine: greedy tokens
        self.model = model  # the same model's weights: logits for sampling
        self.vocab_size = int(engine.vocab_size)
        self.limits = limits or EngineLimits(max_draft_len=max_draft_len, tokens_per_block=tokens_per_block)
        self.max_draft_len = self.limits.max_draft_len
        self.exclude_input_default = exclude_input_in_output
        self.cache = BlockCache(self.limits.tokens_per_block, max_blocks)
        self._lock = threading.Lock()

    # -- token generation ---------------------------------------------------------------
    def _greedy_step(self, sequence: list[int], draft: list[int], end_id: int) -> tuple[list[int], int]:
        from banditspec.engine.contract import VerifyRequest

        result = self.engine.verify([VerifyRequest(
            input_ids=np.asarray(sequence, dtype=np.int32), draft_ids=np.asarray(draft, dtype=np.int32), end_id=end_id,
        )])[0]
        return [int(t) for t in result.output_ids], int(result.num_accepted)

    def _distributions(self, call: Call, sequence: list[int], rows: int):
        """float64 [rows, vocab]: the target's filtered sampling distribution after each of the
        last ``rows`` positions of ``sequence``."""
        import torch
        from banditspec.engine.sampling import SAMPLING_DTYPE

        with torch.inference_mode():
            ids = torch.tensor([sequence], dtype=torch.long)
            logits = self.model(input_ids=ids, logits_to_keep=rows, use_cache=False).logits[0, -rows:]
        logits = logits.to(SAMPLING_DTYPE) / call.temperature
        if call.top_k > 0:
            kth = torch.topk(logits, min(call.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if 0.0 < call.top_p < 1.0:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= call.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs

    def _sampled_step(self, call: Call, sequence: list[int], draft: list[int], generator) -> tuple[list[int], int]:
        import torch
        from banditspec.engine.sampling import SAMPLING_DTYPE, speculative_sample

        p = self._distributions(call, sequence + draft, len(draft) + 1)
        q = None
        if draft and call.draft_logits is not None:
            q = torch.softmax(torch.from_numpy(call.draft_logits).to(SAMPLING_DTYPE), dim=-1)
        outcome = speculative_sample(p, np.asarray(draft, dtype=np.int64), q, generator)
        return draft[: outcome.num_accepted] + [outcome.next_token], outcome.num_accepted

    def iterations(self, call: Call) -> Iterator[tuple[list[int], int | None]]:
        """(new tokens, accepted draft tokens or None) per engine iteration, end_id left out."""
        import torch

        generator = torch.Generator(device="cpu")
        generator.manual_seed(call.seed & (2**63 - 1))  # restarts for every request
        sequence, produced, draft = list(call.input_ids), 0, list(call.draft)
        while produced < call.output_len:
            if call.sampling:
                tokens, accepted = self._sampled_step(call, sequence, draft, generator)
            else:
                tokens, accepted = self._greedy_step(sequence, draft, call.end_id)
            tokens = tokens[: call.output_len - produced]
            ended = call.end_id >= 0 and call.end_id in tokens
            if ended:
                tokens = tokens[: tokens.index(call.end_id)]
            yield tokens, (accepted if draft else None)
            sequence += tokens
            produced += len(tokens)
            draft = []
            if ended:
                return

    # -- responses -------------------------------------------------------------------------
    def respond(self, tensors: Mapping[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        arrival = time.time_ns()
        call = parse_call(tensors, exclude_input_default=self.exclude_input_default,
                          max_draft_len=self.max_draft_len, vocab_size=self.vocab_size, limits=self.limits)
        with self._lock:  # one engine, one request at a time (the real one batches in flight)
            scheduled = time.time_ns()
            reused = self.cache.reused(call.input_ids)
            chunks, first_token = [], 0
            for chunk in self.iterations(call):
                chunks.append(chunk)
                first_token = first_token or time.time_ns()
            last_token = time.time_ns()
            new_tokens = [t for chunk, _ in chunks for t in chunk]
            self.cache.store(call.input_ids + new_tokens)
        accepted = next((a for _, a in chunks if a is not None), 0)
        total = _blocks(len(call.input_ids) + len(new_tokens), self.cache.tokens_per_block)
        values = {
            "kv_cache_reused_blocks": reused,
            "kv_cache_alloc_new_blocks": total - reused,
            "kv_cache_alloc_total_blocks": total,
            "arrival_time_ns": arrival,
            "first_scheduled_time_ns": scheduled,
            "first_token_time_ns": first_token or last_token,
            "last_token_time_ns": last_token,
            "total_draft_tokens": len(call.draft),
            "total_accepted_draft_tokens": accepted,
            "acceptance_rate": accepted / len(call.draft) if call.draft else 0.0,
        }
        figures = {name: (values[name], dtype) for name, dtype in PERF_OUTPUTS.items()}
        if call.streaming:
            pieces = [chunk for chunk, _ in chunks] or [[]]
        else:
            pieces = [new_tokens]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            tokens = piece if call.exclude_input or call.streaming else call.input_ids + piece
            out = {
                "output_ids": np.asarray(tokens, dtype=np.int32).reshape(1, 1, -1),
                "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
            }
            if call.perf_metrics and last:
                out.update({name: np.array([[value]], dtype=dtype) for name, (value, dtype) in figures.items()})
            if call.num_input_tokens:
                out["num_input_tokens"] = np.array([[len(call.input_ids)]], dtype=np.int32)
            if call.num_output_tokens:
                out["num_output_tokens"] = np.array([[len(piece)]], dtype=np.int32)
            yield out


def plain_decoding(standin: StandIn, prompt_ids: list[int], max_tokens: int, end_id: int) -> list[int]:
    """The stand-in's own plain greedy decoding: one request, no draft."""
    tensors = {
        "input_ids": np.asarray([prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "end_id": np.array([[end_id]], dtype=np.int32),
    }
    (answer,) = list(standin.respond(tensors))
    return [int(t) for t in answer["output_ids"].reshape(-1)]
