"""The tensors the controller sends and reads exist in both model repositories.

Two variants: ``model_repository/`` (CPU: reference target, Eagle) and
``model_repository_trtllm/`` (GPU: TensorRT-LLM target and draft engines), filled with
the values engine_build/trtllm/build_engines.py would use. For each, every tensor of
:mod:`banditspec.engine.contract` that the controller sends to ``target``/``draft`` is
declared with the same dtype and a compatible shape, and every output it reads is declared.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from banditspec.engine import contract
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

REPO = Path(__file__).resolve().parents[2]
CPU_REPOSITORY = REPO / "model_repository"
TRT_TEMPLATES = REPO / "model_repository_trtllm"
Table = dict[str, tuple[str, list[int]]]

# What the controller sends to a TensorRT-LLM draft engine: plain generation of gamma
# tokens (no draft inputs, no banned words: the target's verification applies them), plus
# the logits request for speculative sampling.
DRAFT_ONLY_INPUTS = ("draft_input_ids", "draft_logits", "bad_words_list")
DRAFT_INPUTS: Table = getattr(contract, "DRAFT_INPUTS", None) or {
    **{k: v for k, v in contract.TARGET_INPUTS.items() if k not in DRAFT_ONLY_INPUTS},
    "return_generation_logits": ("TYPE_BOOL", [1]),
}
DRAFT_OUTPUTS: Table = getattr(contract, "DRAFT_OUTPUTS", None) or {
    **contract.TARGET_OUTPUTS,
    "generation_logits": ("TYPE_FP32", [-1, -1, -1]),
}


def parse_config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _build_module():
    path = REPO / "engine_build" / "trtllm" / "build_engines.py"
    spec = importlib.util.spec_from_file_location("banditspec_build_engines_rc", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trt_repository(tmp_path_factory) -> Path:
    from banditspec_server.fill_template import fill_repository

    build = _build_module()
    spec = build.BuildSpec(target_hf=Path("/models/hf/t"), draft_hf=Path("/models/hf/d"), out_dir=Path("/models/o"))
    return fill_repository(TRT_TEMPLATES, tmp_path_factory.mktemp("trt") / "repo", build.repository_values(spec))


@pytest.fixture(scope="module")
def cpu_repository() -> Path:
    if not (CPU_REPOSITORY / "target" / "config.pbtxt").is_file():
        pytest.skip("model_repository/target is not written yet")
    return CPU_REPOSITORY


def _declared(tensors) -> dict[str, object]:
    return {t.name: t for t in tensors}


def _dims_compatible(declared: list[int], wanted: list[int]) -> bool:
    """Same rank; a declared -1 takes any size, a declared size must equal a fixed wanted size."""
    return len(declared) == len(wanted) and all(d == -1 or d == w for d, w in zip(declared, wanted))


def check_tensors(config: model_config_pb2.ModelConfig, table: Table, kind: str) -> list[str]:
    """Problems with ``table`` against the config's inputs (kind='input') or outputs."""
    declared = _declared(config.input if kind == "input" else config.output)
    problems = []
    for name, (dtype, dims) in table.items():
        tensor = declared.get(name)
        if tensor is None:
            problems.append(f"{config.name}: {kind} {name} not declared")
            continue
        got_dtype = model_config_pb2.DataType.Name(tensor.data_type)
        if got_dtype != dtype:
            problems.append(f"{config.name}: {kind} {name} is {got_dtype}, the controller uses {dtype}")
        if not _dims_compatible(list(tensor.dims), dims):
            problems.append(f"{config.name}: {kind} {name} dims {list(tensor.dims)}, the controller uses {dims}")
    return problems


def _check_model_basics(repository: Path, name: str) -> model_config_pb2.ModelConfig:
    config = parse_config(repository / name / "config.pbtxt")
    assert config.name == name, "Triton requires the config name to match the folder"
    assert config.max_batch_size > 0, "contract dims exclude the batch dimension"
    assert (repository / name / "1").is_dir(), f"{name} has no version folder"
    return config


def test_dims_rule():
    assert _dims_compatible([-1], [-1]) and _dims_compatible([-1], [1]) and _dims_compatible([1], [1])
    assert not _dims_compatible([1], [-1]) and not _dims_compatible([-1, -1], [-1])


