"""A stand-in for ``triton_python_backend_utils``: just enough of its API for the
models' adapters, with a fake BLS that routes to an in-process handler."""

from __future__ import annotations

import threading
import types

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(7)

    def __init__(self, msg, code=INTERNAL):
        super().__init__(msg)
        self._msg, self._code = msg, code

    def message(self):
        return self._msg

    def code(self):
        return self._code


class Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self.output_tensors = list(output_tensors)
        self._error = error

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class ResponseSender:
    def __init__(self):
        self.sent: list[tuple[InferenceResponse | None, int]] = []
        self.cancelled = False
        self.done = threading.Event()

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done.set()

    def is_cancelled(self):
        return self.cancelled


class Request:
    def __init__(self, tensors: dict):
        self.tensors = {k: Tensor(k, v) for k, v in tensors.items() if v is not None}
        self.sender = ResponseSender()

    def get_response_sender(self):
        return self.sender


def get_input_tensor_by_name(request, name):
    return request.tensors.get(name)


def get_output_tensor_by_name(response, name):
    for t in response.output_tensors:
        if t.name() == name:
            return t
    return None


def make_module(bls_handler):
    """A module object exposing the fake API; BLS exec() calls ``bls_handler(model, tensors, outputs)``."""
    module = types.ModuleType("triton_python_backend_utils")

    class InferenceRequest:
        def __init__(self, model_name, requested_output_names, inputs):
            self.model_name, self.outputs, self.inputs = model_name, requested_output_names, inputs

        def exec(self):
            return bls_handler(self.model_name, {t.name(): t.as_numpy() for t in self.inputs}, self.outputs)

    for name, value in dict(
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        TritonError=TritonError,
        Tensor=Tensor,
        InferenceResponse=InferenceResponse,
        InferenceRequest=InferenceRequest,
        get_input_tensor_by_name=get_input_tensor_by_name,
        get_output_tensor_by_name=get_output_tensor_by_name,
    ).items():
        setattr(module, name, value)
    return module
