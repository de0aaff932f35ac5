"""The layering the folders promise, read from the source with `ast` (nothing is imported):

- no import cycles among the project's modules, counting every import (inside functions and under
  TYPE_CHECKING too: a lazy import hides a cycle from Python, not from the reader);
- backend/ and kernels/ never import gateway/ (the engine is the lower layer; docs/architecture.md);
- gateway/ never imports torch, anywhere (a routing-only gateway runs without it: the torch imports live in
  backend/, which gateway/__main__.py reaches lazily and only when it builds the embedded engine);
- inside gateway/ and inside backend/, every import points down a declared order of layers (GATEWAY_LAYERS,
  BACKEND_LAYERS: lowest first); a module may import its own layer and the ones below, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "backend", "kernels", "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    return {
        module_name(p): p
        for package in PACKAGES
        for p in sorted((root / package).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _at_import_time(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run when the module is imported: not function bodies, not `if TYPE_CHECKING:` blocks."""
    out: list[ast.stmt] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(node, field, []))
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path], import_time: bool = False) -> set[str]:
    """Every module `name` imports (project modules resolved to the module, others as written); with
    `import_time`, only the imports that run when it is imported."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    nodes = _at_import_time(tree) if import_time else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in modules else module)  # `from pkg import module` imports the module
    return found


def import_graph(import_time: bool = False) -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules, import_time) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) per strongly connected component of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan, iteratively (no recursion limit on a long chain)
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            for w in edges:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_in(sorted(c), graph) for c in components]


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside the component)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return component  # unreachable for a strongly connected component


def test_find_cycles_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(find_cycles(graph)) == [["a", "b", "c", "a"], ["e", "e"]]


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_backend_and_kernels_never_import_gateway() -> None:
    graph = import_graph()
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.split(".")[0] in {"backend", "kernels"}
        for target in targets
        if target.split(".")[0] == "gateway"
    )
    assert not wrong, "the lower layers import the gateway:\n" + "\n".join(wrong)


HEAVY = {"torch", "triton", "transformers", "kernels"}  # torch, and what imports it


# The gateway's layers, lowest first. A name stands for that module and everything under it; a module belongs to the
# layer of the longest name that covers it (gateway.keys.config is a config piece, the rest of gateway.keys is keys).
GATEWAY_LAYERS: list[set[str]] = [
    {"gateway.errors", "gateway.ids"},  # the one exception tree, request ids
    # the config pieces each package owns: frozen dataclasses and the parsing of their own YAML section
    {
        "gateway.keys.config",
        "gateway.routing.config",
        "gateway.cache.config",
        "gateway.batches.config",
        "gateway.spend.config",
        "gateway.tracing.config",
    },
    {"gateway.config"},  # the assembler: the YAML file and the environment -> GatewayConfig
    {"gateway.aliases", "gateway.models", "gateway.client", "gateway.ratelimit"},  # shared parts with no policy
    {"gateway.ops"},  # the request record, metrics, live stats, the access log
    {"gateway.tracing"},
    {"gateway.protocol"},
    {"gateway.spend"},
    {"gateway.keys"},
    {"gateway.cache"},
    {"gateway.routing"},
    {"gateway.context"},  # the per-app context the handlers share
    {"gateway.batches"},
    {"gateway.api", "gateway.openai_responses", "gateway.anthropic"},  # the endpoints
    {"gateway.middleware"},
    {"gateway.app"},
    {"gateway.__main__", "gateway.usage"},  # the command lines
]


# The engine's layers, lowest first (kernels/ is below them all, gateway/ above). quant/ holds the linear layers and
# their weight formats (dense prepacked GEMMs, INT4/INT8, GGUF); model/ the network, its weights and how it splits over
# ranks; the engine's parts (requests, scheduler, KV cache, sampler, model runner) sit under spec/, whose drafters
# work on them; the engine's loop (llm_engine, async_engine) drives spec/; parallel/ drives the engine over processes.
BACKEND_LAYERS: list[set[str]] = [
    {"backend.errors", "backend.config"},
    {"backend.quant"},
    {"backend.model"},
    {"backend.engine"},  # the engine's parts
    {"backend.spec"},
    {"backend.engine.llm_engine", "backend.engine.async_engine", "backend.embed"},  # the two engines
    # the drivers and command lines: one engine over processes, fetching models, training Medusa heads (on the
    # engine's own answers)
    {"backend.parallel", "backend.fetch", "backend.spec.medusa_data", "backend.spec.medusa_train"},
]


def layer_of(module: str, layers: list[set[str]]) -> int | None:
    """The index of the layer whose longest name covers `module` (the name itself or a package above it)."""
    best: tuple[int, int] | None = None
    for i, names in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > best[0]):
                best = (len(name), i)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Every `module -> target` where the target's layer is above the module's (both in some layer)."""
    out = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module, layers)
        if mine is None:
            continue
        for target in sorted(targets):
            theirs = layer_of(target, layers)
            if theirs is not None and theirs > mine:
                out.append(f"{module} -> {target}")
    return out


