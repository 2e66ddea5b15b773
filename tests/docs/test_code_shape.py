"""The code's shape, kept: every module of the packages, bench/ and deploy/ is at most 400 lines, every function
at most 100 lines besides its docstring and at most 12 parameters (besides self or cls; *args and **kwargs count
one each: more travel together as a record), and no module imports another module's private (underscore) name.
A file or function that outgrows the limit is split along a role, not mechanically (docs/architecture.md).
A benchmark's module docstring says its role and use in at most 8 lines; how it measures and what it measured
go to docs/benchmarks.md."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("exgrpo", "actors", "learners", "buffers", "bench", "deploy")
PROJECT = ("exgrpo", "actors", "learners", "buffers", "bench")  # import roots whose private names are private
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 400, 100, 12
MAX_BENCH_DOCSTRING_LINES = 8


def _modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the end, less the docstring's."""
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters a caller passes: every named one and *args and **kwargs, less a method's self or cls."""
    a = node.args
    named = [*a.posonlyargs, *a.args]
    own = 1 if named and named[0].arg in ("self", "cls") else 0
    return len(named) - own + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def test_the_folders_hold_modules():
    assert len(_modules()) > 100  # the walk found the tree: the checks below can fail


def test_files_and_functions_stay_within_their_limits():
    too_long = []
    for path in _modules():
        text = path.read_text()
        rel = path.relative_to(ROOT)
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            too_long.append(f"{rel}: {n} lines (at most {MAX_FILE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if (n := _function_lines(node)) > MAX_FUNCTION_LINES:
                too_long.append(f"{rel}:{node.lineno} {node.name}: {n} lines (at most {MAX_FUNCTION_LINES})")
            if (n := _parameters(node)) > MAX_PARAMETERS:
                too_long.append(f"{rel}:{node.lineno} {node.name}: {n} parameters (at most {MAX_PARAMETERS})")
    assert not too_long, "\n".join(too_long)


def docstring_lines(source: str) -> int | None:
    """Lines of a module's docstring as `ast.get_docstring` cleans it (the quotes' own lines not counted); None
    when it has none."""
    doc = ast.get_docstring(ast.parse(source))
    return None if doc is None else len(doc.splitlines())


def test_bench_docstrings_say_role_and_use_within_their_budget():
    over = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        n = docstring_lines(path.read_text())
        if n is None or n > MAX_BENCH_DOCSTRING_LINES:
            over.append(f"{path.relative_to(ROOT)}: {'no docstring' if n is None else f'{n} lines'}")
    assert not over, f"bench docstrings over {MAX_BENCH_DOCSTRING_LINES} lines:\n" + "\n".join(over)


def test_no_module_imports_another_modules_private_name():
    private = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        rel = path.relative_to(ROOT)
                        private.append(f"{rel}:{node.lineno}: from {node.module} import {alias.name}")
    assert not private, "\n".join(private)


def test_the_check_sees_a_long_function_many_parameters_and_a_private_import():
    long_fn = "def f():\n    '''doc\n    more'''\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1)
    node = ast.parse(long_fn).body[0]
    assert (
        isinstance(node, ast.FunctionDef) and _function_lines(node) == MAX_FUNCTION_LINES
    )  # docstring excluded
    many = ast.parse("class C:\n    def m(self, a, b, /, c, *args, d, e, f, g, h, i, j, k, **kw): ...").body[
        0
    ]
    assert isinstance(many, ast.ClassDef) and isinstance(method := many.body[0], ast.FunctionDef)
    assert _parameters(method) == MAX_PARAMETERS + 1  # a..k, *args, **kw; not self
    assert docstring_lines('"""Role.\n\n    python -m bench.x\n"""\nx = 1\n') == 3
    assert docstring_lines("x = 1\n") is None
    imp = ast.parse("from exgrpo.models.resolve import _known").body[0]
    assert isinstance(imp, ast.ImportFrom) and imp.names[0].name.startswith("_")
