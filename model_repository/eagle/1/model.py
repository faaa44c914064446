"""Triton adapter for the Eagle head: tensors in, banditspec.drafters.eagle_service, draft ids out."""

import logging

import numpy as np
import triton_python_backend_utils as pb_utils
from banditspec.drafters.eagle_service import EAGLE_INPUTS, call_from_tensors
from banditspec.errors import BanditSpecValidationError
from banditspec.serving.config import EagleModelConfig, model_parameters
from banditspec.serving.heap import freeze_heap

log = logging.getLogger("banditspec.eagle")


class TritonPythonModel:
    def initialize(self, args):
        import torch
        from banditspec.drafters.eagle import head_fit_problem, head_weights, load_default_eagle_drafter
        from banditspec.drafters.eagle_service import EagleService
        from banditspec.engine.models import load_model

        config = EagleModelConfig.from_parameters(model_parameters(args))
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        target = config.target_model
        self.service = None
        weights = head_weights(config.eagle_head)
        self.unavailable = head_fit_problem(target, weights)
        if self.unavailable is not None:  # e.g. the tiny test model: the controller leaves the arm out
            log.warning("eagle: not serving: %s", self.unavailable)
            return
        model, _ = load_model(target)
        self.service = EagleService(  # min_confidence None: the head's own tuned cut-off
            load_default_eagle_drafter(model, weights, min_confidence=config.min_confidence),
            max_sequences=config.max_sequences,
            max_draft_len=config.max_draft_len_limit,
        )
        del model  # the drafter keeps the embedding only
        if config.gc_freeze:
            freeze_heap()

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        if self.service is None:
            return _error(f"eagle: not served here ({self.unavailable})", pb_utils.TritonError.UNAVAILABLE)
        tensors = {}
        for name in EAGLE_INPUTS:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                tensors[name] = tensor.as_numpy()
        try:
            draft = self.service.handle(call_from_tensors(tensors))
        except BanditSpecValidationError as exc:
            return _error(str(exc), pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:
            log.exception("eagle: drafting failed")
            return _error(f"eagle: drafting failed ({type(exc).__name__})", pb_utils.TritonError.INTERNAL)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("draft_ids", draft.astype(np.int32))])

    def finalize(self):
        self.service = None


def _error(message, code):
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
