"""OpenAI-compatible HTTP API over the ``banditspec`` Triton model (FastAPI + tritonclient gRPC).

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with
``stream`` as server-sent events), ``GET /health``. Every field OpenAI defines that would change
the output is either honoured or refused with HTTP 400 in OpenAI's error shape naming it
(``n`` > 1, ``logprobs``, ``tools``, ``top_p`` < 1, penalties ...); a field OpenAI does not define
is refused too, except BanditSpec's extensions ``policy``, ``arms``, ``max_draft_len``.
Each answer carries ``speculation_stats`` (steps, arm per step, accepted tokens ...) as an
extension field: on the response, or on the final chunk of a stream.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal, NoReturn, Protocol

from banditspec.errors import model_down, parse_retry_after, retry_after_message
from banditspec.text import render_chat, text_ids
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from banditspec_server.openai_api.triton import Chunk, ModelFacts, TritonBackend, TritonError

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
# banditspec input -> the OpenAI field a client sent it as (for the error's "param")
PARAM_OF_INPUT = {"text_input": "prompt", "stop_words": "stop", "random_seed": "seed", "max_tokens": "max_tokens"}
# gRPC statuses of a call that failed as a whole (a stream's own errors carry a message, no code)
HTTP_OF_STATUS = {"INVALID_ARGUMENT": 400, "UNAVAILABLE": 503, "RESOURCE_EXHAUSTED": 503, "CANCELLED": 503,
                  "DEADLINE_EXCEEDED": 503, "NOT_FOUND": 404}
# a message of the controller's that is a server-side condition, even without a retry hint
BUSY_PREFIXES = ("server busy",)
DEFAULT_RETRY_AFTER_S = 5  # nothing better known (the API runs without banditspec serve's supervisor)


class OpenAIError(Exception):
    """An error answer; ``retry_after`` (seconds) goes out as the ``Retry-After`` header of a 503."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 code: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.retry_after = retry_after


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    """Fields both endpoints take. Unknown fields are refused (never silently dropped)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # no effect on the output
    # BanditSpec extensions
    policy: str | None = None
    arms: str | list[str] | None = None
    max_draft_len: int | None = None


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


class _MakeChunk(Protocol):
    """A response chunk (or the whole non-streamed answer) in the endpoint's own shape."""

    def __call__(self, text: str | None, finish: str | None, stats: dict[str, Any] | None, role: bool = False,
                 usage_only: bool = False) -> dict[str, Any]: ...


def _refuse(param: str, message: str) -> NoReturn:
    raise OpenAIError(400, f"{param}: {message}", param=param)


