"""Non-parametric drafters: exact proposals on hand-made sequences, brute-force references,
incremental == rebuild, max_len, the global trie's eviction bound and thread safety, the registry."""

from __future__ import annotations

import math
import random
import threading
from collections import Counter

import numpy as np
import pytest
from banditspec.drafters.base import validated_max_len, validated_tokens
from banditspec.drafters.copy_pointer import CopyPointerDrafter
from banditspec.drafters.pld import PromptLookupDrafter
from banditspec.drafters.registry import DRAFTER_NAMES, make_drafter
from banditspec.drafters.rest import RestDrafter
from banditspec.drafters.rest_datastore import write_datastore
from banditspec.drafters.suffix_tree import SuffixTreeDrafter, SuffixTrie
from banditspec.errors import BanditSpecValidationError


def proposal(session, max_len: int) -> list[int]:
    draft = session.propose(max_len)
    assert draft.token_ids.dtype == np.int32 and draft.token_ids.ndim == 1
    assert draft.probs is None
    assert len(draft) <= max_len
    return draft.token_ids.tolist()


def random_sequence(rng: random.Random, length: int, alphabet: int) -> list[int]:
    return [rng.randrange(alphabet) for _ in range(length)]


# ------------------------------------------------------------------------- PLD


def pld_reference(context: list[int], max_len: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The spec, by brute force: longest suffix n-gram with an earlier occurrence, most recent one."""
    for n in range(min(max_ngram, len(context)), min_ngram - 1, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == suffix:
                return context[start + n : start + n + max_len]
    return []


@pytest.mark.parametrize(
    "context, max_len, expected",
    [
        ([1, 2, 3, 4, 5, 1, 2], 3, [3, 4, 5]),  # bigram (1, 2) seen at the start
        ([1, 2, 9, 1, 2, 8, 1, 2], 2, [8, 1]),  # the most recent occurrence wins
        ([3, 1, 2, 5, 9, 1, 2, 6, 3, 1, 2], 3, [5, 9, 1]),  # the trigram beats a more recent bigram
        ([4, 5, 6, 4], 8, [5, 6, 4]),  # unigram; the continuation stops at the context end
        ([7, 7, 7], 4, [7]),  # overlapping occurrence
        ([1, 2, 3], 4, []),  # nothing repeats
    ],
)
def test_pld_exact_proposals(context, max_len, expected):
    assert proposal(PromptLookupDrafter().start(context), max_len) == expected


def test_pld_max_len_zero_and_validation():
    session = PromptLookupDrafter().start([1, 2, 1])
    assert proposal(session, 0) == []
    with pytest.raises(BanditSpecValidationError) as err:
        session.propose(-1)
    assert err.value.field == "max_len"
    with pytest.raises(BanditSpecValidationError):
        session.observe([3, -4])
    with pytest.raises(BanditSpecValidationError) as err:
        PromptLookupDrafter(max_ngram=0)
    assert err.value.field == "max_ngram"
    with pytest.raises(BanditSpecValidationError) as err:
        PromptLookupDrafter().start([[1, 2]])
    assert err.value.field == "prompt_ids"


@pytest.mark.parametrize("values, ok", [
    ([3, 0, 2**31 - 1], True), (np.array([3, 0], dtype=np.int64), True), ((3, 4), True), ([], True),
    ([3, -4], False), ([2**31], False), ([1.0, 2], False), ([[1, 2]], False),
    (np.array([0.5]), False),
])
def test_validated_tokens_takes_ints_in_range_in_any_sequence_and_names_the_field(values, ok):
    """A list of Python ints (every step's tokens) is checked without numpy; anything else
    goes through numpy's checks; both give the same answer and a new list of ints."""
    if ok:
        out = validated_tokens(values, "new_tokens")
        assert out == [int(v) for v in values] and all(type(v) is int for v in out)
        assert out is not values
    else:
        with pytest.raises(BanditSpecValidationError) as err:
            validated_tokens(values, "new_tokens")
        assert err.value.field == "new_tokens"


@pytest.mark.parametrize("value, ok", [(0, True), (7, True), (np.int64(3), True), (-1, False), (True, False), (2.0, False)])
def test_validated_max_len(value, ok):
    if ok:
        assert validated_max_len(value) == int(value) and type(validated_max_len(value)) is int
    else:
        with pytest.raises(BanditSpecValidationError):
            validated_max_len(value)


def test_pld_matches_reference_and_rebuild_step_by_step():
    rng = random.Random(0)
    for trial in range(40):
        tokens = random_sequence(rng, 60, alphabet=rng.choice([2, 3, 5]))
        prompt_len = rng.randrange(0, 20)
        drafter = PromptLookupDrafter(max_ngram=rng.choice([1, 2, 3, 4]))
        session = drafter.start(tokens[:prompt_len])
        pos = prompt_len
        while pos < len(tokens):
            step = rng.randrange(1, 5)
            session.observe(tokens[pos : pos + step])
            pos = min(len(tokens), pos + step)
            max_len = rng.randrange(0, 7)
            got = proposal(session, max_len)
            assert got == pld_reference(tokens[:pos], max_len, drafter.max_ngram), (trial, pos)
            assert got == proposal(drafter.start(tokens[:pos]), max_len)


# ------------------------------------------------------------------------- suffix trie


def substring_counts(sequences: list[list[int]], max_depth: int) -> Counter:
    counts: Counter = Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for j in range(i + 1, min(len(seq), i + max_depth) + 1):
                counts[tuple(seq[i:j])] += 1
    return counts


def test_trie_counts_match_brute_force_through_inserts_and_removals():
    rng = random.Random(1)
    for trial in range(150):
        depth = rng.randint(2, 7)
        seqs = [random_sequence(rng, rng.randint(0, 30), rng.choice([2, 3, 4])) for _ in range(rng.randint(1, 4))]
        trie = SuffixTrie(depth)
        ids = [trie.insert(tuple(s)) for s in seqs]
        drop = rng.randrange(len(seqs))
        trie.remove(ids[drop])
        kept = seqs[:drop] + seqs[drop + 1 :]
        expected = substring_counts(kept, depth)
        for pattern in substring_counts(seqs, depth):
            assert trie.count(pattern) == expected.get(pattern, 0), (trial, pattern)


def reference_walk(seqs: list[list[int]], pattern: tuple, limit: int, depth: int, min_share: float):
    """Greedy most-frequent continuation of ``pattern`` by brute-force counting: (tokens, score)."""
    counts = substring_counts(seqs, depth)
    tokens: list[int] = []
    score, prob = 0.0, 1.0
    s = pattern
    while len(tokens) < limit:
        if counts[s] == 1:  # a single occurrence: follow it
            seq, start = next((q, i) for q in seqs for i in range(len(q)) if tuple(q[i : i + len(s)]) == s)
            rest = seq[start + len(s) : start + len(s) + limit - len(tokens)]
            tokens += rest
            score += prob * len(rest)
            break
        if len(s) >= depth:
            break
        children = {c[-1]: n for c, n in counts.items() if len(c) == len(s) + 1 and c[:-1] == s}
        if not children:
            break
        token = min(children, key=lambda t: (-children[t], t))
        share = children[token] / sum(children.values())
        if share < min_share:
            break
        prob *= share
        score += prob
        tokens.append(token)
        s = s + (token,)
    return tokens, score


def reference_match(seqs: list[list[int]], context: list[int], max_match: int) -> int:
    """Longest suffix of ``context`` (<= max_match) with an occurrence followed by a token."""
    for m in range(min(max_match, len(context)), 0, -1):
        s = context[-m:]
        if any(q[i : i + m] == s for q in seqs for i in range(len(q) - m)):
            return m
    return 0


def suffix_reference(context, outputs, max_len, depth, alpha, min_share) -> list[int]:
    max_match = depth - min(max_len, depth - 1)
    best: tuple[list[int], float] = ([], 0.0)
    for i, seqs in enumerate(([context], outputs)):
        m = reference_match(seqs, context, max_match)
        if m:
            walk = reference_walk(seqs, tuple(context[-m:]), min(max_len, math.ceil(alpha * m)), depth, min_share)
            if i == 0 or walk[1] > best[1]:
                best = walk
    return best[0]


def test_suffix_exact_proposals_per_request():
    context = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 9, 1, 2, 3]
    # "1 2 3" seen 3x before: 4 (2x) then 5; "1 2 3 4" -> 1 or 9 (tie: smaller id); then a single occurrence
    assert proposal(SuffixTreeDrafter().start(context), 6) == [4, 1, 2, 3, 5, 1]
    assert proposal(SuffixTreeDrafter(min_share=0.6).start(context), 6) == [4]  # share 1/2 < 0.6 stops
    assert proposal(SuffixTreeDrafter(alpha=1.0).start(context), 8) == [4, 1, 2]  # ceil(1 * 3) tokens
    assert proposal(SuffixTreeDrafter().start(context), 0) == []
    assert proposal(SuffixTreeDrafter().start([5, 6, 7]), 4) == []


def test_suffix_global_tree_learns_finished_outputs_only():
    drafter = SuffixTreeDrafter()
    first = drafter.start([100, 101])
    first.observe([1, 2, 3])
    first.observe([4, 5])
    first.close(finished=True)
    cancelled = drafter.start([100])
    cancelled.observe([6, 7, 8])
    cancelled.close(finished=False)
    assert drafter.global_tokens == 5
    assert drafter.global_count([1, 2, 3, 4, 5]) == 1
    assert drafter.global_count([100]) == 0  # prompts are not learned
    assert drafter.global_count([6]) == 0  # cancelled requests are not learned
    # no local repeat: the global tree continues "1 2" with its past output (up to ceil(2 * 2) tokens)
    assert proposal(drafter.start([7, 1, 2]), 8) == [3, 4, 5]
    assert proposal(drafter.start([7, 1, 2]), 2) == [3, 4]


def test_suffix_matches_brute_force_reference():
    rng = random.Random(2)
    for trial in range(80):
        depth, alpha, min_share = rng.randint(3, 8), rng.choice([1.0, 1.5, 2.0]), rng.choice([0.0, 0.3, 0.6])
        alphabet = rng.choice([2, 3, 4])
        budget = rng.choice([12, 30, 1000])  # small budgets evict (stale best children are recomputed)
        drafter = SuffixTreeDrafter(max_depth=depth, alpha=alpha, min_share=min_share, max_global_tokens=budget)
        for _ in range(rng.randint(0, 6)):
            drafter.add_output(random_sequence(rng, rng.randint(1, 12), alphabet))
        outputs = [list(seq) for seq in drafter.global_outputs()]
        tokens = random_sequence(rng, 40, alphabet)
        session = drafter.start(tokens[:5])
        for pos in range(5, len(tokens), 3):
            session.observe(tokens[pos : pos + 3])
            context = tokens[: pos + 3]
            max_len = rng.randint(1, 6)
            expected = suffix_reference(context, outputs, max_len, depth, alpha, min_share)
            assert proposal(session, max_len) == expected, (trial, pos)


def test_suffix_incremental_equals_rebuild():
    rng = random.Random(3)
    tokens = random_sequence(rng, 300, alphabet=6)
    drafter = SuffixTreeDrafter(max_depth=12)
    session = drafter.start(tokens[:50])
    pos = 50
    while pos < len(tokens):
        step = rng.randint(1, 9)
        session.observe(tokens[pos : pos + step])
        pos = min(len(tokens), pos + step)
        rebuilt = drafter.start(tokens[:pos])
        for max_len in (1, 4, 8):
            assert proposal(session, max_len) == proposal(rebuilt, max_len)
    rebuilt = drafter.start(tokens)
    for pattern in substring_counts([tokens], 12):
        assert session.trie.count(pattern) == rebuilt.trie.count(pattern)
    assert session.trie.num_nodes == rebuilt.trie.num_nodes


def test_suffix_global_eviction_keeps_the_token_budget():
    rng = random.Random(4)
    drafter = SuffixTreeDrafter(max_depth=6, max_global_tokens=25)
    outputs = [random_sequence(rng, rng.randint(1, 12), 4) for _ in range(30)]
    for out in outputs:
        drafter.add_output(out)
        assert drafter.global_tokens <= 25
    kept: list[list[int]] = []
    for out in reversed(outputs):  # the newest outputs that fit
        if sum(map(len, kept)) + len(out) > 25:
            break
        kept.insert(0, out)
    assert drafter.global_tokens == sum(map(len, kept))
    expected = substring_counts(kept, 6)
    for pattern in substring_counts(outputs, 6):
        assert drafter.global_count(pattern) == expected.get(pattern, 0)
    # freed nodes do not linger: at most one node per distinct substring held (+ the root)
    assert drafter.global_nodes <= len(expected) + 1
    drafter.add_output(list(range(100)))  # longer than the budget: its last 25 tokens
    assert drafter.global_tokens == 25 and drafter.global_count([75]) == 1 and drafter.global_count([74]) == 0


def test_suffix_global_most_frequent_child_after_eviction():
    drafter = SuffixTreeDrafter(max_global_tokens=12)
    drafter.add_output([1, 5, 1, 5, 1, 5])
    drafter.add_output([1, 6, 1, 6, 1, 5])
    assert proposal(drafter.start([8, 1]), 1) == [5]  # "1 5" x4 beats "1 6" x2
    drafter.add_output([9])  # evicts the first output
    assert drafter.global_count([1, 5]) == 1 and drafter.global_count([1, 6]) == 2
    assert proposal(drafter.start([8, 1]), 2) == [6, 1]


def test_suffix_concurrent_sessions_smoke():
    drafter = SuffixTreeDrafter(max_depth=8, max_global_tokens=400)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(15):
                session = drafter.start(random_sequence(rng, 20, 5))
                for _ in range(10):
                    draft = session.propose(rng.randint(0, 6))
                    session.observe(draft.token_ids.tolist()[:2] + [rng.randrange(5)])
                session.close(finished=rng.random() < 0.8)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 0 < drafter.global_tokens <= 400
    outputs = [list(seq) for seq in drafter.global_outputs()]
    assert sum(map(len, outputs)) == drafter.global_tokens
    for pattern, n in list(substring_counts(outputs, 8).items())[:500]:
        assert drafter.global_count(pattern) == n


def test_suffix_validation():
    for kwargs, field in [({"max_depth": 1}, "max_depth"), ({"alpha": 0}, "alpha"), ({"min_share": 1.5}, "min_share"), ({"max_global_tokens": -1}, "max_global_tokens")]:
        with pytest.raises(BanditSpecValidationError) as err:
            SuffixTreeDrafter(**kwargs)
        assert err.value.field == field
    with pytest.raises(BanditSpecValidationError):
        SuffixTreeDrafter().start([1, 2]).propose(-3)


# ------------------------------------------------------------------------- REST


@pytest.fixture
def small_store(tmp_path):
    docs = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 5], [9, 2, 3, 7], [8, 1, 2, 3, 4, 5, 0]]
    return write_datastore(tmp_path / "store", docs)


