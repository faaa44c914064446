"""Make every verification call batchable with every other one.

Triton's dynamic batcher groups only requests that carry the same set of inputs: a
request without the optional ``draft_input_ids`` (a plain-decoding step, gamma = 0, or a
drafter that found nothing) is never batched with one that has it, so in a mix each
switch between the two kinds starts a new batch (measured: twelve alternating requests,
twelve batches of one). Sent as an empty int32 [N, 0] tensor instead, the draft is the
same to the reference target (zero draft tokens) and the twelve share one pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from banditspec.engine.tensor_codec import InferFn, Tensors


def with_empty_drafts(infer: InferFn) -> InferFn:
    """``infer`` that always sends ``draft_input_ids`` (empty when there is no draft)."""

    def call(model_name: str, tensors: Tensors, output_names: Sequence[str]) -> Tensors:
        if "draft_input_ids" not in tensors:
            rows = np.shape(tensors["input_ids"])[0] if np.ndim(tensors["input_ids"]) >= 2 else 1
            tensors = {**tensors, "draft_input_ids": np.zeros((rows, 0), dtype=np.int32)}
        return infer(model_name, tensors, output_names)

    return call
