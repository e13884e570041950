"""The package's shape, checked from the source tree: imports point one way and never loop, the
top level stays small, and the core never reaches into the engine, the merge, the nodes or the
Prefect glue. Every import counts, also those inside functions or under ``TYPE_CHECKING``: a loop
hidden behind a function-level import is still a loop."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"prefect_odm": "prefect_odm", "flows": "prefect_odm.flows", "tasks": "prefect_odm.tasks",
         "blocks": "prefect_odm.blocks"}  # fmt: skip
"""Source folder -> the package it installs as (setup.py)."""

CORE_PACKAGES = ("prefect_odm.plan", "prefect_odm.align")
"""Pure-core subpackages, beside the top-level modules."""

OUTER = ("engine", "merge", "nodes", "flows", "tasks", "blocks", "cli")
"""Subpackages the core must not import."""

MAX_TOP_LEVEL_MODULES = 15

MAX_MODULE_LINES = 500
"""Longest library module, lines: a longer one is split by moving a cohesive part out."""

MAX_FUNCTION_LINES = 80
"""Longest function or method, lines from ``def`` to its last line (docstring included)."""

GLUE = ("flows", "tasks")
"""Source folders of the Prefect glue, whose public functions may not reuse a core name."""

PENDING_NAME_CLASHES = {"align_submodels"}
"""Clashes left to the helper rewriting ``prefect_odm/align/`` and ``tasks/align.py`` (issue 29):
empty this set when that branch is merged."""


def modules() -> dict[str, Path]:
    """Installed module name -> its source file."""
    found: dict[str, Path] = {}
    for folder, package in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports (anywhere in its body)."""
    mods = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target in mods and target != name:
                    graph[name].add(target)
                    break
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for targets in graph.values() for w in targets}):
        if v not in index:
            visit(v)
    return found


def is_core(name: str) -> bool:
    top = name.count(".") == 1 and (REPO / "prefect_odm" / f"{name.split('.')[1]}.py").exists()
    return top or name.startswith(CORE_PACKAGES)


def test_no_import_loop_hidden_or_not() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_sees_a_loop() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_imports_no_engine_merge_nodes_or_glue() -> None:
    graph = import_graph()
    core = [m for m in modules() if is_core(m)]
    assert "prefect_odm.plan.memory" in core and "prefect_odm.grid" in core
    wrong = {
        m: sorted(t for t in graph[m] if t.split(".")[1] in OUTER)
        for m in core
        if any(t.split(".")[1] in OUTER for t in graph[m])
    }
    assert wrong == {}


def test_the_top_level_stays_small() -> None:
    top = sorted(p.name for p in (REPO / "prefect_odm").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_every_package_folder_is_a_package() -> None:
    """setup.py finds packages by their ``__init__.py``: a folder of modules without one would
    be left out of the wheel (as ``prefect_odm.align`` once was)."""
    for folder in ROOTS:
        for path in (REPO / folder).rglob("*.py"):
            for parent in path.relative_to(REPO / folder).parents:
                if parent != Path(".") and "__pycache__" not in parent.parts:
                    assert (REPO / folder / parent / "__init__.py").exists(), parent


def oversized(paths: dict[str, Path]) -> list[str]:
    """``module: N lines`` and ``module.function: N lines`` for every module over
    :data:`MAX_MODULE_LINES` and every function over :data:`MAX_FUNCTION_LINES`."""
    found: list[str] = []
    for name, path in sorted(paths.items()):
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}.{node.name}: {length} lines")
    return found


def public_functions(folder: Path) -> dict[str, list[str]]:
    """Module-level public function name -> the files under ``folder`` that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(folder.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_"):
                    found[node.name].append(str(path.relative_to(folder.parent)))
    return found


def name_clashes(core: Path, glue: list[Path]) -> dict[str, list[str]]:
    """Public function names defined both in the core package ``core`` and in a glue folder,
    with every file that defines each (one name per function: grep and tracebacks stay
    unambiguous, and a task never hides the core function of the same name)."""
    in_core = public_functions(core)
    clashes: dict[str, list[str]] = {}
    for folder in glue:
        for name, files in public_functions(folder).items():
            if name in in_core:
                clashes.setdefault(name, list(in_core[name])).extend(files)
    return clashes


def test_one_name_per_function_across_core_and_glue() -> None:
    clashes = name_clashes(REPO / "prefect_odm", [REPO / g for g in GLUE])
    assert set(clashes) <= PENDING_NAME_CLASHES, clashes


def test_the_name_check_sees_a_task_named_as_a_core_function(tmp_path: Path) -> None:
    (tmp_path / "core" / "sub").mkdir(parents=True)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "core" / "sub" / "m.py").write_text("def merge(a): ...\ndef _private(): ...\n")
    (tmp_path / "tasks" / "t.py").write_text("def merge(a, b): ...\ndef _private(): ...\n")
    (tmp_path / "tasks" / "u.py").write_text("def other(): ...\n")
    assert name_clashes(tmp_path / "core", [tmp_path / "tasks"]) == {
        "merge": ["core/sub/m.py", "tasks/t.py"]
    }


def test_modules_and_functions_stay_short() -> None:
    assert oversized(modules()) == []


def test_the_size_check_sees_a_long_module_and_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long_function = tmp_path / "long_function.py"
    long_function.write_text(f"def long_one() -> None:\n{body}\n")
    long_module = tmp_path / "long_module.py"
    long_module.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    short = tmp_path / "short.py"
    short.write_text(f"def short_one() -> None:\n{body[: body.rindex(chr(10))]}\n")
    assert oversized({"a": long_function, "b": long_module, "c": short}) == [
        f"a.long_one: {MAX_FUNCTION_LINES + 1} lines",
        f"b: {MAX_MODULE_LINES + 1} lines",
    ]