@pytest.mark.parametrize(
    "context, max_len, min_share, expected",
    [
        ([1, 2, 3], 10, 0.0, [4, 5, 0]),  # 4 (4x), then 5 (3x) over 6, then the only continuation
        ([1, 2, 3], 10, 0.5, [4, 5]),  # after 5: one of 3 matches continues (2 documents end)
        ([1, 2, 3], 2, 0.0, [4, 5]),
        ([9, 2, 3], 10, 0.0, [7]),  # the longest suffix decides: "9 2 3" occurs once
        ([5, 2, 3], 10, 0.0, [4, 5, 0]),  # "5 2 3" is absent, "2 3" occurs 5x
        ([7, 3], 4, 0.0, []),  # "7 3" absent and single tokens are below min_suffix
        ([1, 2, 3], 0, 0.0, []),
    ],
)
def test_rest_exact_proposals(small_store, context, max_len, min_share, expected):
    drafter = RestDrafter(small_store, min_share=min_share)
    assert proposal(drafter.start(context), max_len) == expected


def test_rest_keeps_only_the_context_tail(small_store):
    drafter = RestDrafter(small_store, max_suffix=3)
    session = drafter.start([9] * 1000)
    session.observe([2])
    session.observe([3])
    assert proposal(session, 5) == [7]


