"""Fault-injection drafters and the per-step drafter deadline, in process (mock target)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from banditspec.config import DEFAULT_MAX_DRAFT_LEN as L
from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.drafting import RequestDrafters
from banditspec.decoding.session import run_to_completion
from banditspec.drafters.base import Draft, DrafterTraits, Preview
from banditspec.drafters.deadline import ProposeTimeout, ProposeWorker
from banditspec.drafters.registry import build_drafters
from banditspec.errors import BanditSpecValidationError

from tests import fault_drafters
from tests.fault_drafters import (
    FAULTY_DRAFTER_NAMES,
    HangingDrafter,
    InjectedFault,
    RaisingDrafter,
    make_faulty_drafter,
)
from tests.mock_engine import MockEngine
from tests.unit.test_decoding import ScriptedDrafter, oracle

PROMPT = [3, 5, 7, 11]


def decoder_with(engine, faulty, deadline_s):
    drafters = {"right": ScriptedDrafter("right", oracle(engine, length_cap=2)), faulty.name: faulty}
    return SpeculativeDecoder.for_engine(engine, drafters, drafter_deadline_s=deadline_s)


@pytest.mark.parametrize("policy", ["ucbspec", "exp3spec", "uniform"])
def test_a_raising_drafter_is_dropped_and_the_output_is_lossless(policy):
    engine = MockEngine()
    faulty = RaisingDrafter(fail_after=2)
    decoder = decoder_with(engine, faulty, deadline_s=1.0)
    request = GenerationRequest(PROMPT, 40, policy=policy, arms=["fault_raise", "right"], seed=3)
    result = run_to_completion(engine, decoder.start(request))
    assert result.token_ids == engine.vanilla(PROMPT, 40)
    assert result.stats.dropped_arms == {f"fault_raise@{L}": "propose failed: InjectedFault"}
    assert faulty.faults_raised == 1  # dropped at its first fault, never asked again
    assert result.stats.arms.count(f"fault_raise@{L}") == faulty.fail_after  # its two good (empty) drafts


def test_a_hanging_drafter_costs_one_deadline_then_its_arm():
    engine = MockEngine()
    faulty = HangingDrafter(max_hang_s=20)
    decoder = decoder_with(engine, faulty, deadline_s=0.05)
    request = GenerationRequest(PROMPT, 30, policy="ucbspec", arms=["fault_hang", "right"])
    started = time.perf_counter()
    result = run_to_completion(engine, decoder.start(request))
    elapsed = time.perf_counter() - started
    assert result.token_ids == engine.vanilla(PROMPT, 30)
    assert result.stats.dropped_arms == {f"fault_hang@{L}": "deadline exceeded"}
    assert faulty.hangs_started == 1
    assert elapsed < faulty.max_hang_s / 2, "the step waited for the hung proposal instead of its deadline"
    # dropping the arm closed its session, which releases the stuck proposal thread
    deadline = time.monotonic() + 5
    while faulty.hanging and time.monotonic() < deadline:
        time.sleep(0.01)
    assert faulty.hanging == 0


def test_a_fixed_policy_on_a_hanging_arm_falls_back_to_plain_decoding():
    engine = MockEngine()
    decoder = decoder_with(engine, HangingDrafter(max_hang_s=20), deadline_s=0.05)
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 12, policy="fixed:fault_hang")))
    assert result.token_ids == engine.vanilla(PROMPT, 12)
    assert set(result.stats.arms) == {"vanilla"} and result.stats.steps == 12


def test_concurrent_requests_with_hanging_drafters_all_finish():
    engine = MockEngine()
    faulty = HangingDrafter(max_hang_s=20)
    decoder = decoder_with(engine, faulty, deadline_s=0.05)
    results = {}

    def run(i):
        request = GenerationRequest(PROMPT + [i], 20, policy="ucbspec", arms=["fault_hang", "right"])
        results[i] = run_to_completion(engine, decoder.start(request)).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(results[i] == engine.vanilla(PROMPT + [i], 20) for i in range(6))
    assert faulty.hangs_started == 6


def test_without_a_deadline_proposals_run_inline():
    engine = MockEngine()
    seen = []
    drafters = {"right": ScriptedDrafter("right", lambda ctx, n: seen.append(threading.current_thread()) or [])}
    decoder = SpeculativeDecoder.for_engine(engine, drafters, drafter_deadline_s=None)
    run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 5, policy="fixed:right")))
    assert seen and all(t is threading.current_thread() for t in seen)
    with pytest.raises(BanditSpecValidationError, match="^drafter_deadline_s"):
        SpeculativeDecoder.for_engine(engine, drafters, drafter_deadline_s=0)


def test_propose_worker_returns_raises_and_times_out():
    worker = ProposeWorker()
    try:
        assert worker.call(lambda x: x * 2, 21, timeout=1.0) == 42
        with pytest.raises(KeyError):
            worker.call(lambda x: {}[x], "missing", timeout=1.0)
    finally:
        worker.stop()
    release = threading.Event()
    stuck = ProposeWorker()
    with pytest.raises(ProposeTimeout):
        stuck.call(lambda _: release.wait(10), None, timeout=0.02)
    release.set()
    stuck._thread.join(5)
    assert not stuck._thread.is_alive(), "an abandoned worker exits once its call returns"


def test_faulty_drafters_are_built_only_by_name_and_validate_arguments():
    built = build_drafters(list(FAULTY_DRAFTER_NAMES), tokenizer=None, plugin=Path(fault_drafters.__file__))
    assert isinstance(built["fault_raise"], RaisingDrafter) and isinstance(built["fault_hang"], HangingDrafter)
    with pytest.raises(BanditSpecValidationError, match="^drafters"):
        make_faulty_drafter("fault_segfault")
    with pytest.raises(BanditSpecValidationError, match="^fail_after"):
        RaisingDrafter(fail_after=-1)
    with pytest.raises(BanditSpecValidationError, match="^max_hang_s"):
        HangingDrafter(max_hang_s=0)
    session = RaisingDrafter().start([1, 2])
    with pytest.raises(InjectedFault):
        session.propose(4)


def test_a_request_cannot_name_a_fault_drafter_the_deployment_did_not_build():
    engine = MockEngine()
    decoder = SpeculativeDecoder.for_engine(engine, {"right": ScriptedDrafter("right", oracle(engine))})
    with pytest.raises(BanditSpecValidationError, match="^arms: unknown arm 'fault_hang'"):
        decoder.start(GenerationRequest(PROMPT, 5, arms=["fault_hang"]))


# ---------------------------------------------------------------- RequestDrafters directly


class Session:
    def __init__(self, ids, fail_in=None):
        self.ids, self.fail_in, self.closed = ids, fail_in, None

    def propose(self, max_len):
        if self.fail_in == "propose":
            raise InjectedFault("propose")
        return Draft(token_ids=np.asarray(self.ids, dtype=np.int32))

    def observe(self, tokens, hidden_states=None):
        pass

    def preview(self):
        if self.fail_in == "preview":
            raise InjectedFault("preview")
        return Preview(int(self.ids[0]), 0.9) if len(self.ids) else None

    def close(self, finished):
        self.closed = finished
        if self.fail_in == "close":
            raise InjectedFault("close")


class Fixed:
    """A drafter whose sessions propose ``ids``; ``fail_in``: start | propose | close raises."""

    traits = DrafterTraits()

    def __init__(self, ids, fail_in=None):
        self.ids, self.fail_in, self.sessions = ids, fail_in, []

    def start(self, prompt):
        if self.fail_in == "start":
            raise InjectedFault("start")
        self.sessions.append(Session(self.ids, self.fail_in))
        return self.sessions[-1]


def request_drafters(drafters):
    dropped = {}
    rd = RequestDrafters(drafters, list(drafters), [1, 2, 3], vocab_size=50, deadline_s=None,
                         on_drop=lambda name, reason: dropped.setdefault(name, reason))
    return rd, dropped


@pytest.mark.parametrize("ids, valid", [([0, 49], True), ([7], True), ([-1, 3], False), ([50], False),
                                        ([3, 51], False), ([-5, 60], False)])
def test_a_draft_with_an_id_outside_the_vocabulary_drops_its_drafter(ids, valid):
    """Vocabulary 50: ids 0..49 are drafts; anything else would reach the target as garbage."""
    rd, dropped = request_drafters({"d": Fixed(ids)})
    draft = rd.propose("d", 4)
    if valid:
        assert draft.token_ids.tolist() == ids and dropped == {} and rd.names() == ["d"]
    else:
        assert draft is None and dropped == {"d": "propose failed: ValueError"} and rd.names() == []


class Typed:
    """A drafter whose sessions propose ``ids`` exactly as given (any container, any dtype)."""

    traits = DrafterTraits()

    def __init__(self, ids):
        self.ids = ids

    def start(self, prompt):
        session = Session([])
        session.propose = lambda max_len: Draft(token_ids=self.ids)
        return session


@pytest.mark.parametrize("ids, expected", [
    (np.array([4, 9, 2], dtype=np.int32), [4, 9]),  # the drafters' own form: sliced
    (np.array([4, 9, 2], dtype=np.int64), [4, 9]),
    ([4, 9, 2], [4, 9]),
    (np.array([[4, 9]], dtype=np.int32), [4, 9]),  # any shape: flattened
    (np.array([4, 2**32 + 7], dtype=np.int64), None),  # out of range before any narrowing to int32
    (np.array([2**32 + 7], dtype=np.int64), None),
    (np.array([-1], dtype=np.int32), None),
])
def test_a_drafts_ids_reach_the_target_as_int32_checked_in_their_own_width(ids, expected):
    rd, dropped = request_drafters({"d": Typed(ids)})
    draft = rd.propose("d", 2)
    if expected is None:
        assert draft is None and dropped == {"d": "propose failed: ValueError"}
    else:
        assert draft.token_ids.dtype == np.int32 and draft.token_ids.tolist() == expected and dropped == {}


def test_a_drafter_whose_start_raises_costs_its_arms_not_the_request():
    rd, dropped = request_drafters({"bad": Fixed([1], fail_in="start"), "good": Fixed([4])})
    assert dropped == {"bad": "start failed: InjectedFault"} and rd.names() == ["good"]
    assert rd.propose("good", 4).token_ids.tolist() == [4]


def test_a_drafter_whose_close_raises_does_not_fail_the_end_of_a_request():
    bad, good = Fixed([1], fail_in="close"), Fixed([4])
    rd, dropped = request_drafters({"bad": bad, "good": good})
    rd.close(finished=True)  # must not raise
    assert bad.sessions[0].closed is True and good.sessions[0].closed is True and rd.names() == []
    engine = MockEngine()
    decoder = SpeculativeDecoder.for_engine(engine, {"right": ScriptedDrafter("right", oracle(engine)), "bad": bad})
    request = GenerationRequest(PROMPT, 12, policy="ucbspec", arms=["right", "bad"])
    assert run_to_completion(engine, decoder.start(request)).token_ids == engine.vanilla(PROMPT, 12)


@pytest.mark.parametrize("ids, fail_in, outcome", [([7, 8], None, "ok"), ([60], None, "ValueError"),
                                                  ([7], "preview", "InjectedFault")])
def test_a_preview_that_fails_or_names_an_id_outside_the_vocabulary_drops_its_drafter(ids, fail_in, outcome):
    """A preview is checked as a proposal is: a raise or an id outside the vocabulary (50 here)
    costs the drafter its arms for the rest of the request, never the request."""
    rd, dropped = request_drafters({"d": Fixed(ids, fail_in)})
    assert rd.previews("d")
    preview = rd.preview("d")
    if outcome == "ok":
        assert preview == Preview(7, 0.9) and dropped == {}
    else:
        assert preview is None and dropped == {"d": f"preview failed: {outcome}"} and rd.names() == []
        assert rd.preview("d") is None and not rd.previews("d")