def test_check_tensors_catches_dtype_shape_and_absence():
    config = text_format.Parse(
        'name: "t" max_batch_size: 1 input [ { name: "a" data_type: TYPE_INT64 dims: [ 2 ] } ]',
        model_config_pb2.ModelConfig(),
    )
    problems = check_tensors(config, {"a": ("TYPE_INT32", [-1]), "b": ("TYPE_BOOL", [1])}, "input")
    assert len(problems) == 3 and "b not declared" in problems[2]


# --- the TensorRT-LLM variant ------------------------------------------------------------


def test_trtllm_target_speaks_the_contract(trt_repository):
    config = _check_model_basics(trt_repository, "target")
    assert config.backend == "tensorrtllm"
    assert not config.model_transaction_policy.decoupled, "the controller waits for one answer per call"
    problems = check_tensors(config, contract.TARGET_INPUTS, "input")
    problems += check_tensors(config, contract.TARGET_OUTPUTS, "output")
    assert not problems, "\n".join(problems)


def test_trtllm_target_has_no_reference_extras(trt_repository):
    config = parse_config(trt_repository / "target" / "config.pbtxt")
    declared = set(_declared(config.input)) | set(_declared(config.output))
    extras = set(contract.REFERENCE_EXTRA_INPUTS) | set(contract.REFERENCE_EXTRA_OUTPUTS)
    assert not declared & extras, "the controller asks for extras only where the target declares them"


def test_trtllm_target_reuses_kv_blocks(trt_repository):
    params = parse_config(trt_repository / "target" / "config.pbtxt").parameters
    assert params["enable_kv_cache_reuse"].string_value == "true"
    assert params["gpt_model_type"].string_value == "inflight_fused_batching"
    assert params["gpt_model_path"].string_value == "/models/o/engines/target"


def test_trtllm_draft_speaks_plain_generation(trt_repository):
    config = _check_model_basics(trt_repository, "draft")
    assert config.backend == "tensorrtllm"
    assert not config.model_transaction_policy.decoupled
    problems = check_tensors(config, DRAFT_INPUTS, "input") + check_tensors(config, DRAFT_OUTPUTS, "output")
    assert not problems, "\n".join(problems)
    assert not set(DRAFT_ONLY_INPUTS) & set(_declared(config.input)), "a draft engine verifies nothing"
    assert config.parameters["gpt_model_path"].string_value == "/models/o/engines/draft"


def test_trtllm_banditspec_points_at_target_and_draft(trt_repository):
    config = _check_model_basics(trt_repository, "banditspec")
    params = {k: v.string_value for k, v in config.parameters.items()}
    for key in ("target_name", "draft_name"):
        model = params[key]
        assert parse_config(trt_repository / model / "config.pbtxt").backend == "tensorrtllm", key
    drafters = params["drafters"].split(",")
    assert "eagle" not in drafters, "Eagle needs the reference engine's hidden states"
    assert "draft" in drafters, "the draft engine is the parametric arm"
    assert params["target_kind"] != "reference"


def test_trtllm_banditspec_runs_the_same_model_py():
    link = TRT_TEMPLATES / "banditspec" / "1" / "model.py"
    assert link.resolve() == (CPU_REPOSITORY / "banditspec" / "1" / "model.py").resolve()


def test_trtllm_templates_have_no_unfilled_placeholder_after_filling(trt_repository):
    for config in trt_repository.glob("*/config.pbtxt"):
        assert "${" not in config.read_text(), config


# --- the CPU variant and the two together ------------------------------------------------


def test_reference_target_speaks_the_contract_and_its_extras(cpu_repository):
    config = _check_model_basics(cpu_repository, "target")
    problems = check_tensors(config, {**contract.TARGET_INPUTS, **contract.REFERENCE_EXTRA_INPUTS}, "input")
    problems += check_tensors(config, {**contract.TARGET_OUTPUTS, **contract.REFERENCE_EXTRA_OUTPUTS}, "output")
    assert not problems, "\n".join(problems)


