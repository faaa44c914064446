"""TensorRT-LLM's example clients against a real tritonserver, under the names they use.

The input sets are exactly what upstream's ``end_to_end_grpc_client.py`` (TensorRT-LLM
``triton_backend/inflight_batcher_llm/client``, and tensorrtllm_backend 0.18) builds in its
``prepare_inputs`` for the command lines in the comments, sent the way it sends them (gRPC stream,
one request, the outputs it asks for). Its output check is reproduced too: without
``--exclude-input-in-output`` and without streaming, the text must be prompt + expected.
Greedy output is compared with plain decoding of the same prompt (``local_vanilla``).
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

pytestmark = pytest.mark.integration

PROMPT = "Write a Python function that returns the square of a number."
OUTPUT_LEN = 20


def upstream_inputs(prompt=PROMPT, output_len=OUTPUT_LEN, streaming=False, beam_width=1, temperature=1.0,
                    num_return_sequences=None, exclude_input_in_output=False, stop_words=(), end_id=None,
                    pad_id=None, repetition_penalty=None, return_log_probs=False, return_perf_metrics=False,
                    num_draft_tokens=0, use_draft_logits=None, guided_decoding_guide_type=None, bad_words=()):
    """The client's prepare_inputs with its argparse defaults (beam 1, temperature 1.0, ...)."""
    inputs = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones_like([[prompt]]).astype(np.int32) * output_len,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[beam_width]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
    }
    if num_return_sequences is not None:
        inputs["num_return_sequences"] = np.array([[num_return_sequences]], dtype=np.int32)
    if num_draft_tokens > 0:
        inputs["num_draft_tokens"] = np.array([[num_draft_tokens]], dtype=np.int32)
    if use_draft_logits is not None:
        inputs["use_draft_logits"] = np.array([[use_draft_logits]], dtype=bool)
    if stop_words:
        inputs["stop_words"] = np.array([list(stop_words)], dtype=object)
    if bad_words:
        inputs["bad_words"] = np.array([list(bad_words)], dtype=object)
    if repetition_penalty is not None:
        inputs["repetition_penalty"] = np.array([[repetition_penalty]], dtype=np.float32)
    if return_log_probs:
        inputs["return_log_probs"] = np.array([[True]], dtype=bool)
    if end_id is not None:
        inputs["end_id"] = np.array([[end_id]], dtype=np.int32)
    if pad_id is not None:
        inputs["pad_id"] = np.array([[pad_id]], dtype=np.int32)
    if exclude_input_in_output is not None:
        inputs["exclude_input_in_output"] = np.array([[exclude_input_in_output]], dtype=bool)
    if return_perf_metrics:
        inputs["return_perf_metrics"] = np.array([[True]], dtype=bool)
    if guided_decoding_guide_type is not None:
        inputs["guided_decoding_guide_type"] = np.array([[guided_decoding_guide_type]]).astype(object)
    return inputs


def requested_outputs(return_log_probs=False, return_perf_metrics=False):
    names = ["text_output"]
    if return_log_probs:
        names += ["cum_log_probs", "output_log_probs"]
    if return_perf_metrics:
        names += ["kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                  "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
                  "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"]
    return names


