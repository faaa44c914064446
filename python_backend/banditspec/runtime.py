"""Assemble the in-process stack: target engine, drafters, decoder, tokenizer.

Used by the CLI (``generate --local``), the benchmarks, and (drafters only) the
Triton ``banditspec`` model, whose engine is the BLS adapter instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from banditspec.config import Limits
from banditspec.decoding import SpeculativeDecoder

log = logging.getLogger(__name__)

DEFAULT_ARMS: tuple[str, ...] = ("pld", "suffix", "rest", "eagle")


def build_drafters(
    names: Sequence[str],
    tokenizer,
    *,
    target_model=None,
    rest_datastore: Path | None = None,
    infer=None,
    draft_model_name: str = "draft",
) -> dict:
    """Drafters by name. ``eagle`` needs the target model (its embedding and LM head);
    it is skipped when no target model is given. ``draft`` (a separate draft engine, the
    TensorRT-LLM deployment's parametric arm) needs ``infer``. ``rest`` uses ``rest_datastore`` or the
    default datastore built once into the cache folder."""
    from banditspec.drafters.registry import make_drafter

    drafters = {}
    for name in names:
        if name == "eagle":
            if target_model is None:
                continue  # no hidden states and no LM head here: the arm is not served
            from banditspec.drafters.eagle import load_default_eagle_drafter
            from banditspec.errors import BanditSpecValidationError

            try:
                drafters[name] = load_default_eagle_drafter(target_model)
            except BanditSpecValidationError as exc:  # the shipped head is for another target
                log.warning("eagle arm not served: %s", exc)
        elif name == "draft":
            if infer is None:
                continue  # a separate draft engine is reached only through Triton
            from banditspec.drafters.draft_model import DraftModelDrafter

            drafters[name] = DraftModelDrafter(infer, model_name=draft_model_name, end_id=int(tokenizer.eos_token_id))
        elif name.startswith("fault_"):  # test-only fault injection (config.pbtxt only)
            from banditspec.drafters.faulty import make_faulty_drafter

            drafters[name] = make_faulty_drafter(name)
        elif name == "rest":
            from banditspec.drafters.rest_datastore import default_datastore

            path = rest_datastore if rest_datastore is not None else default_datastore(tokenizer)
            drafters[name] = make_drafter(name, tokenizer=tokenizer, rest_datastore=path)
        else:
            drafters[name] = make_drafter(name, tokenizer=tokenizer)
    return drafters


def calibrate_cost_model(decoder: SpeculativeDecoder, engine, *, max_tokens: int = 9, reps: int = 3,
                         cached: int = 256, seed: int = 0) -> None:
    """Seed the decoder's cost model with timed verify calls of the in-process engine:
    ``reps`` x k = 1..max_tokens new tokens after ``cached`` cached tokens (~1-3 s)."""
    import numpy as np

    from banditspec.bandits.cost_model import calibrate
    from banditspec.engine.contract import VerifyRequest

    rng = np.random.default_rng(seed)
    prefix = rng.integers(100, min(20000, engine.vocab_size), size=cached).astype(np.int32)
    engine.verify([VerifyRequest(prefix, np.zeros(0, np.int32))])  # caches the prefix

    def timed(k: int) -> float:
        tail = rng.integers(100, min(20000, engine.vocab_size), size=k).astype(np.int32)
        start = decoder.clock()
        engine.verify([VerifyRequest(np.concatenate([prefix, tail[:1]]), tail[1:])])
        return decoder.clock() - start

    model = decoder.cost_model
    top = min(max_tokens, model.max_tokens)
    for _ in range(reps):
        for k in range(1, top + 1):
            model.observe(k, timed(k))
    model.calibrated = True
    engine.clear()


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