def test_rest_sampled_matches_keep_the_majority(tmp_path):
    docs = [[1, 2, 5, 5] if i % 10 < 7 else [1, 2, 6, 6] for i in range(200)]
    drafter = RestDrafter(write_datastore(tmp_path / "s", docs), max_matches=9)
    assert proposal(drafter.start([1, 2]), 4) == [5, 5]


def rest_reference(docs: list[list[int]], context: list[int], max_len: int, max_suffix: int, min_suffix: int, min_share: float) -> list[int]:
    for m in range(min(max_suffix, len(context)), min_suffix - 1, -1):
        s = context[-m:]
        follows = [(d, i + m) for d in docs for i in range(len(d) - m + 1) if d[i : i + m] == s]
        if not follows:
            continue
        out: list[int] = []
        while len(out) < max_len and follows:
            nexts = Counter(d[p] for d, p in follows if p < len(d))
            if not nexts:
                break
            token = min(nexts, key=lambda t: (-nexts[t], t))
            if nexts[token] < min_share * len(follows):
                break
            out.append(token)
            follows = [(d, p + 1) for d, p in follows if p < len(d) and d[p] == token]
        return out
    return []


def test_rest_matches_brute_force_reference(tmp_path):
    rng = random.Random(5)
    for trial in range(25):
        docs = [random_sequence(rng, rng.randint(1, 20), rng.choice([2, 3, 4])) for _ in range(rng.randint(1, 8))]
        store = write_datastore(tmp_path / f"s{trial}", docs)
        max_suffix, min_share = rng.randint(2, 6), rng.choice([0.0, 0.4])
        drafter = RestDrafter(store, max_suffix=max_suffix, min_suffix=2, min_share=min_share)
        for _ in range(10):
            context = random_sequence(rng, rng.randint(0, 8), 4)
            max_len = rng.randint(1, 6)
            expected = rest_reference(docs, context, max_len, max_suffix, 2, min_share)
            assert proposal(drafter.start(context), max_len) == expected, (trial, context)


