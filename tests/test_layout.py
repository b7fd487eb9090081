"""The import direction of ``../shared/DESIGN.md`` ("Folders"), checked on the source itself.

Every ``import``/``from ... import`` of every module (at any depth, including imports inside
functions) is resolved to a top-level room; a room may import only the rooms listed for it.
No cycles follow: the allowed graph is acyclic (checked too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# room -> the rooms of ours it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "model": set(),
    "spanner": {"model"},
    "formats": {"model"},
    "cache": {"model"},
    "analysis": {"model", "cache"},
    "demo": {"model", "spanner"},
    "spark": {"model", "spanner", "formats"},
    "jobs": {"model", "spanner", "formats", "cache", "spark", "demo", "analysis"},
    "cli": {"model", "jobs", "analysis", "cache"},
    "main": {"cli"},
    "app": {"app", "model", "jobs", "analysis", "cache", "formats", "demo", "spanner"},
    "pages": {"app", "model"},
}
THIRD_PARTY_FORBIDDEN: dict[str, set[str]] = {
    # UI never starts Spark itself; the backend never imports the UI.
    "app": {"pyspark"},
    "pages": {"pyspark", "duckdb"},
    **{room: {"streamlit", "plotly"} for room in
       ("model", "spanner", "formats", "cache", "demo", "spark", "jobs", "cli")},
    "model": {"pyspark", "streamlit", "plotly", "duckdb"},
}


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "spark_backend":
        if len(parts) == 1:
            return None
        return {"__main__": "main"}.get(parts[1], parts[1])
    if parts[0] in ("app", "pages"):
        return parts[0]
    if parts[0] in ("fixtures", "tests"):
        return parts[0]
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "spark_backend":  # ``from spark_backend import jobs``: the room jobs
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


def _sources() -> list[Path]:
    files = []
    for top in ("spark_backend", "app", "pages"):
        files += sorted((ROOT / top).rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


def test_every_room_imports_only_what_the_design_allows():
    problems = []
    for path in _sources():
        here = _room(_module_name(path))
        if here is None:
            continue
        for line, target in _imports(path):
            there = _room(target)
            top = target.split(".")[0]
            if there is not None and there != here and there not in ALLOWED[here]:
                problems.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {target}")
            if top in THIRD_PARTY_FORBIDDEN.get(here, set()):
                problems.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {top}")
    assert not problems, "imports against the design:\n" + "\n".join(sorted(set(problems)))


def test_the_allowed_graph_has_no_cycles():
    seen: dict[str, int] = {}

    def visit(room: str, stack: tuple[str, ...]) -> None:
        assert room not in stack, "cycle: " + " -> ".join((*stack, room))
        if seen.get(room):
            return
        for other in ALLOWED.get(room, set()) - {room}:
            visit(other, (*stack, room))
        seen[room] = 1

    for room in ALLOWED:
        visit(room, ())


def test_the_checker_catches_a_wrong_import(tmp_path):
    """The checker itself can fail: a cache module importing pyspark's room is reported."""
    bad = ROOT / "spark_backend" / "cache" / "_layout_probe.py"
    bad.write_text("from spark_backend.jobs import pull  # noqa\nimport streamlit  # noqa\n")
    try:
        try:
            test_every_room_imports_only_what_the_design_allows()
        except AssertionError as e:
            assert "_layout_probe.py:1 (cache) imports spark_backend.jobs" in str(e)
            assert "_layout_probe.py:2 (cache) imports streamlit" in str(e)
        else:
            raise AssertionError("a forbidden import went unnoticed")
    finally:
        bad.unlink()


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (at any depth, inside functions too); ``from
    package import name`` names the submodule when ``name`` is one, else the package."""
    modules = {_module_name(path): path for path in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base
                                                                             else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in modules else base)
        deps = set()
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The one cycle left, for the cache's owner to break (``Cache.ingest`` imports the ingest
# module, which imports ``IngestStats`` and ``rebuild_transactions`` from the store). Listed
# here so no new one comes in meanwhile; the test fails once it is gone, to drop it here too.
KNOWN_CYCLES = [["spark_backend.cache.ingest", "spark_backend.cache.store"]]


def test_no_two_modules_import_each_other_even_through_others():
    """File level, inside a folder too: no module of ours imports one that (through any
    chain, lazy imports included) imports it back."""
    cycles = _cycles(_module_graph())
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in new)
    gone = [c for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"no longer a cycle, drop it from KNOWN_CYCLES: {gone}"


def test_the_cycle_check_catches_a_cycle_inside_a_folder():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert _cycles(graph) == [["a.x", "a.y", "a.z"]]
    assert _cycles({"a.x": {"a.y"}, "a.y": set()}) == []
