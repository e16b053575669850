"""The tree is clean under the ruff configuration in pyproject.toml (CI runs this test with the suite)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    try:
        import ruff  # noqa: F401
    except ImportError:
        pytest.fail("ruff is not installed: run run_scripts/setup_env.sh (requirements.txt pins it)")
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix`):\n{res.stdout}"


def test_ruff_format_is_clean():
    """The formatter configuration in pyproject.toml ([tool.ruff.format]) is applied to the whole tree."""
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, f"files not formatted (run `ruff format .`):\n{res.stdout}"


def _our_modules() -> dict[str, Path]:
    """Every module of our packages by dotted name (a package by its own name)."""
    mods = {}
    for package in OURS:
        for path in (REPO / package).rglob("*.py"):
            mods[".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")] = path
    return mods


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports anywhere in its source (module level, inside functions, relative
    imports resolved; ``from pkg import mod`` counts as ``pkg.mod``). A lazy import inside a function still makes
    the two modules depend on each other: only the order of loading changes."""

    def ours(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {ours(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                deps |= {f"{module}.{a.name}" if f"{module}.{a.name}" in mods else ours(module) for a in node.names}
        graph[name] = {d for d in deps if d and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``) of the graph, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep, path + [dep])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle_among_our_modules():
    """Our modules import each other in one direction only, across packages and also through imports inside
    functions (common.error_exit's rank question <-> common.launch was the last cycle; data_pipeline.samples <->
    its loader the one before)."""
    cycle = find_cycle(import_graph(_our_modules()))
    assert cycle is None, "import cycle (move what both need to the lower module or a third one): " + " -> ".join(cycle)


def test_the_cycle_check_sees_lazy_relative_and_from_package_imports(tmp_path):
    mods = {"p": tmp_path / "__init__.py", "p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py", "p.c": tmp_path / "c.py"}
    mods["p"].write_text("")
    mods["p.a"].write_text("from p import b\n")
    mods["p.b"].write_text("def f():\n    from .c import g\n")
    mods["p.c"].write_text("import p.a.x\n")  # a name inside p.a: still p.a
    assert import_graph(mods) == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}
    assert find_cycle(import_graph(mods)) == ["p.a", "p.b", "p.c", "p.a"]
    mods["p.c"].write_text("import os\n")
    assert find_cycle(import_graph(mods)) is None


SHIM = re.compile(r"warn\((?:[^()]|\([^()]*\))*DeprecationWarning|deprecated_alias|is deprecated")


def release_shims(path: Path) -> list[str]:
    """What in ``path`` keeps an old name alive: a DeprecationWarning, a deprecated flag spelling, a module-level
    ``__getattr__`` (the redirect of a moved name)."""
    text = path.read_text(encoding="utf-8")
    found = sorted({m.group(0)[:40] for m in SHIM.finditer(text)})
    tree = ast.parse(text, str(path))
    return found + [
        f"line {n.lineno}: module __getattr__" for n in tree.body if getattr(n, "name", "") == "__getattr__"
    ]


def test_no_release_shims():
    """No release was ever made, so nothing keeps an old module path, name or flag alive: a rename changes every
    caller and the CHANGELOG names the new spelling (the shims were removed in issue #46)."""
    found = {str(p.relative_to(REPO)): s for p in _our_modules().values() if (s := release_shims(p))}
    assert not found, f"release shims (remove them, update the callers): {found}"


def test_the_shim_check_sees_warnings_aliases_and_module_getattr(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import warnings\nwarnings.warn(f'{old} moved', DeprecationWarning, stacklevel=2)\n")
    assert release_shims(src) == ["warn(f'{old} moved', DeprecationWarning"]
    src.write_text("add_deprecated_alias(p, p.add_argument('--a'), '--b')\ndef __getattr__(name):\n    pass\n")
    assert release_shims(src) == ["deprecated_alias", "line 2: module __getattr__"]
    src.write_text(
        "class A:\n    def __getattr__(self, n):\n        pass\nwarnings.simplefilter('ignore', DeprecationWarning)\n"
    )
    assert release_shims(src) == []


SHIPPED_DATA = ("run_scripts/sample_data/",)
MAX_TRACKED_BYTES = 1 << 20


def test_no_large_tracked_file():
    """Nothing over 1 MB is tracked outside the shipped sample data (wheels were committed by accident once)."""
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout")
    res = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
    large = []
    for name in res.stdout.decode().split("\0"):
        path = REPO / name
        if name and not name.startswith(SHIPPED_DATA) and path.is_file() and path.stat().st_size > MAX_TRACKED_BYTES:
            large.append(f"{name} ({path.stat().st_size / 1e6:.1f} MB)")
    assert not large, "tracked files over 1 MB (git rm --cached them and add a .gitignore rule):\n" + "\n".join(large)


OURS = ("common", "data_pipeline", "model", "pretrain", "tools", "benchmarks", "devtools")
ALLOWED_IMPORTS: dict[str, set[str]] = {
    "common": set(),
    "data_pipeline": {"common"},
    "model": {"common"},
    "pretrain": {"common", "data_pipeline", "model"},
    "tools": {"common", "data_pipeline", "model", "pretrain"},
    "benchmarks": {"common", "data_pipeline", "model", "pretrain", "tools"},
    "devtools": {"common", "data_pipeline", "model", "pretrain", "tools", "benchmarks"},
}
"""Which of our packages each package may import (itself always): the table of docs/architecture.md."""


def _imported_packages(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, our package) for every import in the file, module level or inside functions, relative ones resolved."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            root = package if node.level else (node.module or "").split(".")[0]
            out.append((node.lineno, root))
    return [(line, root) for line, root in out if root in OURS]


def test_packages_import_only_the_layers_below():
    assert set(ALLOWED_IMPORTS) == set(OURS)
    wrong = []
    for package, allowed in ALLOWED_IMPORTS.items():
        for path in sorted((REPO / package).rglob("*.py")):
            for line, root in _imported_packages(path, package):
                if root != package and root not in allowed:
                    wrong.append(f"{path.relative_to(REPO)}:{line}: {package} -> {root}")
    assert not wrong, "imports against the layering (docs/architecture.md, Module boundaries):\n" + "\n".join(wrong)


def test_no_module_of_ours_imports_the_tests_or_the_gpu_check():
    """tests/ sits above everything (a benchmark that imported tests/cuda_contracts.py made the test suite a
    dependency of the product), and the GPU check is a runner: nothing imports it but itself."""
    wrong = []
    for package in OURS:
        for path in sorted((REPO / package).rglob("*.py")):
            inside = path.relative_to(REPO).as_posix().startswith("devtools/gpu_check/")
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                for name in names:
                    if name.split(".")[0] == "tests" or (name.startswith("devtools.gpu_check") and not inside):
                        wrong.append(f"{path.relative_to(REPO)}:{node.lineno}: imports {name}")
    assert not wrong, "\n".join(wrong)


_MODULE_RUN = re.compile(r"-m\s+((?:%s)\b[\w.]*)" % "|".join(OURS))


def _started_packages(path: Path) -> list[tuple[int, str]]:
    """(line, our package) for every module the file starts as a process: ``[..., "-m", "pkg.mod", ...]`` in a command
    list, or ``-m pkg.mod`` in an f-string (a bash script built in Python, e.g. ``f"{python} -m pkg.mod ..."``).
    Plain strings are usage examples in help and error texts, not calls."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            for a, b in zip(node.elts, node.elts[1:]):
                if isinstance(a, ast.Constant) and a.value == "-m" and isinstance(b, ast.Constant):
                    out.append((b.lineno, str(b.value).split(".")[0]))
        elif isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    out += [(node.lineno, m.group(1).split(".")[0]) for m in _MODULE_RUN.finditer(part.value)]
    return [(line, root) for line, root in out if root in OURS]


def test_subprocesses_start_only_the_layers_below():
    """A package starts our modules as processes (``python -m pkg.mod``) only from the layers it may import: a
    subprocess is a dependency the import graph cannot see; no file is exempt (the GPU check, which starts the
    benchmark harnesses, sits in devtools/, above benchmarks/)."""
    wrong = []
    for package, allowed in ALLOWED_IMPORTS.items():
        for path in sorted((REPO / package).rglob("*.py")):
            for line, root in _started_packages(path):
                if root != package and root not in allowed:
                    wrong.append(f"{path.relative_to(REPO)}:{line}: {package} starts {root}")
    assert not wrong, "processes started against the layering (docs/architecture.md):\n" + "\n".join(wrong)


def test_the_subprocess_scan_sees_both_forms(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        '"""python -m benchmarks.attention (a docstring: not a call)"""\n'
        'cmd = [sys.executable, "-m", "benchmarks.attention", "--n", "1"]\n'
        'script = f"{py} -m data_pipeline.preprocess --input x"\n'
        'raise SystemExit("usage: python -m pretrain.train (a plain string: an example, not a call)")\n'
    )
    assert sorted(_started_packages(f)) == [(2, "benchmarks"), (3, "data_pipeline")]


def test_architecture_doc_states_the_same_layering():
    doc = (REPO / "docs" / "architecture.md").read_text()
    for package, allowed in ALLOWED_IMPORTS.items():
        want = ", ".join(f"`{p}/`" for p in OURS if p in allowed) or "nothing of ours"
        assert f"| `{package}/` | {want} |" in doc, f"docs/architecture.md: the row of `{package}/` should list {want}"


def test_no_test_monkeypatches_a_torch_config_module():
    """torch's config modules (``torch._dynamo.config``, ``torch._inductor.config``) are patched with their own
    ``config.patch``: pytest 9.2's monkeypatch undoes such a patch by deleting the key, which torch then hides for
    the rest of the session (208 tests failed in CI that way)."""
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("monkeypatch.setattr") and node.args:
                target = ast.unparse(node.args[0]).strip("'\"")
                if re.match(r"torch\.[\w.]*config\b", target):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "use torch's config.patch instead:\n  " + "\n  ".join(found)


def test_every_file_the_repeat_check_names_exists():
    """run_scripts/repeat_check.sh runs its own file list N times under load; a renamed or merged test file would
    silently drop out of it."""
    script = (REPO / "run_scripts" / "repeat_check.sh").read_text()
    named = set(re.findall(r"tests/test_\w+\.py", script))
    assert named, "the repeat check names no test file: this check reads its spelling"
    assert not [t for t in sorted(named) if not (REPO / t).is_file()], "named by repeat_check.sh, missing"