def test_rest_validation(small_store, tmp_path):
    with pytest.raises(BanditSpecValidationError) as err:
        RestDrafter(small_store, max_suffix=1, min_suffix=2)
    assert err.value.field == "max_suffix"
    with pytest.raises(BanditSpecValidationError) as err:
        RestDrafter(tmp_path / "missing")
    assert err.value.field == "rest_datastore"


# ------------------------------------------------------------------------- copy pointer

# A prompt holding a source "5 6 7 8 9 10 11 12" and, elsewhere, "6 7" followed by other tokens.
SOURCE = [5, 6, 7, 8, 9, 10, 11, 12]
COPY_PROMPT = [100, *SOURCE, 101, 6, 7, 30, 31, 102]


def test_copy_pointer_keeps_copying_where_prompt_lookup_jumps_to_the_latest_occurrence():
    copy = CopyPointerDrafter().start(COPY_PROMPT)
    pld = PromptLookupDrafter(max_ngram=3).start(COPY_PROMPT)
    for session in (copy, pld):
        session.observe([5, 6])
    assert proposal(copy, 4) == [7, 8, 9, 10]  # after "5 6" the copy of the source goes on
    copy.observe([7])
    pld.observe([7])
    assert proposal(copy, 3) == [8, 9, 10]
    assert copy.propose(3).match_len == 2 + 1  # the anchoring bigram and the token copied since
    # prompt lookup: the latest "6 7" (a 3-gram "5 6 7" would find the source, but after an
    # edit the 3-gram is gone): its proposal there is the other place's continuation
    other = PromptLookupDrafter(max_ngram=2).start(COPY_PROMPT)
    other.observe([5, 6, 7])
    assert proposal(other, 2) == [30, 31]


