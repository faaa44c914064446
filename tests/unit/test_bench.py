"""The benchmark: method parsing, interleaving, aggregation/oracle, reports, perf metrics,
and an end-to-end in-process run on the tiny model."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
from banditspec.config import DEFAULT_MAX_DRAFT_LEN
from banditspec.errors import BanditSpecValidationError
from banditspec_client.bench.compare import command as bench
from banditspec_client.bench.compare.summary import markdown_report, summarize_workload, target_checks
from banditspec_client.bench.methods import RunRecord, digest, parse_methods, rotated
from banditspec_client.bench.runner import split_available
from banditspec_client.bench.through_triton import bench_repository, private_model_name
from banditspec_server.supervisor import group_cpu_seconds

REPO = Path(__file__).resolve().parents[2]


# -- methods -------------------------------------------------------------------------
def test_methods_parse_into_policies():
    methods = {m.name: m for m in parse_methods("vanilla,pld,suffix@2,ucbspec,exp3spec:throughput")}
    assert methods["vanilla"].policy == "vanilla"
    assert (methods["pld"].policy, methods["pld"].drafter) == ("fixed:pld", "pld")
    assert (methods["suffix@2"].policy, methods["suffix@2"].drafter) == ("fixed:suffix@2", "suffix")
    assert (methods["ucbspec"].policy, methods["ucbspec"].reward) == ("ucbspec", "accepted")
    assert (methods["exp3spec:throughput"].policy, methods["exp3spec:throughput"].reward) == ("exp3spec", "throughput")
    assert methods["ucbspec"].needs_suffix_state and methods["suffix@2"].needs_suffix_state
    assert not methods["pld"].needs_suffix_state and not methods["vanilla"].needs_suffix_state


def test_reward_both_runs_each_adaptive_method_with_each_reward():
    names = [m.name for m in parse_methods("vanilla,ucbspec,exp3spec", reward="both")]
    assert names == ["vanilla", "ucbspec:accepted", "ucbspec:throughput", "exp3spec:accepted", "exp3spec:throughput"]
    assert [m.reward for m in parse_methods("ucbspec", reward="throughput")] == ["throughput"]


def test_an_adaptive_method_may_name_its_own_ceiling_L():
    methods = {m.name: m for m in parse_methods("costaware@4,costaware@8:throughput,costaware")}
    assert (methods["costaware@4"].policy, methods["costaware@4"].max_draft_len) == ("costaware", 4)
    assert (methods["costaware@8:throughput"].max_draft_len, methods["costaware@8:throughput"].reward) == (8, "throughput")
    assert methods["costaware"].max_draft_len is None and methods["costaware@4"].adaptive
    assert private_model_name(methods["costaware@8:throughput"]) == "banditspec_costaware_8_throughput"


@pytest.mark.parametrize("text", ["", "medusa", "pld,pld", "ucbspec:fast", "pld:throughput", "pld@x",
                                  "costaware@0", "costaware@17", "costaware@x", "costaware@", "costaware@4,costaware@4"])
def test_bad_method_lists_are_rejected(text):
    with pytest.raises(BanditSpecValidationError) as err:
        parse_methods(text)
    assert err.value.field == "methods"


def test_rotation_puts_every_method_in_every_position_equally_often():
    methods = parse_methods("vanilla,pld,suffix,ucbspec")
    orders = [[m.name for m in rotated(methods, i)] for i in range(8)]
    assert all(sorted(o) == sorted(m.name for m in methods) for o in orders)
    for position in range(4):
        assert sorted(o[position] for o in orders) == sorted([m.name for m in methods] * 2)


def test_runners_skip_methods_whose_drafters_they_do_not_serve():
    methods = parse_methods("vanilla,pld,eagle,ucbspec")
    usable, skipped = split_available(methods, lambda d: None if d == "pld" else f"no {d}", ["pld"], "none")
    assert [m.name for m in usable] == ["vanilla", "pld", "ucbspec"] and skipped == {"eagle": "no eagle"}
    usable, skipped = split_available(methods, lambda d: "gone", [], "no arms")
    assert [m.name for m in usable] == ["vanilla"] and skipped == {"pld": "gone", "eagle": "gone", "ucbspec": "no arms"}


# -- aggregation and the oracle ------------------------------------------------------
def _record(prompt: str, method: str, tokens: int, seconds: float, steps: int, out: str = "same") -> RunRecord:
    return RunRecord("mixed", "code", prompt, method, tokens, seconds, steps, digest(out),
                     arms=["pld@4"] * steps, drafted=[4] * steps, accepted=[0] * steps)


def _two_prompt_records() -> list[RunRecord]:
    # p1: pld is the fastest arm, p2: suffix is. ucbspec is close to the best on each.
    return [
        _record("p1", "vanilla", 40, 2.0, 40), _record("p1", "pld", 40, 1.0, 16),
        _record("p1", "suffix", 40, 1.6, 25), _record("p1", "ucbspec", 40, 1.1, 18),
        _record("p2", "vanilla", 20, 1.0, 20), _record("p2", "pld", 20, 0.8, 15),
        _record("p2", "suffix", 20, 0.4, 8), _record("p2", "ucbspec", 20, 0.5, 9),
    ]


def test_summary_pools_tokens_and_finds_best_fixed_arm_and_oracle():
    s = summarize_workload("mixed", _two_prompt_records(), ["vanilla", "pld", "suffix", "ucbspec"])
    ucb, vanilla, pld = s.get("ucbspec"), s.get("vanilla"), s.get("pld")
    assert vanilla.tokens_per_second == pytest.approx(60 / 3.0)
    assert ucb.tokens_per_second == pytest.approx(60 / 1.6)
    assert ucb.mean_accepted_tokens == pytest.approx(60 / 27)
    assert ucb.speedup == pytest.approx((60 / 1.6) / (60 / 3.0))
    assert ucb.mean_prompt_speedup == pytest.approx(((40 / 1.1) / 20 + (20 / 0.5) / 20) / 2)
    assert s.best_fixed == "pld"  # 60 tokens in 1.8 s beats suffix's 2.0 s
    assert s.oracle_choices == {"pld": 1, "suffix": 1}
    assert s.oracle_tokens_per_second == pytest.approx(60 / 1.4)
    assert ucb.vs_oracle == pytest.approx(1.4 / 1.6)
    assert ucb.vs_best_fixed == pytest.approx(1.8 / 1.6)
    assert pld.prompts_won == 1 and s.get("suffix").prompts_won == 1
    assert s.lossless_mismatches == []


def test_an_adaptive_methods_ratio_to_the_best_fixed_arm_comes_with_a_bootstrap_interval():
    """Resampling the two prompts gives three pools: p1 twice (ucbspec 40/1.1 against pld's
    40/1.0: 0.909), p2 twice (40/1.0 against suffix's 40/0.8: 0.8), both (the table's 1.125);
    the 90 % interval spans the extremes, the best arm being re-chosen in each resample."""
    records = _two_prompt_records()
    s = summarize_workload("mixed", records, ["vanilla", "pld", "suffix", "ucbspec"])
    ucb = s.get("ucbspec")
    assert ucb.vs_best_fixed_interval == pytest.approx((0.8, 1.125))
    assert s.get("pld").vs_best_fixed_interval is None  # fixed arms and vanilla get none
    assert summarize_workload("mixed", records, ["vanilla", "pld", "suffix", "ucbspec"]).get(
        "ucbspec").vs_best_fixed_interval == ucb.vs_best_fixed_interval  # seeded
    one = summarize_workload("mixed", [r for r in records if r.prompt_id == "p1"], ["vanilla", "pld", "ucbspec"])
    assert one.get("ucbspec").vs_best_fixed_interval is None  # one prompt: nothing to resample
    report = markdown_report([s], title="t", command="c", setup={}, skipped={}, records=records)
    assert "ucbspec / best fixed arm: 112.5%; 90% interval over the prompts [80.0%, 112.5%]" in report


def test_a_prompt_missing_a_method_is_left_out_and_a_different_output_is_flagged():
    records = _two_prompt_records()
    records = [r for r in records if not (r.prompt_id == "p2" and r.method == "suffix")]
    records[1] = _record("p1", "pld", 40, 1.0, 16, out="different")
    s = summarize_workload("mixed", records, ["vanilla", "pld", "suffix", "ucbspec"])
    assert s.prompt_ids == ["p1"]
    assert s.lossless_mismatches == [("p1", "pld")]
    report = markdown_report([s], title="t", command="c", setup={}, skipped={"eagle": "no head"}, records=records)
    assert "Output differs from vanilla" in report and "skipped method `eagle`: no head" in report


def test_the_cpu_clock_ranks_by_cpu_seconds_when_wall_time_was_disturbed():
    records = _two_prompt_records()
    for r in records:
        r.cpu_seconds = r.seconds
    # other load slowed suffix's p1 request down on the wall clock only
    records[2].seconds, records[2].cpu_seconds = 4.0, 0.9
    wall = summarize_workload("mixed", records, ["vanilla", "pld", "suffix", "ucbspec"])
    cpu = summarize_workload("mixed", records, ["vanilla", "pld", "suffix", "ucbspec"], clock="cpu")
    assert (wall.best_fixed, cpu.best_fixed) == ("pld", "suffix")
    assert cpu.oracle_choices == {"suffix": 2}
    assert cpu.get("suffix").tokens_per_second == pytest.approx(60 / 1.3)
    report = markdown_report([wall], title="t", command="c", setup={}, skipped={}, records=records, cpu_summaries=[cpu])
    assert "tokens/CPU-s" in report and "By CPU time (best fixed arm: suffix)" in report


def test_the_decode_clock_leaves_each_requests_first_step_out():
    """The first step prefills the prompt (the same for every method): the decode clock
    counts the tokens and seconds of the steps after it, from the per-step times."""
    fast = RunRecord("mixed", "code", "p1", "pld", 9, 3.0, 3, "x", step_ms=[2000.0, 400.0, 600.0],
                     accepted=[2, 3, 0], drafted=[4, 4, 4])
    slow = RunRecord("mixed", "code", "p1", "vanilla", 9, 2.9, 9, "x", step_ms=[1900.0] + [125.0] * 8,
                     accepted=[0] * 9, drafted=[0] * 9)
    wall = summarize_workload("mixed", [fast, slow], ["vanilla", "pld"])
    decode = summarize_workload("mixed", [fast, slow], ["vanilla", "pld"], clock="decode")
    assert wall.get("pld").speedup == pytest.approx(2.9 / 3.0)  # the prefill hides the difference
    assert decode.get("pld").tokens == 9 - 3 and decode.get("pld").seconds == pytest.approx(1.0)
    assert decode.get("vanilla").tokens == 8 and decode.get("vanilla").seconds == pytest.approx(1.0)
    assert decode.get("pld").speedup == pytest.approx(6 / 8)
    assert decode.get("pld").mean_accepted_tokens == pytest.approx(6 / 2)
    report = markdown_report([wall], title="t", command="c", setup={}, skipped={}, records=[fast, slow],
                             decode_summaries=[decode])
    assert "decode tokens/s" in report and "first step (the prompt's prefill) left out" in report


def test_group_cpu_seconds_counts_this_process():
    own = time.process_time()
    assert group_cpu_seconds(os.getpgrp()) >= own - 0.05


def test_target_checks_compare_against_the_issue_thresholds():
    s = summarize_workload("mixed", _two_prompt_records(), ["vanilla", "pld", "suffix", "ucbspec"])
    checks = {name: (value, met) for name, value, met in target_checks([s])}
    assert checks["ucbspec >= 1.05 x best fixed arm on mixed"] == (pytest.approx(1.8 / 1.6), True)
    assert checks["ucbspec >= 0.95 x per-prompt oracle on mixed"] == (pytest.approx(1.4 / 1.6), False)
    plain = s.get("ucbspec").speedup
    assert checks["ucbspec >= 1.00 x plain decoding on mixed"] == (pytest.approx(plain), plain >= 1.0)
    assert checks["ucbspec >= 1.00 x best fixed arm on mixed"][1] is True


def test_markdown_report_has_one_row_per_method_and_the_per_prompt_oracle():
    records = _two_prompt_records()
    s = summarize_workload("mixed", records, ["vanilla", "pld", "suffix", "ucbspec"])
    report = markdown_report([s], title="Bench", command="banditspec bench", setup={"mode": "x"}, skipped={}, records=records)
    for method in ("vanilla", "pld", "suffix", "ucbspec"):
        assert f"| {method} |" in report
    assert "| p1 | code | 40 | 20.0 | pld | 40.0 | 91% |" in report
    assert "Lossless: every method's output equals vanilla's" in report


def test_an_adaptive_method_at_its_own_L_asks_for_that_L():
    from banditspec_client.bench.in_process import InProcessRunner
    from banditspec_client.bench.runner import RunSettings
    from banditspec_client.bench.workloads import load_workload

    runner = InProcessRunner(RunSettings(model="tiny", max_draft_len=8, threads=1), drafters=["pld"])
    prompt = load_workload("code-edit", 1)[0]
    asked = {}
    for method in parse_methods("costaware@2,costaware"):
        decoder = runner._decoder(method)
        start = decoder.start
        decoder.start = lambda request, _name=method.name, _start=start: asked.setdefault(_name, request) and _start(request)
        record = runner.run(prompt, method, 12)
        assert record.generated_tokens > 0
    assert (asked["costaware@2"].max_draft_len, asked["costaware"].max_draft_len) == (2, 8)


# -- through-Triton repository ---------------------------------------------------------
def test_bench_repository_adds_renamed_private_controller_copies(tmp_path):
    name = private_model_name(parse_methods("ucbspec:throughput")[0])
    assert name == "banditspec_ucbspec_throughput"
    out = bench_repository(REPO / "model_repository", [name], tmp_path / "repo")
    config = (out / name / "config.pbtxt").read_text()
    assert f'name: "{name}"' in config and 'name: "banditspec"' not in config
    assert (out / name / "1" / "model.py").read_bytes() == (REPO / "model_repository/banditspec/1/model.py").read_bytes()
    assert 'name: "banditspec"' in (out / "banditspec" / "config.pbtxt").read_text()


# -- perf_analyzer helpers -------------------------------------------------------------
def _perf_sweep():
    spec = importlib.util.spec_from_file_location("perf_sweep", REPO / "perf" / "perf_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_streaming_metrics_from_a_profile_export():
    ms = 1_000_000
    stats = json.dumps({"generated_tokens": 11})

    def request(sent_ms, stamps_ms):
        outputs = [{"text_output": "x", "speculation_stats": ""} for _ in stamps_ms[:-1]]
        outputs.append({"text_output": "y", "speculation_stats": stats})
        return {"timestamp": sent_ms * ms, "response_timestamps": [t * ms for t in stamps_ms], "response_outputs": outputs}

    profile = {"experiments": [{"experiment": {"mode": "concurrency", "value": 2},
                                "requests": [request(0, [100, 300, 600]), request(50, [250, 1250])]}]}
    (row,) = _perf_sweep().streaming_metrics(profile)
    assert row["concurrency"] == 2 and row["requests"] == 2 and row["output_tokens"] == 22
    assert row["ttft_ms_p50"] == pytest.approx(150.0)  # median of 100 and 200
    assert row["itl_ms_p50"] == pytest.approx((50.0 + 100.0) / 2)  # 500/10 and 1000/10
    assert row["latency_ms_p90"] == pytest.approx(1200.0)
    assert row["output_tokens_per_s"] == pytest.approx(22 / 1.25)


def test_perf_input_data_sets_the_policy_per_entry():
    module = _perf_sweep()
    data = module.make_input_data(["a", "b"], 16)
    assert data["data"][0] == {"text_input": ["a"], "max_tokens": [16], "stream": [True]}
    assert all(e["policy"] == ["vanilla"] for e in module.with_policy(data, "vanilla")["data"])
    assert "policy" not in module.with_policy(module.with_policy(data, "vanilla"), None)["data"][1]
    committed = json.loads((REPO / "perf" / "input_data" / "banditspec_mixed.json").read_text())
    assert len(committed["data"]) >= 3 and all({"text_input", "max_tokens", "stream"} <= set(e) for e in committed["data"])


# -- end to end, in process, tiny model ------------------------------------------------
def test_bench_runs_every_method_on_every_prompt_and_writes_table_json_and_plots(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([
        "--model", "tiny", "--workload", "mixed", "--prompts", "2", "--max-tokens", "6",
        "--methods", "vanilla,pld,suffix,ucbspec,exp3spec", "--drafters", "pld,suffix",
        "--out", str(tmp_path), "--no-progress", "--threads", "1",
    ])
    assert bench.run(args) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    records = result["records"]
    methods = ["vanilla", "pld", "suffix", "ucbspec", "exp3spec"]
    assert sorted((r["prompt_id"], r["method"]) for r in records) == sorted(
        (pid, m) for pid in {r["prompt_id"] for r in records} for m in methods)
    assert len(records) == 2 * len(methods)
    # the methods ran interleaved, rotated per prompt
    assert [r["method"] for r in records[:5]] == methods and records[5]["method"] == "pld"
    for r in records:
        assert 1 <= r["generated_tokens"] <= 6 and r["seconds"] > 0 and r["steps"] == len(r["arms"])
        assert r["cpu_seconds"] > 0
    adaptive_arms = {a for r in records if r["method"] in ("ucbspec", "exp3spec") for a in r["arms"]}
    assert adaptive_arms <= {f"pld@{DEFAULT_MAX_DRAFT_LEN}", f"suffix@{DEFAULT_MAX_DRAFT_LEN}", "vanilla"}
    (summary,) = result["summaries"]
    assert result["cpu_summaries"][0]["clock"] == "cpu"
    assert summary["lossless_mismatches"] == []
    assert summary["best_fixed"] in ("pld", "suffix")
    report = (tmp_path / "results.md").read_text()
    assert "| ucbspec |" in report and "## Targets" in report
    for png in ("tokens_per_second.png", "speedup_sorted.png", "arms_per_step.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the report can be rebuilt from results.json alone, without measuring again
    again = parser.parse_args(["--from-json", str(tmp_path / "results.json"), "--out", str(tmp_path / "again")])
    assert bench.run(again) == 0
    assert (tmp_path / "again" / "results.md").read_text() == report


def test_sweep_measures_a_point_again_after_an_empty_profile_export(tmp_path, monkeypatch):
    """perf_analyzer now and then exits 0 with an empty --profile-export-file, and refuses (exit 99) a
    --profile-export-file that already exists: the second attempt must not trip over the first's file."""
    module = _perf_sweep()
    ms = 1_000_000
    stats = json.dumps({"generated_tokens": 3})
    profile = {"experiments": [{"experiment": {"mode": "concurrency", "value": 1},
                                "requests": [{"timestamp": 0, "response_timestamps": [10 * ms, 30 * ms],
                                              "response_outputs": [{"speculation_stats": stats}]}]}]}
    calls = []

    def fake_perf_analyzer(command, log_path, timeout):  # the real tool's file handling, no server
        export = Path(command[command.index("--profile-export-file") + 1])
        csv_path = Path(command[command.index("-f") + 1])
        log_path.write_text("log\n")
        if export.exists():
            raise RuntimeError("perf_analyzer exited with 99: Path must not already exist.")
        calls.append(export.name)
        export.write_text("" if len(calls) == 1 else json.dumps(profile))
        csv_path.write_text("Concurrency,Inferences/Second\n1,2.0\n")

    monkeypatch.setattr(module, "run_perf_analyzer", fake_perf_analyzer)
    monkeypatch.setattr(module, "warm_up", lambda url, policies: None)
    rows = module.sweep("localhost:1", module.make_input_data(["a"], 4), ["vanilla"], [1], 1, tmp_path)
    assert calls == ["vanilla_c1.profile.json"] * 2
    assert [r["output_tokens"] for r in rows] == [3]
    assert (tmp_path / "runs" / "vanilla_c1.empty-profile.log").exists()


def test_results_name_the_cpu_and_the_panel_kernel_width(tmp_path, monkeypatch):
    """Results from different CPUs are not comparable: the set-up names the CPU (model name and
    family from /proc/cpuinfo) and what the engine's panel GEMM runs on."""
    import builtins

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nflags\t\t: fpu\n"
                       "processor\t: 1\ncpu family\t: 26\nmodel name\t: AMD EPYC\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path, *a, **k))
    assert bench.cpu_description() == "AMD EPYC, family 26"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert bench.cpu_description() == "Some CPU"
    from banditspec.engine import panel_kernel

    assert panel_kernel.describe() in ("avx512", "avx2") or panel_kernel.describe().startswith("unavailable")
