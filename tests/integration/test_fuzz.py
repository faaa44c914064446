"""Protocol-level fuzzing of a real tritonserver with this repository's models (hypothesis):
malformed JSON bodies, random fields and values, headers, binary tensor data over HTTP
``/generate``, ``/generate_stream`` and ``/infer``; random tensors over gRPC ``ModelInfer``
and ``ModelStreamInfer``; random bytes to the gRPC port. Every answer must be a success or a
client error (4xx / INVALID_ARGUMENT class), never a fault of our models, a hang, or a stub
death; afterwards a normal request gives exactly the plain-decoding text.

Short form (the default suite): ``BANDITSPEC_FUZZ_EXAMPLES`` (default 50) examples per target, derandomized.
Long form (``bash scripts/test.sh --long``): ``BANDITSPEC_FUZZ_EXAMPLES=3000 BANDITSPEC_FUZZ_RANDOM=1``.
(figures in docs/reliability.md, "Fuzzing")."""

from __future__ import annotations

import collections
import http.client
import json
import os
import socket
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")  # pinned in the [test] extra
from banditspec.paths import cache_dir  # noqa: E402
from banditspec_client.triton_client import GenerationOptions, generate_grpc  # noqa: E402
from banditspec_server.serve import TritonServer  # noqa: E402
from banditspec_server.supervisor import list_stubs  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("BANDITSPEC_FUZZ_EXAMPLES", "50"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("BANDITSPEC_FUZZ_RANDOM"),
    database=None,
    suppress_health_check=list(HealthCheck),
)
ANSWER_TIMEOUT_S = 30  # no request may take longer to be answered: a hang fails the run
# messages that mean one of *our* models failed (never acceptable for malformed input)
FAULT_MARKERS = ("decoding failed", "could not prepare", "verification failed", "drafting failed",
                 "Stub process", "Traceback", "target engine failed", "Segmentation")
BANDITSPEC_INPUTS = ["text_input", "max_tokens", "stream", "temperature", "random_seed", "stop_words", "policy",
                     "arms", "max_draft_len", "reward", "bad_words", "end_id", "pad_id", "top_k", "top_p",
                     "beam_width", "exclude_input_in_output", "return_log_probs", "num_return_sequences"]
TARGET_INPUTS = ["input_ids", "input_lengths", "request_output_len", "draft_input_ids", "draft_logits", "end_id",
                 "exclude_input_in_output", "temperature", "seed", "hidden_states_from"]
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16", "STRING", "", "int32"]
OBSERVED: collections.Counter = collections.Counter()  # (surface, status, message head) -> count


@pytest.fixture(scope="module")
def fuzz_server():
    log = cache_dir() / "fuzz-tritonserver.log"
    log.write_bytes(b"")
    server = TritonServer(
        model="tiny", http_port=0, grpc_port=0, metrics_port=0, log_path=log,
        overrides={"banditspec": {"drafters": "pld,suffix", "max_tokens_limit": "16", "max_concurrent_sequences": "8"}},
    )
    with server:
        stubs = {s.pid for s in list_stubs(server.process.pid)}
        assert len(stubs) >= 3
        server.rss_start_mb = _rss_mb(server)
        yield server, stubs


def _rss_mb(server) -> float:
    from banditspec_client.soak.processes import server_processes

    return sum(p.rss_bytes for p in server_processes(server.process.pid)) / 2**20


# --- strategies ---------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
small_ints = st.integers(min_value=-3, max_value=20) | st.sampled_from([2**31 - 1, 2**31, -(2**31), 2**63, 2**64])


words = st.text(max_size=12) | st.sampled_from(["ucbspec", "exp3spec", "vanilla", "fixed:pld", "pld", "suffix@2",
                                                 "rest", "eagle", "accepted", "throughput", "\x00", "\udcff"])