def test_copy_pointer_after_an_edit_picks_the_copy_up_forward_of_where_it_got_to():
    copy = CopyPointerDrafter().start(COPY_PROMPT)
    copy.observe([5, 6, 7, 42])  # 8 edited into 42: the copy broke, nothing to propose
    assert proposal(copy, 3) == []
    copy.observe([10, 11])  # back on the source: re-anchored on "10 11"
    assert proposal(copy, 3) == [12, 101, 6]
    assert copy.propose(1).match_len == 2
    # "1 2 3" occurs three times, each followed by its own tokens
    prompt = [1, 2, 3, 50, 60, 1, 2, 3, 51, 61, 1, 2, 3, 52, 62, 99]
    copy = CopyPointerDrafter().start(prompt)
    copy.observe([60, 1, 2])  # copying from after "50": the middle "1 2 3"
    assert proposal(copy, 2) == [3, 51]
    copy.observe([9, 2, 3])  # an edit, then "2 3": the first occurrence past where the copy got to,
    assert proposal(copy, 2) == [51, 61]  # the middle one again
    latest = PromptLookupDrafter(max_ngram=2).start(prompt)
    latest.observe([60, 1, 2, 9, 2, 3])
    assert proposal(latest, 2) == [52, 62]  # where prompt lookup takes the latest
    behind = CopyPointerDrafter().start(prompt)
    behind.observe([52, 62, 7, 1, 2])  # past every "1 2": the first one
    assert proposal(behind, 2) == [3, 50]
    assert CopyPointerDrafter().start([1, 2, 3, 1, 2]).propose(3).token_ids.tolist() == [3, 1, 2]  # from the prompt alone


