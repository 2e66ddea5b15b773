"""docs/architecture.md against the code: the package block names every module of every package (and no
module that does not exist), the roles section names every verb of the Protocols in `exgrpo/core/roles.py`,
and the failures page it links to exists and names every fault point.

Each test lists everything it found missing at once, one line each, so a page left behind by a refactor
is fixed from one run's message."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from exgrpo.core import faults

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
FAILURES = ROOT / "docs" / "failures.md"
TOP_PACKAGES = ("exgrpo", "actors", "buffers", "learners")  # pyproject.toml, [tool.setuptools.packages.find]
# a module named by its file name alone: `records.py`, not `exgrpo/core/records.py` (another package's path)
MODULE_NAME = re.compile(r"(?<![\w/.])([A-Za-z_]\w*)\.py\b")


def packages() -> dict[str, list[str]]:
    """Every package of the project ("exgrpo/core/", ...) -> its modules' names, `__init__` left out."""
    found: dict[str, list[str]] = {}
    for top in TOP_PACKAGES:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            folder = init.parent
            found[folder.relative_to(ROOT).as_posix() + "/"] = sorted(
                p.stem for p in folder.glob("*.py") if p.name != "__init__.py"
            )
    return found


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n") + len(heading) + 1
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[start:], re.M)]
    return text[start : start + ends[0]] if ends else text[start:]


def package_block(text: str) -> dict[str, str]:
    """The package block of "Packages and the import rule": each entry's head ("exgrpo/core/") -> its text.

    An entry starts at a line's first column with the package's folder; its indented lines continue it."""
    block = section(text, "## Packages and the import rule").split("```", 2)[1]
    entries: dict[str, list[str]] = {}
    head = ""
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            head, _, rest = line.partition(" ")
            entries[head] = [rest]
        elif head:
            entries[head].append(line)
    return {h: " ".join(lines) for h, lines in entries.items()}


def package_block_problems(text: str, found: dict[str, list[str]]) -> list[str]:
    entries = package_block(text)
    problems = [f"{pkg}: no entry in the package block" for pkg in found if pkg not in entries]
    for head, entry in entries.items():
        if head not in found:
            problems.append(f"{head}: an entry of the package block, but not a package of the project")
            continue
        named = set(MODULE_NAME.findall(entry))
        problems += [f"{head}{m}.py: missing from its entry" for m in found[head] if m not in named]
        problems += [
            f"{head}{m}.py: in its entry, but no such module" for m in sorted(named - set(found[head]))
        ]
    return problems


def protocol_verbs(source: str) -> dict[str, list[str]]:
    """Each Protocol class of a module -> its public methods, in order."""
    verbs: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [b.value if isinstance(b, ast.Subscript) else b for b in node.bases]
        if any(isinstance(b, ast.Name) and b.id == "Protocol" for b in bases):
            verbs[node.name] = [
                f.name for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")
            ]
    return verbs


def roles_problems(text: str, verbs: dict[str, list[str]]) -> list[str]:
    """A verb belongs in its Protocol's row of the roles table, or anywhere in the section when it has none."""
    roles = section(text, "## Roles (one noun, one verb each)")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", roles, re.M)}
    problems = []
    for name, methods in verbs.items():
        where = rows.get(name, roles)
        place = f"the `{name}` row of the roles table" if name in rows else "the roles section"
        problems += [
            f"{name}.{verb}: not in {place}"
            for verb in methods
            if not re.search(r"`" + re.escape(verb) + r"[`(]", where)
        ]
    return problems


def test_every_module_of_every_package_is_in_the_package_block():
    problems = package_block_problems(ARCHITECTURE.read_text(), packages())
    assert not problems, "docs/architecture.md, package block:\n" + "\n".join(problems)


def test_every_verb_of_every_role_is_in_the_roles_section():
    verbs = protocol_verbs((ROOT / "exgrpo" / "core" / "roles.py").read_text())
    assert {"Rollouts", "Replay", "Learners", "WeightTransport", "Scaling", "RunObserver"} <= set(verbs)
    problems = roles_problems(ARCHITECTURE.read_text(), verbs)
    assert not problems, "docs/architecture.md, roles section:\n" + "\n".join(problems)


def test_the_failures_page_is_linked_and_names_every_fault_point():
    assert "docs/failures.md" in section(ARCHITECTURE.read_text(), "### Failures")
    text = FAILURES.read_text()
    missing = [point for point in faults.POINTS if f"`{point}" not in text]
    assert not missing, "docs/failures.md names no cell of these fault points: " + ", ".join(missing)


def test_the_checks_name_what_is_missing():
    """On a planted page: a missing package, a missing and a stale module, a missing verb, each named."""
    page = """## Packages and the import rule

```
pkg/a/   one.py (the first), ../b/other.py (another package's file, ignored)
pkg/c/   gone.py
```

## Roles (one noun, one verb each)

| role | implementation | verbs |
|---|---|---|
| `Thing` | x | `push`, `pull(n)` |

## Next
"""
    found = {"pkg/a/": ["one", "two"], "pkg/b/": ["other"], "pkg/c/": []}
    assert package_block_problems(page, found) == [
        "pkg/b/: no entry in the package block",
        "pkg/a/two.py: missing from its entry",
        "pkg/c/gone.py: in its entry, but no such module",
    ]
    verbs = protocol_verbs(
        "class Thing(Protocol):\n    def push(self): ...\n    def pull(self): ...\n    def peek(self): ...\n"
        "class Other(Protocol[T]):\n    def wait(self): ...\n    def _private(self): ...\n"
    )
    assert verbs == {"Thing": ["push", "pull", "peek"], "Other": ["wait"]}
    assert roles_problems(page, verbs) == [
        "Thing.peek: not in the `Thing` row of the roles table",
        "Other.wait: not in the roles section",
    ]
