"""The REST token datastore: a corpus of token ids and its suffix array, saved as .npy files.

Folder layout (written by :func:`write_datastore`)::

    tokens.npy        int32 [N]   documents concatenated, each followed by the separator id
    suffix_array.npy  int32 [N]   start positions of the suffixes of tokens, in lexicographic order
    meta.json         {"format": 1, "separator": int, "num_docs": int, "num_tokens": N, ...}

The separator is larger than every token id of the corpus, so no match runs across
documents and the last token of the corpus is always a separator.

:func:`default_datastore` builds the datastore the server uses, once, into
``cache_dir()/rest-datastore/``: assistant turns of the ShareGPT *train* split plus Python
source of the running interpreter's standard library. HumanEval is never used (it is
evaluation data).
"""

from __future__ import annotations

import bisect
import ctypes
import fcntl
import itertools
import json
import logging
import os
import random
import shutil
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from banditspec.errors import BanditSpecValidationError
from banditspec.native import NativeLibrary
from banditspec.paths import cache_dir

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
TOKENS_FILE = "tokens.npy"
SUFFIX_ARRAY_FILE = "suffix_array.npy"
META_FILE = "meta.json"
DEFAULT_DIR_NAME = "rest-datastore"
DEFAULT_SHAREGPT_TOKENS = 2_500_000
DEFAULT_CODE_TOKENS = 1_000_000
_SKIPPED_STDLIB_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}

# The search in C (kernels/suffix_array.c): its own small library, so that text search
# needs neither the engine's kernels nor a vector ISA. Without it the Python search runs.
TEXT_SEARCH = NativeLibrary("text_search", [Path(__file__).with_name("kernels") / "suffix_array.c"],
                            fallback="the Python search")


def build_text_search(*, force: bool = False) -> Path:
    """Compile the C search into the cache (the set-up does, with the engine's kernels)."""
    return TEXT_SEARCH.build(force=force)


def load_text_search() -> ctypes.CDLL | None:
    """The C search library (built on first use), or None when it cannot be built here."""
    return TEXT_SEARCH.load(_declare_text_search)


def _declare_text_search(library: ctypes.CDLL) -> str | None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    library.bs_sa_range.argtypes = [ptr, i64, ptr, ptr, i64, ptr]
    library.bs_sa_range.restype = None
    library.bs_sa_longest.argtypes = [ptr, i64, ptr, ptr, i64, i64, i64, ptr]
    library.bs_sa_longest.restype = None
    library.bs_sa_continuation.argtypes = [ptr, i64, ptr, i64, i64, i64, i64, ctypes.c_double, ctypes.c_int32, i64, ptr]
    library.bs_sa_continuation.restype = i64
    return None  # plain C: runs on any CPU it compiles for


