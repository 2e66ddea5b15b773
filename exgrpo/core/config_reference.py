"""The settings reference, generated from the code: docs/config.md and `python -m exgrpo.run --help-config`.

    python -m exgrpo.core.config_reference           # print the markdown
    python -m exgrpo.core.config_reference --check   # exit 1 when docs/config.md is stale
    python -m exgrpo.core.config_reference --write   # regenerate docs/config.md

Nothing in the reference is written twice by hand: a setting's meaning is the comment on the lines right
above its field (read from the class's source with `tokenize`), its type and code default come from the dataclass, its default
from the packaged default config, its valid range from its `Literal` choices or from
`exgrpo.core.config.BOUNDS` (the table `validate` checks). A field without a comment is an error.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import re
import sys
import textwrap
import tokenize
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from exgrpo.core.config import BOUNDS, LOGGING_BACKENDS, Config, did_you_mean, yaml_key
from exgrpo.core.config_checks import NO_RANGE
from exgrpo.core.config_files import PACKAGED_CONFIGS, load_config

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"
REGENERATE = "python -m exgrpo.core.config_reference --write"
# list settings whose items come from a fixed set (checked in the section's __post_init__)
LIST_CHOICES: dict[str, tuple[str, ...]] = {"logging.backends": LOGGING_BACKENDS}


@dataclass(frozen=True)
class Setting:
    """One row of the reference."""

    key: str  # YAML name: section.key
    type: str
    default: str  # the value `python -m exgrpo.run` starts from (the packaged default config)
    code_default: str  # the dataclass's own default
    valid: str
    meaning: str  # the comment above the field


def field_comments(cls: type) -> dict[str, str]:
    """{field name: its comment} for the annotated fields of a class, from its source.

    A field's comment is the block of whole-line comments right above it (the documented form), followed by
    any comment on the lines of its statement (a trailing one); a field with none maps to "".
    """
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[int, list[str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments.setdefault(tok.start[0], []).append(tok.string.lstrip("#").strip())
    (node,) = ast.parse(source).body
    if not isinstance(node, ast.ClassDef):
        raise TypeError(f"{cls.__name__} is not a class")
    out = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            above: list[str] = []
            line = stmt.lineno - 1
            while line >= 1 and lines[line - 1].lstrip().startswith("#"):
                above = comments.get(line, []) + above
                line -= 1
            end = stmt.end_lineno or stmt.lineno
            texts = above + [c for n in range(stmt.lineno, end + 1) for c in comments.get(n, [])]
            out[stmt.target.id] = " ".join(texts)
    return out


def _value(v: Any) -> str:
    """A value as it is written in YAML (null, true, "text", [a, b])."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '""' if v == "" else v
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return repr(v)


def _optional(tp: Any) -> Any | None:
    """X for `X | None`, else None."""
    args = get_args(tp)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return None


def _type_text(tp: Any) -> str:
    inner = _optional(tp)
    if inner is not None:
        return f"{_type_text(inner)} or null"
    if get_origin(tp) is Literal:
        return "str" if all(isinstance(a, str) for a in get_args(tp)) else "choice"
    if get_origin(tp) is tuple:
        args = get_args(tp)
        names = {_type_text(a) for a in args}
        return f"list of {len(args)} {names.pop()}s" if len(names) == 1 else "list"
    if tp is tuple or tp is list:
        return "list"
    return getattr(tp, "__name__", str(tp))


def _valid_text(key: str, tp: Any) -> str:
    inner = _optional(tp)
    base = inner if inner is not None else tp
    if get_origin(base) is Literal:
        text = ", ".join(_value(a) for a in get_args(base))
    elif base is bool:
        text = "true, false"
    elif key in BOUNDS:
        text = BOUNDS[key].text()
    elif key in LIST_CHOICES:
        text = "any of " + ", ".join(LIST_CHOICES[key])
    elif key in NO_RANGE:
        text = NO_RANGE[key]
    else:
        text = "no bound"
    return f"{text}, or null" if inner is not None else text


def sections() -> dict[str, list[Setting]]:
    """{section YAML name: its settings}, in the order of the code."""
    hints = get_type_hints(Config)
    effective = load_config(None)
    out: dict[str, list[Setting]] = {}
    for sec in fields(Config):
        cls = hints[sec.name]
        types, comments, code = get_type_hints(cls), field_comments(cls), cls()
        name = yaml_key(sec.name)
        out[name] = [
            Setting(
                key=f"{name}.{f.name}",
                type=_type_text(types[f.name]),
                default=_value(getattr(getattr(effective, sec.name), f.name)),
                code_default=_value(getattr(code, f.name)),
                valid=_valid_text(f"{name}.{f.name}", types[f.name]),
                meaning=comments.get(f.name, ""),
            )
            for f in fields(cls)
        ]
    return out


def undocumented(found: dict[str, list[Setting]]) -> list[str]:
    return [s.key for rows in found.values() for s in rows if not s.meaning]


def _documented() -> dict[str, list[Setting]]:
    found = sections()
    missing = undocumented(found)
    if missing:
        raise ValueError(
            f"settings without a doc comment: {', '.join(missing)}; give each field in its section's "
            "dataclass a `# comment` on the line above (its doc)"
        )
    return found


