"""A stand-in for ``triton_python_backend_utils``: just enough of its API for the
models' adapters, with a fake BLS that routes to an in-process handler.

As strict as the real one where the adapters could go wrong: a response sender refuses any
send after the FINAL flag (the real one raises "Response sender has been closed"); a
response carries only tensors (numpy arrays with a Triton dtype); a BLS response holds only
the outputs the caller asked for (``requested_output_names``)."""

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


class TritonModelException(Exception):
    """What the real stub raises for a misuse of its API."""


_TRITON_KINDS = {"b", "i", "u", "f", "O", "S"}  # bool, ints, uints, floats, BYTES (object / bytes)


class Tensor:
    def __init__(self, name, array):
        if not isinstance(name, str) or not name:
            raise TritonModelException(f"tensor name must be a non-empty str, got {name!r}")
        if not isinstance(array, np.ndarray):
            raise TritonModelException(f"tensor {name}: expects a numpy array, got {type(array).__name__}")
        if array.dtype.kind not in _TRITON_KINDS:
            raise TritonModelException(f"tensor {name}: dtype {array.dtype} has no Triton type")
        self._name, self._array = name, array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self.output_tensors = list(output_tensors)
        if not all(isinstance(t, Tensor) for t in self.output_tensors):
            raise TritonModelException("output_tensors must be pb_utils.Tensor objects")
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("error must be a pb_utils.TritonError")
        self._error = error

    def output_tensors_by_name(self):
        return {t.name(): t for t in self.output_tensors}

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
        if self.done.is_set():
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException("an empty response must carry the FINAL flag")
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


def answers(target, requests) -> list:
    """The target adapter's response to each request: returned by ``execute``, or (answering
    early) sent once through each request's response sender, with the final flag."""
    returned = target.execute(requests)
    if returned is not None:
        return returned
    out = []
    for request in requests:
        (sent,) = request.sender.sent  # exactly one response, and it is the last
        response, flags = sent
        assert flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL and response is not None
        out.append(response)
    return out


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
            response = bls_handler(self.model_name, {t.name(): t.as_numpy() for t in self.inputs}, self.outputs)
            if response.has_error():
                return response
            # like Triton: the caller gets the outputs it asked for, and only those
            if not self.outputs:  # none named: every output
                return response
            wanted = set(self.outputs)
            return InferenceResponse(output_tensors=[t for t in response.output_tensors if t.name() in wanted])

    for name, value in dict(
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        TritonError=TritonError,
        TritonModelException=TritonModelException,
        Tensor=Tensor,
        InferenceResponse=InferenceResponse,
        InferenceRequest=InferenceRequest,
        get_input_tensor_by_name=get_input_tensor_by_name,
        get_output_tensor_by_name=get_output_tensor_by_name,
    ).items():
        setattr(module, name, value)
    return module