def chat_prompt(tokenizer: Any, messages: list[Message]) -> str:
    """The prompt text of a chat, rendered by the server's own renderer (``banditspec.text.render_chat``,
    which its single-turn prompts go through too): ``developer`` is a system turn, text parts are joined."""
    turns = [
        {"role": "system" if m.role == "developer" else m.role,
         "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)}
        for m in messages
    ]
    try:
        return render_chat(tokenizer, turns)
    except Exception as exc:
        _refuse("messages", f"cannot be rendered with the model's chat template ({type(exc).__name__})")


def common_inputs(req: _Common, facts: ModelFacts, prompt_tokens: int | None, default_max_tokens: int | None) -> dict[str, Any]:
    """The banditspec inputs for the fields both endpoints share; refusals name the field."""
    if req.n not in (None, 1):
        _refuse("n", f"only 1 is supported, got {req.n}")
    if req.logit_bias:
        _refuse("logit_bias", "is not supported")
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != req.max_completion_tokens:
            _refuse("max_completion_tokens", "differs from max_tokens; send one of them")
        max_tokens = req.max_completion_tokens
    if max_tokens is None:
        max_tokens = default_max_tokens
        if max_tokens is None:  # as much as fits: the server's limit, within the context
            room = facts.max_context - (prompt_tokens or 0)
            max_tokens = max(1, min(facts.max_tokens_limit, room))
    inputs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "stream": req.stream,
        "temperature": 1.0 if req.temperature is None else float(req.temperature),  # OpenAI's default is 1
        "apply_chat_template": False,
    }
    if req.top_p is not None:
        inputs["top_p"] = float(req.top_p)
    if req.seed is not None:
        inputs["random_seed"] = int(req.seed)
    if req.presence_penalty is not None:
        inputs["presence_penalty"] = float(req.presence_penalty)
    if req.frequency_penalty is not None:
        inputs["frequency_penalty"] = float(req.frequency_penalty)
    if req.stop:
        inputs["stop_words"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.policy is not None:
        inputs["policy"] = req.policy
    if req.arms is not None:
        inputs["arms"] = [req.arms] if isinstance(req.arms, str) else list(req.arms)
    if req.max_draft_len is not None:
        inputs["max_draft_len"] = int(req.max_draft_len)
    return inputs


def _triton_error(exc: TritonError, prompt_param: str, input_names: frozenset[str] = frozenset(),
                  retry_after: Callable[[], int] = lambda: DEFAULT_RETRY_AFTER_S) -> OpenAIError:
    """Triton's answer -> OpenAI's error. A gRPC stream carries the message without Triton's
    error code, so the status is read from the message: a retryable server-side condition ends
    with "(retry after N s)" (503, ``Retry-After: N``); invalid input starts with the input's
    name (400); anything else the server did wrong is a 500. A call that failed as a whole
    (the server unreachable or restarting) has its gRPC status: UNAVAILABLE is a 503 whose wait
    is ``retry_after()``."""
    message = exc.message
    if message.startswith("in ensemble"):
        message = message.split(", ", 1)[-1]
    field = message.split(":", 1)[0] if ":" in message else None
    hint = parse_retry_after(message)
    status = 503 if hint is not None else HTTP_OF_STATUS.get(exc.status or "", 0)
    if not status:
        if field in input_names:
            status = 400
        elif message.startswith(BUSY_PREFIXES) or model_down(message):
            status = 503  # the model is down (Triton's words) or full: the server's side
        else:
            status = 500
    if status == 503:
        if hint is None:
            hint = retry_after()
            message = retry_after_message(message, hint)
        return OpenAIError(503, message, kind="server_busy", retry_after=hint)
    if status >= 500:
        return OpenAIError(status, message, kind="server_error")
    param = None
    if field and field.isidentifier():
        param = prompt_param if field == "text_input" else PARAM_OF_INPUT.get(field, field)
    return OpenAIError(status, message, param=param)


def _unreachable(exc: Exception, retry_after: Callable[[], int]) -> OpenAIError:
    seconds = retry_after()
    return OpenAIError(503, retry_after_message(f"the inference server is unavailable ({type(exc).__name__})", seconds),
                       kind="server_busy", retry_after=seconds)


def _usage(stats: dict[str, Any] | None) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens`` where the target says how
    much of the prompt it found in its prefix cache (a conversation's history, resent each turn)."""
    prompt = int((stats or {}).get("prompt_tokens") or 0)
    completion = int((stats or {}).get("generated_tokens") or 0)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    cached = (stats or {}).get("cached_prompt_tokens")
    if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _sse(payload: dict[str, Any] | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def create_app(triton_url: str, *, tokenizer: Any, model_id: str = "banditspec", triton_model: str = "banditspec",
               retry_after: Callable[[], int] | None = None) -> FastAPI:
    """The app; ``tokenizer`` renders chat messages with the model's chat template and counts
    prompt tokens (the same tokenizer the controller uses); ``retry_after`` estimates the seconds
    until an unreachable server answers again (``banditspec serve``: its supervisor's restart time)."""
    wait = retry_after or (lambda: DEFAULT_RETRY_AFTER_S)
    backend = TritonBackend(triton_url, triton_model)
    state: dict[str, ModelFacts] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await backend.close()

    app = FastAPI(title="BanditSpec OpenAI-compatible API", lifespan=lifespan)

    async def facts() -> ModelFacts:
        if "facts" not in state:
            try:
                state["facts"] = await backend.facts()
            except Exception as exc:  # Triton unreachable or restarting
                raise _unreachable(exc, wait) from None
        return state["facts"]

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
        return JSONResponse(error_body(exc.message, exc.kind, exc.param, exc.code), status_code=exc.status,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        message = f"{param}: {first.get('msg', 'invalid request')}" if param else first.get("msg", "invalid request")
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = await backend.ready()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    @app.get("/v1/models", response_model=None)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "banditspec"}]}

    def check_model(name: str) -> None:
        if name != model_id:
            raise OpenAIError(404, f"The model '{name}' does not exist; this server serves '{model_id}'",
                              param="model", code="model_not_found")

    async def start(inputs: dict[str, Any], prompt_param: str) -> tuple[Chunk, AsyncGenerator[Chunk, None]]:
        """First response of the request (errors become HTTP errors before any byte is sent)."""
        stream = backend.generate(inputs)
        try:
            first = await stream.__anext__()
        except TritonError as exc:
            await stream.aclose()
            raise _triton_error(exc, prompt_param, (await facts()).inputs, wait) from None
        except StopAsyncIteration:
            raise OpenAIError(502, "the model sent no response") from None
        except Exception as exc:  # Triton unreachable etc.
            await stream.aclose()
            raise _unreachable(exc, wait) from None
        return first, stream

    async def collect(first: Chunk, stream: AsyncGenerator[Chunk, None]) -> tuple[str, dict[str, Any] | None]:
        parts, chunk = [first.text], first
        try:
            while not chunk.final:
                chunk = await stream.__anext__()
                parts.append(chunk.text)
        except TritonError as exc:
            raise _triton_error(exc, "prompt", retry_after=wait) from None
        except Exception as exc:  # the connection to Triton broke mid-answer
            raise _unreachable(exc, wait) from None
        finally:
            await stream.aclose()
        return "".join(parts), chunk.stats

    def streamed(first: Chunk, stream: AsyncGenerator[Chunk, None], make_chunk: _MakeChunk,
                 include_usage: bool) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            chunk = first
            try:
                yield _sse(make_chunk(None, None, None, role=True))
                while True:
                    if chunk.final:
                        reason = FINISH_REASONS.get((chunk.stats or {}).get("finish_reason", "stop"), "stop")
                        yield _sse(make_chunk(chunk.text, reason, chunk.stats))
                        if include_usage:
                            yield _sse({**make_chunk(None, None, None, usage_only=True), "usage": _usage(chunk.stats)})
                        yield _sse("[DONE]")
                        return
                    if chunk.text:
                        yield _sse(make_chunk(chunk.text, None, None))
                    chunk = await stream.__anext__()
            except Exception as exc:  # a stream ends with an error event, never a silent close
                err = _triton_error(exc, "prompt", retry_after=wait) if isinstance(exc, TritonError) else _unreachable(exc, wait)
                yield _sse(error_body(err.message, err.kind, err.param, err.code))
            finally:
                await stream.aclose()  # an HTTP client that left cancels the Triton request

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> dict[str, Any] | StreamingResponse:
        check_model(req.model)
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        if len(prompts) != 1:
            _refuse("prompt", f"send one prompt per request, got {len(prompts)}")
        if req.best_of not in (None, 1):
            _refuse("best_of", f"only 1 is supported, got {req.best_of}")
        if req.logprobs is not None:
            _refuse("logprobs", "log-probabilities are not supported")
        if req.suffix:
            _refuse("suffix", "is not supported")
        prompt = prompts[0]
        inputs = {"text_input": prompt, **common_inputs(req, await facts(), None, 16)}  # OpenAI's default: 16
        first, stream = await start(inputs, "prompt")
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        echo = prompt if req.echo else ""

        def make_chunk(text: str | None, finish: str | None, stats: dict[str, Any] | None, role: bool = False,
                       usage_only: bool = False) -> dict[str, Any]:
            if role:  # completions have no role chunk: the echo (if any) goes first
                text = echo
            choices = [] if usage_only else [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
            out = {"id": rid, "object": "text_completion", "created": created, "model": req.model, "choices": choices}
            if stats is not None:
                out["speculation_stats"] = stats
            return out

        if req.stream:
            return streamed(first, stream, make_chunk, bool(req.stream_options and req.stream_options.include_usage))
        text, stats = await collect(first, stream)
        out = make_chunk(echo + text, FINISH_REASONS.get((stats or {}).get("finish_reason", "stop"), "stop"), stats)
        out["usage"] = _usage(stats)
        return out

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatRequest) -> dict[str, Any] | StreamingResponse:
        check_model(req.model)
        if req.logprobs or req.top_logprobs:
            _refuse("logprobs", "log-probabilities are not supported")
        if req.tools or req.tool_choice not in (None, "none"):
            _refuse("tools", "tool calling is not supported")
        if req.response_format and req.response_format.get("type") != "text":
            _refuse("response_format", "only {\"type\": \"text\"} is supported")
        prompt = chat_prompt(tokenizer, req.messages)
        prompt_tokens = len(text_ids(tokenizer, prompt))
        inputs = {"text_input": prompt, **common_inputs(req, await facts(), prompt_tokens, None)}
        first, stream = await start(inputs, "messages")
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def make_chunk(text: str | None, finish: str | None, stats: dict[str, Any] | None, role: bool = False,
                       usage_only: bool = False) -> dict[str, Any]:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choices = [] if usage_only else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            out = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model, "choices": choices}
            if stats is not None:
                out["speculation_stats"] = stats
            return out

        if req.stream:
            return streamed(first, stream, make_chunk, bool(req.stream_options and req.stream_options.include_usage))
        text, stats = await collect(first, stream)
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": req.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": FINISH_REASONS.get((stats or {}).get("finish_reason", "stop"), "stop"),
            }],
            "usage": _usage(stats),
            "speculation_stats": stats,
        }

    return app
