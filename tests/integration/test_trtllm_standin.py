"""The GPU controller (``model_repository_trtllm/banditspec``, unchanged) on a real tritonserver,
against CPU stand-ins of TensorRT-LLM's ``tensorrt_llm`` model (tests/trtllm_standin) as
``target`` and ``draft``: greedy output equals the stand-in's own plain decoding for every
policy, even though the stand-in answers a partly rejected draft with more than accepted + 1
tokens and leaves EOS out; sampling really samples (the stand-in decodes greedily unless
top-k/top-p are sent) and differs across seeds but repeats for a seed.
"""

from __future__ import annotations

import numpy as np
import pytest
from banditspec_client.triton_client import GenerationOptions, TritonError, generate_grpc

pytestmark = pytest.mark.integration

MODEL = "tiny"
MAX_TOKENS = 24
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    "List three colours: red, green, blue, red, green,",
]
# The GPU arm set less REST (same drafter code as on CPU, tested there; its datastore makes the
# server start slower and its proposals never match the random-weight model).
# The eagle arm is a TensorRT-LLM Eagle engine asked for a proposal; the `draft` stand-in serves
# that role here (the stand-in models the Triton contract, not Eagle's internals: an Eagle
# engine's answer to a generation request is the target's own tokens, and so is the stand-in's).
DRAFTERS = "pld,suffix,draft,eagle"
POLICIES = ["vanilla", "costaware", "ucbspec", "exp3spec", "uniform",
            "fixed:pld", "fixed:suffix", "fixed:draft", "fixed:eagle"]
MUST_DRAFT = {"ucbspec", "exp3spec", "uniform", "fixed:pld", "fixed:suffix", "fixed:draft", "fixed:eagle"}
BANDITSPEC = {"drafters": DRAFTERS, "eagle_model": "draft"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(served repository, BuildSpec, backend folder): model_repository_trtllm/ filled by
    build_engines as for a GPU, the stand-in installed as the ``tensorrtllm`` backend."""
    from tests.trtllm_standin.repository import backend_dir, build_repository

    root = tmp_path_factory.mktemp("trtllm")
    # max_tokens up to the whole context, so that one request can reach max_seq_len
    repository, spec = build_repository(root, model=MODEL, max_draft_len=4,
                                        banditspec_params={**BANDITSPEC, "max_tokens_limit": "1024"})
    return repository, spec, backend_dir(root / "backends")


@pytest.fixture(scope="module")
def trt_server(built):
    from banditspec.paths import cache_dir

    from tests.trtllm_standin.repository import standin_server

    repository, _, backends = built
    log = cache_dir() / "integration-trtllm-standin.log"
    log.write_bytes(b"")
    # 2 shared cores: a slow first call of the draft stand-in must not drop the arm mid-test
    server = standin_server(repository, backends, model=MODEL, log_path=log,
                            overrides={"banditspec": {**BANDITSPEC, "drafter_deadline_ms": "10000"}})
    with server:
        yield server


def test_target_and_draft_are_served_with_the_gpu_configs_unchanged(built):
    """No copy and no test edit: the served files are build_engines' fill of the shipped templates."""
    from banditspec_server.fill_template import fill_template

    from tests.trtllm_standin.repository import REPO_ROOT

    repository, spec, _ = built
    import sys

    sys.path.insert(0, str(REPO_ROOT / "engine_build" / "trtllm"))
    from build_engines import repository_values

    values = repository_values(spec)
    for name in ("target", "draft"):
        shipped = (REPO_ROOT / "model_repository_trtllm" / name / "config.pbtxt").read_text()
        assert (repository / name / "config.pbtxt").read_text() == fill_template(shipped, values[name])
        assert 'backend: "tensorrtllm"' in shipped


@pytest.fixture(scope="module")
def tokenizer():
    from banditspec.engine.models import load_tokenizer

    return load_tokenizer(MODEL)


def infer_standin(url: str, model: str, tensors: dict[str, np.ndarray], outputs=("output_ids", "sequence_length")):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    client = grpcclient.InferenceServerClient(url)
    try:
        inputs = []
        for name, value in tensors.items():
            item = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            item.set_data_from_numpy(value)
            inputs.append(item)
        result = client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
        return {n: result.as_numpy(n) for n in outputs}
    finally:
        client.close()


def request(ids: list[int], output_len: int, end_id: int, **extra) -> dict[str, np.ndarray]:
    tensors = {
        "input_ids": np.asarray([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[output_len]], dtype=np.int32),
        "end_id": np.array([[end_id]], dtype=np.int32),
    }
    tensors.update(extra)
    return tensors


@pytest.fixture(scope="module")
def standin_plain(trt_server, tokenizer):
    """The stand-in's own plain decoding of a prompt (chat template applied, as banditspec does)."""
    from banditspec.text import prompt_ids

    memo = {}

    def run(prompt: str) -> str:
        if prompt not in memo:
            ids = prompt_ids(tokenizer, prompt, chat=True)
            out = infer_standin(trt_server.grpc_url, "target", request(ids, MAX_TOKENS, tokenizer.eos_token_id))
            tokens = out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])]
            memo[prompt] = tokenizer.decode([int(t) for t in tokens], skip_special_tokens=True)
        return memo[prompt]

    return run


