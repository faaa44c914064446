"""The OpenAI frontend's only way into the server: Triton's gRPC streaming API (tritonclient.grpc.aio).

One OpenAI request is one gRPC stream carrying one request to the ``banditspec`` model (a
decoupled model, so even a non-streamed answer travels over a stream). Leaving the stream early
(the HTTP client went away) cancels the request in Triton, and the controller stops within a step.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

OUTPUTS = ("text_output", "speculation_stats")
# gRPC's reconnect backoff grows to 120 s by default: a channel that found the server restarting
# would answer "failed to connect" long after the server is back. Capped at 1 s here.
RECONNECT_BACKOFF_MS = (("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                        ("grpc.max_reconnect_backoff_ms", 1000))


def _channel_args() -> list[tuple[str, int]]:
    """tritonclient's own channel options (message sizes, keepalive) plus the capped backoff."""
    from tritonclient.grpc import KeepAliveOptions
    from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE

    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        *RECONNECT_BACKOFF_MS,
    ]


class TritonError(Exception):
    """A request Triton refused or failed; ``status`` is the gRPC status name."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Chunk:
    text: str
    final: bool
    stats: dict[str, Any] | None = None


@dataclass
class ModelFacts:
    """Limits read from the controller's config.pbtxt parameters (through Triton)."""

    max_tokens_limit: int = 1024
    max_context: int = 2048
    extra: dict[str, str] = field(default_factory=dict)
    inputs: frozenset[str] = frozenset()  # the model's input names


def _tensor(name: str, value: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def to_tensors(inputs: dict[str, Any]) -> list[grpcclient.InferInput]:
    """Python values -> [1, ...] Triton tensors with banditspec's dtypes."""
    out = []
    for name, value in inputs.items():
        if isinstance(value, bool):
            arr = np.array([[value]], dtype=bool)
        elif isinstance(value, int):
            arr = np.array([[value]], dtype=np.uint64 if name == "random_seed" else np.int32)
        elif isinstance(value, float):
            arr = np.array([[value]], dtype=np.float32)
        elif isinstance(value, str):
            arr = np.array([[value.encode("utf-8")]], dtype=object)
        elif isinstance(value, (list, tuple)):
            arr = np.array([[v.encode("utf-8") for v in value]], dtype=object)
        else:
            raise TypeError(f"{name}: unsupported value {value!r}")
        out.append(_tensor(name, arr))
    return out


class TritonBackend:
    def __init__(self, url: str, model: str = "banditspec"):
        self.url = url
        self.model = model
        self._client: grpcclient.InferenceServerClient | None = None

    @property
    def client(self) -> grpcclient.InferenceServerClient:
        if self._client is None:  # created inside the serving event loop
            self._client = grpcclient.InferenceServerClient(self.url, channel_args=_channel_args())
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def ready(self) -> bool:
        try:
            return await self.client.is_model_ready(self.model)
        except InferenceServerException:
            return False

    async def facts(self) -> ModelFacts:
        config = (await self.client.get_model_config(self.model, as_json=True))["config"]
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}

        def number(key: str, default: int) -> int:
            try:
                return int(params.get(key, default))
            except ValueError:
                return default

        names = frozenset(i["name"] for i in config.get("input", []))
        return ModelFacts(number("max_tokens_limit", 1024), number("max_context", 2048), params, names)

    async def generate(self, inputs: dict[str, Any]) -> AsyncGenerator[Chunk, None]:
        """Responses of one request; raises TritonError for an error response."""
        request = {
            "model_name": self.model,
            "inputs": to_tensors(inputs),
            "outputs": [grpcclient.InferRequestedOutput(name) for name in OUTPUTS],
            "request_id": uuid.uuid4().hex,
            "enable_empty_final_response": True,
        }

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request

        try:
            responses = self.client.stream_infer(one_request())
        except InferenceServerException as exc:
            raise TritonError(_status(exc), exc.message()) from None
        try:
            async for result, error in _transport_errors(responses):
                if error is not None:
                    raise TritonError(_status(error), error.message())
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                text_out = result.as_numpy("text_output")
                text = b"".join(bytes(x) for x in text_out.reshape(-1)).decode("utf-8") if text_out is not None else ""
                stats_out = result.as_numpy("speculation_stats")
                stats = json.loads(bytes(stats_out.reshape(-1)[0])) if stats_out is not None else None
                yield Chunk(text, final, stats)
                if final:
                    return
        finally:
            responses.cancel()  # no-op after the final response; cancels the request otherwise


async def _transport_errors(responses: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """The stream's items; a broken connection (the server went away, or restarts) is a TritonError
    with its gRPC status (UNAVAILABLE, CANCELLED ...), not the grpc library's own exception."""
    iterator = responses.__aiter__()
    while True:
        try:
            item = await iterator.__anext__()
        except StopAsyncIteration:
            return
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise TritonError(code.name if code is not None else "UNKNOWN",
                              f"the inference server closed the stream ({details})") from None
        yield item


def _status(error: InferenceServerException) -> str:
    status = error.status() or ""
    return status.rsplit(".", 1)[-1]  # "StatusCode.INVALID_ARGUMENT" -> "INVALID_ARGUMENT"
