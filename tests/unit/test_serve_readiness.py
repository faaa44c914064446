"""Readiness read from the metrics page: every banditspec model (a benchmark's private copies
too) must say nv_banditspec_ready 1, and the cold ones are named so each gets its warm-up."""

from banditspec_server.serve import cold_models, warm_from_metrics

PAGE = """# HELP nv_banditspec_ready Whether the model is calibrated
# TYPE nv_banditspec_ready gauge
nv_banditspec_ready{model="banditspec",version="1"} 1
nv_banditspec_ready{model="banditspec_costaware",version="1"} 0
nv_inference_request_success{model="target",version="1"} 3
"""


def test_a_cold_private_copy_is_named_and_the_page_is_not_warm():
    assert cold_models(PAGE) == ["banditspec_costaware"]
    assert not warm_from_metrics(PAGE)


def test_all_ones_is_warm_and_no_gauge_means_triton_readiness_alone():
    assert warm_from_metrics(PAGE.replace("} 0", "} 1"))
    assert cold_models("nv_inference_request_success{model=\"target\",version=\"1\"} 3\n") == []