def test_greedy_output_equals_the_stand_ins_plain_decoding_for_every_policy(trt_server, standin_plain):
    extra_tokens_seen = 0
    for policy in POLICIES:
        drafted = 0
        for prompt in PROMPTS:
            result = generate_grpc(trt_server.grpc_url, prompt, GenerationOptions(max_tokens=MAX_TOKENS, policy=policy))
            assert result.text == standin_plain(prompt), f"{policy}: first differing prompt {prompt!r}"
            stats = result.stats
            assert not stats["dropped_arms"], (policy, stats["dropped_arms"])
            drafted += sum(stats["drafted"])
            # tokens beyond accepted + 1 per step are the extra target tokens TensorRT-LLM returns
            extra_tokens_seen += stats["generated_tokens"] - sum(stats["accepted"]) - stats["steps"]
        if policy == "vanilla" or policy in MUST_DRAFT:  # costaware may rightly choose gamma = 0
            assert (drafted > 0) == (policy in MUST_DRAFT), f"{policy}: the arm was served and really drafted"
    assert extra_tokens_seen > 0, "no step got more than accepted + 1 tokens: the extra-token path went untested"
    # every step resent the whole sequence; the stand-in reported the blocks it found again
    from banditspec_client.prometheus_text import metric_total, scrape_metrics

    series = scrape_metrics(trt_server.metrics_port)
    calls = metric_total(series, "nv_banditspec_target_verify_calls", model="banditspec")
    reused = metric_total(series, "nv_banditspec_target_kv_reused_blocks", model="banditspec")
    assert calls >= len(POLICIES) * len(PROMPTS) and reused > 0, (calls, reused)


def test_sampling_samples_differs_across_seeds_and_repeats_for_a_seed(trt_server, standin_plain):
    """Arms whose drafts depend on the request alone (PLD, the draft engine), so that a replay
    sees the same drafts (the suffix arm also learns from earlier requests' outputs)."""
    prompt = PROMPTS[1]

    def sample(seed: int, policy: str = "ucbspec") -> str:
        opts = GenerationOptions(max_tokens=16, policy=policy, arms=["pld", "draft"], temperature=0.9, seed=seed)
        return generate_grpc(trt_server.grpc_url, prompt, opts).text

    first = sample(1)
    assert sample(1) == first, "the same seed must give the same text"
    others = {sample(seed) for seed in (2, 3)}
    assert first not in others and len(others) == 2, "different seeds must give different text"
    assert first != standin_plain(prompt), "sampling came back greedy (top-k/top-p not sent?)"
    plain = sample(1, "vanilla")
    assert plain != standin_plain(prompt) and plain == sample(1, "vanilla")


