"""The ``banditspec`` Triton model's logic, without Triton.

The Triton adapter (``model_repository/banditspec/1/model.py``) turns each request into a
dict of numpy arrays and a :class:`ResponseSink`, and calls :meth:`Controller.handle`.
Everything that decides anything is here, tested with plain numpy inputs.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import DecodingSession, generate
from banditspec.engine.contract import Engine
from banditspec.errors import BanditSpecValidationError, EngineError, retry_after_message
from banditspec.serving import trtllm_compat
from banditspec.serving.admission import AdmissionQueue, AdmissionRefused, AdmissionSnapshot
from banditspec.serving.config import ServingDefaults
from banditspec.serving.outcomes import (  # how a request ended (Controller.on_request_done)
    OUTCOME_BUSY,
    OUTCOME_CANCELLED,
    OUTCOME_INTERNAL,
    OUTCOME_INVALID,
    OUTCOME_SUCCESS,
    OUTCOME_TARGET_ERROR,
)
from banditspec.serving.outcomes import (
    OUTCOMES as OUTCOMES,  # re-exported: the label values of the requests metric
)
from banditspec.text import IncrementalDetokenizer, bad_word_sequences, prompt_ids, stop_sequences

log = logging.getLogger(__name__)


class ResponseSink(Protocol):
    def send(self, text: str, stats: dict | None, final: bool) -> None:
        """One response; ``final`` closes the request's stream."""

    def fail(self, kind: str, message: str) -> None:
        """Final error response; kind is "invalid" | "unavailable" | "internal"."""

    def is_cancelled(self) -> bool: ...


class _FinalHeldBack:
    """Wraps a sink so that the final response (text or error) waits until :meth:`release`.

    The controller finishes its bookkeeping (active count, slot, metrics) before the client
    hears that the request ended, so whatever a client observes after its final response
    (``nv_banditspec_*`` counters, a free slot) already includes that request.
    """

    def __init__(self, sink: ResponseSink):
        self._sink = sink
        self._final: tuple | None = None

    def send(self, text: str, stats: dict | None, final: bool) -> None:
        if final:
            self._final = ("send", text, stats, True)
        else:
            self._sink.send(text, stats, False)

    def fail(self, kind: str, message: str) -> None:
        self._final = ("fail", kind, message)

    def is_cancelled(self) -> bool:
        return self._sink.is_cancelled()

    def release(self) -> None:
        final, self._final = self._final, None
        if final is None:
            return
        if final[0] == "send":
            self._sink.send(*final[1:])
        else:
            self._sink.fail(*final[1:])


# Optional inputs: name -> (kind, what the value must be). Required: text_input, max_tokens.
INPUT_KINDS: dict[str, str] = {
    "text_input": "text",
    "max_tokens": "int",
    "stream": "bool",
    "temperature": "float",
    "random_seed": "int",
    "stop_words": "text_list",
    "policy": "text",
    "arms": "text_list",
    "max_draft_len": "int",
    "reward": "text",
    # TensorRT-LLM's ensemble / tensorrt_llm_bls inputs: honoured or refused (banditspec.serving.trtllm_compat)
    **{k: v for k, v in trtllm_compat.input_kinds().items() if k not in ("text_input", "max_tokens", "stream",
                                                                          "temperature", "random_seed", "stop_words")},
}
REQUIRED_INPUTS = ("text_input", "max_tokens")

# Controller.prepare's warm-up requests: a prompt through the chat template, a few tokens each.
WARM_UP_PROMPT = "Write a Python function that returns the sum of a list of numbers."
WARM_UP_TOKENS = 16


def _warm_up_policies(default: str) -> tuple[str, ...]:
    """Plain decoding and the default policy (once when they are the same)."""
    return tuple(dict.fromkeys(("vanilla", default)))


