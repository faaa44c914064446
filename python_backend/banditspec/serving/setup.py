"""Build the serving controller from the ``banditspec`` model's configuration
(:class:`~banditspec.serving.config.ServingConfig`, read once from config.pbtxt parameters).

Paths and models come only from there, never from a request."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.drafters.base import Drafter
from banditspec.drafters.registry import build_drafters
from banditspec.engine.contract import Engine
from banditspec.engine.gather import VerifyGatherer
from banditspec.engine.tensor_codec import InferFn, TensorEngine
from banditspec.engine.uniform_inputs import with_empty_drafts
from banditspec.gamma_controller import make_gamma_budget
from banditspec.serving.config import ParameterSource, ServingConfig
from banditspec.serving.controller import Controller


def load_serving_tokenizer(params: ParameterSource) -> Any:
    """The serving tokenizer: ``tokenizer_dir``, else the ``target_model`` checkpoint's."""
    from transformers import AutoTokenizer

    from banditspec.engine.models import model_dir

    config = ServingConfig.of(params)
    return AutoTokenizer.from_pretrained(config.tokenizer_dir or model_dir(config.target_model))


def _drafters(config: ServingConfig, tokenizer: Any, infer: InferFn) -> dict[str, Drafter]:
    """The served drafters by name (banditspec.drafters.registry). ``eagle`` drafts from the
    target's hidden states, which only the reference target returns; it runs in the
    ``eagle_model`` Triton model, or in this process when that parameter is empty; with a
    TensorRT-LLM target, ``eagle_model`` names a TensorRT-LLM Eagle engine."""

    def load_target() -> Any:  # the target checkpoint, for the in-process head's embedding / LM head
        from banditspec.engine.models import load_model

        return load_model(config.target_model)[0]

    return build_drafters(
        config.drafters,
        tokenizer,
        load_target_model=load_target,
        target_name=config.target_model,
        rest_datastore=config.rest_datastore,
        infer=infer,
        draft_model_name=config.draft_name,
        eagle_model=config.eagle_model,
        eagle_engine=config.target_kind == "tensorrtllm",
        eagle_head=config.eagle_head,
        eagle_probe=config.eagle_probe,
        plugin=config.drafter_plugin,
    )


def build_controller(params: ParameterSource, infer: InferFn) -> Controller:
    """The controller of the ``banditspec`` model, from its configuration (or its parameters)."""
    config = ServingConfig.of(params)
    tokenizer = load_serving_tokenizer(config)
    drafters = _drafters(config, tokenizer, infer)
    reference = config.target_kind == "reference"
    engine = TensorEngine(
        with_empty_drafts(infer) if reference else infer,  # so that gamma = 0 steps batch with drafting ones
        model_name=config.target_name,
        vocab_size=len(tokenizer),
        max_context=config.max_context,
        eos_id=int(tokenizer.eos_token_id),
        provides_hidden_states="eagle" in drafters,  # what the eagle arm drafts from
        tensorrtllm=not reference,  # real sampling inputs, per-step seed, KV-reuse figures
        max_rows=config.verify_max_rows,  # a TensorRT-LLM target takes one sequence a request
        reports_passes=reference,  # what each batched pass cost: BatchCost's evidence under load
    )
    # The reference target verifies concurrent sequences' steps as one request (the
    # controller gathers them; TensorRT-LLM batches in flight on its own).
    served: Engine = engine
    if reference and config.verify_gather_us > 0:
        served = VerifyGatherer(engine, window_s=config.verify_gather_us / 1e6, max_rows=engine.max_rows)
    budget = make_gamma_budget(config.gamma_controller, config.gamma_controller_max)
    decoder = SpeculativeDecoder.for_engine(
        engine,
        drafters,
        default_arms=config.defaults.arms,
        limits=config.limits,
        drafter_deadline_s=config.drafter_deadline_s,
        budget=budget,
        bookkeeping=config.bookkeeping,
    )
    defaults = replace(config.defaults, arms=None)  # the decoder holds the default arms
    from banditspec.serving.runtime import calibrate_cost_model

    controller = Controller(decoder, served, tokenizer, defaults,
                            calibrate=lambda: calibrate_cost_model(decoder, engine))  # timed alone, never gathered
    if decoder.cost_model.batch is not None:
        decoder.cost_model.batch.pricing = config.batch_pricing
    if isinstance(served, VerifyGatherer) and decoder.cost_model.batch is not None:
        served.report_to(decoder.cost_model.batch)  # what batched calls cost: the controller's price under load
    for counted in (budget, served, decoder.cost_model.batch):
        if counted is not None and hasattr(counted, "bind_active_sequences"):  # the server's exact count of sequences in flight
            counted.bind_active_sequences(lambda: controller.active_sequences)
    return controller
