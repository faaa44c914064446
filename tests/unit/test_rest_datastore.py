"""REST datastore: suffix array correctness (vocab 49152), save/load round trip, building from
texts, the default datastore's sources and its one-time atomic build."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from banditspec.drafters import rest_datastore
from banditspec.drafters.rest_datastore import (
    META_FILE,
    TokenDatastore,
    build_datastore,
    default_datastore,
    load_datastore,
    write_datastore,
)
from banditspec.errors import BanditSpecValidationError


class ByteTokenizer:
    """A stand-in tokenizer: one token per UTF-8 byte, vocab 256."""

    def __len__(self) -> int:
        return 256

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [list(t.encode("utf-8")) for t in texts]}


def brute_count(tokens: np.ndarray, pattern: list[int]) -> int:
    m = len(pattern)
    return sum(1 for i in range(len(tokens) - m + 1) if tokens[i : i + m].tolist() == pattern)


def test_round_trip_and_suffix_array_with_large_ids(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(49140, 49152, size=int(rng.integers(1, 40))) for _ in range(80)]
    docs.append(np.array([0, 1, 49151]))
    folder = write_datastore(tmp_path / "ds", docs, separator=49152)
    store = load_datastore(folder)
    meta = json.loads((folder / META_FILE).read_text())
    assert meta["separator"] == 49152 and meta["num_docs"] == len(docs) and meta["num_tokens"] == len(store)
    expected = np.concatenate([np.append(d, 49152) for d in docs]).astype(np.int32)
    np.testing.assert_array_equal(store.tokens, expected)
    assert store.tokens.dtype == np.int32 and store.suffix_array.dtype == np.int32
    # the suffix array sorts the suffixes lexicographically, by token id
    suffixes = [store.tokens[s:].tolist() for s in store.suffix_array]
    assert suffixes == sorted(suffixes)
    assert sorted(store.suffix_array.tolist()) == list(range(len(store)))
    for _ in range(50):
        doc = docs[int(rng.integers(len(docs)))]
        start = int(rng.integers(len(doc)))
        pattern = doc[start : start + int(rng.integers(1, 4))].tolist()
        assert store.count(pattern) == brute_count(store.tokens, pattern)
    assert store.count([49152 - 1, 0, 0, 0, 7]) == 0


def test_suffix_range_rows_hold_the_pattern(tmp_path):
    rng = random.Random(1)
    docs = [[rng.randrange(3) for _ in range(rng.randint(1, 30))] for _ in range(40)]
    store = load_datastore(write_datastore(tmp_path / "ds", docs))
    for pattern in ([0], [1, 2], [2, 2, 0], [0, 1, 0, 1]):
        lo, hi = store.suffix_range(pattern)
        rows = store.suffix_array[lo:hi]
        assert all(store.tokens[s : s + len(pattern)].tolist() == pattern for s in rows)
        assert hi - lo == brute_count(store.tokens, pattern)


def test_write_rejects_bad_corpora(tmp_path):
    with pytest.raises(BanditSpecValidationError, match="rest_datastore"):
        write_datastore(tmp_path / "a", [[], []])
    with pytest.raises(BanditSpecValidationError, match="separator"):
        write_datastore(tmp_path / "b", [[1, 5]], separator=5)
    with pytest.raises(BanditSpecValidationError, match=">= 0"):
        write_datastore(tmp_path / "c", [[1, -2]])
    with pytest.raises(BanditSpecValidationError, match="separator"):
        TokenDatastore(np.array([1, 2], np.int32), np.array([0, 1], np.int32), separator=3)


def test_build_from_texts_stops_at_the_token_budget(tmp_path):
    texts = ["abc", "", "de", "fghij", "never read"]
    store = load_datastore(build_datastore(tmp_path / "ds", ByteTokenizer(), texts, max_tokens=8, batch_size=2))
    assert store.separator == 256
    assert store.tokens.tolist() == [*b"abc", 256, *b"de", 256, *b"fgh", 256]


def test_stdlib_texts_skip_test_folders(tmp_path, monkeypatch):
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    (tmp_path / "test").mkdir()
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "mod.py").write_text("KEEP_A = 1\n")
    (tmp_path / "pkg" / "core.py").write_text("KEEP_B = 2\n")
    (tmp_path / "pkg" / "tests" / "test_core.py").write_text("SKIP = 3\n")
    (tmp_path / "test" / "test_x.py").write_text("SKIP = 4\n")
    (tmp_path / "site-packages" / "other.py").write_text("SKIP = 5\n")
    (tmp_path / "notes.txt").write_text("SKIP = 6\n")
    monkeypatch.setattr(rest_datastore.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    assert sorted(rest_datastore.stdlib_python_texts()) == ["KEEP_A = 1\n", "KEEP_B = 2\n"]


def test_sharegpt_texts_are_train_assistant_turns(monkeypatch):
    import banditspec.datasets

    asked = []

    def fake_split(split):
        asked.append(split)
        return [(("human", "question"), ("gpt", "answer one")), (("gpt", " "), ("gpt", "answer two"))]

    monkeypatch.setattr(banditspec.datasets, "sharegpt_split", fake_split)
    assert list(rest_datastore.sharegpt_train_texts()) == ["answer one", "answer two"]
    assert asked == ["train"]


def test_default_datastore_is_built_once_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("BANDITSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(rest_datastore, "sharegpt_train_texts", lambda: iter(["chat text"]))
    monkeypatch.setattr(rest_datastore, "stdlib_python_texts", lambda: iter(["x = 1\n"]))
    folder = default_datastore(ByteTokenizer())
    assert folder == tmp_path / rest_datastore.DEFAULT_DIR_NAME
    store = load_datastore(folder)
    assert store.tokens.tolist() == [*b"chat text", 256, *b"x = 1\n", 256]
    assert not list(tmp_path.glob("*.tmp-*"))  # the temporary build folder was renamed

    def must_not_run():
        raise AssertionError("rebuilt")

    monkeypatch.setattr(rest_datastore, "sharegpt_train_texts", must_not_run)
    assert default_datastore(ByteTokenizer()) == folder


@pytest.mark.slow
def test_default_datastore_with_smollm2_tokenizer():
    from banditspec.drafters.rest import RestDrafter
    from banditspec.engine.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    store = load_datastore(default_datastore(tokenizer))
    assert 2_000_000 <= len(store) <= 4_000_000
    assert store.separator == len(tokenizer) == 49152
    assert int(store.tokens[store.tokens != store.separator].max()) < 49152
    drafter = RestDrafter(store)
    prompt = tokenizer("class Point:\n    def __init__(self", add_special_tokens=False)["input_ids"]
    draft = drafter.start(prompt).propose(8)
    assert len(draft) > 0
    assert tokenizer.decode(draft.token_ids.tolist()).startswith((",", ")"))


def random_store(tmp_path, rng, alphabet, separator, *, spread, docs, longest):
    """(documents, their datastore, the lowest id) of random ids: 0 .. alphabet - 1 (separator
    None), or the ``spread`` ids just below ``separator`` (large ids). The C search library
    must build and load here (plain C: any CPU with a C compiler), as the set-up does."""
    library = rest_datastore.load_text_search()
    assert library is not None, f"the text-search library must build here: {rest_datastore.TEXT_SEARCH.unavailable_reason()}"
    low = 0 if separator is None else alphabet - spread
    high = alphabet if separator is None else separator
    documents = [rng.integers(low, high, size=int(rng.integers(1, longest))) for _ in range(docs)]
    return documents, load_datastore(write_datastore(tmp_path / "ds", documents, separator=separator)), low


@pytest.mark.parametrize("alphabet, separator", [(3, None), (49152, 49152)], ids=["small-ids", "large-ids"])
def test_the_c_search_finds_the_longest_suffix_the_python_search_finds(tmp_path, alphabet, separator):
    """The kernel library's search (one call a lookup) against the Python bisection over the
    same suffix array: contexts that occur whole, in part, at a document's end, not at all,
    and with ids above the corpus's (an unknown id never matches)."""
    rng = np.random.default_rng(3)
    docs, store, low = random_store(tmp_path, rng, alphabet, separator, spread=12, docs=60, longest=60)
    assert store.native_search() is not None
    checked = 0
    for _ in range(300):
        doc = docs[int(rng.integers(len(docs)))].tolist()
        end = int(rng.integers(1, len(doc) + 1))
        context = doc[max(0, end - int(rng.integers(1, 20))) : end]
        if rng.random() < 0.3:  # a tail the corpus does not hold
            context = context + rng.integers(low, store.separator, size=int(rng.integers(1, 4))).tolist()
        for min_len, max_len in ((1, 16), (2, 8), (3, 3)):
            native = store.longest_suffix(context, min_len, max_len)
            assert native == store.longest_suffix_python(context, min_len, max_len), (context, min_len, max_len)
            m, lo, hi = native
            if m:
                assert hi - lo == brute_count(store.tokens, context[-m:])
            checked += m > 0
    assert checked > 300  # most contexts match somewhere
    assert store.longest_suffix([], 2, 16) == (0, 0, 0)


