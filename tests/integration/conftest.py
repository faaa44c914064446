"""A real tritonserver for the integration tests (started once per session)."""

from __future__ import annotations

import pytest
from banditspec.paths import cache_dir


@pytest.fixture(scope="session")
def server():
    from banditspec_server.serve import TritonServer

    log = cache_dir() / "integration-tritonserver.log"
    log.write_bytes(b"")
    srv = TritonServer(
        model="smollm2",
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        log_path=log,
        overrides={"banditspec": {"max_concurrent_sequences": "4"}},
    )
    with srv:
        # The controller times the target before its first request decodes (the cost model's
        # calibration, ~30 target calls); tests that count the target's calls start after it.
        from banditspec_client.triton_client import GenerationOptions, generate_grpc

        generate_grpc(srv.grpc_url, "warm-up", GenerationOptions(max_tokens=1))
        yield srv


@pytest.fixture(scope="session")
def local_vanilla():
    """In-process plain greedy decoding with the same model: text for (prompt, max_tokens)."""
    from banditspec.config import GenerationRequest
    from banditspec.decoding.session import run_to_completion
    from banditspec.serving.runtime import load_local
    from banditspec.text import prompt_ids

    stack = load_local("smollm2", arms=("pld",))
    memo = {}

    def run(prompt: str, max_tokens: int) -> str:
        key = (prompt, max_tokens)
        if key not in memo:
            ids = prompt_ids(stack.tokenizer, prompt, chat=True)
            result = run_to_completion(stack.engine, stack.decoder.start(GenerationRequest(ids, max_tokens, policy="vanilla")))
            memo[key] = stack.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        return memo[key]

    return run
