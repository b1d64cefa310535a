"""The shape of the package: floors in one direction of flow, no import circle, no module
reaching into another's private names, modules of a readable size.

The import graph is built from the source with :mod:`ast` (every ``import`` and ``from ...
import``, at module level or inside a function; imports under ``if TYPE_CHECKING:`` are type
annotations only and are left out).
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "parosim"

#: the floors, lowest first; a module may import its own floor and the floors below it
FLOORS = [
    {"errors"},
    {"units"},
    {"spec"},
    {"plots"},
    {"io"},
    {"fabric"},
    {"collectives"},
    {"cost"},
    {"plan"},
    {"evaluate"},
    {"simulate"},
    {"studies", "calibrate", "sweep"},
    {"validate"},
    {"cli"},
]
RANK = {name: i for i, floor in enumerate(FLOORS) for name in floor}
MAX_LINES = 800


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = ["parosim", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


MODULES = _modules()


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _imports(mod: str, path: pathlib.Path):
    """(target module, imported names, line) for every parosim import of ``mod``."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("parosim"):
                continue
            names = [a.name for a in node.names]
            # ``from . import x`` imports the submodule x
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            if subs:
                for s in subs:
                    yield s, [], node.lineno
            else:
                yield target, names, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("parosim"):
                    yield a.name, [], node.lineno


def _floor(mod: str) -> str:
    parts = mod.split(".")
    if parts[-1] == "__main__":
        return "cli"            # ``python -m parosim.X`` entry points sit with the command line
    return parts[1] if len(parts) > 1 else "parosim"


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for mod, path in MODULES.items():
        g.add_node(mod)
        for target, _, line in _imports(mod, path):
            if target in MODULES and target != mod:
                g.add_edge(mod, target, line=line)
    return g


def test_the_import_graph_sees_the_package():
    g = _graph()
    assert len(MODULES) > 60 and g.number_of_edges() > 200
    assert g.has_edge("parosim.simulate.step", "parosim.evaluate.replay")


def test_no_import_circle():
    g = _graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert cycles == []


def test_floors_import_only_downwards():
    bad = []
    for mod, path in MODULES.items():
        here = _floor(mod)
        if here == "parosim":
            continue
        for target, _, line in _imports(mod, path):
            there = _floor(target)
            if there in ("parosim", here):
                continue
            assert there in RANK, f"{target}: floor {there!r} is not in FLOORS"
            if RANK[there] >= RANK[here]:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} {mod} -> {target}")
    assert bad == []


def test_no_module_imports_private_names_of_another():
    bad = []
    for mod, path in MODULES.items():
        for target, names, line in _imports(mod, path):
            for n in names:
                if n.startswith("_") and not n.startswith("__") and target != mod:
                    bad.append(f"{path.relative_to(ROOT.parent)}:{line} {n} from {target}")
    assert bad == []


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_size(mod):
    n = len(MODULES[mod].read_text().splitlines())
    assert n <= MAX_LINES, f"{mod} has {n} lines (at most {MAX_LINES})"


def test_floors_cover_every_package():
    pkgs = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    mods = {p.stem for p in ROOT.glob("*.py")} - {"__init__", "__main__"}
    assert pkgs | mods <= set(RANK)


def test_old_import_paths_are_aliases_of_the_new_modules():
    import importlib
    import warnings

    import parosim

    for old, new in parosim.MOVED.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            a = importlib.import_module(old)
        homes = [importlib.import_module(n) for n in new.split("|")]
        if len(homes) == 1:
            assert a is homes[0], old
        for home in homes:      # every public name of every new home is reachable
            for name in (n for n in vars(home) if not n.startswith("_")):
                first = next(h for h in homes if hasattr(h, name))   # earlier homes win
                assert getattr(a, name) is getattr(first, name), (old, name)


def test_function_local_imports_are_explained():
    """A deferred import says why (a comment on its line or the line above)."""
    bad = defaultdict(list)
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    here = " ".join(lines[node.lineno - 1:node.end_lineno])
                    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                    first = next((i for i in range(node.lineno - 2, fn.lineno - 1, -1)
                                  if not lines[i].strip().startswith(("from ", "import ", ")"))
                                  and lines[i].strip()), None)
                    block = lines[first].strip() if first is not None else ""
                    if "#" not in here and not above.startswith("#") and not (
                            block.startswith("#")):
                        bad[str(path.relative_to(ROOT.parent))].append(node.lineno)
    assert dict(bad) == {}


def test_version_is_the_installed_one():
    import re
    import subprocess
    import sys

    import parosim

    toml = (ROOT.parent / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', toml, re.M).group(1) == parosim.__version__
    out = subprocess.run([sys.executable, "-m", "parosim", "--version"], capture_output=True,
                         text=True, cwd=ROOT.parent, check=True).stdout
    assert out == f"parosim {parosim.__version__}\n"


def test_the_core_imports_no_pandas_matplotlib_or_torch():
    core = {"errors", "units", "spec", "io", "fabric", "collectives", "cost", "plan", "evaluate",
            "simulate"}
    bad = []
    for mod, path in MODULES.items():
        if _floor(mod) not in core:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{mod}: {n}" for n in names
                    if n.split(".")[0] in ("pandas", "matplotlib", "torch")]
    assert bad == []
