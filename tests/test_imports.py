"""The import graph of the whole tree, read from the source: no circles, and one door for commands.

Every ``import`` and ``from ... import`` statement counts, at module level and
inside functions (a lazy import is still a dependency), in ``if
TYPE_CHECKING`` blocks too, and so does ``importlib.import_module`` of a
string literal. An edge goes to the module named, ``from edgecap import
stages`` to ``edgecap.stages``; to the package itself only when a name of its
``__init__`` is imported (a submodule's import of its parent package is
implicit and not an edge, or every package whose ``__init__`` imports a
submodule would be a circle). The tree is what installs and runs: edgecap/
(``edgecap``, with ``edgecap.service``), compile/ (installed as
``edgecap_compile``), lab/edgecap_lab/ (the lab, a distribution of its own:
what measures the product), models/ and tools/. tests/ is outside it.
"""

from __future__ import annotations

import ast
import functools
import gc
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
# Folder of the tree -> the package name it imports as.
ROOTS = {"edgecap": "edgecap", "compile": "edgecap_compile", "lab/edgecap_lab": "edgecap_lab",
         "models": "models", "tools": "tools"}
LAB = "edgecap_lab"
# What the wheel a board installs holds: it never imports the lab.
RUNTIME = ("edgecap", "edgecap_compile")
COMMAND = "edgecap.command"  # the shared exit policy: commands only
CLI = "edgecap.cli"
ARGTYPES = "edgecap.argtypes"  # the command lines' shared parser and number types: commands only

Graph = Dict[str, Set[str]]


def _module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


@functools.lru_cache(maxsize=None)
def _parsed(repo: Path) -> Dict[str, Tuple[ast.Module, str, bool]]:
    """Maps each module of the tree to its syntax tree, its text and whether it is an ``__init__``."""
    found = {}
    # The collector would scan the young syntax trees again and again: a third of the time.
    gc.disable()
    try:
        for folder, package in ROOTS.items():
            for path in sorted((repo / folder).rglob("*.py")):
                text = path.read_text()
                found[_module_name(path, repo / folder, package)] = (
                    ast.parse(text, str(path)), text, path.name == "__init__.py")
    finally:
        gc.enable()
    return found


def _known(name: str, modules: Set[str]) -> Optional[str]:
    """The longest prefix of the dotted ``name`` that is a module of the tree, if any."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in modules:
            return prefix
    return None


def _statements(body: List[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body`` and of the blocks nested in it (functions, classes, if, try, ...)."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, block, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def _import_module_calls(tree: ast.Module) -> Iterator[str]:
    """The string literals passed to ``importlib.import_module`` or ``__import__``."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
                in ("import_module", "__import__")):
            yield node.args[0].value


def _targets(tree: ast.Module, text: str, module: str, is_package: bool,
             modules: Set[str]) -> Iterator[str]:
    package = module if is_package else module.rpartition(".")[0]
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found = _known(alias.name, modules)
                if found:
                    yield found
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                # `from edgecap import stages` names a module; `from edgecap.stages import X` a name in one.
                found = _known(f"{base}.{alias.name}", modules) if alias.name != "*" else None
                if found != f"{base}.{alias.name}":
                    found = _known(base, modules)
                if found:
                    yield found
    # Walking every expression is most of the cost: only where a call can be.
    if "import_module(" in text or "__import__(" in text:
        for name in _import_module_calls(tree):
            found = _known(name, modules)
            if found:
                yield found


def _is_script(tree: ast.Module) -> bool:
    """Whether a module ends in an ``if __name__ == "__main__":`` entry."""
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
            return True
    return False


@functools.lru_cache(maxsize=None)
def import_graph(repo: Path = REPO) -> Tuple[Graph, frozenset]:
    """Returns the tree's import graph (module -> modules it imports) and its entry scripts."""
    sources = _parsed(repo)
    modules = set(sources)
    graph: Graph = {}
    scripts = set()
    for module, (tree, text, is_package) in sources.items():
        graph[module] = set(_targets(tree, text, module, is_package, modules)) - {module}
        if _is_script(tree):
            scripts.add(module)
    return graph, frozenset(scripts)


def circles(graph: Graph) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _importers(graph: Graph, target: str) -> Set[str]:
    return {m for m, deps in graph.items() if target in deps}


def _may_import_command(module: str, scripts: frozenset) -> bool:
    # The CLI, the developer scripts, and the compiler's, the lab's and models/' own command-line entries.
    return (module == CLI or module.startswith("tools.")
            or (module in scripts and module.split(".")[0] in ("edgecap_compile", LAB, "models")))


def test_the_tree_has_no_import_circles() -> None:
    graph, _ = import_graph()
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("module", [COMMAND, ARGTYPES])
def test_only_commands_import_the_exit_policy(module: str) -> None:
    graph, scripts = import_graph()
    assert _importers(graph, module), f"nothing imports {module}: the graph misses edges"
    wrong = sorted(m for m in _importers(graph, module) if not _may_import_command(m, scripts))
    assert not wrong, f"{module} is for commands; imported by {', '.join(wrong)}"


