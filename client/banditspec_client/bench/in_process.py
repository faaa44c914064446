"""In-process benchmark runner: the torch reference engine and the drafters in this process.

Fairness rules (every method pays the same costs):

* the engine's prefix KV cache is cleared before each request, so that a method never
  reuses the prompt prefill of the method that ran the same prompt before it;
* methods whose requests feed the suffix drafter's global trie of past outputs (suffix,
  the adaptive policies) each get their own suffix drafter, so none sees the output of
  the *same* prompt produced by another method; each has seen the earlier prompts' outputs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from banditspec_client.bench.methods import FIXED_DRAFTERS, Method, RunRecord, digest
from banditspec_client.bench.runner import RunSettings, split_available
from banditspec_client.bench.workloads import Prompt

if TYPE_CHECKING:
    from banditspec.decoding.decoder import SpeculativeDecoder
    from banditspec.drafters.base import Drafter

log = logging.getLogger(__name__)


class InProcessRunner:
    """A :class:`~banditspec_client.bench.runner.Runner` on one shared :class:`ReferenceEngine`;
    ``drafters``: the drafters to build (those the compared methods need)."""

    label = "in-process"

    def __init__(self, settings: RunSettings = RunSettings(), *, drafters: Sequence[str] = FIXED_DRAFTERS,
                 max_context: int = 2048):
        from banditspec.engine.reference import ReferenceEngine

        self.settings = settings
        self.engine = ReferenceEngine.from_name(settings.model, max_context=max_context)
        self.tokenizer = self.engine.tokenizer
        self.shared_drafters: dict[str, Drafter] = {}
        self.unavailable: dict[str, str] = {}  # drafter -> why it is not served
        for name in drafters:
            try:
                self.shared_drafters.update(self._build([name]))
            except Exception as exc:  # e.g. the Eagle head is not trained/installed yet
                self.unavailable[name] = f"{type(exc).__name__}: {exc}"
        self._decoders: dict[str, SpeculativeDecoder] = {}

    def _build(self, names: Sequence[str]) -> dict[str, Drafter]:
        from banditspec.drafters.registry import build_drafters

        built = build_drafters(list(names), self.tokenizer, target_model=self.engine.model)
        missing = [n for n in names if n not in built]
        if missing:
            raise RuntimeError(f"drafter(s) {missing} not built")
        return built

    @property
    def adaptive_arms(self) -> list[str]:
        """The adaptive methods' arm set: the wanted drafters that could be built."""
        return [d for d in FIXED_DRAFTERS if d in self.shared_drafters and d in self.settings.adaptive_drafters]

    def available(self, methods: Sequence[Method]) -> tuple[list[Method], dict[str, str]]:
        """(methods this stack can run, {skipped method: reason})."""

        def unserved(drafter: str) -> str | None:
            if drafter in self.shared_drafters:
                return None
            return f"drafter {drafter!r} unavailable: {self.unavailable.get(drafter, 'not built')}"

        return split_available(methods, unserved, self.adaptive_arms, "no drafter available")

    def _decoder(self, method: Method) -> SpeculativeDecoder:
        from banditspec.decoding.decoder import SpeculativeDecoder

        if method.name not in self._decoders:
            drafters = dict(self.shared_drafters)
            if method.needs_suffix_state and "suffix" in drafters:
                drafters.update(self._build(["suffix"]))  # a private global trie
            decoder = SpeculativeDecoder.for_engine(self.engine, drafters, default_arms=self.adaptive_arms)
            if method.policy == "costaware":
                from banditspec.serving.runtime import calibrate_cost_model

                calibrate_cost_model(decoder, self.engine)  # as load_local does: its cost model
            self._decoders[method.name] = decoder
        return self._decoders[method.name]

    def run(self, prompt: Prompt, method: Method, max_tokens: int) -> RunRecord:
        from banditspec.config import GenerationRequest
        from banditspec.decoding.session import run_to_completion
        from banditspec.text import prompt_ids

        decoder = self._decoder(method)
        request = GenerationRequest(
            prompt_ids=prompt_ids(self.tokenizer, prompt.text, chat=True),
            max_tokens=max_tokens,
            policy=method.policy,
            arms=self.adaptive_arms if method.adaptive else None,
            max_draft_len=method.draft_len(self.settings.max_draft_len),
            seed=self.settings.seed,
            temperature=self.settings.temperature,
            reward=method.reward,
        )
        self.engine.clear()
        cpu_started, started = time.process_time(), time.perf_counter()
        session = decoder.start(request)
        result = run_to_completion(self.engine, session)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        stats = result.stats.as_dict()
        stats["finish_reason"] = result.finish_reason
        return RunRecord.from_stats(
            workload=prompt.workload, kind=prompt.kind, prompt_id=prompt.prompt_id, method=method.name,
            seconds=seconds, output_digest=digest(result.token_ids), stats=stats, cpu_seconds=cpu_seconds,
        )

    def close(self) -> None:
        self.engine.clear()
