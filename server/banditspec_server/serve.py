"""Start a real ``tritonserver`` (the one ``nvidia-pytriton`` carries) with this
project's model repository.

Facts this relies on (../shared/PLATFORM.md): the Python backend's three files are
copied into a backend folder (only when their bytes differ, replaced by unlink +
create); ``LD_LIBRARY_PATH`` holds pytriton's libs and the venv interpreter's LIBDIR;
the venv's ``bin`` is first on ``PATH`` so that the stubs import this package.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import importlib.util
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING

from banditspec.paths import REPO_ROOT, cache_dir

if TYPE_CHECKING:
    from banditspec_server.supervisor import StubWatch

SOURCE_REPOSITORY = REPO_ROOT / "model_repository"
# the longest a warm-up request waits for an answer (its first one follows the model's calibration,
# ~30 target calls); a model that answers nothing this long gets another warm-up request
WARM_UP_ANSWER_S = 300.0
# The Python backend's stub runs an isolated interpreter (Triton 2.51: sys.flags.isolated, so
# PYTHONPATH is ignored): it finds the core through the virtual environment's installed copy,
# whichever checkout that was installed from. Its model directory is on its sys.path before
# that copy is consulted, so a link there to this checkout's core makes the server run the
# code of the checkout that rendered the repository.
CORE_PACKAGE = REPO_ROOT / "python_backend" / "banditspec"


def pytriton_dir() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed (see README set-up)")
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


def prepare_backend_dir() -> Path:
    """``<cache>/triton/backends/python`` holding libtriton_python.so, the utils and the 3.11 stub."""
    src = pytriton_dir()
    dst = cache_dir() / "triton" / "backends" / "python"
    dst.mkdir(parents=True, exist_ok=True)
    files = [
        src / "backends" / "python" / "libtriton_python.so",
        src / "backends" / "python" / "triton_python_backend_utils.py",
        src / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub",
    ]
    for f in files:
        target = dst / f.name
        if target.exists() and target.read_bytes() == f.read_bytes():
            continue
        tmp = dst / f".{f.name}.tmp"
        shutil.copy2(f, tmp)
        os.replace(tmp, target)  # never overwrite a loaded .so in place
    return dst.parent


def server_environment() -> dict[str, str]:
    env = dict(os.environ)
    site = pytriton_dir().parent.parent
    libdirs = [str(site / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    if env.get("LD_LIBRARY_PATH"):
        libdirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libdirs if p)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", str(max(1, os.cpu_count() or 1)))
    return env


_PARAM = re.compile(r'(parameters\s*\{\s*key:\s*"(?P<key>[^"]+)"\s*value:\s*\{\s*string_value:\s*")(?P<value>[^"]*)(")')


def set_parameters(config_text: str, values: Mapping[str, str]) -> str:
    """Replace the string values of existing ``parameters`` entries; unknown keys fail."""
    seen: set[str] = set()

    def repl(match: re.Match[str]) -> str:
        key = match.group("key")
        if key in values:
            seen.add(key)
            return f"{match.group(1)}{values[key]}{match.group(4)}"
        return match.group(0)

    text = _PARAM.sub(repl, config_text)
    unknown = set(values) - seen
    if unknown:
        raise KeyError(f"no such parameter(s) in config.pbtxt: {sorted(unknown)}")
    return text


def render_repository(overrides: Mapping[str, Mapping[str, str]], source: Path = SOURCE_REPOSITORY) -> Path:
    """A private copy of the model repository with parameters overridden per model."""
    base = cache_dir() / "triton" / "repositories"
    base.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="repo-", dir=base))
    for model_dir in sorted(p for p in source.iterdir() if (p / "config.pbtxt").exists()):
        shutil.copytree(model_dir, out / model_dir.name, ignore=shutil.ignore_patterns("__pycache__"))
        if CORE_PACKAGE.is_dir() and (out / model_dir.name / "1" / "model.py").exists():
            (out / model_dir.name / CORE_PACKAGE.name).symlink_to(CORE_PACKAGE, target_is_directory=True)
        config = out / model_dir.name / "config.pbtxt"
        if model_dir.name in overrides:
            config.write_text(set_parameters(config.read_text(), overrides[model_dir.name]))
    unknown_models = set(overrides) - {p.name for p in out.iterdir()}
    if unknown_models:
        raise KeyError(f"no such model(s) in the repository: {sorted(unknown_models)}")
    return out


PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "banditspec-ports"
PORT_FIELDS = ("http_port", "grpc_port", "metrics_port")
_reserved: dict[int, int] = {}  # port -> descriptor of its lock file (the reservation), held until release_port
_port_random = random.Random()  # private: a test that seeds `random` must not make processes pick alike


class PortInUseError(RuntimeError):
    """tritonserver cannot listen on a port it was told to use; ``field`` names the setting."""

    def __init__(self, field: str, port: int, host: str, detail: str = ""):
        self.field, self.port = field, port
        super().__init__(f"{field} {port}: {host}:{port} is already in use by another process"
                         f"{' (' + detail + ')' if detail else ''}; choose another port or stop that process")

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def port_is_free(host: str, port: int) -> bool:
    """Whether a listening socket could bind ``host:port`` now (SO_REUSEADDR, as tritonserver
    binds: a port in TIME_WAIT counts as free, one another socket holds does not)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _reserve(port: int) -> bool:
    """Take this machine's advisory lock on ``port`` (a lock file under PORT_LOCK_DIR), held
    until :func:`release_port` or the end of this process; False when another process has it."""
    if port in _reserved:
        return False
    try:
        PORT_LOCK_DIR.mkdir(mode=0o777, exist_ok=True)
        fd = os.open(PORT_LOCK_DIR / f"{port}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _reserved[port] = fd
    return True


def release_port(port: int) -> None:
    fd = _reserved.pop(port, None)
    if fd is not None:
        os.close(fd)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server that binds it later (tritonserver binds
    its ports only after loading every model: seconds to minutes). Two things could take it
    meanwhile, and neither can: the port lies below the kernel's ephemeral range, so no
    outgoing connection gets it as its local port; and it is reserved (a lock file) against
    every other process of this machine that picks ports here, until :func:`release_port` or
    the end of this process. Anything else that binds it in that window makes tritonserver
    fail; :class:`TritonServer` then picks again (``PortInUseError`` for a port it was given)."""
    low, _ = _ephemeral_range()
    first = 20000 if low > 21000 else 1024
    for _ in range(500):
        if low - first >= 1000:
            port = _port_random.randrange(first, low)
        else:  # an unusual ephemeral range: let the kernel choose
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        if not _reserve(port):
            continue
        if port_is_free(host, port):
            return port
        release_port(port)
    raise RuntimeError("free_port: no free port found in 500 tries")


_PORT_IN_USE = re.compile(r"failed to start (\w+) service: .*Socket '(?P<address>[^']*):(?P<port>\d+)' already in use")
PORT_RETRIES = 5  # start-ups tried again with a fresh port when an automatic one was taken


class _OutputTail:
    """Drains tritonserver's output (and its stubs') into its log file, or nowhere, keeping
    the last lines: a failed start-up can then say why."""

    def __init__(self, stream: IO[bytes], log_path: Path | None, keep: int = 200) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.thread = threading.Thread(target=self._run, args=(stream, log_path), daemon=True, name="tritonserver-output")
        self.thread.start()

    def _run(self, stream: IO[bytes], log_path: Path | None) -> None:
        sink = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed when the stream ends)
        try:
            for line in iter(stream.readline, b""):
                self.lines.append(line.decode(errors="replace").rstrip())
                if sink is not None:
                    try:
                        sink.write(line)
                        sink.flush()
                    except OSError:
                        pass  # keep draining: a full pipe would stall the server
        finally:
            stream.close()
            if sink is not None:
                sink.close()

    def port_in_use(self, wait_s: float = 2.0) -> int | None:
        """The port tritonserver said it could not listen on, None if it said nothing of that
        kind (waits up to ``wait_s`` for its last lines)."""
        deadline = time.monotonic() + wait_s
        while True:
            for line in reversed(self.lines):
                match = _PORT_IN_USE.search(line)
                if match:
                    return int(match.group("port"))
            if not self.thread.is_alive() or time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def last_error(self) -> str:
        errors = [line for line in self.lines if line.startswith("E") or "error" in line.lower()]
        return errors[-1].strip() if errors else ""


def cold_models(text: str) -> list[str]:
    """The models whose ``nv_banditspec_ready`` gauge in a metrics page says 0 (not yet
    calibrated and warm); empty when every one says 1 or there is none (metrics turned off:
    Triton's readiness is all there is to go by)."""
    from banditspec_client.prometheus_text import parse_metrics

    series = parse_metrics(text).get("nv_banditspec_ready", [])
    return sorted({labels.get("model", "banditspec") for labels, value in series if value != 1.0})


def warm_from_metrics(text: str) -> bool:
    """Whether every ``nv_banditspec_ready`` series in a metrics page says 1 (see :func:`cold_models`)."""
    return not cold_models(text)


class TritonServer:
    """A tritonserver process serving this project's models; a context manager.

    A port given as 0 is chosen here (:func:`free_port`); should another process take it
    before tritonserver listens, the start-up is tried again with a fresh one. A port given
    explicitly that is taken fails with :class:`PortInUseError` naming it. Once the server
    has been ready, its ports stay (a restart reuses them: clients know them)."""

    def __init__(
        self,
        *,
        model: str = "smollm2",
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        overrides: Mapping[str, Mapping[str, str]] | None = None,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
        source: Path = SOURCE_REPOSITORY,
        host: str = "127.0.0.1",
        admin_key: str | None = None,
    ) -> None:
        self.model = model
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        for field in PORT_FIELDS:
            port = getattr(self, field)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise ValueError(f"{field}: expected a port number 0-65535 (0: any free port), got {port!r}")
        self._auto_ports = {f for f in PORT_FIELDS if getattr(self, f) == 0}  # chosen here, may move until ready
        self._ports_fixed = False
        self._warming: threading.Thread | None = None  # the warm-up requests in flight, if any
        self._output: _OutputTail | None = None
        self.port_retries = 0  # start-ups tried again because an automatic port was taken
        merged: dict[str, dict[str, str]] = {"target": {"target_model": model}, "banditspec": {"target_model": model}}
        if (Path(source) / "eagle" / "config.pbtxt").exists():
            merged["eagle"] = {"target_model": model}
        for name, values in (overrides or {}).items():
            merged.setdefault(name, {}).update(values)
        self.overrides = merged
        self.log_path = log_path
        self.extra_args = extra_args
        self.source = source
        self.process: subprocess.Popen[bytes] | None = None
        self.repository: Path | None = None
        # where HTTP, gRPC and metrics listen; with admin_key, the APIs in RESTRICTED_APIS
        # answer only requests that carry the header ``admin-key: <key>``
        self.host, self.admin_key = host, admin_key
        self.watch: StubWatch | None = None  # the stubs and their /dev/shm regions

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    def command(self) -> list[str]:
        tritonserver = pytriton_dir() / "bin" / "tritonserver"
        return [
            str(tritonserver),
            f"--model-repository={self.repository}",
            f"--backend-directory={prepare_backend_dir()}",
            f"--cache-directory={pytriton_dir() / 'caches'}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--model-control-mode=none",
            "--exit-on-error=true",
            "--log-verbose=0",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            *restricted_api_args(self.admin_key),
            *self.extra_args,
        ]

    def _choose_ports(self) -> None:
        """Fill the automatic ports; check that every port is free now (an explicit one that
        is not fails at once, before minutes of model loading)."""
        for field in PORT_FIELDS:
            port = getattr(self, field)
            movable = field in self._auto_ports and not self._ports_fixed
            if movable and (port == 0 or not port_is_free(self.host, port)):
                if port:
                    release_port(port)
                setattr(self, field, free_port(self.host))
            elif not port_is_free(self.host, port):
                raise PortInUseError(field, port, self.host)

    def start(self) -> TritonServer:
        self._warming = None  # a warm-up still waiting on a previous process is that process's
        self._choose_ports()
        _prebuild(self.model, self.overrides)
        self.repository = render_repository(self.overrides, self.source)
        self.process = subprocess.Popen(
            self.command(), env=server_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert self.process.stdout is not None  # stdout=PIPE
        self._output = _OutputTail(self.process.stdout, self.log_path)
        from banditspec_server.supervisor import StubWatch

        self.watch = StubWatch(self.process.pid)
        return self

    def _failed_start(self) -> None:
        """tritonserver exited before it was ready: start again on a fresh port if an
        automatic one was taken meanwhile (returns), raise otherwise."""
        code = self.process.returncode if self.process is not None else None
        taken = self._output.port_in_use() if self._output is not None else None
        field = next((f for f in PORT_FIELDS if taken is not None and getattr(self, f) == taken), None)
        if (field is not None and taken is not None and field in self._auto_ports and not self._ports_fixed
                and self.port_retries < PORT_RETRIES):
            self.port_retries += 1
            print(f"tritonserver: {field} {taken} was taken before it could listen; starting again on another port",
                  file=sys.stderr, flush=True)
            self.stop(timeout=5)
            release_port(taken)
            setattr(self, field, 0)
            self.start()
            return
        if field is not None and taken is not None:
            self.stop(timeout=5)
            raise PortInUseError(field, taken, self.host, "tritonserver could not listen there")
        detail = self._output.last_error() if self._output is not None else ""
        raise RuntimeError(f"tritonserver exited with code {code} (log: {self.log_path}){': ' + detail if detail else ''}")

    def is_ready(self) -> bool:
        """Triton says ready, and the banditspec model is calibrated and warm (its
        ``nv_banditspec_ready`` gauge; see :meth:`wait_ready`)."""
        return self._triton_ready() and self._warm()

    def _triton_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def _metrics_text(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://localhost:{self.metrics_port}/metrics", timeout=2) as r:
                return r.read().decode("utf-8", "replace")
        except OSError:
            return None

    def _warm(self) -> bool:
        text = self._metrics_text()
        return text is not None and warm_from_metrics(text)

    def _warm_up(self) -> None:
        """Each cold banditspec model's first request, which calibrates it and warms it up
        before it decodes (Triton allows a Python model to call another only from a request);
        a repository may serve several (a benchmark's private copies). Sent from a thread of
        its own, one round at a time: a model that hangs while it warms up (a stopped stub
        answers nothing) must not hold the start-up, which then still sees a stop request or
        the server's exit."""
        if self._warming is not None and self._warming.is_alive():
            return
        text = self._metrics_text()
        cold = cold_models(text) if text is not None else []
        if cold:
            self._warming = threading.Thread(target=self._send_warm_ups, args=(self.grpc_url, cold), daemon=True,
                                             name="warm-up")
            self._warming.start()

    @staticmethod
    def _send_warm_ups(grpc_url: str, models: list[str]) -> None:
        from banditspec_client.triton_client import GenerationOptions, generate_grpc

        # The model's default policy, not plain decoding: its first step also asks the target for
        # the states the served Eagle head reads, and from then on the target keeps those for
        # every sequence it caches, so a prompt cached by any request serves the head too.
        for model in models:
            try:
                generate_grpc(grpc_url, "warm-up", GenerationOptions(max_tokens=1), model_name=model,
                              timeout=WARM_UP_ANSWER_S)
            except Exception as exc:  # the gauge is what tells; a failure here is in the log
                print(f"tritonserver: warm-up request to {model} failed: {exc}", file=sys.stderr, flush=True)

    def wait_ready(self, timeout: float = 600, cancel: threading.Event | None = None) -> None:
        """Until ready (returns), ``cancel`` is set (returns), the time is up (TimeoutError)
        or the server exits (RuntimeError; PortInUseError for a taken port it was given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                return
            if self.process is None:
                raise RuntimeError("tritonserver is not running (start() first)")
            if self.process.poll() is not None:
                self._failed_start()  # returns when it started again on a fresh port
                continue
            if self._triton_ready() and not self._warm():
                self._warm_up()
            if self.is_ready():
                self._ports_fixed = True
                if self.watch is not None:  # remember the stubs and their regions while they live; a death
                    self.watch.record()  # seen now is left for the supervisor's next poll
                return
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s (log: {self.log_path})")

    def stop(self, timeout: float = 30) -> int | None:
        proc, self.process = self.process, None
        if proc is None:
            return None
        regions = set(_stub_shm_regions(proc.pid))
        if self.watch is not None:
            self.watch.record()
            regions |= self.watch.regions  # a stub that died earlier is no longer in /proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        from banditspec_server.supervisor import remove_regions, wait_group_gone

        _kill_group(proc.pid)
        wait_group_gone(proc.pid, timeout=5)  # a SIGKILLed stub is gone a moment after the signal
        if self._output is not None:
            self._output.thread.join(timeout=5)  # ends when every process holding its pipe is gone
        remove_regions(regions)  # left behind only when the server had to be killed
        if self.repository is not None:
            shutil.rmtree(self.repository, ignore_errors=True)
            self.repository = None
        return proc.returncode

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for field in self._auto_ports:
            release_port(getattr(self, field))


RESTRICTED_APIS = "model-repository,shared-memory,statistics,trace,logging"  # as the GPU image
ADMIN_KEY_ENV = "BANDITSPEC_ADMIN_KEY"


def restricted_api_args(admin_key: str | None) -> list[str]:
    """tritonserver flags that put RESTRICTED_APIS behind the header ``admin-key: <key>``."""
    if not admin_key:
        return []
    if not re.fullmatch(r"[A-Za-z0-9._~-]{8,256}", admin_key):
        raise ValueError(f"{ADMIN_KEY_ENV}: 8-256 characters of A-Z a-z 0-9 . _ ~ -")
    spec = f"{RESTRICTED_APIS}:admin-key={admin_key}"
    return [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]  # 2.51: gRPC says "protocol"


def admin_key_from_environment() -> tuple[str, bool]:
    """(key, whether it came from the environment); a random key locks the APIs for good."""
    key = os.environ.get(ADMIN_KEY_ENV, "")
    if key:
        return key, True
    import secrets

    return secrets.token_urlsafe(32), False


def _stub_shm_regions(pgid: int) -> list[str]:
    """Names of the /dev/shm regions of the Python-backend stubs in the server's process group
    (a stub's second argument is its region's name)."""
    regions = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc_dir.name)) != pgid:
                continue
            argv = (proc_dir / "cmdline").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue
        if argv and argv[0].endswith(b"triton_python_backend_stub") and len(argv) > 2:
            name = argv[2].decode(errors="replace").lstrip("/")
            if name and "/" not in name:
                regions.append(name)
    return regions


def _kill_group(pgid: int) -> None:
    """Stubs are in the server's session; make sure none outlives it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _prebuild(model: str, overrides: Mapping[str, Mapping[str, str]]) -> None:
    """Build the converted model and the REST datastore here, not inside a stub start-up."""
    from banditspec.engine.models import model_dir

    model_dir(model)
    drafters = overrides.get("banditspec", {}).get("drafters", "pld,suffix,rest,copy")
    datastore = overrides.get("banditspec", {}).get("rest_datastore", "default")
    if "rest" in drafters and datastore in ("", "default"):
        from banditspec.drafters.rest_datastore import default_datastore
        from banditspec.engine.models import load_tokenizer

        default_datastore(load_tokenizer("smollm2"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--http-port", type=int, default=8000, help="0: any free port")
    parser.add_argument("--grpc-port", type=int, default=8001, help="0: any free port")
    parser.add_argument("--metrics-port", type=int, default=8002, help="0: any free port")
    parser.add_argument("--set", action="append", default=[], metavar="MODEL.PARAM=VALUE",
                        help="override a config.pbtxt parameter, e.g. banditspec.default_policy=exp3spec")
    parser.add_argument("--log-file", type=Path, default=None,
                        help="tritonserver's log, appended to (default: serve-tritonserver.log in the cache folder)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address of the HTTP, gRPC and metrics ports (0.0.0.0: every interface; containers)")
    parser.add_argument("--on-stub-death", choices=["restart", "exit"], default="restart",
                        help="when a model process dies: restart tritonserver (default) or exit non-zero (exit code 3)")
    parser.add_argument("--drain-seconds", type=float, default=30.0,
                        help="after the eagle process dies: restart once no request is active, or after this long")
    parser.add_argument("--hang-seconds", type=_hang_seconds, default=60.0,
                        help="a target or eagle process that completes nothing for this long gets a one-token probe; "
                             "no answer within as long again (or Triton's 'not healthy') counts as its death (0: off)")
    parser.add_argument("--openai-port", type=int, default=9000, help="OpenAI-compatible HTTP API port (default 9000)")
    parser.add_argument("--openai-host", default=None, help="OpenAI API address (default: --host)")
    parser.add_argument("--no-openai", dest="openai", action="store_false", help="do not serve the OpenAI API")


def _hang_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 (0: no hang detection), got {text!r}")
    return value


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        model, dot, param = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"--set expects MODEL.PARAM=VALUE, got {item!r}")
        out.setdefault(model, {})[param] = value
    return out


def run(args: argparse.Namespace) -> int:
    if args.log_file is None:
        from banditspec.paths import cache_dir

        args.log_file = cache_dir() / "serve-tritonserver.log"
        args.log_file.parent.mkdir(parents=True, exist_ok=True)
    server = TritonServer(
        model=args.model,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        overrides=parse_overrides(args.set),
        log_path=args.log_file,
        host=getattr(args, "host", "127.0.0.1"),
        admin_key=admin_key_from_environment()[0],
    )
    stop = {"requested": False}
    stop_event = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop["requested"] = True
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"starting tritonserver (model {args.model}; log: {args.log_file}) ...", file=sys.stderr, flush=True)
    openai_api = None
    from banditspec_server.supervisor import Availability

    availability = Availability()  # the start-up time measured here is what clients are told to wait
    try:
        try:
            availability.starting()
            server.start()
            server.wait_ready(timeout=24 * 3600, cancel=stop_event)
            availability.ready()
        except PortInUseError as exc:
            print(f"banditspec serve: {exc.flag} {exc.port}: {str(exc).split(': ', 1)[1]}", file=sys.stderr, flush=True)
            return 1
        except (RuntimeError, TimeoutError) as exc:
            print(f"tritonserver exited during start-up: {exc}", file=sys.stderr, flush=True)
            return 1
        if not stop["requested"] and getattr(args, "openai", False):
            from banditspec_server.openai_api.server import OpenAIServer

            openai_host = args.openai_host or getattr(args, "host", "127.0.0.1")
            openai_api = OpenAIServer(server.grpc_url, host=openai_host, port=args.openai_port, model=args.model,
                                      retry_after=availability.retry_after)
            openai_api.start()
            print(f"OpenAI API: {openai_api.url}/v1 (model 'banditspec')", file=sys.stderr, flush=True)
        if not stop["requested"]:
            print(
                f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}  metrics localhost:{server.metrics_port}/metrics\n"
                f"try: banditspec generate --url {server.grpc_url} --stream \"Write a haiku about GPUs\"",
                file=sys.stderr,
                flush=True,
            )
        if stop["requested"]:
            return 0
        from banditspec_server.supervisor import Supervisor

        print(f"restricted APIs ({RESTRICTED_APIS}) need the header 'admin-key' "
              f"({'from ' + ADMIN_KEY_ENV if os.environ.get(ADMIN_KEY_ENV) else 'random key: locked'})",
              file=sys.stderr, flush=True)
        return Supervisor(server, on_stub_death=getattr(args, "on_stub_death", "restart"),
                          drain_s=getattr(args, "drain_seconds", 30.0),
                          hang_s=getattr(args, "hang_seconds", 60.0), availability=availability).run(stop_event)
    finally:
        if openai_api is not None:
            openai_api.stop()
        print("stopping tritonserver ...", file=sys.stderr, flush=True)
        server.stop()
    return 0
