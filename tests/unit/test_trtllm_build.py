"""engine_build/trtllm: the exact commands of the GPU build, checked without a GPU."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
from banditspec.errors import BanditSpecValidationError
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "engine_build" / "trtllm" / "build_engines.py"
CONVERT_SCRIPT = REPO / "engine_build" / "trtllm" / "convert_hf.py"

# trtllm-build flags of TensorRT-LLM 1.2 that this project may emit (tensorrt_llm/commands/build.py's
# argparse and plugin options, read from upstream); a typo or a flag from another version fails
# here, not on a GPU box. --gather_generation_logits exists but is deliberately not used.
KNOWN_TRTLLM_BUILD_FLAGS = {
    "--checkpoint_dir", "--output_dir", "--max_batch_size", "--max_input_len", "--max_seq_len",
    "--max_beam_width", "--max_num_tokens", "--kv_cache_type", "--logits_dtype",
    "--speculative_decoding_mode", "--max_draft_len", "--gemm_plugin", "--gpt_attention_plugin",
    "--remove_input_padding", "--context_fmha", "--use_paged_context_fmha", "--workers",
}
SPECULATIVE_MODES = {"draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"}


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


build = _load(BUILD_SCRIPT, "banditspec_build_engines")
convert_hf = _load(CONVERT_SCRIPT, "banditspec_convert_hf")


def _spec(tmp_path: Path, **kw):
    return build.BuildSpec(target_hf=tmp_path / "hf_t", draft_hf=tmp_path / "hf_d", out_dir=tmp_path / "out", **kw)


def _flags(cmd: list[str]) -> dict[str, str | None]:
    """trtllm-build argv -> {flag: value or None for a switch}."""
    out, i = {}, 1
    while i < len(cmd):
        if i + 1 < len(cmd) and not cmd[i + 1].startswith("--"):
            out[cmd[i]] = cmd[i + 1]
            i += 2
        else:
            out[cmd[i]] = None
            i += 1
    return out


def test_plan_order_and_wiring(tmp_path):
    spec = _spec(tmp_path, max_draft_len=6)
    conv_t, conv_d, build_t, build_d = build.plan_commands(spec)
    assert conv_t[:2] == ["python3", str(CONVERT_SCRIPT)] and conv_d[:2] == conv_t[:2]
    assert conv_t[conv_t.index("--model_dir") + 1] == str(tmp_path / "hf_t")
    assert conv_d[conv_d.index("--model_dir") + 1] == str(tmp_path / "hf_d")
    t, d = _flags(build_t), _flags(build_d)
    assert build_t[0] == build_d[0] == "trtllm-build"
    assert t["--checkpoint_dir"] == conv_t[conv_t.index("--output_dir") + 1]
    assert d["--checkpoint_dir"] == conv_d[conv_d.index("--output_dir") + 1]
    assert t["--output_dir"] != d["--output_dir"]


def test_target_is_an_external_draft_engine_with_block_reuse_support(tmp_path):
    t = _flags(build.plan_commands(_spec(tmp_path, max_draft_len=6))[2])
    assert t["--speculative_decoding_mode"] == "draft_tokens_external"
    assert t["--max_draft_len"] == "6"
    assert t["--use_paged_context_fmha"] == "enable"
    assert t["--kv_cache_type"] == "paged"
    assert t["--remove_input_padding"] == "enable"


def test_draft_is_a_plain_engine(tmp_path):
    d = _flags(build.plan_commands(_spec(tmp_path))[3])
    assert "--speculative_decoding_mode" not in d and "--max_draft_len" not in d
    assert d["--use_paged_context_fmha"] == "enable"  # its KV blocks are reused too


def test_engines_take_the_whole_context_as_input(tmp_path):
    spec = _spec(tmp_path, max_seq_len=3072, max_batch_size=4, max_num_tokens=4096)
    for cmd in build.plan_commands(spec)[2:]:
        f = _flags(cmd)
        assert f["--max_seq_len"] == "3072"
        assert f["--max_input_len"] == "3071"  # the stateless contract resends prompt + output
        assert f["--max_batch_size"] == "4"
        assert f["--max_num_tokens"] == "4096"
        assert f["--logits_dtype"] == "float32"  # draft_logits is declared TYPE_FP32


def test_no_engine_gathers_logits_nobody_reads(tmp_path):
    spec = _spec(tmp_path, eagle_hf=tmp_path / "eagle", eagle_convert_script=tmp_path / "conv.py")
    for cmd in build.plan_commands(spec):
        assert not any(word.startswith("--gather_") for word in cmd), cmd


def test_pinned_to_the_last_release_with_the_engine_flow():
    assert build.TENSORRT_LLM_VERSION == "1.2.1"
    assert build.NGC_IMAGE == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"


def test_eagle_arm_is_built_only_when_asked_for(tmp_path):
    assert len(build.plan_commands(_spec(tmp_path))) == 4
    spec = _spec(tmp_path, eagle_hf=tmp_path / "eagle", eagle_convert_script=tmp_path / "TRTLLM/examples/eagle/convert_checkpoint.py")
    commands = build.plan_commands(spec)
    assert len(commands) == 6
    convert, engine = commands[2], _flags(commands[5])
    assert convert[:2] == ["python3", str(spec.eagle_convert_script)]
    assert convert[convert.index("--model_dir") + 1] == str(spec.target_hf)  # a second copy of the target
    assert convert[convert.index("--eagle_model_dir") + 1] == str(tmp_path / "eagle")
    assert engine["--speculative_decoding_mode"] == "eagle"
    assert engine["--checkpoint_dir"] == str(spec.checkpoint_dir("eagle"))
    assert build.banditspec_parameters(spec) == {"drafters": "pld,suffix,rest,copy,draft,eagle", "eagle_model": "eagle"}
    assert build.banditspec_parameters(_spec(tmp_path)) == {}


@pytest.mark.parametrize("kw, field", [
    ({"eagle_hf": Path("/e")}, "eagle_convert_script"),
    ({"eagle_hf": Path("/e"), "eagle_convert_script": Path("/c"), "eagle_kv_fraction": 0.3}, "eagle_kv_fraction"),
    ({"eagle_hf": Path("/e"), "eagle_convert_script": Path("/c"), "max_num_tokens": 256}, "max_num_tokens"),
])
def test_bad_eagle_spec_names_the_field(tmp_path, kw, field):
    with pytest.raises(BanditSpecValidationError) as info:
        _spec(tmp_path, **kw)
    assert info.value.field == field


def test_every_flag_is_a_known_trtllm_build_flag(tmp_path):
    spec = _spec(tmp_path, dtype="bfloat16", eagle_hf=tmp_path / "e", eagle_convert_script=tmp_path / "c.py")
    for cmd in build.plan_commands(spec)[3:]:
        flags = set(_flags(cmd))
        assert flags <= KNOWN_TRTLLM_BUILD_FLAGS, flags - KNOWN_TRTLLM_BUILD_FLAGS
        assert _flags(cmd)["--gemm_plugin"] == "bfloat16"
        assert _flags(cmd).get("--speculative_decoding_mode", "eagle") in SPECULATIVE_MODES


def test_convert_script_override(tmp_path):
    official = tmp_path / "TensorRT-LLM/examples/models/core/llama/convert_checkpoint.py"
    conv = build.plan_commands(_spec(tmp_path, convert_script=official))[0]
    assert conv[1] == str(official)
    assert {"--model_dir", "--output_dir", "--dtype"} <= set(conv)  # flags both converters share


def test_dry_run_prints_exactly_the_planned_commands_and_touches_nothing(tmp_path, capsys):
    argv = ["--target-hf", str(tmp_path / "hf_t"), "--draft-hf", str(tmp_path / "hf_d"),
            "--out", str(tmp_path / "out"), "--max-draft-len", "5", "--dry-run"]
    assert build.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    spec = _spec(tmp_path, max_draft_len=5)
    commands = [line for line in lines if not line.startswith("#") and line.startswith(("python3", "trtllm-build"))]
    assert commands == [shlex.join(c) for c in build.plan_commands(spec)]
    assert [shlex.split(c) for c in commands] == build.plan_commands(spec)
    assert any(build.NGC_IMAGE in line and build.TENSORRT_LLM_VERSION in line for line in lines)
    assert not (tmp_path / "out").exists()


def test_dry_run_as_a_script():
    proc = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--target-hf", "/m/t", "--draft-hf", "/m/d", "--out", "/m/o", "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--speculative_decoding_mode draft_tokens_external" in proc.stdout
    values = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert values["target"]["engine_dir"] == "/m/o/engines/target"


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"max_num_tokens": 16, "max_batch_size": 8}, "max_num_tokens"),  # < 8 * (4 + 1), not a block multiple
        ({"max_num_tokens": 64, "max_batch_size": 16}, "max_num_tokens"),  # 64 < 16 * 5
        ({"max_prompt_len": 4096, "max_seq_len": 4096}, "max_prompt_len"),
        ({"max_draft_len": 0}, "max_draft_len"),
        ({"max_draft_len": 17}, "max_draft_len"),
        ({"dtype": "float32"}, "dtype"),
        ({"target_kv_fraction": 0.8, "draft_kv_fraction": 0.3}, "draft_kv_fraction"),
        ({"max_batch_size": True}, "max_batch_size"),
    ],
)
def test_bad_build_spec_names_the_field(tmp_path, kw, field):
    with pytest.raises(BanditSpecValidationError) as err:
        _spec(tmp_path, **kw)
    assert err.value.field == field


def _hf_dir(path: Path, vocab: int = 49152, arch: str = "LlamaForCausalLM") -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "vocab_size": vocab}))
    (path / "tokenizer.json").write_text("{}")
    (path / "tokenizer_config.json").write_text("{}")
    (path / "model.safetensors").write_text("weights are not copied")
    return path


def test_vocab_mismatch_refused_before_any_step(tmp_path, capsys, monkeypatch):
    _hf_dir(tmp_path / "hf_t")
    _hf_dir(tmp_path / "hf_d", vocab=32000)
    monkeypatch.setattr(build.subprocess, "run", lambda *a, **k: pytest.fail("no step may run"))
    argv = ["--target-hf", str(tmp_path / "hf_t"), "--draft-hf", str(tmp_path / "hf_d"), "--out", str(tmp_path / "o")]
    assert build.main(argv) == 2
    assert "draft_hf" in capsys.readouterr().err


def test_full_run_with_stand_in_tools_fills_a_loadable_repository(tmp_path, monkeypatch):
    """Everything but the GPU: steps run in order, the repository is filled and parses."""
    _hf_dir(tmp_path / "hf_t")
    _hf_dir(tmp_path / "hf_d")
    spec = _spec(tmp_path, max_draft_len=3)
    ran: list[list[str]] = []

    def fake_run(cmd, *a, **k):
        ran.append(cmd)
        out = Path(cmd[cmd.index("--output_dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(build.subprocess, "run", fake_run)
    assert build.run(spec, dry_run=False, force=False) == 0
    assert ran == build.plan_commands(spec)
    assert (spec.tokenizer_dir / "tokenizer.json").is_file()
    assert not (spec.tokenizer_dir / "model.safetensors").exists()
    repo = spec.repository_dir
    for model in ("banditspec", "target", "draft"):
        text = (repo / model / "config.pbtxt").read_text()
        assert "${" not in text
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert config.name == model
    target = text_format.Parse((repo / "target" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert target.parameters["gpt_model_path"].string_value == str(spec.engine_dir("target"))
    assert target.parameters["enable_kv_cache_reuse"].string_value == "true"
    bandit = text_format.Parse((repo / "banditspec" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert bandit.parameters["default_max_draft_len"].string_value == "3"
    assert bandit.parameters["tokenizer_dir"].string_value == str(spec.tokenizer_dir)
    model_py = repo / "banditspec" / "1" / "model.py"
    assert model_py.is_file() and not model_py.is_symlink()

    ran.clear()  # a second run skips what exists
    assert build.run(spec, dry_run=False, force=False) == 0
    assert ran == []


def test_failed_step_stops_the_build(tmp_path, monkeypatch, capsys):
    _hf_dir(tmp_path / "hf_t")
    _hf_dir(tmp_path / "hf_d")
    spec = _spec(tmp_path)
    ran = []
    monkeypatch.setattr(
        build.subprocess, "run", lambda cmd, *a, **k: ran.append(cmd) or subprocess.CompletedProcess(cmd, 3)
    )
    assert build.run(spec, dry_run=False, force=False) == 3
    assert len(ran) == 1 and not spec.repository_dir.exists()
    assert "exit code 3" in capsys.readouterr().err


def test_convert_hf_rejects_other_architectures(tmp_path):
    _hf_dir(tmp_path / "gpt", arch="GPT2LMHeadModel")
    with pytest.raises(SystemExit, match="not one of"):
        convert_hf.check_architecture(tmp_path / "gpt")
    with pytest.raises(SystemExit, match="config.json"):
        convert_hf.check_architecture(tmp_path / "nothing")


def test_convert_hf_calls_the_tensorrt_llm_api_per_rank(tmp_path, monkeypatch):
    calls = []

    class FakeModel:
        def __init__(self, rank):
            self.rank = rank

        def save_checkpoint(self, out, save_config):
            calls.append(("save", self.rank, out, save_config))

    class FakeLlama:
        @staticmethod
        def from_hugging_face(model_dir, dtype, mapping):
            calls.append(("load", model_dir, dtype, mapping.rank, mapping.tp_size))
            return FakeModel(mapping.rank)

    class FakeMapping:
        def __init__(self, world_size, rank, tp_size, pp_size):
            assert world_size == tp_size and pp_size == 1
            self.rank, self.tp_size = rank, tp_size

    trtllm = types.ModuleType("tensorrt_llm")
    mapping_mod = types.ModuleType("tensorrt_llm.mapping")
    mapping_mod.Mapping = FakeMapping
    models_mod = types.ModuleType("tensorrt_llm.models")
    models_mod.LLaMAForCausalLM = FakeLlama
    monkeypatch.setitem(sys.modules, "tensorrt_llm", trtllm)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.mapping", mapping_mod)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.models", models_mod)

    hf = _hf_dir(tmp_path / "hf")
    out = tmp_path / "ckpt"
    argv = ["--model_dir", str(hf), "--output_dir", str(out), "--dtype", "bfloat16", "--tp_size", "2"]
    assert convert_hf.main(argv) == 0
    assert calls == [
        ("load", str(hf), "bfloat16", 0, 2), ("save", 0, str(out), True),
        ("load", str(hf), "bfloat16", 1, 2), ("save", 1, str(out), False),
    ]


def test_full_run_with_the_eagle_arm_adds_the_eagle_model_and_arm(tmp_path, monkeypatch):
    _hf_dir(tmp_path / "hf_t")
    _hf_dir(tmp_path / "hf_d")
    _hf_dir(tmp_path / "eagle")
    spec = _spec(tmp_path, eagle_hf=tmp_path / "eagle", eagle_convert_script=tmp_path / "convert_checkpoint.py")

    def fake_run(cmd, *a, **k):
        out = Path(cmd[cmd.index("--output_dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(build.subprocess, "run", fake_run)
    assert build.run(spec, dry_run=False, force=False) == 0
    repo = spec.repository_dir
    eagle = text_format.Parse((repo / "eagle" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert eagle.name == "eagle" and eagle.backend == "tensorrtllm" and (repo / "eagle" / "1").is_dir()
    assert eagle.parameters["gpt_model_path"].string_value == str(spec.engine_dir("eagle"))
    assert eagle.parameters["decoding_mode"].string_value == "eagle"
    assert not {"draft_input_ids", "draft_logits"} & {t.name for t in eagle.input}
    bandit = text_format.Parse((repo / "banditspec" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert "eagle" in bandit.parameters["drafters"].string_value.split(",")
    assert bandit.parameters["eagle_model"].string_value == "eagle"
