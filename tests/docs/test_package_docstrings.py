"""Package docstrings name only modules that exist: every `module`, `module.Name`, `exgrpo.pkg.module.Name`
and `pkg/module.py` in an `__init__.py` docstring resolves to a file of the project (and the name to a
top-level definition of that module). A name alone in backticks counts as a module where a list item
starts with it or a colon follows it ("- `pool`: the sampler pool"); elsewhere it may be a class or a
setting. Read from the source, nothing imported but the settings' names; names resolve as the pointers'
check resolves them (tests/docs/pointers.py)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from pointers import unresolved

ROOT = Path(__file__).resolve().parents[2]
TOP_PACKAGES = ("exgrpo", "actors", "buffers", "learners")  # pyproject.toml, [tool.setuptools.packages.find]
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
PATH = re.compile(r"\b((?:" + "|".join(TOP_PACKAGES) + r")(?:/\w+)*/\w+\.py)\b")
TOKEN = re.compile(r"`+([^`]+)`+")
ITEM_START = re.compile(
    r"^[ \t]*-[ \t]+((?:`+[^`]+`+,?[ \t]*)+)", re.M
)  # `a`, `b`: ... at a list item's start
BEFORE_COLON = re.compile(r"`+([^`]+)`+:")


def module_positions(doc: str) -> set[str]:
    """The tokens a docstring puts where a module's name goes: a list item's first ones, those before a colon."""
    first = {t for m in ITEM_START.finditer(doc) for t in TOKEN.findall(m.group(1))}
    return first | set(BEFORE_COLON.findall(doc))


def docstring_problems(init: Path, config_keys: set[str]) -> list[str]:
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    folder = init.parent
    where = init.relative_to(ROOT).as_posix()
    problems = [f"{where}: {p} does not exist" for p in PATH.findall(doc) if not (ROOT / p).is_file()]
    modules = module_positions(doc)
    for token in TOKEN.findall(doc):
        name = token.split("(", 1)[0]
        if not DOTTED.match(name) or name in config_keys:
            continue
        parts = name.split(".")
        if parts[0] in TOP_PACKAGES:
            why = unresolved(parts, ROOT, root=ROOT)
        elif (folder / f"{parts[0]}.py").is_file() or (folder / parts[0] / "__init__.py").is_file():
            why = unresolved(parts, folder, root=ROOT)
        elif token in modules:
            why = f"{where.rsplit('/', 1)[0]}/ has no module {parts[0]}"
        else:
            continue  # a class, a function or a setting named alone
        if why:
            problems.append(f"{where}: `{token}`: {why}")
    return problems


def config_keys() -> set[str]:
    """Settings such as `learners.grad_share_every`, whose section may share a package's name."""
    from exgrpo.core.config_reference import sections

    return {s.key for settings in sections().values() for s in settings}


def test_package_docstrings_name_only_modules_that_exist():
    keys = config_keys()
    inits = [init for top in TOP_PACKAGES for init in sorted((ROOT / top).rglob("__init__.py"))]
    assert len(inits) > 10
    problems = [p for init in inits for p in docstring_problems(init, keys)]
    assert not problems, "\n".join(problems)


def test_a_stale_name_is_reported(tmp_path, monkeypatch):
    """Planted in a copy of `actors/`: a module that is gone, a name its module lacks, a missing path."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    pkg = tmp_path / "actors"
    pkg.mkdir()
    (pkg / "pool.py").write_text("class SamplerPool: ...\n")
    (pkg / "__init__.py").write_text(
        '"""- `pool.SamplerPool`, `pool.Gone`: the pool; `SamplerPool`; actors/old.py;\n'
        "- `sampler`, `engines`: modules that are gone; `vllm_load`: another.\n"
        '`samplers.num` and `actors.pool` and `learners.grad_share_every`, `version`."""\n'
    )
    assert docstring_problems(pkg / "__init__.py", {"learners.grad_share_every"}) == [
        "actors/__init__.py: actors/old.py does not exist",
        "actors/__init__.py: `pool.Gone`: pool.py defines no Gone",
        "actors/__init__.py: `sampler`: actors/ has no module sampler",
        "actors/__init__.py: `engines`: actors/ has no module engines",
        "actors/__init__.py: `vllm_load`: actors/ has no module vllm_load",
    ]