class TokenDatastore:
    """A loaded datastore (read-only, safe to share between threads).

    tokens:       int32 [N] the corpus (see the module docstring)
    suffix_array: int32 [N] its suffix array
    separator:    the id that ends every document
    """

    def __init__(self, tokens: np.ndarray, suffix_array: np.ndarray, separator: int):
        if tokens.ndim != 1 or suffix_array.shape != tokens.shape:
            raise BanditSpecValidationError("rest_datastore", "tokens and suffix_array must be 1-D arrays of one length")
        if tokens.size == 0 or int(tokens[-1]) != separator:
            raise BanditSpecValidationError("rest_datastore", "the corpus must end with the separator")
        self.tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self.suffix_array = np.ascontiguousarray(suffix_array, dtype=np.int32)
        self.separator = int(separator)
        # Big-endian unsigned bytes compare like the token sequences they encode (ids >= 0),
        # so a suffix's first m tokens are one bytes slice away.
        self._keys = self.tokens.astype(">u4").tobytes()
        self._sa_view = self.suffix_array.data  # a memoryview of the array
        self._native: Any = None  # the C search library (TEXT_SEARCH), once looked up
        self._native_checked = False
        self._tokens_ptr, self._sa_ptr = self.tokens.ctypes.data, self.suffix_array.ctypes.data

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def suffix_range(self, pattern: Sequence[int]) -> tuple[int, int]:
        """[lo, hi): the rows of the suffix array whose suffix starts with ``pattern`` (O(m log N))."""
        key = np.asarray(pattern, dtype=np.int64).astype(">u4").tobytes()
        width = len(key)
        keys = self._keys

        def prefix(start: int) -> bytes:
            return keys[4 * start : 4 * start + width]

        lo = bisect.bisect_left(self._sa_view, key, key=prefix)
        hi = bisect.bisect_right(self._sa_view, key, lo=lo, key=prefix)
        return lo, hi

    def longest_suffix(self, context: Sequence[int], min_len: int, max_len: int) -> tuple[int, int, int]:
        """(m, lo, hi): the longest suffix of ``context`` of ``min_len`` .. ``max_len`` tokens
        that occurs in the corpus (m = 0: none) and its rows [lo, hi). A binary search over
        the length (a shorter suffix of a present one is present), in C when the search
        library loads (:data:`TEXT_SEARCH`: one call instead of ~8 bisections with a Python
        key function, ~200 callbacks a lookup), else here."""
        native = self.native_search()
        if native is not None:
            ids = np.ascontiguousarray(context, dtype=np.int32)
            out = (ctypes.c_int64 * 3)()
            native(self._tokens_ptr, len(self.tokens), self._sa_ptr, ids.ctypes.data, len(ids), min_len, max_len, out)
            return int(out[0]), int(out[1]), int(out[2])
        return self.longest_suffix_python(context, min_len, max_len)

    def longest_suffix_python(self, context: Sequence[int], min_len: int, max_len: int) -> tuple[int, int, int]:
        """:meth:`longest_suffix` without the C library (and its reference in the tests)."""
        best = (0, 0, 0)
        lo_len, hi_len = min_len - 1, min(max_len, len(context))
        while lo_len < hi_len:
            mid = (lo_len + hi_len + 1) // 2
            lo, hi = self.suffix_range(context[len(context) - mid :])
            if hi > lo:
                lo_len, best = mid, (mid, lo, hi)
            else:
                hi_len = mid - 1
        return best

    def native_search(self) -> Any:
        """The C library's search (loaded, or built, on the first call), or None."""
        library = self._library()
        return None if library is None else library.bs_sa_longest

    def native_continuation(self, match_len: int, lo: int, hi: int, max_len: int, max_matches: int,
                            min_share: float) -> list[int] | None:
        """RestDrafter.continuation in C (the search library's ``bs_sa_continuation``: ~10 numpy
        calls a drafted token otherwise); None without the library."""
        library = self._library()
        if library is None:
            return None
        out = np.empty(max(max_len, 1), dtype=np.int32)
        k = library.bs_sa_continuation(self._tokens_ptr, len(self.tokens), self._sa_ptr, lo, hi, match_len, max_matches,
                                       min_share, self.separator, max_len, out.ctypes.data)
        return None if k < 0 else out[:k].tolist()

    def _library(self) -> Any:
        if not self._native_checked:
            self._native = load_text_search()
            self._native_checked = True
        return self._native

    def count(self, pattern: Sequence[int]) -> int:
        lo, hi = self.suffix_range(pattern)
        return hi - lo


def write_datastore(out_dir: Path, docs: Iterable[Sequence[int] | np.ndarray], separator: int | None = None) -> Path:
    """Save documents of token ids (ids >= 0) as a datastore folder; returns ``out_dir``.

    separator: the id placed after every document; default max id + 1. It must exceed every id.
    """
    from pydivsufsort import divsufsort

    arrays = [np.asarray(doc, dtype=np.int64).reshape(-1) for doc in docs]
    arrays = [a for a in arrays if a.size]
    if not arrays:
        raise BanditSpecValidationError("rest_datastore", "no tokens to store")
    max_id = max(int(a.max()) for a in arrays)
    if min(int(a.min()) for a in arrays) < 0:
        raise BanditSpecValidationError("rest_datastore", "token ids must be >= 0")
    separator = max_id + 1 if separator is None else int(separator)
    if separator <= max_id or separator > np.iinfo(np.int32).max:
        raise BanditSpecValidationError("rest_datastore", f"separator {separator} must exceed every token id ({max_id}) and fit int32")
    sep = np.array([separator], dtype=np.int64)
    tokens = np.concatenate(list(itertools.chain.from_iterable((a, sep) for a in arrays))).astype(np.int32)
    suffix_array = np.asarray(divsufsort(tokens), dtype=np.int32)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / TOKENS_FILE, tokens)
    np.save(out_dir / SUFFIX_ARRAY_FILE, suffix_array)
    meta = {"format": FORMAT_VERSION, "separator": separator, "num_docs": len(arrays), "num_tokens": int(tokens.size)}
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=1))
    return out_dir


