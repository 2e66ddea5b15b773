"""Every pointer into the tree that a docstring or a page of docs/ names resolves.

A pointer is a path (`exgrpo/runtime/parts.py`, `configs/default.yaml`, `exgrpo/runtime/parts`), a path with a
symbol (`exgrpo/runtime/env.py::remote_actor`, `Class.method` after the `::`), or a dotted name
(`exgrpo.transport.staged`, `actors.sampler.Sampler.generate`). Paths must exist; a symbol must be defined at
the top level of its module (a function, class or assignment), and a dotted rest inside that class: names are
resolved by tests/docs/pointers.py, as the package docstrings' check resolves them.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from pointers import ROOT, has_symbol, tree, unresolved

PACKAGES = ("exgrpo", "actors", "learners", "buffers", "bench")
TOP = (*PACKAGES, "tests", "configs", "docs", "deploy", "scripts", "constraints")
CODE = ("exgrpo", "actors", "learners", "buffers", "bench", "deploy", "scripts")

_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[\w./-]*\w)(?:::([\w.]+))?")
_DOTTED = re.compile(r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)")
# placeholders and globs that stand for a family of paths, not one
_PATTERN = re.compile(r"[<>*{}]|/N\b|-N\b|\bX\b")
GENERATED = ("bench/out/", "runs/")  # what the commands write, not what the tree holds


@cache
def _config_keys() -> frozenset[str]:
    """`learners.lr` and the like: settings of the config section that shares the learners package's name."""
    from dataclasses import fields

    from exgrpo.core.config import LearnerConfig

    return frozenset(f"learners.{f.name}" for f in fields(LearnerConfig))


def _check_path(text: str, symbol: str | None, after: str = "") -> str | None:
    generated = text.startswith(GENERATED) or f"{text}/" in GENERATED
    if _PATTERN.search(text) or set(after) & {"*", "<", "{"} or generated:
        return None
    path = ROOT / text
    module = path if path.suffix == ".py" else path.with_suffix(".py")
    if not (path.exists() or module.exists()):
        return f"{text}: no such file or directory"
    if symbol and module.exists() and not has_symbol(module, symbol):
        return f"{text}::{symbol}: not defined there"
    return None


def _check_dotted(name: str) -> str | None:
    if ".".join(name.split(".")[:2]) in _config_keys():
        return None
    why = unresolved(name.split("."))
    return f"{name}: {why}" if why else None


def _docstrings(path: Path) -> list[str]:
    out = []
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(doc)
    return out


def _broken(text: str) -> list[str]:
    bad = [_check_path(m.group(1), m.group(2), text[m.end() : m.end() + 2]) for m in _PATH.finditer(text)]
    bad += [_check_dotted(m.group(1)) for m in _DOTTED.finditer(text)]
    return [b for b in bad if b]


def test_every_pointer_in_docstrings_and_docs_resolves() -> None:
    problems: list[str] = []
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            for doc in _docstrings(path):
                problems += [f"{path.relative_to(ROOT)}: {b}" for b in _broken(doc)]
    for page in sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]):
        problems += [f"{page.relative_to(ROOT)}: {b}" for b in _broken(page.read_text(encoding="utf-8"))]
    assert not sorted(set(problems)), "\n".join(sorted(set(problems)))


def test_the_checker_finds_what_it_should() -> None:
    assert _broken("see exgrpo/runtime/assembly.py::build_system and actors.sampler.Sampler.generate") == []
    assert _broken("exgrpo/runtime/nowhere.py") == ["exgrpo/runtime/nowhere.py: no such file or directory"]
    assert _broken("exgrpo/transport/broadcast.py::pack_weights") == [
        "exgrpo/transport/broadcast.py::pack_weights: not defined there"
    ]
    assert _broken("exgrpo.transport.broadcast.pack_weights") == [
        "exgrpo.transport.broadcast.pack_weights: broadcast.py defines no pack_weights"
    ]
    assert _broken("exgrpo.runtime.nowhere and bench.sim.cluster and exgrpo.models.weights") == [
        "exgrpo.runtime.nowhere: exgrpo/runtime/ has no module nowhere"
    ]
    assert _broken("runs/<id>/config.yaml and bench/out/ and configs/X.yaml") == []
