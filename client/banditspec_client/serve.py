"""Start a real ``tritonserver`` (the one ``nvidia-pytriton`` carries) with this
project's model repository.

Facts this relies on (../shared/PLATFORM.md): the Python backend's three files are
copied into a backend folder (only when their bytes differ, replaced by unlink +
create); ``LD_LIBRARY_PATH`` holds pytriton's libs and the venv interpreter's LIBDIR;
the venv's ``bin`` is first on ``PATH`` so that the stubs import this package.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
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
from pathlib import Path
from typing import Mapping

from banditspec.paths import REPO_ROOT, cache_dir

SOURCE_REPOSITORY = REPO_ROOT / "model_repository"


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
    seen = set()

    def repl(match):
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
        config = out / model_dir.name / "config.pbtxt"
        if model_dir.name in overrides:
            config.write_text(set_parameters(config.read_text(), overrides[model_dir.name]))
    unknown_models = set(overrides) - {p.name for p in out.iterdir()}
    if unknown_models:
        raise KeyError(f"no such model(s) in the repository: {sorted(unknown_models)}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServer:
    """A tritonserver process serving this project's models; a context manager."""

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
    ):
        self.model = model
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        merged: dict[str, dict[str, str]] = {"target": {"target_model": model}, "banditspec": {"target_model": model}}
        if (Path(source) / "eagle" / "config.pbtxt").exists():
            merged["eagle"] = {"target_model": model}
        for name, values in (overrides or {}).items():
            merged.setdefault(name, {}).update(values)
        self.overrides = merged
        self.log_path = log_path
        self.extra_args = extra_args
        self.source = source
        self.process: subprocess.Popen | None = None
        self.repository: Path | None = None
        # where HTTP, gRPC and metrics listen; with admin_key, the APIs in RESTRICTED_APIS
        # answer only requests that carry the header ``admin-key: <key>``
        self.host, self.admin_key = host, admin_key
        self.watch = None  # supervisor.StubWatch: the stubs and their /dev/shm regions

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

    def start(self) -> "TritonServer":
        _prebuild(self.model, self.overrides)
        self.repository = render_repository(self.overrides, self.source)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.command(), env=server_environment(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        from banditspec_client.supervisor import StubWatch

        self.watch = StubWatch(self.process.pid)
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.process.returncode} (log: {self.log_path})")
            if self.is_ready():
                if self.watch is not None:
                    self.watch.poll()  # remember the stubs' regions while they live
                return
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s (log: {self.log_path})")

    def stop(self, timeout: float = 30) -> int | None:
        proc, self.process = self.process, None
        if proc is None:
            return None
        regions = set(_stub_shm_regions(proc.pid))
        if self.watch is not None:
            self.watch.poll()
            regions |= self.watch.regions  # a stub that died earlier is no longer in /proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _kill_group(proc.pid)
        for region in regions:  # left behind only when the server had to be killed
            try:
                os.unlink(Path("/dev/shm") / region)
            except FileNotFoundError:
                pass
        if self.repository is not None:
            shutil.rmtree(self.repository, ignore_errors=True)
        return proc.returncode

    def __enter__(self) -> "TritonServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


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
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _prebuild(model: str, overrides: Mapping[str, Mapping[str, str]]) -> None:
    """Build the converted model and the REST datastore here, not inside a stub start-up."""
    from banditspec.engine.models import model_dir

    model_dir(model)
    drafters = overrides.get("banditspec", {}).get("drafters", "pld,suffix,rest")
    datastore = overrides.get("banditspec", {}).get("rest_datastore", "default")
    if "rest" in drafters and datastore in ("", "default"):
        from banditspec.drafters.rest_datastore import default_datastore
        from banditspec.engine.models import load_tokenizer

        default_datastore(load_tokenizer("smollm2"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--set", action="append", default=[], metavar="MODEL.PARAM=VALUE",
                        help="override a config.pbtxt parameter, e.g. banditspec.default_policy=exp3spec")
    parser.add_argument("--log-file", type=Path, default=None, help="server log (default: the terminal)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address of the HTTP, gRPC and metrics ports (0.0.0.0: every interface; containers)")
    parser.add_argument("--on-stub-death", choices=["restart", "exit"], default="restart",
                        help="when a model process dies: restart tritonserver (default) or exit non-zero (exit code 3)")
    parser.add_argument("--drain-seconds", type=float, default=30.0,
                        help="after the eagle process dies: restart once no request is active, or after this long")
    parser.add_argument("--openai-port", type=int, default=9000, help="OpenAI-compatible HTTP API port (default 9000)")
    parser.add_argument("--openai-host", default=None, help="OpenAI API address (default: --host)")
    parser.add_argument("--no-openai", dest="openai", action="store_false", help="do not serve the OpenAI API")


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        model, dot, param = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"--set expects MODEL.PARAM=VALUE, got {item!r}")
        out.setdefault(model, {})[param] = value
    return out


def run(args) -> int:
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

    def on_signal(signum, frame):
        stop["requested"] = True
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"starting tritonserver (model {args.model}) ...", file=sys.stderr, flush=True)
    server.start()
    openai_api = None
    try:
        while not stop["requested"] and not server.is_ready():
            if server.process.poll() is not None:
                print("tritonserver exited during start-up", file=sys.stderr)
                return 1
            time.sleep(0.5)
        if not stop["requested"] and getattr(args, "openai", False):
            from banditspec_client.openai_api.server import OpenAIServer

            openai_host = args.openai_host or getattr(args, "host", "127.0.0.1")
            openai_api = OpenAIServer(server.grpc_url, host=openai_host, port=args.openai_port, model=args.model)
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
        from banditspec_client.supervisor import Supervisor

        print(f"restricted APIs ({RESTRICTED_APIS}) need the header 'admin-key' "
              f"({'from ' + ADMIN_KEY_ENV if os.environ.get(ADMIN_KEY_ENV) else 'random key: locked'})",
              file=sys.stderr, flush=True)
        return Supervisor(server, on_stub_death=getattr(args, "on_stub_death", "restart"),
                          drain_s=getattr(args, "drain_seconds", 30.0)).run(stop_event)
    finally:
        if openai_api is not None:
            openai_api.stop()
        print("stopping tritonserver ...", file=sys.stderr, flush=True)
        server.stop()
    return 0