def load_datastore(folder: Path) -> TokenDatastore:
    folder = Path(folder)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise BanditSpecValidationError("rest_datastore", f"no datastore in the configured folder ({META_FILE} missing)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise BanditSpecValidationError("rest_datastore", f"unsupported datastore format {meta.get('format')!r}")
    tokens = np.load(folder / TOKENS_FILE)
    suffix_array = np.load(folder / SUFFIX_ARRAY_FILE)
    return TokenDatastore(tokens, suffix_array, int(meta["separator"]))


def tokenize_texts(tokenizer: Any, texts: Iterable[str], max_tokens: int | None = None, *, batch_size: int = 64, desc: str = "tokenizing") -> list[np.ndarray]:
    """Documents of int32 token ids (no special tokens), stopping after ``max_tokens`` tokens."""
    from tqdm import tqdm

    docs: list[np.ndarray] = []
    total = 0
    text_iter = iter(texts)
    with tqdm(total=max_tokens, desc=desc, unit="tok", unit_scale=True, mininterval=1.0) as bar:
        while max_tokens is None or total < max_tokens:
            batch = [t for t in itertools.islice(text_iter, batch_size) if t]
            if not batch:
                break
            for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
                if max_tokens is not None:
                    ids = ids[: max_tokens - total]
                if ids:
                    docs.append(np.asarray(ids, dtype=np.int32))
                    total += len(ids)
                    bar.update(len(ids))
                if max_tokens is not None and total >= max_tokens:
                    break
    return docs


def build_datastore(out_dir: Path, tokenizer: Any, texts: Iterable[str], *, max_tokens: int | None = None, batch_size: int = 64) -> Path:
    """Tokenize ``texts`` (progress bar) and save them as a datastore; the separator is len(tokenizer)."""
    docs = tokenize_texts(tokenizer, texts, max_tokens, batch_size=batch_size)
    return write_datastore(out_dir, docs, separator=len(tokenizer))


def sharegpt_train_texts() -> Iterator[str]:
    """Assistant ("gpt") turns of the ShareGPT train split, in file order."""
    from banditspec.datasets import sharegpt_split

    for conversation in sharegpt_split("train"):
        for role, text in conversation:
            if role == "gpt" and text.strip():
                yield text


def stdlib_python_texts() -> Iterator[str]:
    """Source of the running interpreter's standard library (*.py, test folders skipped).

    Files come in a fixed shuffled order, so that a token budget samples the whole library.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = [p for p in sorted(root.rglob("*.py")) if not _SKIPPED_STDLIB_DIRS.intersection(p.relative_to(root).parts[:-1])]
    random.Random(0).shuffle(paths)
    for path in paths:
        try:
            yield path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def default_datastore(tokenizer: Any) -> Path:
    """The default datastore folder, built on first use (~3.5M tokens, seconds; atomic, locked)."""
    out = cache_dir() / DEFAULT_DIR_NAME
    if (out / META_FILE).is_file():
        return out
    with open(cache_dir() / f".{DEFAULT_DIR_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (out / META_FILE).is_file():
                _build_default(out, tokenizer)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out


def _build_default(out: Path, tokenizer: Any) -> None:
    log.info("building the REST datastore into %s (once)", out)
    docs = tokenize_texts(tokenizer, sharegpt_train_texts(), DEFAULT_SHAREGPT_TOKENS, desc="REST datastore: ShareGPT train")
    docs += tokenize_texts(tokenizer, stdlib_python_texts(), DEFAULT_CODE_TOKENS, desc="REST datastore: stdlib code")
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_DIR_NAME}.tmp-", dir=cache_dir()))
    try:
        write_datastore(tmp, docs, separator=len(tokenizer))
        if out.exists():  # a half-written folder of an older layout
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