# a value of the declared type (reaches the model's own validation) for each banditspec input
TYPED = {
    "text_input": st.text(max_size=80), "max_tokens": small_ints, "stream": st.booleans(),
    "temperature": st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 0.7, -1.0]),
    "random_seed": st.integers(min_value=0, max_value=2**64 - 1), "stop_words": st.lists(words, max_size=20),
    "policy": words, "arms": st.lists(words, max_size=5), "max_draft_len": small_ints, "reward": words,
}


@st.composite
def generate_bodies(draw) -> bytes:
    kind = draw(st.sampled_from(["typed", "typed", "fields", "fields", "raw", "mutated"]))
    if kind == "raw":
        return draw(st.binary(max_size=300))
    body = {}
    if kind == "typed":
        body["text_input"] = draw(TYPED["text_input"])
        body["max_tokens"] = draw(st.integers(min_value=-1, max_value=17) | small_ints)
        for name in draw(st.lists(st.sampled_from(sorted(TYPED)[:]), max_size=4, unique=True)):
            body[name] = draw(TYPED[name])
        return json.dumps(body, allow_nan=True).encode()
    if draw(st.booleans()):
        body["text_input"] = draw(st.text(max_size=60) | json_values)
    if draw(st.booleans()):
        body["max_tokens"] = draw(small_ints | json_values)
    for name in draw(st.lists(st.sampled_from(BANDITSPEC_INPUTS[2:]), max_size=4, unique=True)):
        body[name] = draw(json_values | small_ints | words)
    body.update(draw(st.dictionaries(st.text(max_size=10), json_values, max_size=2)))
    raw = json.dumps(body, allow_nan=True).encode()
    if kind == "mutated" and raw:
        cut = draw(st.integers(min_value=0, max_value=len(raw)))
        raw = raw[:cut] + draw(st.binary(max_size=8)) + raw[cut + draw(st.integers(min_value=0, max_value=4)):]
    return raw


headers = st.dictionaries(
    st.sampled_from(["Content-Type", "Accept", "Inference-Header-Content-Length", "Content-Encoding",
                     "Accept-Encoding", "X-Request-Id", "triton-grpc-protocol-admin-key"]),
    st.sampled_from(["application/json", "text/plain", "gzip", "deflate", "br", "0", "-1", "7", "99999999",
                     "", "identity", "\u00e9t\u00e9", "a" * 300]),
    max_size=3,
)


@st.composite
def tensor_specs(draw, names):
    name = draw(st.sampled_from(names) | st.text(max_size=12))
    shape = draw(st.lists(st.integers(min_value=-2, max_value=6) | st.sampled_from([2**31, 2**40]), max_size=3))
    datatype = draw(st.sampled_from(DATATYPES))
    return name, shape, datatype


@st.composite
def infer_bodies(draw):
    """(model, body bytes, headers): the JSON header, optionally followed by binary tensor data."""
    model = draw(st.sampled_from(["target", "eagle", "banditspec", "no_such_model"]))
    names = TARGET_INPUTS if model != "eagle" else ["sequence_id", "prompt_ids", "input_ids", "hidden_states",
                                                    "max_draft_len", "end"]
    inputs, binary = [], b""
    for name, shape, datatype in draw(st.lists(tensor_specs(names), max_size=4)):
        entry = {"name": name, "shape": shape, "datatype": datatype}
        if draw(st.booleans()):
            data = draw(st.binary(max_size=64))
            entry["parameters"] = {"binary_data_size": draw(st.sampled_from([len(data), len(data) + 1, 0, -1, 2**40]))}
            binary += data
        else:
            entry["data"] = draw(json_values | st.lists(small_ints, max_size=8))
            # KNOWN_CRASHER: JSON data with a huge shape aborts tritonserver 2.51 itself (std::bad_alloc);
            # kept out of the fuzzed space, pinned in test_serve_command.py (the supervisor restarts it)
            entry["shape"] = [d for d in shape if d < 2**20]
        inputs.append(entry)
    header = json.dumps({"inputs": inputs, **draw(st.dictionaries(st.sampled_from(["outputs", "parameters", "id"]),
                                                                  json_values, max_size=2))}).encode()
    extra = {}
    if binary or draw(st.booleans()):
        extra["Inference-Header-Content-Length"] = str(draw(st.sampled_from([len(header), len(header) + 3, 0,
                                                                            len(header) + len(binary) + 10])))
    return model, header + binary, extra


