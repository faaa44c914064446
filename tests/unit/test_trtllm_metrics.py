"""KV-cache reuse of a TensorRT-LLM target reaches the metrics port (counters fed from the
TensorEngine's running totals of the per-request figures)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from banditspec.engine.contract import VerifyRequest
from banditspec.engine.tensor_codec import TensorEngine
from banditspec.metrics import build_serving_metrics
from banditspec.metrics.target_kv import TargetKvMetrics

from tests.unit.test_metrics import FakeFactory
from tests.unit.test_trtllm_contract import EOS, VOCAB, Recorder


def trt_engine():
    return TensorEngine(Recorder(), vocab_size=VOCAB, max_context=256, eos_id=EOS, tensorrtllm=True)


def verify(engine, n):
    for _ in range(n):
        engine.verify([VerifyRequest(input_ids=np.arange(3, 9, dtype=np.int32), end_id=EOS)])


def test_counters_follow_the_engine_totals():
    factory, engine = FakeFactory(), trt_engine()
    metrics = TargetKvMetrics(factory, engine, model="banditspec", version="1")
    assert factory.series("nv_banditspec_target_kv_reused_blocks").value == 0  # present from the start
    verify(engine, 2)
    metrics.update()
    verify(engine, 1)
    metrics.update()
    metrics.update()  # no new calls: nothing added
    assert factory.series("nv_banditspec_target_kv_reused_blocks", model="banditspec").value == 9  # 3 per call
    assert factory.series("nv_banditspec_target_kv_new_blocks").value == 3
    assert factory.series("nv_banditspec_target_verify_calls").value == 3


def test_built_for_a_tensorrt_llm_target_only():
    params = {"metrics": "true", "metrics_log_interval_s": "0"}

    def controller(engine):
        return SimpleNamespace(engine=engine, decoder=SimpleNamespace(limits=SimpleNamespace(max_draft_len=4)))

    served = build_serving_metrics(controller(trt_engine()), FakeFactory(), params)
    assert served.target_kv is not None
    reference = TensorEngine(Recorder(), vocab_size=VOCAB, max_context=256, eos_id=EOS)
    assert build_serving_metrics(controller(reference), FakeFactory(), params).target_kv is None
    assert build_serving_metrics(controller(trt_engine()), None, params).target_kv is None
    engine = served.target_kv._engine
    verify(engine, 1)
    served.on_step(SimpleNamespace(arm="pld@4", drafted=0, accepted=0, new_token_ids=[5]))
    served.flush()  # what the export thread, or the request's final response, does
    assert served.target_kv._last["kv_cache_reused_blocks"] == 3
    served.close()
    assert served.target_kv is None
