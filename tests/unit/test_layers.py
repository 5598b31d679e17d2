"""The package's layers (docs/architecture.md, "Layers"): every module of src/libreyolo has a row,
no import runs from a lower layer to a higher one, and no modules import each other in a circle.

Imports are read from the code (ast), at module level and inside functions alike, with the task
specs' `lazy("module", name)` references; importing `a.b.c` from outside package `a.b` also runs
`a/b/__init__.py`, so that counts as an import of it too (the package `libreyolo` itself excepted:
its `__init__.py` is the face, which every import runs first; and a package whose `__init__.py`
imports nothing runs nothing)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in (SRC / "libreyolo").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _imports(modules: dict[str, tuple[Path, bool]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs between modules of the package."""
    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = set()
    for mod, (path, package) in modules.items():
        here = mod.split(".") if package else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else node.module or ""
                names = [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                names = [node.args[0].value]
            for name in names:
                target = known(name) if name.startswith("libreyolo") else None
                if target is None or target == mod:
                    continue
                edges.add((mod, target))
    importing = {a for a, _ in edges}
    for mod, target in list(edges):
        parts = target.split(".")
        for i in range(2, len(parts)):  # the packages on the way, from outside them
            pkg = ".".join(parts[:i])
            if pkg in importing and not mod.startswith(pkg + ".") and mod != pkg:
                edges.add((mod, pkg))  # (a package whose __init__.py imports nothing runs nothing)
    return edges


def _layers() -> dict[str, int]:
    """Docs table rows -> {module or package prefix: layer number}."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    out = {}
    for number, cells in re.findall(r"^\| (\d+) [^|]*\|[^|]*\| (.*) \|$", section, flags=re.M):
        for path in re.findall(r"`([^`]+)`", cells):
            name = "libreyolo" + ("." + path.removesuffix("/").removesuffix(".py").replace("/", ".")
                                  if path != "__init__.py" else "")
            out[name] = int(number)
    return out


def _layer_of(module: str, layers: dict[str, int]) -> int | None:
    best = None
    for prefix in layers:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else layers[best]


def test_every_module_has_a_layer_and_no_import_climbs():
    modules, layers = _modules(), _layers()
    assert len(layers) > 20, "the Layers table of docs/architecture.md was not read"
    assert set(layers) <= set(modules), f"rows naming no module: {sorted(set(layers) - set(modules))}"
    unplaced = sorted(m for m in modules if _layer_of(m, layers) is None)
    assert not unplaced, f"modules without a row in docs/architecture.md's Layers table: {unplaced}"
    climbs = sorted(f"{a} (layer {_layer_of(a, layers)}) imports {b} (layer {_layer_of(b, layers)})"
                    for a, b in _imports(modules) if _layer_of(b, layers) > _layer_of(a, layers))
    assert not climbs, "\n".join(climbs)


def test_no_import_circles():
    edges = _imports(_modules())
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    # Tarjan's strongly connected components: a component of two or more modules is a circle.
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_a_climbing_import_would_be_seen():
    """The reader itself: the trainer imports the hooks' seam, which imports nothing above it."""
    edges = _imports(_modules())
    assert ("libreyolo.engine.trainer", "libreyolo.engine.run") in edges
    assert ("libreyolo.tasks.detect", "libreyolo.eval.table") in edges  # a lazy() reference
    assert ("libreyolo.engine.step", "libreyolo.markers") in edges
    assert ("libreyolo.engine.trainer", "libreyolo.tasks") in edges  # tasks.base runs tasks/__init__.py