# --- the oracle -----------------------------------------------------------------------------


def _http(server, method, path, body: bytes, extra_headers: dict) -> tuple[int, bytes]:
    try:
        return _http_once(server, method, path, body, extra_headers)
    except (OSError, http.client.HTTPException) as exc:
        time.sleep(0.5)
        state = "died" if server.process.poll() is not None else "is alive"
        raise AssertionError(f"no answer ({type(exc).__name__}); tritonserver {state}; request: {method} {path} "
                             f"headers={extra_headers} body={body[:400]!r}") from None


def _http_once(server, method, path, body: bytes, extra_headers: dict) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("localhost", server.http_port, timeout=ANSWER_TIMEOUT_S)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for key, value in extra_headers.items():
            connection.putheader(key, value.encode("utf-8") if isinstance(value, str) else value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _message(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    try:
        value = json.loads(text.split("data:", 1)[-1].strip().splitlines()[0]) if text.strip() else {}
        return str(value.get("error", "")) if isinstance(value, dict) else ""
    except (ValueError, IndexError):
        return text[:80]


def _judge_http(surface: str, status: int, raw: bytes) -> None:
    message = _message(raw)
    OBSERVED[(surface, status, message[:48])] += 1
    assert not any(m in message for m in FAULT_MARKERS), f"{surface}: a model failed: {status} {message}"
    assert status < 500 or _triton_own_answer(surface, status, message), f"{surface}: server fault {status} {message!r}"


def _triton_own_answer(surface: str, status: int, message: str) -> bool:
    """5xx answers tritonserver 2.51 gives by itself, before any model of ours sees the request
    (listed in docs/reliability.md, "Fuzzing"): 500 for some malformed JSON, 501 for plain HTTP
    infer on a decoupled model."""
    if status == 501:
        return (surface == "infer/banditspec" and "decoupled" in message) or message == "Unsupported compression type"
    return status == 500 and message.startswith(TRITON_PARSER_500)


# tritonserver 2.51's own JSON parser answers these with 500 (seen by this fuzzer)
TRITON_PARSER_500 = ("Unable to parse 'data'", "Unable to parse JSON bytes array", "failed to parse the request JSON buffer",
                     "failed to get request params", "Unable to parse")


# --- the fuzz targets -------------------------------------------------------------------------


def test_fuzz_http_generate(fuzz_server):
    server, _ = fuzz_server

    @FUZZ
    @given(body=generate_bodies(), extra=headers, stream=st.booleans())
    def run(body, extra, stream):
        endpoint = "generate_stream" if stream else "generate"
        status, raw = _http(server, "POST", f"/v2/models/banditspec/{endpoint}", body, extra)
        _judge_http(endpoint, status, raw)

    run()


def test_fuzz_http_infer_with_binary_tensor_data(fuzz_server):
    server, _ = fuzz_server

    @FUZZ
    @given(case=infer_bodies(), extra=headers)
    def run(case, extra):
        model, body, binary_headers = case
        status, raw = _http(server, "POST", f"/v2/models/{model}/infer", body, {**extra, **binary_headers})
        _judge_http(f"infer/{model}", status, raw)

    run()


GRPC_CLIENT_ERRORS = {"INVALID_ARGUMENT", "NOT_FOUND", "UNIMPLEMENTED", "OUT_OF_RANGE", "FAILED_PRECONDITION"}


def test_fuzz_grpc_infer_and_stream(fuzz_server):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    server, _ = fuzz_server
    channel = grpc.insecure_channel(server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    @FUZZ
    @given(model=st.sampled_from(["target", "banditspec", "eagle"]), specs=st.lists(tensor_specs(TARGET_INPUTS + BANDITSPEC_INPUTS[:4]), max_size=4),
           payloads=st.lists(st.binary(max_size=64), max_size=5), streaming=st.booleans())
    def run(model, specs, payloads, streaming):
        request = service_pb2.ModelInferRequest(model_name=model)
        for name, shape, datatype in specs:
            tensor = request.inputs.add()
            tensor.name, tensor.datatype = name, datatype
            tensor.shape.extend([max(-(2**63), min(2**63 - 1, d)) for d in shape])
        request.raw_input_contents.extend(payloads)
        try:
            if streaming:
                for answer in stub.ModelStreamInfer(iter([request]), timeout=ANSWER_TIMEOUT_S):
                    message = answer.error_message
                    OBSERVED[("grpc-stream/" + model, "error" if message else "ok", message[:48])] += 1
                    assert not any(m in message for m in FAULT_MARKERS), message
            else:
                stub.ModelInfer(request, timeout=ANSWER_TIMEOUT_S)
                OBSERVED[("grpc/" + model, "OK", "")] += 1
        except grpc.RpcError as exc:
            code, message = exc.code().name, exc.details() or ""
            OBSERVED[("grpc/" + model, code, message[:48])] += 1
            assert code != "DEADLINE_EXCEEDED", f"no answer within {ANSWER_TIMEOUT_S} s: {message}"
            assert not any(m in message for m in FAULT_MARKERS), message
            assert code in GRPC_CLIENT_ERRORS or (code == "UNAVAILABLE" and model == "eagle"), f"{code}: {message}"

    try:
        run()
    finally:
        channel.close()


def test_fuzz_raw_bytes_to_the_grpc_port(fuzz_server):
    server, _ = fuzz_server

    @FUZZ
    @given(data=st.binary(min_size=1, max_size=400) | st.builds(lambda tail: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + tail,
                                                                st.binary(max_size=200)))
    def run(data):
        with socket.create_connection(("localhost", server.grpc_port), timeout=ANSWER_TIMEOUT_S) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):  # the server answers (or not) and closes; it must not stall
                pass

    run()


def test_after_fuzzing_no_stub_died_and_a_normal_request_is_exact(fuzz_server):
    """Runs last in this module: the same stubs are alive, health is ready, outputs exact."""
    from banditspec_client.soak.expected import VanillaReference

    server, stubs = fuzz_server
    assert {s.pid for s in list_stubs(server.process.pid)} == stubs, "a stub died (or restarted) under fuzzing"
    assert server.is_ready()
    prompt = "List three prime numbers."
    expected = VanillaReference("tiny").text(prompt, 16)
    assert generate_grpc(server.grpc_url, prompt, GenerationOptions(max_tokens=16)).text == expected
    status, raw = _http(server, "POST", "/v2/models/banditspec/generate",
                        json.dumps({"text_input": prompt, "max_tokens": 16}).encode(), {"Content-Type": "application/json"})
    assert status == 200 and json.loads(raw)["text_output"] == expected
    rss = _rss_mb(server)
    assert rss < server.rss_start_mb + 256, f"RSS grew from {server.rss_start_mb:.0f} to {rss:.0f} MB"
    print(f"\nfuzz: {sum(OBSERVED.values())} requests, server+stubs RSS {server.rss_start_mb:.0f} -> {rss:.0f} MB; "
          "answers by (surface, status):")
    totals = collections.Counter()
    for (surface, status, _), n in OBSERVED.items():
        totals[(surface, status)] += n
    for key, n in sorted(totals.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        print(f"  {key[0]:28s} {key[1]!s:20s} {n}")
    top = sorted(OBSERVED.items(), key=lambda kv: -kv[1])[:25]
    print("most frequent messages:\n" + "\n".join(f"  {n:5d} {k}" for k, n in top))
