"""banditspec.serving.controller.Controller with numpy inputs, a byte tokenizer and a mock target."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.engine.tensor_codec import TensorEngine, decode_request, encode_result
from banditspec.serving.controller import Controller, ServingDefaults

from tests.fake_tokenizer import ByteTokenizer
from tests.mock_engine import MockEngine
from tests.unit.test_decoding import ScriptedDrafter, always_wrong, oracle


class RecordingSink:
    def __init__(self, cancel_after: int | None = None):
        self.sent: list[tuple[str, dict | None, bool]] = []
        self.errors: list[tuple[str, str]] = []
        self.cancel_after = cancel_after

    def send(self, text, stats, final):
        self.sent.append((text, stats, final))

    def fail(self, kind, message):
        self.errors.append((kind, message))

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after

    @property
    def text(self):
        return "".join(t for t, _, _ in self.sent)


class AsciiEngine(MockEngine):
    """Emits lowercase letters only, so that text round-trips through the byte tokenizer."""

    def target(self, seq):
        return 97 + super().target(seq) % 26


def make_controller(engine=None, oracle_source=None, **defaults):
    engine = engine or MockEngine(vocab_size=257, eos_id=256, max_context=1024)
    source = oracle_source or engine
    drafters = {"right": ScriptedDrafter("right", oracle(source, length_cap=3)), "wrong": ScriptedDrafter("wrong", always_wrong(source))}
    decoder = SpeculativeDecoder.for_engine(engine, drafters)
    return Controller(decoder, engine, ByteTokenizer(), ServingDefaults(**defaults)), engine


def inputs(text="hello world", max_tokens=40, **extra):
    out = {"text_input": np.array([[text.encode()]], dtype=object), "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    out.update({k.removeprefix("extra_"): v for k, v in extra.items()})  # extra_NAME overrides; None removes
    return out


def expected_text(engine, prompt, n):
    return ByteTokenizer().decode(engine.vanilla(list(prompt.encode()), n))


@pytest.mark.parametrize("policy", ["vanilla", "ucbspec", "exp3spec", "fixed:right"])
def test_non_streamed_request_is_one_final_response(policy):
    controller, engine = make_controller()
    sink = RecordingSink()
    controller.handle(inputs(policy=np.array([[policy.encode()]], dtype=object)), sink)
    assert not sink.errors
    assert len(sink.sent) == 1 and sink.sent[0][2] is True
    assert sink.text == expected_text(engine, "hello world", 40)
    assert sink.sent[0][1]["generated_tokens"] == 40


def test_streamed_request_sends_deltas_that_concatenate_to_the_text():
    controller, engine = make_controller()
    sink = RecordingSink()
    controller.handle(inputs(stream=np.array([[True]])), sink)
    assert len(sink.sent) > 1
    assert [final for _, _, final in sink.sent] == [False] * (len(sink.sent) - 1) + [True]
    assert sink.text == expected_text(engine, "hello world", 40)


def test_cancellation_stops_within_a_step():
    controller, engine = make_controller()
    sink = RecordingSink(cancel_after=2)
    calls_when_cancelled = []
    original_send = sink.send

    def send(text, stats, final):
        original_send(text, stats, final)
        if sink.is_cancelled():
            calls_when_cancelled.append(engine.calls)

    sink.send = send
    controller.handle(inputs(max_tokens=200, stream=np.array([[True]]), policy=np.array([[b"vanilla"]], dtype=object)), sink)
    assert len(sink.sent) == 2 and not sink.sent[-1][2]
    assert engine.calls == calls_when_cancelled[0]  # no target call after the cancellation was seen
    assert controller.active_sequences == 0


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(text_input=None), "text_input"),
        (dict(max_tokens=None), "max_tokens"),
        (dict(text_input=np.array([[b""]], dtype=object)), "text_input"),
        (dict(text_input=np.array([[b"\xff\xfe bad"]], dtype=object)), "text_input"),
        (dict(text_input=np.array([[b"nul \x00 inside"]], dtype=object)), "text_input"),
        (dict(max_tokens=np.array([[0]], dtype=np.int32)), "max_tokens"),
        (dict(max_tokens=np.array([[-5]], dtype=np.int32)), "max_tokens"),
        (dict(max_tokens=np.array([[10**9]], dtype=np.int32)), "max_tokens"),
        (dict(max_tokens=np.array([[1.5]], dtype=np.float32)), "max_tokens"),
        (dict(max_tokens=np.array([[3, 4]], dtype=np.int32)), "max_tokens"),
        (dict(temperature=np.array([[np.nan]], dtype=np.float32)), "temperature"),
        (dict(temperature=np.array([[-0.5]], dtype=np.float32)), "temperature"),
        (dict(policy=np.array([[b"nope"]], dtype=object)), "policy"),
        (dict(arms=np.array([[b"right,nope"]], dtype=object)), "arms"),
        (dict(max_draft_len=np.array([[0]], dtype=np.int32)), "max_draft_len"),
        (dict(max_draft_len=np.array([[64]], dtype=np.int32)), "max_draft_len"),
        (dict(stop_words=np.array([[b""]], dtype=object)), "stop_words"),
    ],
)
def test_bad_input_fails_naming_the_field_and_the_next_request_works(bad, field):
    controller, engine = make_controller()
    sink = RecordingSink()
    controller.handle(inputs(**{"extra_" + k: v for k, v in bad.items()}), sink)
    assert sink.sent == []
    assert len(sink.errors) == 1
    kind, message = sink.errors[0]
    assert kind == "invalid" and message.startswith(field), message
    assert "Traceback" not in message and ".py" not in message
    good = RecordingSink()
    controller.handle(inputs(), good)
    assert good.text == expected_text(engine, "hello world", 40)


def test_prompt_plus_max_tokens_over_context_is_rejected():
    controller, _ = make_controller(MockEngine(vocab_size=257, eos_id=256, max_context=64))
    sink = RecordingSink()
    controller.handle(inputs(text="x" * 40, max_tokens=30), sink)
    assert sink.errors and sink.errors[0][1].startswith("max_tokens")


def test_stop_words_cut_the_text():
    controller, engine = make_controller(AsciiEngine(vocab_size=257, eos_id=256, max_context=1024))
    full = expected_text(engine, "hello world", 40)
    stop = full[12:15]
    sink = RecordingSink()
    controller.handle(inputs(stop_words=np.array([[stop.encode()]], dtype=object), stream=np.array([[True]])), sink)
    assert sink.text == full[: full.index(stop)]
    assert sink.sent[-1][1]["finish_reason"] == "stop"


def _one_slot_busy(**defaults):
    """A controller with one sequence slot, held by a request that decodes until ``gate`` is set."""
    gate, armed = threading.Event(), threading.Event()

    class GatedEngine(MockEngine):
        def verify(self, requests):
            if armed.is_set():  # the warm-up's steps pass: the gate holds the test's request only
                gate.wait(5)
            return super().verify(requests)

    controller, engine = make_controller(GatedEngine(vocab_size=257, eos_id=256), max_concurrent_sequences=1, **defaults)
    controller.prepare()  # its warm-up decodes before the gate is armed
    armed.set()
    first = RecordingSink()
    worker = threading.Thread(target=controller.handle, args=(inputs(max_tokens=3), first))
    worker.start()
    while controller.active_sequences == 0:
        pass
    return controller, engine, gate, first, worker


def test_without_a_queue_a_request_beyond_the_slots_is_refused_with_a_retry_after():
    from banditspec.errors import parse_retry_after

    controller, _, gate, first, worker = _one_slot_busy(max_queue_size=0)
    second = RecordingSink()
    controller.handle(inputs(), second)
    gate.set()
    worker.join()
    ((kind, message),) = second.errors
    assert kind == "unavailable" and message.startswith("server busy") and parse_retry_after(message) >= 1
    assert first.sent and first.sent[-1][2]


def test_a_request_beyond_the_slots_waits_its_turn_and_is_served():
    controller, engine, gate, first, worker = _one_slot_busy(max_queue_size=4)
    second = RecordingSink()
    waiting = threading.Thread(target=controller.handle, args=(inputs(max_tokens=5), second))
    waiting.start()
    while controller.admission.snapshot().queued == 0:
        pass
    gate.set()
    worker.join()
    waiting.join(30)
    assert not second.errors and second.text == expected_text(engine, "hello world", 5)
    assert controller.admission.snapshot().active == 0 and controller.active_sequences == 0


def test_an_expired_wait_is_refused_with_a_retry_after_and_the_request_counted_busy():
    from banditspec.errors import parse_retry_after

    controller, _, gate, _, worker = _one_slot_busy(max_queue_size=4, max_queue_wait_s=0.2)
    outcomes, waits = [], []
    controller.on_request_done = lambda outcome, stats: outcomes.append(outcome)
    controller.on_queue_wait = lambda seconds, result: waits.append((result, seconds))
    second = RecordingSink()
    controller.handle(inputs(), second)
    gate.set()
    worker.join()
    ((kind, message),) = second.errors
    assert kind == "unavailable" and "max_queue_wait_s" in message and parse_retry_after(message) >= 1
    assert outcomes[0] == "busy" and waits[0][0] == "expired" and waits[0][1] >= 0.2


def test_a_request_cancelled_while_waiting_leaves_without_decoding():
    controller, engine, gate, _, worker = _one_slot_busy(max_queue_size=4)
    outcomes = []
    controller.on_request_done = lambda outcome, stats: outcomes.append(outcome)
    leaving = RecordingSink(cancel_after=0)  # its client went away
    calls = engine.calls
    controller.handle(inputs(), leaving)
    assert not leaving.sent and not leaving.errors and outcomes == ["cancelled"]
    assert controller.admission.snapshot().queued == 0
    gate.set()
    worker.join()
    assert engine.calls > calls  # only the first request's steps
    assert controller.admission.snapshot().active == 0


def test_prepare_calibrates_and_warms_up_once_and_says_ready():
    engine = MockEngine(vocab_size=257, eos_id=256, max_context=1024)
    decoder = SpeculativeDecoder.for_engine(engine, {"right": ScriptedDrafter("right", oracle(engine, length_cap=3))})
    calibrations = []
    controller = Controller(decoder, engine, ByteTokenizer(), ServingDefaults(),
                            calibrate=lambda: calibrations.append(engine.calls))
    told = []
    controller.on_ready = lambda: told.append(True)
    assert not controller.ready.is_set()
    controller.prepare()
    assert controller.ready.is_set() and told == [True] and calibrations == [0]
    warm_up_calls = engine.calls
    assert warm_up_calls > 0  # the warm-up requests decoded through the target
    sink = RecordingSink()
    controller.handle(inputs(max_tokens=10), sink)
    controller.prepare()
    assert calibrations == [0] and told == [True]
    assert not sink.errors and sink.text == expected_text(engine, "hello world", 10)


def test_engine_failure_is_a_clear_error_not_a_hang():
    from banditspec.errors import EngineError

    def broken(model, tensors, outputs):
        raise EngineError("target: model is not ready")

    engine = TensorEngine(broken, vocab_size=257, max_context=1024, eos_id=256)
    controller, _ = make_controller(engine)
    sink = RecordingSink()
    controller.handle(inputs(), sink)
    assert sink.errors == [("unavailable", "target engine failed: target: model is not ready")]


def test_tensor_engine_round_trip_through_the_codec():
    """Controller -> tensors -> (reference target's decode) -> mock -> tensors -> controller."""
    mock = MockEngine(vocab_size=257, eos_id=256, max_context=1024)
    seen = []

    def infer(model, tensors, outputs):
        seen.append(sorted(tensors))
        (result,) = mock.verify([decode_request({k: v for k, v in tensors.items()})])
        return {k: v for k, v in encode_result(result).items() if k in outputs}

    engine = TensorEngine(infer, vocab_size=257, max_context=1024, eos_id=256)
    controller, _ = make_controller(engine, oracle_source=mock)
    sink = RecordingSink()
    controller.handle(inputs(policy=np.array([[b"ucbspec"]], dtype=object)), sink)
    assert sink.text == expected_text(mock, "hello world", 40)
    assert any("draft_input_ids" in names for names in seen)


@pytest.mark.parametrize("case", ["success", "invalid", "engine_error"])
def test_bookkeeping_is_done_before_the_final_response(case):
    """A client that reads metrics or sends its next request right after its final response
    must find this request already counted and its slot free."""
    controller, engine = make_controller(max_concurrent_sequences=1)
    seen: list[str] = []
    controller.on_request_done = lambda outcome, stats: seen.append(f"done:{outcome}")
    controller.on_active = lambda active: seen.append(f"active:{active}")

    class OrderSink(RecordingSink):
        def send(self, text, stats, final):
            super().send(text, stats, final)
            if final:
                seen.append("final")

        def fail(self, kind, message):
            super().fail(kind, message)
            seen.append("final")

    if case == "engine_error":
        def broken(*args, **kwargs):
            raise RuntimeError("target down")
        engine.verify = broken
    request = inputs(max_tokens=-1) if case == "invalid" else inputs(max_tokens=8)
    controller.handle(request, OrderSink())
    assert seen[-1] == "final" and seen.count("final") == 1
    assert any(s.startswith("done:") for s in seen[:-1])
    if case != "invalid":
        assert "active:0" in seen[:-1]


def test_the_published_active_count_ends_at_zero_under_concurrent_requests():
    """The on_active hook sees the counts in the order they happened: after many concurrent
    requests the last value published is 0 (an older count must not overwrite it)."""
    import time

    controller, _ = make_controller(max_concurrent_sequences=64)
    published: list[int] = []

    def slow_hook(active):  # widens the window between counting and publishing
        time.sleep(0.001)
        published.append(active)

    controller.on_active = slow_hook
    threads = [threading.Thread(target=controller.handle, args=(inputs(max_tokens=4), RecordingSink())) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert controller.active_sequences == 0
    assert published[-1] == 0 and len(published) == 64


def test_the_cost_model_is_calibrated_once_before_the_first_request_decodes():
    """Through Triton the controller's verify-cost curve used to start from a prior slope and
    learn only from the draft lengths it chose (short ones, because of that slope): the
    serving controller now times the target once, before the first request decodes."""
    from banditspec.serving.runtime import calibrate_cost_model

    engine = MockEngine(vocab_size=257, eos_id=256, max_context=1024)
    decoder = SpeculativeDecoder.for_engine(engine, {"right": ScriptedDrafter("right", oracle(engine, length_cap=3))})
    order = []

    def calibrate():
        order.append(("calibrate", engine.calls))
        calibrate_cost_model(decoder, engine, max_tokens=5, reps=3, contexts=(16, 200))

    controller = Controller(decoder, engine, ByteTokenizer(), ServingDefaults(), calibrate=calibrate)
    assert not decoder.cost_model.calibrated
    for _ in range(2):
        sink = RecordingSink()
        controller.handle(inputs(max_tokens=10), sink)
        assert not sink.errors and sink.text == expected_text(engine, "hello world", 10)
    assert order == [("calibrate", 0)]  # once, before any decoding call
    assert decoder.cost_model.calibrated and min(decoder.cost_model.as_dict()["observations"][:5]) >= 3

    def broken():
        raise RuntimeError("target unreachable")

    failing = Controller(decoder, engine, ByteTokenizer(), ServingDefaults(), calibrate=broken)
    sink = RecordingSink()
    failing.handle(inputs(max_tokens=10), sink)  # a failed calibration does not fail the request
    assert not sink.errors and sink.text == expected_text(engine, "hello world", 10)


class SlowEngine(MockEngine):
    """A target whose every call takes 2 ms, so that timestamps of different steps differ."""

    def verify(self, requests):
        import time

        time.sleep(0.002)
        return super().verify(requests)


def test_timing_reports_when_the_first_and_the_last_token_came():
    """timing_ns in the final response's stats: arrival <= first scheduled <= first token <
    last token when the request took several steps; with no token at all (EOS at once) the
    first token time is the last one (never 0)."""
    controller, _ = make_controller(SlowEngine(vocab_size=257, eos_id=256, max_context=1024))
    sink = RecordingSink()
    controller.handle(inputs(max_tokens=6, policy=np.array([[b"vanilla"]], dtype=object)), sink)
    timing = sink.sent[-1][1]["timing_ns"]
    assert timing["arrival"] <= timing["first_scheduled"] <= timing["first_token"]
    assert timing["last_token"] - timing["first_token"] >= 5 * 2_000_000  # 5 more steps of >= 2 ms
    controller, _ = make_controller(SlowEngine(vocab_size=257, eos_id=256, max_context=1024, eos_after=0))
    sink = RecordingSink()
    controller.handle(inputs(max_tokens=6), sink)
    stats = sink.sent[-1][1]
    assert stats["finish_reason"] == "eos" and sink.text == ""
    assert 0 < stats["timing_ns"]["first_scheduled"] <= stats["timing_ns"]["first_token"] == stats["timing_ns"]["last_token"]
