"""Every tensor the GPU controller sends to, and asks of, a TensorRT-LLM model, checked against
upstream's ``tensorrt_llm`` contract as written down in ``tests/trtllm_standin/contract.json``
(read from NVIDIA/TensorRT-LLM's own config.pbtxt; the file names path, commits and version),
not against this project's templates. The templates are then checked against that table too.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from banditspec.drafters.draft_model import DraftModelDrafter
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.tensor_codec import TensorEngine
from banditspec.engine.trtllm import step_seed
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.trtllm_standin.standin import CONTRACT, IMPLEMENTED_INPUTS, contract_inputs, contract_outputs, render_config

REPO = Path(__file__).resolve().parents[2]
NUMPY_TO_TRITON = {
    "int32": "TYPE_INT32", "int64": "TYPE_INT64", "uint64": "TYPE_UINT64", "float32": "TYPE_FP32",
    "float16": "TYPE_FP16", "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "object": "TYPE_STRING",
}
VOCAB, EOS = 64, 2


class Recorder:
    """An InferFn that records every call and answers like a TensorRT-LLM model would."""

    def __init__(self):
        self.calls: list[tuple[str, dict[str, np.ndarray], list[str]]] = []

    def __call__(self, model, tensors, outputs):
        self.calls.append((model, dict(tensors), list(outputs)))
        n = int(np.asarray(tensors["request_output_len"]).reshape(-1)[0])
        draft = np.asarray(tensors.get("draft_input_ids", np.zeros((1, 0), np.int32))).reshape(-1)
        out = np.concatenate([draft[:1], np.full(n, 7, dtype=np.int32)])[:n].astype(np.int32)
        answer = {"output_ids": out.reshape(1, 1, -1), "sequence_length": np.array([[n]], dtype=np.int32)}
        if "kv_cache_reused_blocks" in outputs:
            answer["kv_cache_reused_blocks"] = np.array([[3]], dtype=np.int32)
            answer["kv_cache_alloc_new_blocks"] = np.array([[1]], dtype=np.int32)
        return answer


def controller_traffic() -> Recorder:
    """What the GPU controller sends in every situation it knows: plain decoding, greedy and
    sampled verification (with and without a draft distribution), and the draft arm."""
    recorder = Recorder()
    engine = TensorEngine(recorder, vocab_size=VOCAB, max_context=256, eos_id=EOS, tensorrtllm=True)
    ids = np.arange(3, 20, dtype=np.int32)
    draft = np.array([5, 6, 9], dtype=np.int32)
    probs = np.full((3, VOCAB), 1.0 / VOCAB, dtype=np.float32)
    engine.verify([
        VerifyRequest(input_ids=ids, end_id=EOS),
        VerifyRequest(input_ids=ids, draft_ids=draft, end_id=EOS),
        VerifyRequest(input_ids=ids, draft_ids=draft, temperature=0.7, seed=11, end_id=EOS),
        VerifyRequest(input_ids=ids, draft_ids=draft, draft_probs=probs, temperature=0.7, seed=11, end_id=EOS),
        VerifyRequest(input_ids=ids, temperature=1.3, seed=2**64 - 1, end_id=EOS),
    ])
    session = DraftModelDrafter(recorder, end_id=EOS).start(list(ids))
    session.propose(4)
    return recorder


def triton_dtype(value: np.ndarray) -> str:
    return NUMPY_TO_TRITON[np.asarray(value).dtype.name]


def problems_against(table: dict[str, dict], recorder: Recorder) -> list[str]:
    problems = []
    for model, tensors, outputs in recorder.calls:
        for name, value in tensors.items():
            spec = table.get(name)
            if spec is None:
                problems.append(f"{model}: sends {name}, which upstream's tensorrt_llm does not declare")
                continue
            value = np.asarray(value)
            if triton_dtype(value) != spec["data_type"]:
                problems.append(f"{model}: {name} sent as {triton_dtype(value)}, upstream declares {spec['data_type']}")
            if value.ndim != len(spec["dims"]) + 1 or value.shape[0] != 1:
                problems.append(f"{model}: {name} sent with shape {value.shape}, upstream dims {spec['dims']} + batch 1")
            elif any(d != -1 and d != s for d, s in zip(spec["dims"], value.shape[1:])):
                problems.append(f"{model}: {name} shape {value.shape} does not fit upstream dims {spec['dims']}")
        for name in outputs:
            if name not in contract_outputs():
                problems.append(f"{model}: asks for output {name}, which upstream does not declare")
    return problems


def test_the_contract_table_names_its_upstream_source():
    source = CONTRACT["source"]
    assert source["path"] == "triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt"
    assert source["repository"].endswith("NVIDIA/TensorRT-LLM")
    assert all(len(commit) == 40 for commit in source["read_at_commits"])
    assert CONTRACT["pinned"]["tensorrt_llm"] == "1.2.1"
    inputs = contract_inputs()
    # the few facts the controller depends on most, spelled out
    assert inputs["seed"]["data_type"] == "TYPE_UINT64" and "random_seed" not in inputs
    assert {n for n, t in inputs.items() if not t["optional"]} == {"input_lengths", "request_output_len"}
    assert inputs["draft_logits"]["data_type"] == "TYPE_FP32" and inputs["draft_logits"]["dims"] == [-1, -1]
    assert contract_outputs()["output_ids"]["dims"] == [-1, -1]


def test_every_tensor_the_gpu_controller_sends_is_upstreams():
    recorder = controller_traffic()
    sent = {name for _, tensors, _ in recorder.calls for name in tensors}
    # the traffic really covers sampling, drafts and the KV-reuse request
    assert {"runtime_top_k", "runtime_top_p", "seed", "draft_input_ids", "draft_logits", "return_perf_metrics"} <= sent
    problems = problems_against(contract_inputs(), recorder)
    assert not problems, "\n".join(problems)
    missing = sorted(sent - IMPLEMENTED_INPUTS)
    assert not missing, f"the stand-in ignores inputs the controller relies on: {missing}"


def test_the_check_catches_a_wrong_name_dtype_and_rank():
    recorder = Recorder()
    recorder.calls.append(("target", {
        "random_seed": np.array([[1]], dtype=np.uint64),  # the 0.18 name
        "seed": np.array([[1]], dtype=np.int64),  # wrong dtype
        "end_id": np.array([2], dtype=np.int32),  # no batch dimension
        "input_lengths": np.array([[3, 4]], dtype=np.int32),  # two values where upstream has [1]
    }, ["generation_logits", "hidden_states"]))
    problems = problems_against(contract_inputs(), recorder)
    assert len(problems) == 5, problems
    assert "random_seed" in problems[0] and "hidden_states" in problems[-1]


def test_sampling_is_real_and_its_seed_changes_every_step():
    recorder = controller_traffic()
    sampled = [t for _, t, _ in recorder.calls if "temperature" in t]
    assert sampled, "no sampled call recorded"
    for tensors in sampled:
        # temperature alone would decode greedily on TensorRT-LLM
        assert int(tensors["runtime_top_k"].reshape(-1)[0]) == 0
        assert float(tensors["runtime_top_p"].reshape(-1)[0]) == 1.0
        position = tensors["input_ids"].shape[1]
        assert int(tensors["seed"].reshape(-1)[0]) != 11 or position == 0
    seeds = {step_seed(11, n) for n in range(20, 60)}
    assert len(seeds) == 40, "a different seed at every position"
    assert step_seed(11, 20) == step_seed(11, 20) and step_seed(11, 20) != step_seed(12, 20)
    greedy = [t for _, t, _ in recorder.calls if "temperature" not in t]
    assert greedy and not any("runtime_top_k" in t or "seed" in t for t in greedy)


def test_kv_reuse_is_asked_for_and_read_back():
    recorder = Recorder()
    engine = TensorEngine(recorder, vocab_size=VOCAB, max_context=256, eos_id=EOS, tensorrtllm=True)
    (result,) = engine.verify([VerifyRequest(input_ids=np.arange(3, 9, dtype=np.int32), end_id=EOS)])
    assert recorder.calls[0][1]["return_perf_metrics"].all()
    assert result.kv_cache_reused_blocks == 3 and result.kv_cache_alloc_new_blocks == 1
    assert (engine.kv_cache_reused_blocks, engine.kv_cache_alloc_new_blocks, engine.verify_calls) == (3, 1, 1)


def test_a_reference_target_gets_none_of_the_tensorrt_llm_extras():
    recorder = Recorder()
    engine = TensorEngine(recorder, vocab_size=VOCAB, max_context=256, eos_id=EOS)
    engine.verify([VerifyRequest(input_ids=np.arange(3, 9, dtype=np.int32), temperature=0.5, seed=4, end_id=EOS)])
    tensors = recorder.calls[0][1]
    assert not {"runtime_top_k", "runtime_top_p", "return_perf_metrics"} & set(tensors)
    assert int(tensors["seed"].reshape(-1)[0]) == 4  # the reference engine mixes in the position itself


def test_an_answer_cut_at_eos_gets_its_eos_back():
    """TensorRT-LLM leaves end_id out of output_ids; the controller must still see the EOS."""

    def infer(model, tensors, outputs):
        return {"output_ids": np.array([[[5]]], dtype=np.int32), "sequence_length": np.array([[1]], dtype=np.int32)}

    engine = TensorEngine(infer, vocab_size=VOCAB, max_context=256, eos_id=EOS, tensorrtllm=True)
    draft = np.array([5, EOS, 9], dtype=np.int32)
    (result,) = engine.verify([VerifyRequest(input_ids=np.arange(3, 9, dtype=np.int32), draft_ids=draft, end_id=EOS)])
    assert result.output_ids.tolist() == [5, EOS] and result.num_accepted == 1


# --- the project's trimmed templates against the same table ---------------------------------


def _build_module():
    path = REPO / "engine_build" / "trtllm" / "build_engines.py"
    spec = importlib.util.spec_from_file_location("banditspec_build_engines_tc", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Path:
    from banditspec_server.fill_template import fill_repository, fill_template

    build = _build_module()
    spec = build.BuildSpec(target_hf=Path("/m/t"), draft_hf=Path("/m/d"), out_dir=Path("/m/o"),
                           eagle_hf=Path("/m/e"), eagle_convert_script=Path("/m/c.py"))
    values = build.repository_values(spec)
    eagle = values.pop("eagle")
    out = fill_repository(REPO / "model_repository_trtllm", tmp_path_factory.mktemp("c") / "r", values)
    (out / "eagle").mkdir()
    (out / "eagle" / "config.pbtxt").write_text(fill_template((build.EAGLE_TEMPLATE / "config.pbtxt").read_text(), eagle))
    return out


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.mark.parametrize("model", ["target", "draft", "eagle"])
def test_templates_declare_tensors_exactly_as_upstream(filled, model):
    config = _config(filled / model / "config.pbtxt")
    problems = []
    for kind, declared, table in (("input", config.input, contract_inputs()), ("output", config.output, contract_outputs())):
        for tensor in declared:
            spec = table.get(tensor.name)
            if spec is None:
                problems.append(f"{model}: {kind} {tensor.name} is not upstream's")
                continue
            dtype = model_config_pb2.DataType.Name(tensor.data_type)
            if dtype != spec["data_type"] or list(tensor.dims) != spec["dims"]:
                problems.append(f"{model}: {kind} {tensor.name} {dtype} {list(tensor.dims)} vs upstream {spec}")
            if kind == "input" and (tensor.optional != spec["optional"] or tensor.HasField("reshape") != spec["reshape_scalar"]):
                problems.append(f"{model}: input {tensor.name} optional/reshape differ from upstream")
    assert not problems, "\n".join(problems)


def test_the_target_template_declares_everything_the_controller_sends(filled):
    declared = {t.name for t in _config(filled / "target" / "config.pbtxt").input}
    draft_declared = {t.name for t in _config(filled / "draft" / "config.pbtxt").input}
    eagle_declared = {t.name for t in _config(filled / "eagle" / "config.pbtxt").input}
    assert draft_declared <= eagle_declared, "the eagle arm sends what the draft arm sends"
    outputs = {t.name for t in _config(filled / "target" / "config.pbtxt").output}
    for model, tensors, wanted in controller_traffic().calls:
        names = declared if model == "target" else draft_declared
        assert set(tensors) <= names, f"{model} would refuse {set(tensors) - names}"
        if model == "target":
            assert set(wanted) <= outputs


def test_the_stand_in_config_declares_all_of_upstream():
    config = text_format.Parse(render_config("tensorrt_llm", decoupled=True, parameters={"target_model": "tiny"}),
                               model_config_pb2.ModelConfig())
    assert [t.name for t in config.input] == [t["name"] for t in CONTRACT["inputs"]]
    assert [t.name for t in config.output] == [t["name"] for t in CONTRACT["outputs"]]
    assert config.model_transaction_policy.decoupled and config.max_batch_size > 0


def test_more_tokens_than_asked_for_is_an_engine_error():
    from banditspec.errors import EngineError

    def infer(model, tensors, outputs):
        n = int(tensors["request_output_len"].reshape(-1)[0]) + 1
        return {"output_ids": np.full((1, 1, n), 7, dtype=np.int32), "sequence_length": np.array([[n]], dtype=np.int32)}

    engine = TensorEngine(infer, vocab_size=VOCAB, max_context=256, eos_id=EOS, tensorrtllm=True)
    with pytest.raises(EngineError, match="returned 3 tokens for 1 draft tokens"):
        engine.verify([VerifyRequest(input_ids=np.arange(3, 9, dtype=np.int32), draft_ids=np.array([7], np.int32), end_id=EOS)])