def send_like_upstream(url, model_name, inputs, outputs):
    """start_stream, async_stream_infer, stop_stream (waits for the server to close), then drain."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url=url)
    client.start_stream(callback=lambda result, error: results.put(error if error else result))
    tensors = []
    for name, value in inputs.items():
        tensor = grpcclient.InferInput(name, value.shape, np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    client.async_stream_infer(model_name, tensors, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                              request_id="")
    client.stop_stream()
    client.close()
    out = []
    while not results.empty():
        out.append(results.get())
    return out


def text_of(responses, streaming):
    for r in responses:
        assert not isinstance(r, Exception), r
    texts = [r.as_numpy("text_output")[0].decode("utf-8") for r in responses]
    return "".join(texts) if streaming else texts[-1]


@pytest.mark.parametrize("model_name", ["ensemble", "tensorrt_llm_bls"])
def test_default_invocation_prompt_plus_greedy_output(server, local_vanilla, model_name):
    # end_to_end_grpc_client.py -p PROMPT -o 20 --model-name {ensemble,tensorrt_llm_bls}
    responses = send_like_upstream(server.grpc_url, model_name, upstream_inputs(), requested_outputs())
    assert len(responses) == 1
    # temperature 1.0 without top_k/top_p decodes greedily in TensorRT-LLM, and so here
    assert text_of(responses, False) == PROMPT + local_vanilla(PROMPT, OUTPUT_LEN)


def test_streaming_exclude_input_with_end_pad_ids(server, local_vanilla):
    # end_to_end_grpc_client.py -p PROMPT -o 20 -S --exclude-input-in-output --end-id 2 --pad-id 2
    from banditspec.serving.setup import load_serving_tokenizer

    eos = load_serving_tokenizer({"target_model": "smollm2"}).eos_token_id
    inputs = upstream_inputs(streaming=True, exclude_input_in_output=True, end_id=eos, pad_id=eos)
    responses = send_like_upstream(server.grpc_url, "ensemble", inputs, requested_outputs())
    assert len(responses) > 1
    assert text_of(responses, True) == local_vanilla(PROMPT, OUTPUT_LEN)


def test_perf_metrics_as_the_current_client_reads_them(server):
    # end_to_end_grpc_client.py -p PROMPT -o 20 --return-perf-metrics --exclude-input-in-output (current)
    inputs = upstream_inputs(exclude_input_in_output=True, return_perf_metrics=True)
    (response,) = send_like_upstream(server.grpc_url, "tensorrt_llm_bls", inputs, requested_outputs(return_perf_metrics=True))
    assert not isinstance(response, Exception), response
    get = lambda name: response.as_numpy(name)[0][0]  # noqa: E731  (the client's own indexing)
    assert get("arrival_time_ns") <= get("first_scheduled_time_ns") <= get("first_token_time_ns") <= get("last_token_time_ns")
    assert 0 <= get("total_accepted_draft_tokens") <= get("total_draft_tokens")
    assert get("kv_cache_reused_blocks") == -1  # not available, never made up


@pytest.mark.parametrize(
    "options, field",
    [
        (dict(beam_width=2), "beam_width"),  # -b 2
        (dict(num_return_sequences=2), "num_return_sequences"),  # -n 2
        (dict(return_log_probs=True), "return_log_probs"),  # --return-log-probs
        (dict(repetition_penalty=1.3), "repetition_penalty"),  # --repetition-penalty 1.3
        (dict(guided_decoding_guide_type="json"), "guided_decoding_guide_type"),  # --guided-decoding-guide-type json
    ],
)
def test_unsupported_options_are_refused_naming_the_input(server, options, field):
    outputs = requested_outputs(return_log_probs=options.get("return_log_probs", False))
    responses = send_like_upstream(server.grpc_url, "ensemble", upstream_inputs(**options), outputs)
    assert len(responses) == 1 and isinstance(responses[0], Exception)
    assert f"{field}:" in responses[0].message()  # a gRPC stream carries the message, not the code


def test_refusal_is_invalid_arg_over_http_generate(server):
    import json
    import urllib.error
    import urllib.request

    body = json.dumps({"text_input": PROMPT, "max_tokens": 4, "beam_width": 2}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/ensemble/generate", data=body)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=60)
    assert err.value.code == 400  # INVALID_ARG
    assert "beam_width: only 1 is supported" in json.loads(err.value.read())["error"]


def test_banditspec_takes_the_same_input_set(server, local_vanilla):
    # the model's own name with the client's set; temperature 0 here: banditspec's temperature samples
    inputs = upstream_inputs(temperature=0.0, exclude_input_in_output=True, num_draft_tokens=3, use_draft_logits=False)
    responses = send_like_upstream(server.grpc_url, "banditspec", inputs, requested_outputs())
    assert text_of(responses, False) == local_vanilla(PROMPT, OUTPUT_LEN)


# --- bad_words with stop_words, end_id, pad_id and streaming; fresh seeds ----------------

BAD_WORDS = (" square", " num **")  # the first appears in the greedy answer: the ban changes it
STOP_WORDS = ("```\n",)


def _eos() -> int:
    from banditspec.serving.setup import load_serving_tokenizer

    return load_serving_tokenizer({"target_model": "smollm2"}).eos_token_id


def _banned_inputs(**extra):
    eos = _eos()
    return upstream_inputs(streaming=True, exclude_input_in_output=True, end_id=eos, pad_id=eos,
                           stop_words=STOP_WORDS, bad_words=BAD_WORDS, **extra)


def _plain_with_the_ban(server) -> str:
    """Plain decoding (num_draft_tokens 0: policy vanilla) with the same ban, through the server."""
    inputs = _banned_inputs(temperature=0.0, num_draft_tokens=0)
    return text_of(send_like_upstream(server.grpc_url, "banditspec", inputs, requested_outputs()), True)


@pytest.mark.parametrize("model_name", ["ensemble", "tensorrt_llm_bls", "banditspec"])
def test_bad_words_stop_words_end_pad_ids_and_streaming_together(server, local_vanilla, model_name):
    # end_to_end_grpc_client.py -p PROMPT -o 20 -S --exclude-input-in-output --end-id 2 --pad-id 2
    #   --stop-words '```\n' --bad-words ' square' ' num **' --model-name MODEL
    # (banditspec's own temperature samples: the client's set with temperature 0 there)
    inputs = _banned_inputs(temperature=0.0 if model_name == "banditspec" else 1.0)
    responses = send_like_upstream(server.grpc_url, model_name, inputs, requested_outputs())
    assert not any(isinstance(r, Exception) for r in responses), [str(r) for r in responses]
    assert len(responses) > 1  # streamed
    text = text_of(responses, True)
    assert text == _plain_with_the_ban(server)
    assert text != local_vanilla(PROMPT, OUTPUT_LEN)  # the ban acted


@pytest.mark.parametrize("policy", ["fixed:pld", "fixed:suffix", "costaware"])
def test_speculative_greedy_with_a_ban_equals_plain_with_it_through_the_server(server, policy):
    inputs = _banned_inputs(temperature=0.0)
    inputs["policy"] = np.array([[policy]]).astype(object)
    text = text_of(send_like_upstream(server.grpc_url, "banditspec", inputs, requested_outputs()), True)
    assert text == _plain_with_the_ban(server)


def _sampled(server, seed=None):
    import json

    inputs = upstream_inputs(exclude_input_in_output=True, temperature=0.8)
    inputs["top_p"] = np.array([[1.0]], dtype=np.float32)  # TensorRT-LLM's meaning: sample the whole distribution
    if seed is not None:
        inputs["seed"] = np.array([[seed]], dtype=np.uint64)
    (response,) = send_like_upstream(server.grpc_url, "ensemble", inputs, ["text_output", "speculation_stats"])
    assert not isinstance(response, Exception), response
    stats = json.loads(response.as_numpy("speculation_stats").reshape(-1)[0])
    return response.as_numpy("text_output").reshape(-1)[0].decode("utf-8"), stats["seed"]


def test_requests_without_a_seed_draw_fresh_ones_and_the_reported_seed_reproduces_them(server):
    # Two draws of a short, confident answer can agree by chance (seen at T = 0.8): fresh seeds must
    # differ every time, and the texts must not all be the same over a few draws.
    draws = [_sampled(server) for _ in range(5)]
    seeds = [seed for _, seed in draws]
    assert len(set(seeds)) == len(seeds) and len({text for text, _ in draws}) > 1, draws
    text_a, seed_a = draws[0]
    assert _sampled(server, seed_a) == (text_a, seed_a)
    assert _sampled(server, 42) == _sampled(server, 42)