def unplaced(graph: dict[str, set[str]], root: str, layers: list[set[str]]) -> list[str]:
    """The modules under `root` no layer covers (the root package itself, an empty namespace, is not one)."""
    return sorted(m for m in graph if m.startswith(root + ".") and layer_of(m, layers) is None)


def test_upward_imports_are_reported() -> None:
    layers = [{"p.low"}, {"p.mid", "p.mid2"}, {"p.top"}, {"p.low.up"}]
    graph = {"p.low": {"p.mid"}, "p.low.up": {"p.top"}, "p.mid": {"p.mid2", "p.low"}, "p.top": {"p.mid.x"}}
    assert upward_imports(graph, layers) == ["p.low -> p.mid"]
    assert unplaced({"p.low.a": set(), "p.other": set(), "p": set()}, "p", layers) == ["p.other"]


def _check_layers(root: str, layers: list[set[str]]) -> None:
    graph = import_graph()
    missing = unplaced(graph, root, layers)
    assert not missing, f"modules of {root}/ in no layer (add them to its layers):\n" + "\n".join(missing)
    stale = sorted(n for names in layers for n in names if not any(m == n or m.startswith(n + ".") for m in graph))
    assert not stale, "layer names that name no module:\n" + "\n".join(stale)
    up = upward_imports(graph, layers)
    assert not up, f"{root}/ imports that point up its layers:\n" + "\n".join(up)


def test_gateway_imports_point_down() -> None:
    _check_layers("gateway", GATEWAY_LAYERS)


def test_backend_imports_point_down() -> None:
    _check_layers("backend", BACKEND_LAYERS)


def test_kernels_never_import_backend() -> None:
    graph = import_graph()
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.split(".")[0] == "kernels"
        for target in targets
        if target.split(".")[0] in {"backend", "gateway"}
    )
    assert not wrong, "kernels/ imports the layers above it:\n" + "\n".join(wrong)


def test_gateway_never_imports_torch() -> None:
    """No gateway module imports torch itself, anywhere; and importing any gateway module loads no torch through
    the backend modules it imports (backend.engine.outputs, backend.config, ...: torch-free types)."""
    graph = import_graph()
    direct = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.split(".")[0] == "gateway"
        for target in targets
        if target.split(".")[0] in HEAVY
    )
    assert not direct, "the gateway imports torch (or what needs it):\n" + "\n".join(direct)
    at_import = import_graph(import_time=True)
    for module in (m for m in at_import if m.split(".")[0] == "gateway"):
        path, seen = {module: [module]}, [module]
        while seen:
            v = seen.pop()
            for w in sorted(at_import.get(v, ())):
                if w.split(".")[0] in HEAVY:
                    raise AssertionError(f"importing {module} imports {w}: " + " -> ".join([*path[v], w]))
                if w in at_import and w not in path:
                    path[w] = [*path[v], w]
                    seen.append(w)