def test_reference_target_keeps_matching_the_trtllm_target(cpu_repository, trt_repository):
    """Whatever both declare is declared alike; what TensorRT-LLM requires, the reference requires
    too (so a controller that forgets it fails on CPU, not first on a GPU)."""
    ref = _declared(parse_config(cpu_repository / "target" / "config.pbtxt").input)
    trt = _declared(parse_config(trt_repository / "target" / "config.pbtxt").input)
    problems = []
    for name in sorted(set(ref) & set(trt)):
        a, b = ref[name], trt[name]
        if (a.data_type, list(a.dims), a.HasField("reshape")) != (b.data_type, list(b.dims), b.HasField("reshape")):
            problems.append(f"{name}: reference {a} vs TensorRT-LLM {b}")
    for name, tensor in trt.items():
        if not tensor.optional and (name not in ref or ref[name].optional):
            problems.append(f"{name}: required by TensorRT-LLM, not by the reference target")
    assert not problems, "\n".join(problems)


def test_banditspec_interface_is_identical_in_both_variants(cpu_repository, trt_repository):
    cpu_path = cpu_repository / "banditspec" / "config.pbtxt"
    if not cpu_path.is_file():
        pytest.skip("model_repository/banditspec is not written yet")
    cpu, trt = parse_config(cpu_path), parse_config(trt_repository / "banditspec" / "config.pbtxt")
    assert list(cpu.input) == list(trt.input)
    assert list(cpu.output) == list(trt.output)
    assert cpu.model_transaction_policy.decoupled == trt.model_transaction_policy.decoupled
    assert (cpu.backend, cpu.max_batch_size) == (trt.backend, trt.max_batch_size)
    missing = set(cpu.parameters) - set(trt.parameters)
    assert not missing, f"parameters the controller reads but the TensorRT-LLM variant lacks: {missing}"


def test_cpu_banditspec_points_at_its_target(cpu_repository):
    path = cpu_repository / "banditspec" / "config.pbtxt"
    if not path.is_file():
        pytest.skip("model_repository/banditspec is not written yet")
    params = parse_config(path).parameters
    assert (cpu_repository / params["target_name"].string_value / "config.pbtxt").is_file()


NUMPY_TO_TRITON = {"uint64": "TYPE_UINT64", "int32": "TYPE_INT32", "float32": "TYPE_FP32", "bool": "TYPE_BOOL"}


def test_the_remote_eagle_arm_speaks_the_eagle_model(cpu_repository):
    """Every tensor RemoteEagleSession sends (first call, later call, end) is declared by
    ``eagle`` with its dtype and rank; the output it reads is declared; banditspec names it."""
    import numpy as np
    from banditspec.drafters.eagle_remote import EAGLE_OUTPUTS, RemoteEagleDrafter

    config = parse_config(cpu_repository / "eagle" / "config.pbtxt")
    assert config.name == "eagle" and config.max_batch_size == 0 and (cpu_repository / "eagle" / "1").is_dir()
    sent: dict[str, tuple[str, list[int]]] = {}

    def infer(model, tensors, outputs):
        assert model == "eagle"
        for name, value in tensors.items():
            sent[name] = (NUMPY_TO_TRITON[value.dtype.name], [-1] * value.ndim)
        return {"draft_ids": np.zeros(0, dtype=np.int32)}

    session = RemoteEagleDrafter(infer).start([1, 2, 3])
    session.observe([4], np.zeros((3, 8), dtype=np.float32))
    session.propose(4)
    session.observe([5], np.zeros((1, 8), dtype=np.float32))
    session.propose(2)
    session.close(finished=True)
    declared = _declared(config.input)
    problems = []
    for name, (dtype, dims) in sent.items():
        tensor = declared.get(name)
        if tensor is None:
            problems.append(f"eagle: input {name} not declared")
        elif model_config_pb2.DataType.Name(tensor.data_type) != dtype or len(tensor.dims) != len(dims):
            problems.append(f"eagle: input {name} declared {tensor}, sent {dtype} rank {len(dims)}")
    assert not problems, "\n".join(problems)
    assert set(sent) == set(declared), "every declared input is used"
    assert set(EAGLE_OUTPUTS) <= set(_declared(config.output))
    params = parse_config(cpu_repository / "banditspec" / "config.pbtxt").parameters
    assert params["eagle_model"].string_value == "eagle"
