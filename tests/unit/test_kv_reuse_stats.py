"""Per-request KV-cache reuse figures from the engine reach speculation_stats."""

from __future__ import annotations

from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import run_to_completion
from banditspec.engine.trtllm import TrtllmVerifyResult

from tests.mock_engine import MockEngine


class ReportingEngine(MockEngine):
    """Reports, as TensorRT-LLM does with return_perf_metrics, blocks reused and allocated."""

    def verify(self, requests):
        results = super().verify(requests)
        return [TrtllmVerifyResult(r.output_ids, r.num_accepted, r.hidden_states,
                                   kv_cache_reused_blocks=3, kv_cache_alloc_new_blocks=1) for r in results]


def test_kv_reuse_is_summed_per_request():
    engine = ReportingEngine()
    decoder = SpeculativeDecoder.for_engine(engine, {})
    result = run_to_completion(engine, decoder.start(GenerationRequest(prompt_ids=[3, 4, 5], max_tokens=7, policy="vanilla")))
    stats = result.stats.as_dict()
    assert stats["steps"] == 7
    assert stats["kv_cache_reused_blocks"] == 21 and stats["kv_cache_alloc_new_blocks"] == 7


def test_no_kv_figures_when_the_engine_reports_none():
    engine = MockEngine()
    decoder = SpeculativeDecoder.for_engine(engine, {})
    result = run_to_completion(engine, decoder.start(GenerationRequest(prompt_ids=[3, 4, 5], max_tokens=4, policy="vanilla")))
    assert "kv_cache_reused_blocks" not in result.stats.as_dict()