def test_nothing_in_the_tree_imports_the_cli() -> None:
    graph, _ = import_graph()
    assert CLI in graph
    wrong = sorted(_importers(graph, CLI))
    assert not wrong, f"{CLI} is the top; imported by {', '.join(wrong)}"


def test_the_runtime_imports_no_lab_module() -> None:
    graph, _ = import_graph()
    assert any(m.startswith(LAB + ".") for m in graph), "the graph misses the lab"
    wrong = sorted(f"{m} -> {t}" for m, deps in graph.items() if m.split(".")[0] in RUNTIME
                   for t in deps if t.split(".")[0] == LAB)
    assert not wrong, "the runtime imports the lab:\n" + "\n".join(wrong)


def test_the_cli_is_the_one_door_to_the_lab() -> None:
    # The door names its module at run time (no edge in the graph): one call, in the CLI, says it.
    door = f'import_module(f"{LAB}.'
    doors = {m: text.count(door) for m, (_, text, _) in _parsed(REPO).items()
             if m.split(".")[0] in RUNTIME and door in text}
    assert doors == {CLI: 1}


def test_argparse_stays_out_of_the_runtime_library() -> None:
    # Command lines are the CLI's or a script's; a runtime module takes arguments, not argv.
    wrong = []
    for module, (tree, _, _) in _parsed(REPO).items():
        if module.startswith("edgecap.") and module not in (CLI, ARGTYPES):
            if any(isinstance(n, (ast.Import, ast.ImportFrom))
                   and "argparse" in ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module])
                   for n in _statements(tree.body)):
                wrong.append(module)
    assert not wrong, f"argparse in runtime modules: {', '.join(wrong)}"


# ---------------------------------------------------------------- the graph reader itself


def _tree(tmp_path: Path, files: Dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in ROOTS:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    return tmp_path


def test_every_kind_of_import_is_an_edge(tmp_path) -> None:
    repo = _tree(tmp_path, {
        "edgecap/__init__.py": "",
        "edgecap/a.py": ("from edgecap import b\n"
                         "from . import c\n"
                         "from .d import thing\n"
                         "import edgecap.e as e\n"
                         "def later():\n"
                         "    from edgecap.service.f import g\n"
                         "    import importlib\n"
                         "    importlib.import_module('edgecap_compile.h')\n"),
        "edgecap/b.py": "", "edgecap/c.py": "", "edgecap/d.py": "", "edgecap/e.py": "",
        "edgecap/service/__init__.py": "",
        "edgecap/service/f.py": "from ..b import x\nfrom .. import c\nfrom edgecap import __version__\n",
        "compile/__init__.py": "", "compile/h.py": "import numpy\nfrom edgecap_compile import h\n",
    })
    graph, _ = import_graph.__wrapped__(repo)
    assert graph["edgecap.a"] == {"edgecap.b", "edgecap.c", "edgecap.d", "edgecap.e",
                                  "edgecap.service.f", "edgecap_compile.h"}
    assert graph["edgecap.service.f"] == {"edgecap.b", "edgecap.c", "edgecap"}
    assert graph["edgecap_compile.h"] == set()


def test_a_lazy_circle_is_reported_by_name(tmp_path) -> None:
    repo = _tree(tmp_path, {
        "edgecap/__init__.py": "",
        "edgecap/x.py": "import edgecap.y\n",
        "edgecap/y.py": "def f():\n    from edgecap.z import g\n",
        "edgecap/z.py": "from edgecap import x\n",
        "edgecap/free.py": "import edgecap.x\n",
        "models/m.py": "from models import n\n", "models/n.py": "import models.m\n",
    })
    graph, _ = import_graph.__wrapped__(repo)
    assert circles(graph) == [["edgecap.x", "edgecap.y", "edgecap.z"], ["models.m", "models.n"]]


def test_only_entry_scripts_may_import_the_exit_policy(tmp_path) -> None:
    main = "from edgecap.command import run_command\nif __name__ == '__main__':\n    pass\n"
    repo = _tree(tmp_path, {
        "edgecap/__init__.py": "", "edgecap/command.py": "", "edgecap/cli.py": main,
        "edgecap/bench.py": main, "compile/validity.py": main,
        "compile/plan.py": "from edgecap.command import run_command\n",
        "tools/soak.py": "from edgecap.command import run_command\n",
    })
    graph, scripts = import_graph.__wrapped__(repo)
    allowed = {m: _may_import_command(m, scripts) for m in _importers(graph, COMMAND)}
    assert allowed == {"edgecap.cli": True, "edgecap.bench": False, "edgecap_compile.validity": True,
                       "edgecap_compile.plan": False, "tools.soak": True}


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}}, [["a", "b", "c"], ["d", "e"]]),
])
def test_circles_are_the_strongly_connected_components(graph, expected) -> None:
    assert circles(graph) == expected
