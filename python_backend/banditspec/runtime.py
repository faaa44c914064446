"""Assemble the in-process stack: target engine, drafters, decoder, tokenizer.

Used by the CLI (``generate --local``) and the benchmarks. The drafters come from the
one drafter factory, :func:`banditspec.drafters.registry.build_drafters` (the Triton
``banditspec`` model builds its drafters there too; its engine is the BLS adapter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from banditspec.bandits.cost_model import CALIBRATION_CONTEXTS, calibration_plan
from banditspec.config import Limits
from banditspec.decoder import SpeculativeDecoder
from banditspec.drafters.registry import build_drafters

DEFAULT_ARMS: tuple[str, ...] = ("pld", "suffix", "rest", "eagle")


def calibrate_cost_model(decoder: SpeculativeDecoder, engine, *, max_tokens: int = 9, reps: int = 3,
                         contexts: Sequence[int] = CALIBRATION_CONTEXTS, seed: int = 0) -> None:
    """Seed the decoder's cost model with ``reps`` timed verify calls of the engine per
    (context, k) of :func:`~banditspec.bandits.cost_model.calibration_plan`, so that the
    model prices k and context from the start (~4 s on a 2-core CPU)."""
    import numpy as np

    from banditspec.engine.contract import VerifyRequest

    rng = np.random.default_rng(seed)
    model = decoder.cost_model
    top = min(max_tokens, model.max_tokens)
    for cached, ks in calibration_plan(top, contexts):
        cached = max(1, min(cached, int(getattr(engine, "max_context", 1 << 20)) - top - 1))
        prefix = rng.integers(100, min(20000, engine.vocab_size), size=cached).astype(np.int32)
        engine.verify([VerifyRequest(prefix, np.zeros(0, np.int32))])  # caches the prefix

        def timed(k: int, prefix: np.ndarray = prefix) -> float:
            tail = rng.integers(100, min(20000, engine.vocab_size), size=k).astype(np.int32)
            start = decoder.clock()
            engine.verify([VerifyRequest(np.concatenate([prefix, tail[:1]]), tail[1:])])
            return decoder.clock() - start

        for _ in range(reps):
            for k in ks:
                model.observe(k, timed(k), cached + 1)
        if hasattr(engine, "clear"):  # an engine reached through Triton evicts on its own
            engine.clear()
    model.calibrated = True


@dataclass
class LocalStack:
    engine: object
    decoder: SpeculativeDecoder
    tokenizer: object
    model_name: str


def load_local(
    model: str = "smollm2",
    arms: Sequence[str] = DEFAULT_ARMS,
    *,
    limits: Limits = Limits(),
    max_context: int = 2048,
) -> LocalStack:
    """The whole stack in this process (no Triton)."""
    from banditspec.engine.reference import ReferenceEngine

    engine = ReferenceEngine.from_name(model, max_context=max_context)
    tokenizer = engine.tokenizer
    drafter_names = sorted({a.partition("@")[0] for a in arms if a != "vanilla"})
    drafters = build_drafters(drafter_names, tokenizer, target_model=engine.model)
    decoder = SpeculativeDecoder.for_engine(engine, drafters, default_arms=[a for a in arms if a.partition("@")[0] in drafters], limits=limits)
    calibrate_cost_model(decoder, engine)
    return LocalStack(engine, decoder, tokenizer, model)
