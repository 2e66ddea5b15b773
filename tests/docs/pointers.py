"""How the docs checks resolve a name in the tree, read from the source (nothing imported): `defined` (what a
module body defines), `has_symbol` (a top-level name, and a dotted rest inside its class) and `unresolved` (why a
dotted name such as `exgrpo.transport.staged` or `pool.SamplerPool` names no package, module or definition).
Used by tests/docs/test_pointers.py (pointers in docstrings and docs/) and tests/docs/test_package_docstrings.py
(the package docstrings), so both read a name the same way."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def defined(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module or class body defines: functions, classes, assignments, imports, and the same under an
    `if` or `try` guard."""
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names[t.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.ImportFrom | ast.Import):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):  # names defined under a guard
            names.update(defined(node.body))
    return names


def has_symbol(module: Path, symbol: str) -> bool:
    """Whether `module` defines `symbol` at its top level; a dotted rest must be defined inside that class (or
    set on self in its methods); past a function, an instance attribute or an import it is not checked."""
    parts = symbol.split(".")
    node = defined(tree(module).body).get(parts[0])
    for part in parts[1:]:
        if not isinstance(node, ast.ClassDef):
            return node is not None  # an attribute of an instance or import: not checked further
        inner = defined(node.body)
        # attributes set in methods (self.x = ...) count too
        attrs = {
            t.attr
            for n in ast.walk(node)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Attribute)
        }
        if part not in inner and part not in attrs:
            return False
        node = inner.get(part)
    return node is not None


def unresolved(parts: Sequence[str], folder: Path = ROOT, *, root: Path = ROOT) -> str | None:
    """Why the dotted name `parts`, read from `folder`, names nothing; None when it names something.

    Packages (folders with an `__init__.py`) are walked while the parts name them; the part that names a module
    file resolves with the rest as its symbol (`has_symbol`); a part that names neither resolves when the
    package's `__init__.py` defines it, and a plain folder is walked too (bench/'s, package data)."""
    for i, part in enumerate(parts):
        init = folder / "__init__.py"
        if (folder / part / "__init__.py").is_file():
            folder = folder / part
        elif (folder / f"{part}.py").is_file():
            rest = ".".join(parts[i + 1 :])
            return (
                f"{part}.py defines no {rest}"
                if rest and not has_symbol(folder / f"{part}.py", rest)
                else None
            )
        elif init.is_file() and has_symbol(init, ".".join(parts[i:])):
            return None
        elif (folder / part).is_dir():  # a folder without `__init__.py`: bench/'s, package data
            folder = folder / part
        else:
            return f"{folder.relative_to(root).as_posix()}/ has no module {part}"
    return None