@pytest.mark.parametrize("alphabet, separator", [(4, None), (49152, 49152)], ids=["small-ids", "large-ids"])
def test_the_c_continuation_is_the_python_continuation(tmp_path, alphabet, separator):
    """REST's continuation in the kernel library against the numpy one, on corpora with many
    repeats (groups, ties, separators, a single occurrence left) and on every path: all
    occurrences read or an evenly spaced subset (max_matches), min_share cutting it short."""
    from banditspec.drafters.rest import RestDrafter

    rng = np.random.default_rng(5)
    docs, store, _ = random_store(tmp_path, rng, alphabet, separator, spread=4, docs=80, longest=40)
    compared, long_ones, subsets = 0, 0, 0
    for max_matches, min_share in ((5000, 0.0), (7, 0.0), (1, 0.0), (2, 0.0), (5000, 0.4), (13, 0.6)):
        drafter = RestDrafter(store, min_suffix=1, max_suffix=6, max_matches=max_matches, min_share=min_share)
        for _ in range(150):
            doc = docs[int(rng.integers(len(docs)))].tolist()
            end = int(rng.integers(1, len(doc) + 1))
            m, lo, hi = drafter.longest_match(doc[max(0, end - 6) : end])
            if m == 0:
                continue
            for max_len in (1, 3, 8, 30):
                native = store.native_continuation(m, lo, hi, max_len, max_matches, min_share)
                assert native == drafter.continuation_python(m, lo, hi, max_len), (m, lo, hi, max_len, max_matches, min_share)
                assert drafter.continuation(m, lo, hi, max_len) == native
                compared += 1
                long_ones += len(native) > 2
                subsets += hi - lo > max_matches
    assert compared > 1500 and long_ones > 100 and subsets > 200


def test_text_search_needs_neither_the_engine_nor_torch():
    """The C search is its own library: a fresh process loads it and searches without
    importing the engine's modules (or torch), and the library carries no engine kernel."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from banditspec.drafters import rest, rest_datastore\n"
        "library = rest_datastore.load_text_search()\n"
        "assert library is not None, rest_datastore.TEXT_SEARCH.unavailable_reason()\n"
        "assert not hasattr(library, 'bs_panel_gemm')\n"
        "print(sorted(m for m in sys.modules if m.startswith('banditspec.engine') or m == 'torch'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
