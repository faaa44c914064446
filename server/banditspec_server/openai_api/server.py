"""Run the OpenAI-compatible API: in a thread of ``banditspec serve``, or on its own
(``banditspec openai --triton-url HOST:8001``) in front of any server that has the ``banditspec`` model."""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from banditspec_server.openai_api.app import create_app

DEFAULT_PORT = 9000


def load_tokenizer(model: str, tokenizer_dir: str = "") -> Any:
    from banditspec.serving.setup import load_serving_tokenizer

    return load_serving_tokenizer({"target_model": model, "tokenizer_dir": tokenizer_dir})


class OpenAIServer:
    """uvicorn serving the app in a background thread; ``stop()`` shuts it down."""

    def __init__(self, triton_url: str, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, tokenizer: Any = None,
                 model: str = "smollm2", tokenizer_dir: str = "", model_id: str = "banditspec",
                 triton_model: str = "banditspec", retry_after: Callable[[], int] | None = None) -> None:
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model, tokenizer_dir)
        app = create_app(triton_url, tokenizer=tokenizer, model_id=model_id, triton_model=triton_model,
                         retry_after=retry_after)
        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(self.config)
        self.thread: threading.Thread | None = None
        self.host, self.port = host, port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30) -> OpenAIServer:
        self.thread = threading.Thread(target=self.server.run, name="openai-api", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the OpenAI API could not start on {self.host}:{self.port} (port in use?)")
            if time.monotonic() > deadline:
                raise RuntimeError("the OpenAI API did not start in time")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 10) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--triton-url", default="localhost:8001", help="Triton gRPC address")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2", help="whose tokenizer renders chat")
    parser.add_argument("--tokenizer-dir", default="", help="a tokenizer folder (overrides --model)")
    parser.add_argument("--model-id", default="banditspec", help="the model name clients send and /v1/models lists")
    parser.add_argument("--triton-model", default="banditspec", help="the Triton model it serves (a copy's name)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    app = create_app(args.triton_url, tokenizer=load_tokenizer(args.model, args.tokenizer_dir), model_id=args.model_id,
                     triton_model=args.triton_model)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