def _one(name: str, value: np.ndarray) -> Any:
    arr = np.asarray(value)
    if arr.size != 1:
        raise BanditSpecValidationError(name, f"expected a single value, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def _text(name: str, raw: object) -> str:
    if isinstance(raw, (bytes, np.bytes_)):
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise BanditSpecValidationError(name, "is not valid UTF-8") from None
    if isinstance(raw, str):
        return raw
    raise BanditSpecValidationError(name, f"must be a string, got {type(raw).__name__}")


@dataclass(frozen=True)
class RequestInputs:
    """One request's inputs as typed values, checked once (every check that needs no
    tokenizer), with the server's defaults applied and TensorRT-LLM's inputs resolved
    (``compat``: sampling, seed, echo, what num_draft_tokens asks for)."""

    text_input: str
    max_tokens: int
    stream: bool
    policy: str
    arms: list[str] | None
    max_draft_len: int
    reward: str
    stop_words: list[str]
    chat_template: bool
    compat: trtllm_compat.Resolved

    def generation_request(self, tokenizer: Any) -> GenerationRequest:
        """The decoding request: the prompt and stop words tokenized (the token-level checks
        are :func:`banditspec.config.validate_request`'s, when the decoder starts it)."""
        return GenerationRequest(
            prompt_ids=prompt_ids(tokenizer, self.text_input, chat=self.chat_template),
            max_tokens=self.max_tokens,
            policy=self.policy,
            arms=self.arms,
            max_draft_len=self.max_draft_len,
            temperature=self.compat.temperature,
            seed=self.compat.seed,
            stop_sequences=stop_sequences(tokenizer, self.stop_words),
            reward=self.reward,
            bad_words=bad_word_sequences(tokenizer, self.compat.bad_words),
        )


def _tensor_values(inputs: Mapping[str, np.ndarray | None]) -> dict:
    """The request's tensors (those present) as plain values, by :data:`INPUT_KINDS`."""
    for name in REQUIRED_INPUTS:
        if inputs.get(name) is None:
            raise BanditSpecValidationError(name, "is required")
    values: dict = {}
    for name, kind in INPUT_KINDS.items():
        tensor = inputs.get(name)
        if tensor is None:
            continue
        arr = np.asarray(tensor)
        if kind == "tensor":  # only its presence matters (banditspec.serving.trtllm_compat refuses it)
            values[name] = arr
            continue
        if kind == "text_list":
            items = [_text(name, x) for x in arr.reshape(-1)]
            if name == "arms":
                items = [a.strip() for item in items for a in item.split(",") if a.strip()]
            values[name] = items
            continue
        raw = _one(name, arr)
        if kind == "text":
            values[name] = _text(name, raw)
        elif kind == "int":
            if not np.issubdtype(arr.dtype, np.integer):
                raise BanditSpecValidationError(name, f"must be an integer tensor, got {arr.dtype}")
            values[name] = int(raw)
        elif kind == "float":
            if not np.issubdtype(arr.dtype, np.floating):
                raise BanditSpecValidationError(name, f"must be a float tensor, got {arr.dtype}")
            value = float(raw)
            if not math.isfinite(value):
                raise BanditSpecValidationError(name, "must be a finite number")
            values[name] = value
        elif kind == "bool":
            values[name] = bool(raw)
    return values


def parse_inputs(
    inputs: Mapping[str, np.ndarray | None],
    defaults: ServingDefaults,
    *,
    vocab_size: int,
    eos_id: int,
    max_draft_len_limit: int,
) -> RequestInputs:
    """Request tensors -> :class:`RequestInputs`, with every check that needs no tokenizer."""
    values = _tensor_values(inputs)
    compat = trtllm_compat.resolve(values, vocab_size=vocab_size, eos_id=eos_id)
    if compat.max_draft_len is not None and not 1 <= compat.max_draft_len <= max_draft_len_limit:
        raise BanditSpecValidationError(
            "num_draft_tokens", f"must be in 0..{max_draft_len_limit}, got {compat.max_draft_len}"
        )
    arms = values.get("arms", list(defaults.arms) if defaults.arms is not None else None)
    return RequestInputs(
        text_input=values["text_input"],
        max_tokens=values["max_tokens"],
        stream=values.get("stream", False),
        policy=compat.policy if compat.policy and "policy" not in values else values.get("policy", defaults.policy),
        arms=arms,
        max_draft_len=compat.max_draft_len or values.get("max_draft_len", defaults.max_draft_len),
        reward=values.get("reward", defaults.reward),
        stop_words=values.get("stop_words", []),
        chat_template=values.get("apply_chat_template", defaults.chat_template),
        compat=compat,
    )


class Controller:
    """Runs requests: parse, tokenize, decode step by step through ``engine``, stream text."""

    def __init__(self, decoder: SpeculativeDecoder, engine: Engine, tokenizer: Any, defaults: ServingDefaults,
                 calibrate: Callable[[], None] | None = None) -> None:
        """calibrate: times the target once, before the first request decodes (the cost
        model's verify curve: without it the controller starts from a prior slope and, choosing
        short drafts because of it, rarely observes the long ones that would correct it);
        :meth:`prepare` runs it."""
        self.decoder = decoder
        self.engine = engine
        self.tokenizer = tokenizer
        self.defaults = defaults
        self._calibrate = calibrate
        self._prepare_lock = threading.Lock()
        self.admission = AdmissionQueue(defaults.admission_limits(), on_change=self._queue_changed)
        self.ready = threading.Event()  # set once calibrated and warmed up (prepare)
        self._active = 0
        self._active_lock = threading.Lock()
        # Observability hooks (metrics); a hook that raises is logged, never fails a request.
        self.on_step: Callable | None = None  # (StepEvent) -> None, every decoding step
        self.on_active: Callable[[int], None] | None = None  # (sequences in flight) on every change
        self.on_queue: Callable[[int], None] | None = None  # (requests waiting for a slot) on every change
        # (seconds a request waited for a slot, how the wait ended: "admitted" | "cancelled" | "expired")
        self.on_queue_wait: Callable[[float, str], None] | None = None
        # (outcome: one of OUTCOMES, the request's SpeculationStats or None when it never started)
        self.on_request_done: Callable | None = None
        # () just before a request's final response (the observer exports what its steps left queued)
        self.on_final_response: Callable[[], None] | None = None
        self.on_ready: Callable[[], None] | None = None  # () once, when ready is set

    def _queue_changed(self, snapshot: AdmissionSnapshot) -> None:
        self._notify(self.on_queue, snapshot.queued)

    def _change_active(self, delta: int) -> None:
        """Count a sequence in or out and publish the count. Published under the lock, so
        that the last value published is the current one (two requests ending at once must
        not leave an older count on the gauge)."""
        with self._active_lock:
            self._active += delta
            self._notify(self.on_active, self._active)

    def _notify(self, hook: Callable | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            log.exception("observability hook failed")

    @property
    def active_sequences(self) -> int:
        return self._active

    def build_request(self, inputs: Mapping[str, np.ndarray | None]) -> tuple[GenerationRequest, bool]:
        request, stream, _ = self._build(inputs)
        return request, stream

    def _build(self, inputs: Mapping[str, np.ndarray | None]) -> tuple[GenerationRequest, bool, trtllm_compat.Resolved]:
        """(GenerationRequest, stream, trtllm_compat.Resolved) for a request's tensors."""
        parsed = parse_inputs(
            inputs,
            self.defaults,
            vocab_size=self.decoder.vocab_size,
            eos_id=self.decoder.eos_id,
            max_draft_len_limit=self.decoder.limits.max_draft_len,
        )
        return parsed.generation_request(self.tokenizer), parsed.stream, parsed.compat

    def handle(self, inputs: Mapping[str, np.ndarray | None], sink: ResponseSink) -> None:
        """Serve one request to completion; never raises."""
        held = _FinalHeldBack(sink)
        try:
            self._handle(inputs, held)
        finally:
            held.release()

    def _handle(self, inputs: Mapping[str, np.ndarray | None], sink: ResponseSink) -> None:
        try:
            arrival_ns = time.time_ns()
            request, stream, compat = self._build(inputs)
            session = self.decoder.start(request)
        except BanditSpecValidationError as exc:
            sink.fail("invalid", str(exc))
            self._notify(self.on_request_done, OUTCOME_INVALID, None)
            return
        except Exception as exc:  # tokenizer trouble etc.: no traceback to the client
            log.exception("request rejected")
            sink.fail("internal", f"could not prepare the request ({type(exc).__name__})")
            self._notify(self.on_request_done, OUTCOME_INTERNAL, None)
            return
        if not self.ready.is_set():
            self.prepare()
        waited_from = time.monotonic()
        try:
            slot = self.admission.acquire(sink.is_cancelled)
        except AdmissionRefused as exc:
            session.cancel()
            if exc.reason == "wait_expired":
                self._notify(self.on_queue_wait, time.monotonic() - waited_from, "expired")
            sink.fail("unavailable", retry_after_message(str(exc), exc.retry_after_s))
            self._notify(self.on_request_done, OUTCOME_BUSY, None)
            return
        if slot is None:  # the client went away while waiting
            session.cancel()
            self._notify(self.on_queue_wait, time.monotonic() - waited_from, "cancelled")
            self._notify(self.on_request_done, OUTCOME_CANCELLED, session.stats)
            return
        self._notify(self.on_queue_wait, slot.waited_s, "admitted")
        self._change_active(+1)
        outcome = OUTCOME_INTERNAL
        try:
            info = {"compat": compat, "prompt_tokens": len(request.prompt_ids), "arrival_ns": arrival_ns}
            outcome = self._run(session, stream, sink, info)
        finally:
            self._change_active(-1)
            slot.release()
            self._notify(self.on_request_done, outcome, session.stats)

    def prepare(self, policies: Sequence[str] | None = None) -> None:
        """What would otherwise slow a fresh server's first requests, done once: the cost
        model's calibration, then one short request per policy in ``policies`` (default: plain
        decoding and the default policy) so that the target's, the drafters' and the
        tokenizer's first calls are behind us; then ``ready``. The first request runs it before
        it decodes (`banditspec serve` sends one before it says it is ready); requests that come
        meanwhile wait for it. Warm-up requests take no slot and reach no metric; what the
        controller learns from them is what it learns from any request (the target's real
        timings and acceptance). Never raises: what fails is logged, and the cost model learns
        online from its prior."""
        with self._prepare_lock:
            if self.ready.is_set():
                return
            if self._calibrate is not None:
                try:
                    self._calibrate()
                except Exception:
                    log.exception("calibrating the cost model failed; it learns online from its prior")
            for policy in policies if policies is not None else _warm_up_policies(self.defaults.policy):
                try:
                    self._warm_up(policy)
                except Exception:
                    log.exception("warm-up with policy %s failed", policy)
            self.mark_ready()

    def _warm_up(self, policy: str) -> None:
        request = parse_inputs(
            {"text_input": np.array([WARM_UP_PROMPT.encode()], dtype=np.object_),
             "max_tokens": np.array([WARM_UP_TOKENS], dtype=np.int32),
             "policy": np.array([policy.encode()], dtype=np.object_)},
            self.defaults, vocab_size=self.decoder.vocab_size, eos_id=self.decoder.eos_id,
            max_draft_len_limit=self.decoder.limits.max_draft_len,
        ).generation_request(self.tokenizer)
        detok = IncrementalDetokenizer(self.tokenizer)
        for event in generate(self.engine, self.decoder.start(request)):
            detok.push(event.new_token_ids, final=event.finished)

    def mark_ready(self) -> None:
        """Say that the controller serves at speed from now on (``ready``, ``on_ready``)."""
        if not self.ready.is_set():
            self.ready.set()
            self._notify(self.on_ready)

    def _run(self, session: DecodingSession, stream: bool, sink: ResponseSink, info: dict | None = None) -> str:
        """Decode ``session`` to the end, streaming through ``sink``; returns the outcome."""
        detok = IncrementalDetokenizer(self.tokenizer)
        steps = generate(self.engine, session)
        delta = ""
        scheduled_ns = time.time_ns()
        first_token_ns = 0
        try:
            for event in steps:
                self._notify(self.on_step, event)
                if event.new_token_ids and not first_token_ns:
                    first_token_ns = time.time_ns()
                delta = detok.push(event.new_token_ids, final=event.finished)
                if event.finished:
                    break
                if stream and delta and not sink.is_cancelled():
                    sink.send(delta, None, final=False)
                if sink.is_cancelled():  # checked every step, before the next target call
                    session.cancel()
                    return OUTCOME_CANCELLED
        except EngineError as exc:
            sink.fail("unavailable", f"target engine failed: {exc}")
            return OUTCOME_TARGET_ERROR
        except Exception as exc:
            log.exception("decoding failed")
            sink.fail("internal", f"decoding failed ({type(exc).__name__})")
            return OUTCOME_INTERNAL
        finally:
            steps.close()
        if sink.is_cancelled():
            return OUTCOME_CANCELLED
        stats = session.result().stats.as_dict()
        stats["finish_reason"] = session.finish_reason
        text = delta if stream else detok.text
        if info is not None:
            stats["prompt_tokens"] = info["prompt_tokens"]
            if info["compat"].echo_prompt:  # exclude_input_in_output = false (upstream's default): prompt + completion
                text = info["compat"].prompt_text + text
            last_ns = time.time_ns()
            stats["timing_ns"] = {
                "arrival": info["arrival_ns"],
                "first_scheduled": scheduled_ns,
                "first_token": first_token_ns or last_ns,
                "last_token": last_ns,
            }
        self._notify(self.on_final_response)
        sink.send(text, stats, final=True)
        return OUTCOME_SUCCESS


def stats_json(stats: dict) -> bytes:
    return json.dumps(stats, separators=(",", ":")).encode()
