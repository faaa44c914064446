"""Building and loading the package's C libraries (banditspec.native): the cache key covers
every source, headers included, and the flags; a build is reused; a failed build, a
library's own CPU check or the disabling variable make load() return None with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from banditspec.native import COMPILE_FLAGS, NativeLibrary


@pytest.fixture()
def sources(tmp_path, monkeypatch) -> list[Path]:
    monkeypatch.setenv("BANDITSPEC_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "common.h").write_text("#define ANSWER 42\n")
    (folder / "a.c").write_text('#include "common.h"\nint answer(void) { return ANSWER; }\n')
    (folder / "b.c").write_text("int twice(int x) { return 2 * x; }\n")
    return [folder / "common.h", folder / "a.c", folder / "b.c"]


def test_the_c_files_are_compiled_into_one_cached_library(sources):
    library = NativeLibrary("test", sources, fallback="nothing")
    path = library.build()
    assert path.is_file() and path.name == "libbanditspec_test.so" and path.parent.parent.name == "kernels"
    assert library.build() == path  # cached
    built = path.stat().st_mtime_ns
    assert library.build() == path and path.stat().st_mtime_ns == built
    loaded = library.load(lambda lib: None)
    assert loaded is not None and loaded.answer() == 42 and loaded.twice(21) == 42
    assert library.load(lambda lib: "not called again") is loaded and library.unavailable_reason() is None


@pytest.mark.parametrize("changed", ["common.h", "a.c", "b.c"])
def test_every_source_and_the_flags_are_in_the_cache_key(sources, changed):
    before = NativeLibrary("test", sources, fallback="nothing").path()
    by_name = {p.name: p for p in sources}
    by_name[changed].write_text(by_name[changed].read_text() + "\n/* changed */\n")
    assert NativeLibrary("test", sources, fallback="nothing").path() != before
    after = NativeLibrary("test", sources, fallback="nothing").path()
    assert NativeLibrary("test", sources, (*COMPILE_FLAGS, "-DX"), fallback="nothing").path() != after


def test_a_failed_build_or_check_gives_none_and_the_reason(sources, tmp_path, monkeypatch):
    broken = tmp_path / "broken.c"
    broken.write_text("int f(void) { return }\n")
    library = NativeLibrary("broken", [broken], fallback="nothing")
    assert library.load(lambda lib: None) is None
    assert "compiling broken failed" in (library.unavailable_reason() or "")
    with pytest.raises(RuntimeError):
        library.build()

    checked = NativeLibrary("test", sources, fallback="nothing")
    assert checked.load(lambda lib: "this CPU lacks it") is None
    assert checked.unavailable_reason() == "this CPU lacks it"

    monkeypatch.setenv("BANDITSPEC_TEST_LIBRARY", "0")
    disabled = NativeLibrary("test", sources, fallback="nothing", disable_env="BANDITSPEC_TEST_LIBRARY")
    assert disabled.load(lambda lib: None) is None
    assert disabled.unavailable_reason() == "disabled by BANDITSPEC_TEST_LIBRARY=0"


def test_a_library_needs_a_c_file():
    with pytest.raises(ValueError):
        NativeLibrary("headers", [Path("common.h")], fallback="nothing")

