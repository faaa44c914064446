"""Build and load the package's C libraries: compiled once into the cache, loaded with ctypes.

Each library (the engine's kernels, :mod:`banditspec.engine.panel_kernel`; REST's text
search, :mod:`banditspec.drafters.rest_datastore`) is a :class:`NativeLibrary`: its C
files are compiled with the system C compiler into ``<cache>/kernels/<hash>/`` the first
time it is needed (about a second; ``banditspec build kernels``, run by the set-up, does
it ahead of time). The hash covers every source file (headers too), its name and the
compiler flags, so a changed file or flag builds a new library beside the old one. No
torch headers, no build system.

Loading is once per process: a missing compiler, a failed build or a CPU check of the
library's own make :meth:`NativeLibrary.load` return None, with the reason in
:meth:`NativeLibrary.unavailable_reason`; callers then use their Python paths.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from banditspec.paths import cache_dir

# -fno-tree-vectorize: no auto-vectorized loop may change an order or pick a vector expf
# for some lengths only (the kernels are explicit intrinsics; plain loops stay scalar).
# -std=c11 (not gnu11) also keeps GCC from contracting a * b + c into an FMA on its own.
COMPILE_FLAGS: tuple[str, ...] = ("-O3", "-fno-tree-vectorize", "-shared", "-fPIC", "-std=c11")

log = logging.getLogger("banditspec.native")


class NativeLibrary:
    """One shared library compiled from ``sources`` (``.c`` files are compiled together,
    the others, headers, are only part of the cache key), loaded once per process."""

    def __init__(self, name: str, sources: Sequence[Path], flags: Sequence[str] = COMPILE_FLAGS,
                 *, fallback: str, disable_env: str | None = None):
        if not any(path.suffix == ".c" for path in sources):
            raise ValueError(f"library {name!r} has no .c source")
        self.name = name
        self.sources = tuple(sources)
        self.flags = tuple(flags)
        self.fallback = fallback  # what the callers use without it, for the log
        self.disable_env = disable_env  # NAME=0 in the environment: load() returns None, nothing built
        self._lock = threading.Lock()
        self._library: ctypes.CDLL | None = None
        self._reason: str | None = None
        self._loaded = False

    def path(self) -> Path:
        """Where the library for the current sources and flags lives (built or not)."""
        digest = hashlib.sha256()
        for source in sorted(self.sources, key=lambda p: p.name):
            digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
        digest.update(" ".join(self.flags).encode())
        return cache_dir() / "kernels" / digest.hexdigest()[:16] / f"libbanditspec_{self.name}.so"

    def build(self, *, force: bool = False) -> Path:
        """Compile into the cache (atomically; safe when several processes start at once, e.g.
        Triton's model stubs). Returns the library's path; raises RuntimeError on failure."""
        target = self.path()
        if target.exists() and not force:
            return target
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise RuntimeError("no C compiler found (set CC, or install gcc)")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if target.exists() and not force:
                return target
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                out = Path(tmp) / target.name
                c_files = [str(path) for path in self.sources if path.suffix == ".c"]
                result = subprocess.run(
                    [compiler, *self.flags, "-o", str(out), *c_files],
                    capture_output=True, text=True, timeout=300,
                )
                if result.returncode != 0:
                    raise RuntimeError(f"compiling {self.name} failed: {result.stderr.strip()[-2000:]}")
                os.replace(out, target)
        return target

    def load(self, configure: Callable[[ctypes.CDLL], str | None]) -> ctypes.CDLL | None:
        """The loaded library, building it if needed; None when it cannot run here.

        configure(library), called once after loading, declares the functions' signatures and
        returns why the library cannot run on this machine (None: it can)."""
        with self._lock:
            if self._loaded:
                return self._library
            self._loaded = True
            if self.disable_env and os.environ.get(self.disable_env, "1") == "0":
                self._reason = f"disabled by {self.disable_env}=0"
                return None
            try:
                library = ctypes.CDLL(str(self.build()))
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                self._reason = str(error)
                log.warning("C library %s unavailable (%s); using %s", self.name, error, self.fallback)
                return None
            reason = configure(library)
            if reason is not None:
                self._reason = reason
                return None
            self._library = library
            return library

    def unavailable_reason(self) -> str | None:
        """Why :meth:`load` returned None (None when it loaded or was not tried)."""
        return self._reason