def test_copy_pointer_sessions_agree_however_the_tokens_arrive_and_validate():
    rng = random.Random(3)
    prompt = [rng.randrange(20) for _ in range(200)]
    output = [rng.randrange(20) for _ in range(100)]
    one, chunked = CopyPointerDrafter().start(prompt), CopyPointerDrafter().start(prompt)
    i = 0
    while i < len(output):
        step = rng.randrange(1, 6)
        for token in output[i : i + step]:
            one.observe([token])
        chunked.observe(output[i : i + step])
        assert proposal(one, 8) == proposal(chunked, 8)
        assert one.propose(8).match_len == chunked.propose(8).match_len
        i += step
    assert proposal(one, 0) == []
    assert one.context_len == 300
    one.close(finished=True)
    assert one.context_len == 0 and proposal(one, 4) == []
    for bad in (0, 1.5, True):
        with pytest.raises(BanditSpecValidationError) as err:
            CopyPointerDrafter(ngram=bad)
        assert err.value.field == "ngram"
    with pytest.raises(BanditSpecValidationError) as err:
        chunked.observe([-1])
    assert err.value.field == "new_tokens"
    with pytest.raises(BanditSpecValidationError) as err:
        chunked.propose(-1)
    assert err.value.field == "max_len"


# ------------------------------------------------------------------------- registry


def test_registry_builds_each_drafter(small_store):
    assert DRAFTER_NAMES == ("pld", "suffix", "rest", "copy")
    for name in DRAFTER_NAMES:
        drafter = make_drafter(name, rest_datastore=small_store)
        assert drafter.name == name
        session = drafter.start([1, 2, 3, 4, 1, 2, 3])
        assert proposal(session, 2) == ([4, 5] if name == "rest" else [4, 1])
        session.observe([4])
        session.close(finished=True)
    assert make_drafter("pld", max_ngram=5).max_ngram == 5


def test_registry_rejects_unknown_names_and_options():
    with pytest.raises(BanditSpecValidationError) as err:
        make_drafter("medusa")
    assert err.value.field == "arms" and "medusa" in str(err.value)
    with pytest.raises(BanditSpecValidationError) as err:
        make_drafter("pld", depth=3)
    assert err.value.field == "arms" and "depth" in str(err.value)


def test_the_factory_builds_the_eagle_arm_the_deployment_can_serve(monkeypatch):
    """One factory, three Eagle arms: a TensorRT-LLM Eagle engine, the ``eagle`` model
    through BLS (only when the shipped head fits the target), or none."""
    import banditspec.drafters.eagle as eagle
    from banditspec.drafters.draft_model import DraftModelDrafter
    from banditspec.drafters.eagle_remote import RemoteEagleDrafter
    from banditspec.drafters.registry import build_drafters

    from tests.fake_tokenizer import ByteTokenizer

    def infer(*args):
        return {}

    def build(**kwargs):
        return build_drafters(["eagle", "draft", "pld"], ByteTokenizer(), infer=infer, **kwargs)

    engine = build(eagle_model="eagle_engine", eagle_engine=True)
    assert list(engine) == ["eagle", "draft", "pld"] and isinstance(engine["eagle"], DraftModelDrafter)
    assert engine["eagle"].model_name == "eagle_engine" and engine["draft"].model_name == "draft"
    assert "eagle" not in build(eagle_engine=True)  # a TensorRT-LLM target: no hidden states here
    monkeypatch.setattr(eagle, "head_fit_problem", lambda name, weights=None: None)
    assert isinstance(build(eagle_model="eagle")["eagle"], RemoteEagleDrafter)
    # the remote head's target states follow the head named: EAGLE-3 (the default) reads layers
    # 1, 14, 26, EAGLE-1 the last post-norm state
    assert build(eagle_model="eagle")["eagle"].traits.feature_layers == (1, 14, 26)
    assert build(eagle_model="eagle", eagle_head="eagle3")["eagle"].traits.feature_layers == (1, 14, 26)
    assert build(eagle_model="eagle", eagle_head="eagle1")["eagle"].traits.feature_layers == ()
    with pytest.raises(BanditSpecValidationError, match="eagle_head"):
        build(eagle_model="eagle", eagle_head="eagle9")
    monkeypatch.setattr(eagle, "head_fit_problem", lambda name, weights=None: "head built for another target")
    assert "eagle" not in build(eagle_model="eagle")
    assert list(build_drafters(["eagle", "draft"], ByteTokenizer())) == []  # nothing to draft with
