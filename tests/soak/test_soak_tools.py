"""The soak's helpers without a server: metrics parsing, the workload mix, process probing."""

from __future__ import annotations

import os

from banditspec_client.prometheus_text import metric_total, parse_metrics
from banditspec_client.soak.processes import leftovers, server_processes
from banditspec_client.soak.workload import DETERMINISTIC_POLICY, build_workload

SCRAPE = """# HELP nv_banditspec_arm_pulls Number of decoding steps that chose the arm
# TYPE nv_banditspec_arm_pulls counter
nv_banditspec_arm_pulls{arm="pld@4",model="banditspec",version="1"} 12
nv_banditspec_arm_pulls{arm="vanilla",model="banditspec",version="1"} 3
nv_banditspec_accepted_length_bucket{arm="pld@4",model="banditspec",version="1",le="+Inf"} 12
nv_banditspec_active_sequences{model="banditspec",version="1"} 0
"""


def test_parse_metrics_and_sum_series_by_labels():
    series = parse_metrics(SCRAPE)
    assert metric_total(series, "nv_banditspec_arm_pulls") == 15
    assert metric_total(series, "nv_banditspec_arm_pulls", arm="pld@4") == 12
    assert metric_total(series, "nv_banditspec_accepted_length_bucket", le="+Inf") == 12
    assert metric_total(series, "nv_banditspec_active_sequences", model="banditspec") == 0
    assert metric_total(series, "nv_missing") == 0


def test_workload_is_seeded_and_mixed():
    cases = build_workload(400, seed=3)
    assert cases == build_workload(400, seed=3) and cases != build_workload(400, seed=4)
    kinds = {k: sum(c.kind == k for c in cases) for k in ("good", "cancel", "invalid")}
    assert kinds["good"] > 250 and 20 < kinds["cancel"] < 80 and 20 < kinds["invalid"] < 80
    assert all(c.bad_field for c in cases if c.kind == "invalid")
    assert all(c.options.stream and c.cancel_after for c in cases if c.kind == "cancel")
    repeated = [c for c in cases if c.options.policy == DETERMINISTIC_POLICY and c.kind == "good"]
    assert len({c.options.max_tokens for c in repeated}) == 1 and not any(c.options.stop_words for c in repeated)


def test_process_probe_sees_this_process_and_no_leftovers_of_a_live_one():
    (me, *children) = server_processes(os.getpid())
    assert me.role == "server" and me.rss_bytes > 0
    assert leftovers([me], wait_s=0) == ([os.getpid()], [])


def test_cut_at_stop_drops_the_first_stop_word_and_what_follows():
    from banditspec_client.soak.expected import cut_at_stop

    assert cut_at_stop([1, 2, 3, 4, 5], [[3, 4]], 10) == [1, 2]
    assert cut_at_stop([1, 2, 3, 4, 5], [[4], [2, 3]], 10) == [1]  # the stop word that ends first
    assert cut_at_stop([1, 2, 3, 4, 5], [[9]], 3) == [1, 2, 3]
    assert cut_at_stop([1, 2, 3], [[3]], 2) == [1, 2]  # max_tokens reached before the stop word
    assert cut_at_stop([1, 2, 3], [], 5) == [1, 2, 3]


def test_expected_text_equals_plain_decoding_by_the_decoding_loop():
    """The soak's reference (target calls + its own stop rule) and the decoding loop's vanilla
    policy (the server's code) agree, stop words included."""
    from banditspec.config import GenerationRequest
    from banditspec.decoding.session import run_to_completion
    from banditspec.serving.runtime import load_local
    from banditspec.text import prompt_ids, stop_sequences
    from banditspec_client.soak.expected import VanillaReference
    from banditspec_client.soak.workload import PROMPTS

    reference, stack = VanillaReference("tiny"), load_local("tiny", arms=("pld",))
    tok = stack.tokenizer
    cut = 0
    for prompt in PROMPTS[:3]:
        words = reference.text(prompt, 24).split()  # stop words the (random) tiny model does produce
        for stop in ((), (".",), (f" {words[4]}",), (f" {words[8]}", f" {words[2]}")):
            request = GenerationRequest(prompt_ids(tok, prompt, chat=True), 24, policy="vanilla",
                                        stop_sequences=stop_sequences(tok, list(stop)))
            result = run_to_completion(stack.engine, stack.decoder.start(request))
            assert reference.token_ids(prompt, 24, stop) == result.token_ids, (prompt, stop)
            assert reference.text(prompt, 24, stop) == tok.decode(result.token_ids, skip_special_tokens=True)
            cut += result.finish_reason == "stop"
    assert cut >= 3  # the stop rule was exercised