def test_the_stand_in_streams_per_iteration_and_refuses_streaming_when_not_decoupled(trt_server, tokenizer):
    import queue

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    ids = tokenizer("Once upon a time")["input_ids"]
    eos = tokenizer.eos_token_id
    plain = infer_standin(trt_server.grpc_url, "target", request(ids, 6, eos))["output_ids"].reshape(-1).tolist()
    draft = [plain[0], (plain[1] + 1) % len(tokenizer), plain[2]]  # accepted 1, then a rejection
    tensors = request(ids, 4, eos, draft_input_ids=np.asarray([draft], dtype=np.int32),
                      streaming=np.array([[True]]))
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(trt_server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        inputs = []
        for name, value in tensors.items():
            item = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            item.set_data_from_numpy(value)
            inputs.append(item)
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        chunks = []
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, error
            out = result.as_numpy("output_ids")
            if out is not None:
                chunks.append(out.reshape(-1).tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert chunks == [plain[:2], [plain[2]], [plain[3]]], "verify iteration first, then one token per iteration"

    with pytest.raises(Exception, match=r"INTERNAL\] Streaming is only supported if model is deployed using decoupled mode"):
        infer_standin(trt_server.grpc_url, "target", request(ids, 4, eos, streaming=np.array([[True]])))


def test_the_stand_in_reports_block_reuse_of_a_growing_sequence(trt_server, tokenizer):
    ids = tokenizer(" ".join(["token"] * 80))["input_ids"][:70]
    outputs = ("output_ids", "sequence_length", "kv_cache_reused_blocks", "kv_cache_alloc_new_blocks")
    flags = {"return_perf_metrics": np.array([[True]])}
    first = infer_standin(trt_server.grpc_url, "target", request(ids, 3, -1, **flags), outputs)
    grown = ids + first["output_ids"].reshape(-1).tolist()
    second = infer_standin(trt_server.grpc_url, "target", request(grown, 3, -1, **flags), outputs)
    assert int(second["kv_cache_reused_blocks"].reshape(-1)[0]) == len(grown[:-1]) // 64 > 0  # tokens_per_block 64
    assert int(second["kv_cache_reused_blocks"].reshape(-1)[0]) >= int(first["kv_cache_reused_blocks"].reshape(-1)[0])


def test_a_bad_verify_request_is_refused_naming_the_input(trt_server):
    with pytest.raises(Exception, match=r"INTERNAL\] Draft tokens length \(9\) exceeds maximum draft tokens length \(4\)"):
        infer_standin(trt_server.grpc_url, "target", request([5, 6, 7], 10, 2, draft_input_ids=np.zeros((1, 9), np.int32)))
    with pytest.raises(TritonError, match="max_tokens"):
        generate_grpc(trt_server.grpc_url, "hi", GenerationOptions(max_tokens=0))


def test_a_request_that_reaches_max_seq_len_ends_at_its_length_without_an_invented_eos(built, trt_server, tokenizer):
    """A request as long as the controller allows (its max_context, as build_engines filled it)
    reaches the end of the engine's max_seq_len. There the engine cuts request_output_len
    (prompt + output + draft tokens per step, the engine's max_draft_len for a plain step): the
    controller's limit must leave that room, so that the answer runs to its length with the
    engine's own tokens and no EOS is made up from a cut answer."""
    import re

    from banditspec.text import prompt_ids

    repository, spec, _ = built
    text = (repository / "banditspec" / "config.pbtxt").read_text()
    max_context = int(re.search(r'key: "max_context" value: \{ string_value: "(\d+)"', text).group(1))
    prompt = PROMPTS[1]
    ids = prompt_ids(tokenizer, prompt, chat=True)
    max_tokens = max_context - len(ids)
    results = {}
    for policy in ("vanilla", "fixed:pld", "ucbspec"):
        result = generate_grpc(trt_server.grpc_url, prompt, GenerationOptions(max_tokens=max_tokens, policy=policy))
        assert result.stats["generated_tokens"] == max_tokens, (policy, result.stats["generated_tokens"], result.stats)
        results[policy] = result.text
    out = infer_standin(trt_server.grpc_url, "target", request(ids, max_tokens, tokenizer.eos_token_id))
    plain = out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])].tolist()
    assert len(plain) == max_tokens and tokenizer.eos_token_id not in plain, "the engine itself cut the answer"
    assert results == dict.fromkeys(results, tokenizer.decode(plain, skip_special_tokens=True))
    with pytest.raises(TritonError, match="max_tokens|context"):
        generate_grpc(trt_server.grpc_url, prompt, GenerationOptions(max_tokens=max_tokens + 1))
