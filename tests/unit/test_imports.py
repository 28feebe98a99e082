"""The import graph of celery_durable: no circles, and arrows that run one way.

Read from the source (nothing imported): every import counts, module level, lazy inside a
function, or under ``if TYPE_CHECKING:`` — a type-only import is still a dependency of the
design. ``from pkg import name`` is followed through ``pkg/__init__.py`` to the module that
defines ``name``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "celery_durable"

#: layer of each module (by longest matching prefix); a module may import only its own layer or lower
LAYERS = {
    "_moved": 0,  # old module paths, imported by name at run time only
    "errors": 0,
    "codecs": 0,
    "retry": 0,
    "settings": 0,
    "observability": 0,
    "stores": 1,
    "engine": 2,
    "workflow": 3,
    "activity": 3,  # the API inside activities (celery_durable.activity)
    "handle": 3,
    "start_options": 3,  # Workflow.options(...)
    "glue": 4,  # the Celery glue
    # public paths of glue objects (celery_durable.signals, .metrics, .outbox, .contrib.filesystem:Transport)
    "signals": 5,
    "metrics": 5,
    "outbox": 5,
    "contrib": 5,
    "cli": 5,
    "app": 5,
    "schedules": 5,  # durable.schedules: managed schedules' facade
    "day_two": 5,  # Durable's day-two operations (pause, batch, canvas)
    "ui": 5,  # the web UI: an app over the engine, imported (lazily) by the cli only
    "testing": 6,
    "": 7,  # the package's __init__: the public API
}
LAYER_NAMES = {
    0: "basics",
    1: "stores",
    2: "engine",
    3: "workflow API",
    4: "Celery glue",
    5: "app/cli/ui and public aliases",
    6: "testing",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(module: str, level: int, target: str | None) -> str:
    """Absolute module name (without the ``celery_durable.`` prefix) of a relative import."""
    is_pkg = MODULES[module].name == "__init__.py" if module in MODULES else False
    base = module.split(".") if module else []
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *(target.split(".") if target else [])])


def _defining(module: str, name: str, seen: frozenset[str] = frozenset()) -> str:
    """Follow ``from module import name`` through package re-exports to the defining module."""
    sub = f"{module}.{name}" if module else name
    if sub in MODULES:
        return sub
    path = MODULES.get(module)
    if path is None or path.name != "__init__.py" or module in seen:
        return module
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            if any((a.asname or a.name) == name for a in node.names):
                source = _resolve(module, node.level, node.module)
                return _defining(source, name, seen | {module})
    return module


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                source = _resolve(module, node.level, node.module)
                targets = [_defining(source, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("celery_durable"):
                source = node.module.removeprefix("celery_durable").lstrip(".")
                targets = [_defining(source, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [
                    a.name.removeprefix("celery_durable").lstrip(".")
                    for a in node.names
                    if a.name.startswith("celery_durable")
                ]
            graph[module].update(t for t in targets if t in MODULES and t != module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".") or p == ""), key=len)
    return LAYERS[best]


def test_the_graph_reader_sees_imports() -> None:
    graph = _edges()
    # a module-level import, a lazy one and a type-only one are all edges
    assert "engine.core" in graph["app"]
    assert "glue.hooks" in graph["signals"]
    assert "stores.base" in graph["engine.core"]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_import_circles() -> None:
    circles = _cycles(_edges())
    assert not circles, f"import circles: {circles}"


def test_imports_run_one_way() -> None:
    """glue → engine → stores → basics: never an arrow to a higher layer."""
    graph = _edges()
    bad = [
        f"{m} ({LAYER_NAMES.get(_layer(m), 'api')}) imports {t} ({LAYER_NAMES.get(_layer(t), 'api')})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if _layer(t) > _layer(m)
    ]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_cited_design_documents_are_in_the_project() -> None:
    """Docstrings point at docs/architecture.md, which lives here (not at a file outside the repo);
    so do the README and the documentation pages, whose other docs/... citations exist too."""
    import re

    root = PKG.parent
    cited: set[str] = set()
    for path in [*PKG.rglob("*.py"), root / "README.md", *(root / "docs").rglob("*.md")]:
        text = path.read_text()
        assert "DESIGN.md" not in text, f"{path} cites DESIGN.md, which is not part of the project"
        cited.update(re.findall(r"docs/[\w.-]+(?:/[\w.-]+)*\.md", text))
    assert "docs/architecture.md" in cited
    missing = sorted(c for c in cited if not (root / c).exists())
    assert not missing, f"cited but missing: {missing}"
