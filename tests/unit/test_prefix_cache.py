"""PrefixCache on its own: which entry a lookup picks, what it hands out, what store keeps.

Tensors here are small stand-ins (1 KV layer, features of width 3) whose values name their
positions, so a cut in the wrong place shows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from banditspec.engine.prefix_cache import PrefixCache

EAGLE3 = (1, 14, 26)


def ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One layer of keys/values [1, 1, n, 2] whose values are the positions."""
    positions = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(1, 1, n, 2).contiguous()
    return [(positions, positions + 0.5)]


def states(n: int, offset: float = 0.0) -> torch.Tensor:
    """Features [n, 3]: row i holds offset + i."""
    return (torch.arange(n, dtype=torch.float32)[:, None] + offset).expand(n, 3).contiguous()


def test_features_are_kept_and_cut_to_the_prefix():
    cache = PrefixCache()
    cache.store(ids(range(10, 20)), kv(10), {(): states(10), EAGLE3: states(10, 100.0)})
    sequence = ids(list(range(10, 16)) + [99, 98])
    hit = cache.lookup(sequence, max_length=len(sequence) - 1, hidden_from=0, kind=EAGLE3)
    assert hit.length == 6
    assert set(hit.features) == {(), EAGLE3}
    assert torch.equal(hit.features[EAGLE3], states(6, 100.0))
    assert torch.equal(hit.features[()], states(6))
    assert torch.equal(hit.layers[0][0], kv(6)[0][0])
    # the entry itself is untouched and still whole
    whole = cache.lookup(ids(range(10, 21)), 10, hidden_from=0, kind=EAGLE3)
    assert whole.length == 10 and torch.equal(whole.features[EAGLE3], states(10, 100.0))
    assert torch.equal(whole.features[()], states(10)) and torch.equal(whole.layers[0][1], kv(10)[0][1])


@pytest.mark.parametrize("stored", [None, {(): states(10)}], ids=["no features", "another kind"])
def test_an_entry_without_the_kind_caps_reuse_at_hidden_from(stored):
    cache = PrefixCache()
    cache.store(ids(range(10, 20)), kv(10), stored)
    sequence = ids(range(10, 20))
    assert cache.lookup(sequence, 9, hidden_from=4, kind=EAGLE3).length == 4
    assert cache.lookup(sequence, 9, hidden_from=0, kind=EAGLE3).length == 0
    assert cache.lookup(sequence, 9).length == 9  # no states asked: the whole prefix
    expected = 9 if stored else 4  # the post-norm kind (): usable only where the entry holds it
    assert cache.lookup(sequence, 9, hidden_from=4, kind=()).length == expected


def test_the_longest_usable_entry_is_chosen():
    cache = PrefixCache()
    shared = list(range(10, 20))
    cache.store(ids(shared + [1, 2, 3, 4]), kv(14), {(): states(14)})  # longest, no EAGLE-3 states
    cache.store(ids(shared[:8]), kv(8), {(): states(8), EAGLE3: states(8, 100.0)})
    cache.store(ids(shared[:5] + [7]), kv(6), {(): states(6), EAGLE3: states(6, 200.0)})
    sequence = ids(shared + [1, 2, 3, 4, 5])
    hit = cache.lookup(sequence, len(sequence) - 1, hidden_from=0, kind=EAGLE3)
    assert hit.length == 8 and torch.equal(hit.features[EAGLE3], states(8, 100.0))
    assert cache.lookup(sequence, len(sequence) - 1, hidden_from=0, kind=()).length == 14
    assert cache.lookup(sequence, len(sequence) - 1, hidden_from=10, kind=EAGLE3).length == 10
    assert cache.lookup(sequence, len(sequence) - 1, hidden_from=3, kind=EAGLE3).length == 8
    # of two equally long prefixes, the one holding the kind (what is stored next can keep it)
    short = ids(shared[:6] + [42])
    hit = cache.lookup(short, 6, hidden_from=6, kind=EAGLE3)
    assert hit.length == 6 and EAGLE3 in hit.features


