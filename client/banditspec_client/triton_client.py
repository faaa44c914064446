"""Talk to the ``banditspec`` model through Triton with tritonclient (gRPC) or the
HTTP generate endpoints. A decoupled model is reached over gRPC streaming even when
the client wants one answer; over HTTP, ``/generate`` and ``/generate_stream``."""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class GenerationOptions:
    max_tokens: int = 128
    stream: bool = False
    temperature: float | None = None
    seed: int | None = None
    stop_words: Sequence[str] = ()
    policy: str | None = None
    arms: Sequence[str] | None = None
    max_draft_len: int | None = None
    reward: str | None = None


@dataclass
class RemoteResult:
    text: str
    stats: dict[str, Any]
    responses: int  # how many responses the server sent
    first_token_seconds: float | None = None
    seconds: float = 0.0
    chunks: list[str] = field(default_factory=list)


class TritonError(RuntimeError):
    """An error response from the server (its message, no traceback)."""


def _grpc_inputs(prompt: str, opts: GenerationOptions) -> list[Any]:
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value: list[Any], dtype: type[np.generic]) -> Any:
        arr = np.array(value, dtype=dtype).reshape(1, -1)
        t = grpcclient.InferInput(name, list(arr.shape), {np.int32: "INT32", np.float32: "FP32", np.uint64: "UINT64", np.bool_: "BOOL", np.object_: "BYTES"}[dtype])
        t.set_data_from_numpy(arr)
        return t

    inputs = [tensor("text_input", [prompt.encode("utf-8")], np.object_), tensor("max_tokens", [opts.max_tokens], np.int32)]
    inputs.append(tensor("stream", [opts.stream], np.bool_))
    if opts.temperature is not None:
        inputs.append(tensor("temperature", [opts.temperature], np.float32))
    if opts.seed is not None:
        inputs.append(tensor("random_seed", [opts.seed], np.uint64))
    if opts.stop_words:
        inputs.append(tensor("stop_words", [w.encode() for w in opts.stop_words], np.object_))
    if opts.policy is not None:
        inputs.append(tensor("policy", [opts.policy.encode()], np.object_))
    if opts.arms:
        inputs.append(tensor("arms", [a.encode() for a in opts.arms], np.object_))
    if opts.max_draft_len is not None:
        inputs.append(tensor("max_draft_len", [opts.max_draft_len], np.int32))
    if opts.reward is not None:
        inputs.append(tensor("reward", [opts.reward.encode()], np.object_))
    return inputs


def generate_grpc(
    url: str,
    prompt: str,
    opts: GenerationOptions,
    *,
    model_name: str = "banditspec",
    on_text: Callable[[str], None] | None = None,
    cancel_after: int | None = None,
    timeout: float = 600,
) -> RemoteResult:
    """One request over gRPC streaming. ``cancel_after``: cancel after that many responses."""
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    started = time.perf_counter()
    first = None
    chunks, stats, responses = [], {}, 0
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(model_name, _grpc_inputs(prompt, opts), enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=timeout)
            if error is not None:
                raise TritonError(str(error.message() if hasattr(error, "message") else error))
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param if "triton_final_response" in response.parameters else False
            text = result.as_numpy("text_output")
            if text is not None:
                responses += 1
                piece = b"".join(np.asarray(text).reshape(-1)).decode("utf-8")
                if first is None:
                    first = time.perf_counter() - started
                chunks.append(piece)
                if on_text is not None:
                    on_text(piece)
                raw_stats = result.as_numpy("speculation_stats")
                if raw_stats is not None:
                    stats = json.loads(np.asarray(raw_stats).reshape(-1)[0])
            if final:
                break
            if cancel_after is not None and responses >= cancel_after:
                client.stop_stream(cancel_requests=True)
                break
    finally:
        try:
            client.stop_stream()
        finally:
            client.close()
    return RemoteResult("".join(chunks), stats, responses, first, time.perf_counter() - started, chunks)


def _http_body(prompt: str, opts: GenerationOptions) -> dict:
    body: dict = {"text_input": prompt, "max_tokens": opts.max_tokens, "stream": opts.stream}
    for key, value in (
        ("temperature", opts.temperature),
        ("random_seed", opts.seed),
        ("policy", opts.policy),
        ("max_draft_len", opts.max_draft_len),
        ("reward", opts.reward),
    ):
        if value is not None:
            body[key] = value
    if opts.stop_words:
        body["stop_words"] = list(opts.stop_words)
    if opts.arms:
        body["arms"] = list(opts.arms)
    return body


def generate_http(
    url: str,
    prompt: str,
    opts: GenerationOptions,
    *,
    model_name: str = "banditspec",
    on_text: Callable[[str], None] | None = None,
    timeout: float = 600,
) -> RemoteResult:
    """``POST /v2/models/<model>/generate`` (or ``generate_stream``, server-sent events)."""
    endpoint = "generate_stream" if opts.stream else "generate"
    req = urllib.request.Request(
        f"http://{url}/v2/models/{model_name}/{endpoint}",
        data=json.dumps(_http_body(prompt, opts)).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    chunks, stats, first = [], {}, None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            lines = resp if opts.stream else [b"data: " + resp.read()]
            for line in lines:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise TritonError(event["error"])
                piece = event.get("text_output", "")
                piece = "".join(piece) if isinstance(piece, list) else piece
                if first is None:
                    first = time.perf_counter() - started
                chunks.append(piece)
                if on_text is not None:
                    on_text(piece)
                if event.get("speculation_stats"):
                    raw = event["speculation_stats"]
                    stats = json.loads(raw[0] if isinstance(raw, list) else raw)
    except urllib.error.HTTPError as exc:
        raise TritonError(json.loads(exc.read() or b"{}").get("error", str(exc))) from None
    return RemoteResult("".join(chunks), stats, len(chunks), first, time.perf_counter() - started, chunks)


def generate_remote(args: argparse.Namespace) -> int:
    opts = GenerationOptions(
        max_tokens=args.max_tokens,
        stream=args.stream,
        temperature=args.temperature if args.temperature else None,
        seed=args.seed,
        stop_words=args.stop,
        policy=args.policy,
        arms=args.arms.split(",") if args.arms else None,
        max_draft_len=args.max_draft_len,
        reward=args.reward,
    )
    show = (lambda piece: print(piece, end="", flush=True)) if args.stream and not args.json else None
    call = generate_grpc if args.protocol == "grpc" else generate_http
    try:
        result = call(args.url, args.prompt, opts, model_name=args.model_name, on_text=show)
    except TritonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"text": result.text, "stats": result.stats, "responses": result.responses}))
    else:
        print(result.text if not args.stream else "")
        if result.stats:
            s = result.stats
            print(
                f"[{s.get('generated_tokens')} tokens in {s.get('steps')} steps, mean accepted tokens "
                f"{s.get('mean_accepted_tokens')}, {result.seconds:.2f} s; arms {s.get('per_arm')}]",
                file=sys.stderr,
            )
    return 0