def config_files() -> list[tuple[str, str]]:
    """(the paths of one shipped config, the first sentence of its leading comment), one per name.

    `configs/` and `exgrpo/configs/` ship the same files; a name whose two copies differ says so.
    """
    by_name: dict[str, list[Path]] = {}
    for p in sorted((ROOT / "configs").glob("*.yaml")) + sorted(PACKAGED_CONFIGS.glob("*.yaml")):
        by_name.setdefault(p.name, []).append(p)
    out = []
    for _, paths in sorted(by_name.items()):
        texts = [p.read_text(encoding="utf-8") for p in paths]
        lead = []
        for line in texts[0].splitlines():
            if not line.startswith("#"):
                break
            lead.append(line.lstrip("#").strip())
        match = re.match(r"(.*?\.)(?:\s|$)", " ".join(lead))
        what = match.group(1) if match else " ".join(lead)
        if len(set(texts)) > 1:
            what += " (the copies differ)"
        out.append((", ".join(f"`{p.relative_to(ROOT)}`" for p in paths), what))
    return out


OVERRIDES = """\
A run's config is built in three layers, each overriding the one before:

1. the packaged default, `exgrpo/configs/default.yaml` (always read first);
2. `--config FILE`: a YAML file, or the name of a packaged config (`--config tiny-cpu`);
3. overrides on the command line, `section.key=value`, any number, in order.

An override's value is read as a YAML scalar: `trainer.steps=10`, `replay.rho=0.25`, `replay.mu=null`,
`replay.enabled=false`, `logging.backends=[tensorboard,wandb]`, `model.path=/models/Qwen2.5-Math-7B`;
`data.eval=` (nothing after `=`) sets the empty string. A key that does not exist fails with the
closest valid one and names the file or override it came from; a value outside its range fails
with the range; every error exits 2 before anything starts.

    python -m exgrpo.run --config tiny-cpu trainer.steps=5 replay.rho=0.25
    python -m exgrpo.run --print-config [overrides]     # the resolved config as YAML
    python -m exgrpo.run --help-config [section]        # this reference in the terminal
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The whole of docs/config.md."""
    found = _documented()
    n = sum(len(rows) for rows in found.values())
    lines = [
        "# Configuration reference",
        "",
        f"<!-- generated from exgrpo/core/config.py by `{REGENERATE}`; do not edit by hand -->",
        "",
        f"Every setting of a training run: {n} settings in {len(found)} sections. The default is the value "
        "every run starts from: the packaged default config (`exgrpo/configs/default.yaml`), which "
        "`python -m exgrpo.run` and `exgrpo.train()` (given a file, a config's name or nothing) read first. The valid range is checked when the config "
        f"loads. {IN_CODE_NOTE} The same settings by the names of TRL and verl: [peers.md](peers.md).",
        "",
        "## Config files",
        "",
        "`configs/` holds the shipped configs and `exgrpo/configs/` the same files inside the package, "
        "where `--config NAME` finds them by name from any directory.",
        "",
        "| file | what it runs |",
        "|---|---|",
        *(f"| {paths} | {_cell(lead)} |" for paths, lead in config_files()),
        "",
        "## Overrides",
        "",
        OVERRIDES.rstrip("\n"),
    ]
    for name, rows in found.items():
        lines += [
            "",
            f"## `{name}`",
            "",
            "| key | type | default | valid | meaning |",
            "|---|---|---|---|---|",
        ]
        for s in rows:
            lines.append(
                f"| `{s.key}` | {_cell(s.type)} | `{_cell(s.default)}` | {_cell(s.valid)} | {_cell(s.meaning)} |"
            )
    differ = [s for rows in found.values() for s in rows if s.code_default != s.default]
    lines += [
        "",
        f"## {IN_CODE}",
        "",
        IN_CODE_TABLE,
        "",
        "| key | a run's default | `Config()`'s |",
        "|---|---|---|",
    ]
    lines += [f"| `{s.key}` | `{_cell(s.default)}` | `{_cell(s.code_default)}` |" for s in differ]
    return "\n".join(lines) + "\n"


IN_CODE = "`Config()` in Python"
BUILT = (
    "A `Config()` built in Python (which `exgrpo.train` also takes) does not read the packaged default config: it "
    "keeps the dataclasses' own values"
)
IN_CODE_NOTE = f'{BUILT}; the settings where they differ are listed under "{IN_CODE}" at the end.'
IN_CODE_TABLE = f"{BUILT}. They differ from a run's defaults in these settings:"


def plain_text(section: str | None = None) -> str:
    """The reference for the terminal, for every section or one; raises KeyError naming the valid ones."""
    found = _documented()
    if section is not None and section not in found:
        raise KeyError(f"unknown config section {section!r}{did_you_mean(section, list(found))}")
    out = []
    for name, rows in found.items():
        if section is not None and name != section:
            continue
        out.append(name)
        for s in rows:
            out.append(f"  {s.key}: {s.type} = {s.default}; valid: {s.valid}")
            out += textwrap.wrap(s.meaning, width=100, initial_indent="      ", subsequent_indent="      ")
        differ = ", ".join(f"{s.key}={s.code_default}" for s in rows if s.code_default != s.default)
        if differ:  # once per section: the default is a run's; a Config() built in Python starts elsewhere
            note = (
                "(the defaults above are a run's, from exgrpo/configs/default.yaml; a Config() built in Python "
                f"without that file has {differ})"
            )
            out += textwrap.wrap(note, width=100, initial_indent="  ", subsequent_indent="  ")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m exgrpo.core.config_reference", description=__doc__.split("\n")[0]
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when docs/config.md is stale")
    mode.add_argument("--write", action="store_true", help="regenerate docs/config.md")
    args = parser.parse_args(argv)
    text = markdown()
    if args.write:
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC}")
    elif args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.is_file() else None
        if current != text:
            what = "is stale" if current is not None else "does not exist"
            print(f"{DOC} {what}; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        print(f"{DOC} is current")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
