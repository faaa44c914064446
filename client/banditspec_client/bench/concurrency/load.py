"""The load generator of ``banditspec bench-load``: closed-loop streams on one asyncio loop.

A level of N streams is N coroutines on one event loop in this process (no thread or
process per stream), each sending its next request as soon as its previous one ended,
``requests_per_stream`` requests in all. Two transports:

* ``triton``: Triton's streaming gRPC (``tritonclient.grpc.aio``), one stream per request,
  ``stream`` on: a response per piece of text, the last carrying ``speculation_stats``;
* ``openai``: the OpenAI API's ``/v1/chat/completions`` with ``stream`` on (server-sent
  events over aiohttp), the last chunk carrying ``speculation_stats`` and the usage.

Per request: the time to its first text, its latency, its output tokens (the server's
count) and its text; a request that fails (an error response, a refused connection, a
timeout) is counted with its message, and the stream goes on with its next request. The
generator's own CPU time (this process) is measured over each block, so a report can say
how much of the machine the generator took.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from banditspec_client.triton_client import GenerationOptions

TRANSPORTS = ("triton", "openai")


@dataclass
class RequestOutcome:
    """One request of a closed loop."""

    stream: int
    prompt_index: int
    started: float  # seconds since the block began
    latency_s: float = 0.0
    ttft_s: float | None = None
    output_tokens: int = 0
    text: str = ""
    error: str | None = None
    drafted_per_step: float | None = None
    # the controller's view of the batched step when the request ended (costaware's
    # BatchCost summary from speculation_stats: sequences per call, rows, the row-cost fit)
    batch_view: dict[str, Any] | None = None
    per_arm: dict[str, dict[str, int]] | None = None  # speculation_stats' pulls, drafted, accepted per arm
    step_ms: float = 0.0  # the request's steps: all of it, and the target calls within it
    verify_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def itl_s(self) -> float | None:
        """Inter-token latency: the time after the first text, per further output token
        (aiperf's and genai-perf's definition); None for fewer than two tokens."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class BlockResult:
    """One method at one concurrency through one transport."""

    transport: str
    method: str
    concurrency: int
    wall_s: float
    generator_cpu_s: float
    outcomes: list[RequestOutcome] = field(default_factory=list)
    # the target's engine calls over the block and their mean sequences (its metrics port)
    target_batches: dict[str, float] | None = None

    @property
    def failed(self) -> list[RequestOutcome]:
        return [o for o in self.outcomes if not o.ok]

    def summary(self) -> dict[str, Any]:
        """Output tokens/s over the block's wall time, and percentiles over its requests."""
        done = [o for o in self.outcomes if o.ok]
        tokens = sum(o.output_tokens for o in done)
        ttft = [o.ttft_s for o in done if o.ttft_s is not None]
        itl = [o.itl_s for o in done if o.itl_s is not None]
        latency = [o.latency_s for o in done]
        drafted = [o.drafted_per_step for o in done if o.drafted_per_step is not None]
        arms: dict[str, dict[str, int]] = {}
        for o in done:
            for arm, entry in (o.per_arm or {}).items():
                total = arms.setdefault(arm, {"pulls": 0, "drafted": 0, "accepted": 0})
                for key in total:
                    total[key] += int(entry.get(key, 0))
        steps = sum(sum(a["pulls"] for a in (o.per_arm or {}).values()) for o in done)
        # the view of the request that ended nearest the block's middle: the last one ends
        # when the other streams have gone, and the view's decayed means say "alone" by then
        ends = sorted((o.started + o.latency_s, i) for i, o in enumerate(done) if o.batch_view is not None)
        view = done[ends[len(ends) // 2][1]].batch_view if ends else None
        return {
            "transport": self.transport,
            "method": self.method,
            "concurrency": self.concurrency,
            "requests": len(self.outcomes),
            "failed": len(self.failed),
            "errors": sorted({o.error or "" for o in self.failed})[:5],
            "output_tokens": tokens,
            "wall_s": round(self.wall_s, 3),
            "output_tokens_per_s": round(tokens / self.wall_s, 3) if self.wall_s > 0 else 0.0,
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p99_s": percentile(ttft, 99),
            "itl_p50_s": percentile(itl, 50),
            "itl_p99_s": percentile(itl, 99),
            "latency_p50_s": percentile(latency, 50),
            "latency_p99_s": percentile(latency, 99),
            "drafted_per_step": round(float(np.mean(drafted)), 3) if drafted else None,
            "target_batches": self.target_batches,
            "batch_view": view,
            "per_arm": arms,
            # per step: the controller's own milliseconds (drafting, choosing, waiting to be
            # gathered) and the target call's (its queue and pass)
            "own_ms_per_step": round(sum(o.step_ms - o.verify_ms for o in done) / steps, 3) if steps else None,
            "verify_ms_per_step": round(sum(o.verify_ms for o in done) / steps, 3) if steps else None,
            "generator_cpu_s": round(self.generator_cpu_s, 3),
            "generator_cpu_share": round(self.generator_cpu_s / self.wall_s, 4) if self.wall_s > 0 else 0.0,
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), rounded to 0.1 ms; None without values."""
    return round(float(np.percentile(values, q)), 4) if len(values) else None


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Client:
    """One transport's requests (see the module docstring)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def request(self, prompt: str, opts: GenerationOptions, outcome: RequestOutcome, began: float) -> None:
        raise NotImplementedError


class TritonStreamClient(Client):
    def __init__(self, url: str, model_name: str = "banditspec"):
        self.url, self.model_name = url, model_name
        self._client: Any = None

    async def start(self) -> None:
        import tritonclient.grpc.aio as grpcclient

        self._client = grpcclient.InferenceServerClient(self.url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def request(self, prompt: str, opts: GenerationOptions, outcome: RequestOutcome, began: float) -> None:
        from banditspec_client.triton_client import _grpc_inputs

        inputs = _grpc_inputs(prompt, opts)

        async def one() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self.model_name, "inputs": inputs}

        pieces: list[str] = []
        responses = self._client.stream_infer(one())
        try:
            async for result, error in responses:
                if error is not None:
                    outcome.error = f"triton: {error}"[:300]
                    return
                raw_text = result.as_numpy("text_output")
                if raw_text is not None:
                    text = b"".join(t if isinstance(t, bytes) else str(t).encode() for t in np.asarray(raw_text).reshape(-1))
                    if text and outcome.ttft_s is None:
                        outcome.ttft_s = time.monotonic() - began - outcome.started
                    pieces.append(text.decode("utf-8", errors="replace"))
                raw = result.as_numpy("speculation_stats")
                if raw is not None:  # the request's last response carries its statistics
                    _take_stats(outcome, json.loads(np.asarray(raw).reshape(-1)[0]))
                    break
                parameters = result.get_response().parameters
                if "triton_final_response" in parameters and parameters["triton_final_response"].bool_param:
                    outcome.error = "triton: the final response carried no speculation_stats"
                    return
            else:
                outcome.error = outcome.error or "triton: the stream ended without a final response"
        finally:
            responses.cancel()
            outcome.text = "".join(pieces)


class OpenAIStreamClient(Client):
    def __init__(self, base_url: str, model: str = "banditspec", timeout_s: float = 600.0):
        self.base_url, self.model, self.timeout_s = base_url.rstrip("/"), model, timeout_s
        self._session: Any = None

    async def start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                              connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, prompt: str, opts: GenerationOptions, outcome: RequestOutcome, began: float) -> None:
        body: dict[str, Any] = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                                "max_tokens": opts.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
        # the OpenAI API samples at temperature 1 when none is sent: greedy must say 0
        body["temperature"] = opts.temperature if opts.temperature is not None else 0.0
        if opts.seed is not None:
            body["seed"] = opts.seed
        if opts.policy is not None:
            body["policy"] = opts.policy
        if opts.max_draft_len is not None:
            body["max_draft_len"] = opts.max_draft_len
        pieces: list[str] = []
        try:
            async with self._session.post(f"{self.base_url}/v1/chat/completions", json=body) as response:
                if response.status != 200:
                    outcome.error = f"openai: HTTP {response.status}: {(await response.text())[:200]}"
                    return
                buffer = b""
                async for block in response.content.iter_any():
                    buffer += block
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        if self._event(event, pieces, outcome, began):
                            return
                outcome.error = outcome.error or "openai: the stream ended without [DONE]"
        finally:
            outcome.text = "".join(pieces)

    @staticmethod
    def _event(event: bytes, pieces: list[str], outcome: RequestOutcome, began: float) -> bool:
        """One server-sent event; True at the stream's end."""
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return True
            chunk = json.loads(data)
            if "error" in chunk:
                outcome.error = f"openai: {json.dumps(chunk['error'])[:200]}"
                return True
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content") or ""
                if text and outcome.ttft_s is None:
                    outcome.ttft_s = time.monotonic() - began - outcome.started
                pieces.append(text)
            if chunk.get("speculation_stats"):
                _take_stats(outcome, chunk["speculation_stats"])
            usage = chunk.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                outcome.output_tokens = int(usage["completion_tokens"])
        return False


def _take_stats(outcome: RequestOutcome, stats: dict) -> None:
    outcome.output_tokens = int(stats.get("generated_tokens", outcome.output_tokens))
    drafted = stats.get("drafted") or []
    outcome.drafted_per_step = float(np.mean(drafted)) if drafted else 0.0
    batch = ((stats.get("controller") or {}).get("cost_model") or {}).get("batch")
    outcome.batch_view = batch if isinstance(batch, dict) else None
    per_arm = stats.get("per_arm")
    outcome.per_arm = per_arm if isinstance(per_arm, dict) else None
    outcome.step_ms = float(sum(stats.get("step_ms") or ()))
    outcome.verify_ms = float(sum(stats.get("verify_ms") or ()))


async def run_block(client: Client, *, transport: str, method: str, prompts: Sequence[str], prompt_indices: Sequence[int],
                    concurrency: int, requests_per_stream: int, opts: GenerationOptions,
                    request_timeout_s: float = 600.0,
                    on_request: Callable[[RequestOutcome], object] | None = None) -> BlockResult:
    """``concurrency`` closed-loop streams, each sending ``requests_per_stream`` requests:
    stream s sends prompt_indices[s], prompt_indices[s + concurrency], ... (cycled)."""
    outcomes: list[RequestOutcome] = []
    began = time.monotonic()
    cpu_before = _cpu_seconds()

    async def stream(s: int) -> None:
        for j in range(requests_per_stream):
            index = prompt_indices[(s + j * concurrency) % len(prompt_indices)]
            outcome = RequestOutcome(s, index, time.monotonic() - began)
            outcomes.append(outcome)
            try:
                await asyncio.wait_for(client.request(prompts[index], opts, outcome, began), request_timeout_s)
            except TimeoutError:
                outcome.error = f"{transport}: no answer in {request_timeout_s:g} s"
            except Exception as exc:  # a refused connection, a broken stream: counted, the loop goes on
                outcome.error = f"{transport}: {type(exc).__name__}: {exc}"[:300]
            outcome.latency_s = time.monotonic() - began - outcome.started
            if on_request is not None:
                on_request(outcome)

    await asyncio.gather(*(stream(s) for s in range(concurrency)))
    return BlockResult(transport, method, concurrency, time.monotonic() - began, _cpu_seconds() - cpu_before, outcomes)