def test_store_checks_the_features_length():
    cache = PrefixCache()
    with pytest.raises(ValueError, match="features"):
        cache.store(ids(range(10, 20)), kv(10), {(): states(9)})
    assert len(cache) == 0


def test_an_extension_supersedes_only_entries_whose_kinds_it_holds():
    cache = PrefixCache()
    cache.store(ids(range(10, 20)), kv(10), {(): states(10), EAGLE3: states(10, 100.0)})
    cache.store(ids(range(10, 25)), kv(15), {(): states(15)})  # lacks EAGLE-3: both stay
    assert len(cache) == 2
    hit = cache.lookup(ids(range(10, 30)), 19, hidden_from=0, kind=EAGLE3)
    assert hit.length == 10 and EAGLE3 in hit.features
    cache.store(ids(range(10, 26)), kv(16), {(): states(16), EAGLE3: states(16, 100.0)})
    assert len(cache) == 1 and cache.cached_tokens() == 16  # holds every kind of both: supersedes


def test_features_held_from_a_start_serve_requests_from_that_start_on():
    cache = PrefixCache()
    # positions 4..9 of EAGLE-3 states only (a head's window on the prompt)
    cache.store(ids(range(10, 20)), kv(10), {(): states(10), EAGLE3: states(6, 104.0)}, feature_from={EAGLE3: 4})
    sequence = ids(list(range(10, 20)) + [99])
    hit = cache.lookup(sequence, 10, hidden_from=4, kind=EAGLE3)
    assert hit.length == 10 and hit.feature_from == {EAGLE3: 4}
    assert torch.equal(hit.features[EAGLE3], states(6, 104.0))  # row j is position 4 + j
    assert cache.lookup(sequence, 10, hidden_from=7, kind=EAGLE3).length == 10
    assert cache.lookup(sequence, 10, hidden_from=3, kind=EAGLE3).length == 3  # states before 4 unknown
    # a prefix that ends inside the held rows is cut like the KV; one that ends before them has none
    cut = cache.lookup(ids(list(range(10, 17)) + [99]), 7, hidden_from=5, kind=EAGLE3)
    assert cut.length == 7 and torch.equal(cut.features[EAGLE3], states(3, 104.0))
    short = cache.lookup(ids(list(range(10, 13)) + [99]), 3)
    assert short.length == 3 and EAGLE3 not in short.features and short.feature_from == {}


def test_store_checks_the_features_length_from_their_start():
    cache = PrefixCache()
    with pytest.raises(ValueError, match="features"):
        cache.store(ids(range(10, 20)), kv(10), {EAGLE3: states(10)}, feature_from={EAGLE3: 4})
    with pytest.raises(ValueError, match="features"):
        cache.store(ids(range(10, 20)), kv(10), {EAGLE3: states(0)}, feature_from={EAGLE3: 10})
    assert len(cache) == 0


def test_an_extension_holding_a_kind_from_later_does_not_supersede():
    cache = PrefixCache()
    cache.store(ids(range(10, 20)), kv(10), {(): states(10), EAGLE3: states(8, 102.0)}, feature_from={EAGLE3: 2})
    cache.store(ids(range(10, 25)), kv(15), {(): states(15), EAGLE3: states(10, 105.0)}, feature_from={EAGLE3: 5})
    assert len(cache) == 2  # the first holds EAGLE-3 from 2, the extension only from 5
    assert cache.lookup(ids(range(10, 30)), 19, hidden_from=3, kind=EAGLE3).length == 10
    assert cache.lookup(ids(range(10, 30)), 19, hidden_from=6, kind=EAGLE3).length == 15
    cache.store(ids(range(10, 26)), kv(16), {(): states(16), EAGLE3: states(15, 101.0)}, feature_from={EAGLE3: 1})
    assert len(cache) == 1  # from 1: holds all either did
