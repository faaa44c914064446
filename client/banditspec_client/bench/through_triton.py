"""Through-Triton benchmark runner: a real tritonserver (``TritonServer``) and gRPC requests.

Fairness rules, as in process (see :mod:`banditspec_client.bench.in_process`):

* the target's prefix KV cache holds one sequence (``cache_entries=1``) and after each
  request a one-token verification call on ``target`` evicts it, so that no method
  reuses the prefill of the method that ran the same prompt before it;
* methods that feed the suffix drafter's global trie (suffix, the adaptive policies) are
  each served by a private copy of the ``banditspec`` model (``banditspec_<method>``,
  same code and parameters), so each has its own trie.

Per request: ``seconds`` is the client's wall time of a non-streaming gRPC request,
``cpu_seconds`` the CPU time the server's processes (tritonserver and its stubs, one
process group) spent meanwhile; tokens come from the ``speculation_stats`` output.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from banditspec_server.supervisor import group_cpu_seconds

from banditspec_client.bench.methods import FIXED_DRAFTERS, Method, RunRecord, digest
from banditspec_client.bench.runner import RunSettings, split_available
from banditspec_client.bench.workloads import Prompt

if TYPE_CHECKING:
    from banditspec_server.serve import TritonServer

    from banditspec_client.triton_client import RemoteResult

CONTROLLER = "banditspec"
PROBE_PROMPT = "Say hello."
FLUSH_TOKEN = 2  # one-token sequences from here on share no prefix with a chat-templated prompt


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def private_model_name(method: _Named) -> str:
    """The controller model copy a method gets when it must not share the suffix trie of past outputs."""
    return f"{CONTROLLER}_" + re.sub(r"[^A-Za-z0-9]+", "_", method.name).strip("_")


def bench_repository(source: Path, copies: Sequence[str], out: Path) -> Path:
    """``out``: a copy of the model repository ``source`` plus one copy of the controller
    model per name in ``copies`` (its ``name:`` line renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    for model_dir in sorted(p for p in source.iterdir() if (p / "config.pbtxt").exists()):
        shutil.copytree(model_dir, out / model_dir.name, ignore=shutil.ignore_patterns("__pycache__"))
    template = (source / CONTROLLER / "config.pbtxt").read_text()
    pattern = re.compile(rf'^name:\s*"{CONTROLLER}"', re.MULTILINE)
    if not pattern.search(template):
        raise RuntimeError(f"{source / CONTROLLER / 'config.pbtxt'} has no name: \"{CONTROLLER}\" line")
    for name in copies:
        shutil.copytree(source / CONTROLLER, out / name, ignore=shutil.ignore_patterns("__pycache__"))
        (out / name / "config.pbtxt").write_text(pattern.sub(f'name: "{name}"', template, count=1))
    return out


class TritonRunner:
    """A :class:`~banditspec_client.bench.runner.Runner` through a real tritonserver, started
    for ``methods`` (context manager); requests over gRPC."""

    label = "triton"

    def __init__(self, settings: RunSettings, methods: Sequence[Method], *, log_path: Path | None = None,
                 cache_entries: int = 1):
        self.settings = settings
        self.cache_entries = cache_entries  # the target's prefix cache (1: no reuse across requests, see _flush)
        self.methods = list(methods)
        self.log_path = log_path
        self.model_for = {m.name: private_model_name(m) if m.needs_suffix_state else CONTROLLER for m in self.methods}
        self.served: list[str] = []  # drafters the server serves
        self.adaptive_arms: list[str] = []  # the adaptive methods' arm set
        self._server: TritonServer | None = None
        self._workdir: Path | None = None
        self._client: Any = None

    # -- server lifetime -------------------------------------------------------------
    def __enter__(self) -> TritonRunner:
        from banditspec.paths import cache_dir
        from banditspec_server.serve import SOURCE_REPOSITORY, TritonServer

        copies = sorted({name for name in self.model_for.values() if name != CONTROLLER})
        self._workdir = Path(tempfile.mkdtemp(prefix="bench-repo-", dir=cache_dir()))
        source = bench_repository(SOURCE_REPOSITORY, copies, self._workdir / "models")
        overrides = {
            "target": {"cache_entries": str(self.cache_entries), "torch_threads": str(self.settings.threads)},
            CONTROLLER: {"max_concurrent_sequences": "2"},
        }
        for name in copies:
            overrides[name] = {"target_model": self.settings.model, "max_concurrent_sequences": "2"}
        self._server = server = TritonServer(
            model=self.settings.model, http_port=0, grpc_port=0, metrics_port=0,
            overrides=overrides, log_path=self.log_path, source=source,
        )
        try:
            server.__enter__()
            import tritonclient.grpc as grpcclient

            self._client = grpcclient.InferenceServerClient(server.grpc_url)
            self.served = self._probe_drafters()
            self.adaptive_arms = [d for d in self.served if d in self.settings.adaptive_drafters]
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def close(self) -> None:
        self.__exit__()

    # -- requests --------------------------------------------------------------------
    def _generate(self, model_name: str, text: str, method: Method, max_tokens: int,
                  arms: Sequence[str] | None = None) -> RemoteResult:
        from banditspec_client.triton_client import GenerationOptions, generate_grpc

        opts = GenerationOptions(
            max_tokens=max_tokens, stream=False, seed=self.settings.seed, temperature=self.settings.temperature,
            policy=method.policy, arms=arms,
            max_draft_len=method.draft_len(self.settings.max_draft_len), reward=method.reward,
        )
        return generate_grpc(self.grpc_url, text, opts, model_name=model_name)

    def _probe_drafters(self) -> list[str]:
        """Drafters the server serves: a fixed-arm request for each must succeed."""
        from banditspec_client.triton_client import TritonError

        served = []
        for drafter in FIXED_DRAFTERS:
            try:
                self._generate(CONTROLLER, PROBE_PROMPT, Method(drafter, f"fixed:{drafter}", drafter), 2)
                served.append(drafter)
            except TritonError:
                pass
        self._flush()
        return served

    def available(self, methods: Sequence[Method]) -> tuple[list[Method], dict[str, str]]:
        def unserved(drafter: str) -> str | None:
            return None if drafter in self.served else f"drafter {drafter!r} is not served through Triton here"

        return split_available(methods, unserved, self.adaptive_arms, "no drafter served")

    @property
    def grpc_url(self) -> str:
        assert self._server is not None, "the runner's server is not started"
        return self._server.grpc_url

    def _flush(self) -> None:
        """Evict every sequence the target's prefix cache holds: as many one-token verification
        calls, each of its own token, as the cache has entries (least recently used goes first)."""
        import tritonclient.grpc as grpcclient

        for token in range(FLUSH_TOKEN, FLUSH_TOKEN + self.cache_entries):
            inputs = []
            for name, value in (("input_ids", token), ("input_lengths", 1), ("request_output_len", 1)):
                tensor = grpcclient.InferInput(name, [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
                inputs.append(tensor)
            self._client.infer("target", inputs)

    def _target_compute(self) -> tuple[float, int]:
        """(milliseconds, executions) of the ``target`` model's compute so far, from Triton's
        statistics: what its stub spent in ``execute``, without the BLS round trip."""
        stats = self._client.get_inference_statistics("target", as_json=True)
        model = stats["model_stats"][0]
        compute = model["inference_stats"].get("compute_infer", {})
        return int(compute.get("ns", 0)) / 1e6, int(model.get("execution_count", 0))

    def run(self, prompt: Prompt, method: Method, max_tokens: int) -> RunRecord:
        assert self._server is not None and self._server.process is not None, "the runner's server is not started"
        pgid = self._server.process.pid  # the server runs in its own session; its stubs too
        cpu_before = group_cpu_seconds(pgid)
        target_before = self._target_compute()
        result = self._generate(
            self.model_for[method.name], prompt.text, method, max_tokens, self.adaptive_arms if method.adaptive else None
        )
        cpu_seconds = group_cpu_seconds(pgid) - cpu_before
        target_after = self._target_compute()
        self._flush()
        record = RunRecord.from_stats(
            workload=prompt.workload, kind=prompt.kind, prompt_id=prompt.prompt_id, method=method.name,
            seconds=result.seconds, output_digest=digest(result.text), stats=result.stats, cpu_seconds=cpu_seconds,
        )
        record.target_compute_ms = round(target_after[0] - target_before[0], 3)
        record.target_calls = target_after[1] - target_before[1]
        return record
