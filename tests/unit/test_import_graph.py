"""No import loop in the packages: the static import graph (every ``import`` statement,
function-level lazy ones included) of banditspec, banditspec_client and banditspec_train has no
cycle between modules, nor between the packages they live in (``drafters`` <-> ``eagle``); and
the serving package (banditspec, and the Triton models that run it) never imports the offline
training package (banditspec_train); and the drafters that search text never reach the engine."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVING = ROOT / "python_backend" / "banditspec"
TRAINING = ROOT / "training" / "banditspec_train"
PACKAGES = (SERVING, ROOT / "server" / "banditspec_server", ROOT / "client" / "banditspec_client", TRAINING)
# the Triton models' own files: they run in the server, beside the serving package
MODEL_FILES = sorted((ROOT / "model_repository").glob("*/1/model.py")) + sorted(
    (ROOT / "model_repository_trtllm").glob("*/1/model.py"))


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            parts = list(path.relative_to(package.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The known modules that ``module`` imports anywhere in its source."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` of a non-module: its nearest module
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {
        module: imported(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py", known)
        for module, path in files.items()
    }


def package_of(module: str) -> str:
    """The first-level package a module lives in (banditspec.drafters.pld -> banditspec.drafters);
    a first-level module is its own unit."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = packages.setdefault(package_of(module), set())
        edges.update(package_of(t) for t in targets if package_of(t) != package_of(module))
    return packages


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_lazy_and_relative_imports():
    source = "def f():\n    from banditspec.drafters import pld\n    from .base import Draft\n"
    known = {"banditspec.drafters", "banditspec.drafters.pld", "banditspec.drafters.base", "banditspec.drafters.x"}
    assert imported(ast.parse(source), "banditspec.drafters.x", False, known) == {
        "banditspec.drafters", "banditspec.drafters.pld", "banditspec.drafters.base"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    graph = import_graph()
    assert len(graph) > 90 and graph["banditspec.decoding.session"]
    assert cycles(graph) == [], "import loops between modules"


def test_no_package_imports_itself_back():
    assert cycles(package_graph(import_graph())) == [], "import loops between packages"


def test_the_serving_package_never_imports_the_training_package():
    graph = import_graph()
    training = {m for m in graph if m.split(".")[0] == TRAINING.name}
    assert "banditspec_train.eagle.train" in training and "banditspec.drafters.eagle" in graph
    serving = {m: targets for m, targets in graph.items() if m.split(".")[0] == SERVING.name}
    offenders = {m: sorted(targets & training) for m, targets in serving.items() if targets & training}
    assert offenders == {}, "the serving package imports offline training"
    assert len(MODEL_FILES) >= 4
    for path in MODEL_FILES:
        targets = imported(ast.parse(path.read_text(), str(path)), "model", False, set(graph))
        assert not targets & training, f"{path.relative_to(ROOT)} imports offline training"
        assert any(t.split(".")[0] == SERVING.name for t in targets), path  # the check sees its imports


# Drafters that run a model (a draft model, an Eagle head, their registry) use the engine's
# layers and contract; every other drafter only searches text and must not reach the engine
# (REST's C search is its own library, banditspec.native builds both).
MODEL_DRAFTERS = {
    "banditspec.drafters.draft_model",
    "banditspec.drafters.eagle",
    "banditspec.drafters.eagle_remote",
    "banditspec.drafters.eagle_service",
    "banditspec.drafters.registry",
}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_text_search_drafters_never_reach_the_engine():
    graph = import_graph()
    drafters = {m for m in graph if m == "banditspec.drafters" or m.startswith("banditspec.drafters.")}
    assert {"banditspec.drafters.rest", "banditspec.drafters.rest_datastore", "banditspec.drafters.pld"} <= drafters
    assert drafters >= MODEL_DRAFTERS
    # the check sees the engine where it is imported, lazily too (eagle's model_dir)
    assert "banditspec.engine.models" in graph["banditspec.drafters.eagle"]
    offenders = {
        module: sorted(t for t in reachable(graph, module) if t == "banditspec.engine" or t.startswith("banditspec.engine."))
        for module in sorted(drafters - MODEL_DRAFTERS)
    }
    assert {m: found for m, found in offenders.items() if found} == {}, "a text-search drafter reaches the engine"
    assert "banditspec.native" in graph["banditspec.drafters.rest_datastore"]
    assert not any(t.startswith("banditspec.engine") for t in reachable(graph, "banditspec.native"))


def test_the_core_top_level_stays_small():
    """Beside its sub-packages the core keeps at most twelve modules: what belongs together
    lives in a package (decoding, serving, evaluation, ...)."""
    top = sorted(p.name for p in SERVING.glob("*.py") if p.name != "__init__.py")
    assert 0 < len(top) <= 12, top


def test_the_client_never_holds_the_server():
    """serve, the supervisor and the OpenAI API are the server package's; the client package
    may start a server (benchmarks, soak) but holds none of it."""
    client = ROOT / "client" / "banditspec_client"
    for name in ("serve.py", "supervisor.py", "openai_api", "fill_template.py", "model_aliases.py"):
        assert not (client / name).exists(), name
        assert (ROOT / "server" / "banditspec_server" / name).exists(), name
    server = {m: t for m, t in import_graph().items() if m.startswith("banditspec_server")}
    assert "banditspec_server.serve" in server


# Layers, lowest first: a module imports only its own layer and the ones it may use. The
# client's protocol helpers (a Triton request, the metrics page's text) sit below the server,
# which uses them to warm itself up and to watch its models; the client's tools (benchmarks,
# soak, demo, the command line, which also runs the training) sit above the server they start.
CLIENT_HELPERS = {"banditspec_client", "banditspec_client.triton_client", "banditspec_client.prometheus_text"}
MAY_IMPORT = {
    "core": {"core"},
    "training": {"core", "training"},
    "client helpers": {"core", "client helpers"},
    "server": {"core", "client helpers", "server"},
    "client tools": {"core", "training", "client helpers", "server", "client tools"},
}


def layer_of(module: str) -> str:
    top = module.split(".")[0]
    if top == "banditspec":
        return "core"
    if top == "banditspec_train":
        return "training"
    if module in CLIENT_HELPERS:
        return "client helpers"
    if top == "banditspec_server":
        return "server"
    return "client tools"


def test_no_module_imports_a_higher_layer():
    graph = import_graph()
    assert {"banditspec_server.serve", "banditspec_client.bench.runner", "banditspec_train.eagle.train"} <= set(graph)
    assert "banditspec_client.triton_client" in graph["banditspec_server.serve"]  # the check sees the edges it allows
    offenders = sorted(
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in graph.items() for target in targets
        if layer_of(target) not in MAY_IMPORT[layer_of(module)]
    )
    assert offenders == [], "\n".join(offenders)
