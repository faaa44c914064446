"""Assemble the in-process stack: target engine, drafters, decoder, tokenizer.

Used by the CLI (``generate --local``) and the benchmarks. The drafters come from the
one drafter factory, :func:`banditspec.drafters.registry.build_drafters` (the Triton
``banditspec`` model builds its drafters there too; its engine is the BLS adapter).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from banditspec.bandits.cost_model import CALIBRATION_CONTEXTS, calibration_plan
from banditspec.config import VANILLA_ARM, Limits, arm_drafter
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.drafters.registry import ARM_DRAFTERS, build_drafters
from banditspec.engine.contract import Engine

DEFAULT_ARMS: tuple[str, ...] = ARM_DRAFTERS


def calibrate_cost_model(decoder: SpeculativeDecoder, engine: Engine, *, max_tokens: int = 9, reps: int = 3,
                         contexts: Sequence[int] = CALIBRATION_CONTEXTS, seed: int = 0) -> None:
    """Seed the decoder's cost model with ``reps`` timed verify calls of the engine per
    (context, k) of :func:`~banditspec.bandits.cost_model.calibration_plan`, so that the
    model prices k and context from the start (~4 s on a 2-core CPU).

    Each timed call is a decoding step as the decoding loop makes it: it continues the
    sequence the previous call left (the target's own tokens appended) and asks for the
    target's states as the loop does when a drafter reads them, so the engine extends its
    cached positions in place. A call that diverged from what the engine holds (the same
    prefix with another tail every time, as calibration once did) also times a copy of the
    whole cache (engine/kv_buffer.py), which would price every length too high, too noisily, and for
    the lifetime of the cells nothing else fills (short contexts, lengths seldom chosen)."""
    import numpy as np

    from banditspec.engine.contract import VerifyRequest

    rng = np.random.default_rng(seed)
    model = decoder.cost_model
    top = min(max_tokens, model.max_tokens)
    readers, layers = decoder.state_readers(decoder.drafters)
    states = bool(readers)
    high = min(20000, engine.vocab_size)
    for cached, ks in calibration_plan(top, contexts):
        growth = 2 + reps * sum(ks)  # the most tokens the calls can append
        cached = max(1, min(cached, int(getattr(engine, "max_context", 1 << 20)) - growth))
        sequence = rng.integers(100, high, size=cached).astype(np.int32)

        def step(k: int, timed: bool = True) -> float:
            """One decoding step feeding k tokens (the last one generated and k - 1
            drafted); the sequence goes on with what the target returned."""
            nonlocal sequence
            request = VerifyRequest(sequence, rng.integers(100, high, size=k - 1).astype(np.int32),
                                    hidden_from=len(sequence) - 1 if states else -1, hidden_layers=layers)
            start = decoder.clock()
            (result,) = engine.verify([request])
            seconds = decoder.clock() - start
            sequence = np.concatenate([sequence, np.asarray(result.output_ids, np.int32).reshape(-1)])
            if timed and model.batch is not None and result.verified_in is not None:
                model.batch.anchor_pass(result.verified_in)  # a lone pass: what a row costs
            return seconds

        step(1, timed=False)  # the prefill, as a request's first step
        step(1, timed=False)  # the first step after a prefill
        for _ in range(reps):
            for k in ks:
                context = len(sequence)  # what the loop reports: the tokens before the round
                model.observe(k, step(k), context)
        if hasattr(engine, "clear"):  # an engine reached through Triton evicts on its own
            engine.clear()
    model.calibrated = True


@dataclass
class LocalStack:
    engine: Engine
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
    drafter_names = sorted({arm_drafter(a) for a in arms if a != VANILLA_ARM})
    drafters = build_drafters(drafter_names, tokenizer, target_model=engine.model)
    decoder = SpeculativeDecoder.for_engine(engine, drafters, default_arms=[a for a in arms if arm_drafter(a) in drafters], limits=limits)
    calibrate_cost_model(decoder, engine)
    return LocalStack(engine, decoder, tokenizer, model)
