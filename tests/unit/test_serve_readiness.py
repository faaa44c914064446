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


class _Running:
    """A tritonserver process that keeps running."""

    def poll(self):
        return None


def test_a_warm_up_that_hangs_holds_neither_the_start_up_nor_a_stop(monkeypatch):
    """A banditspec stub stopped while it warms up answers nothing: the warm-up request waits
    on its own thread, the start-up keeps polling (one warm-up at a time, not one per poll) and
    a stop request ends the wait at once."""
    import threading
    import time

    from banditspec_server import serve

    server = serve.TritonServer(model="tiny")
    server.process = _Running()
    released, sent = threading.Event(), []

    def hanging(url, models):
        sent.append(models)
        released.wait(10)

    page = PAGE.replace('model="banditspec",version="1"} 1', 'model="banditspec",version="1"} 0')
    monkeypatch.setattr(serve.TritonServer, "_send_warm_ups", staticmethod(hanging))
    monkeypatch.setattr(server, "_triton_ready", lambda: True)
    monkeypatch.setattr(server, "_metrics_text", lambda: page)
    monkeypatch.setattr(server, "is_ready", lambda: False)
    monkeypatch.setattr(serve.time, "sleep", lambda s: time.monotonic())  # polls without pause
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    began = time.monotonic()
    try:
        server.wait_ready(timeout=30, cancel=cancel)
        assert time.monotonic() - began < 5
        assert sent == [["banditspec", "banditspec_costaware"]]  # once, though polled many times
    finally:
        released.set()
