"""docs/peers.md: every setting it names is one of this project's, and every TRL name is a field of the installed
TRL's `GRPOConfig`, an argument of `GRPOTrainer` or a field of PEFT's `LoraConfig` (skipped without TRL)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from exgrpo.core.config_reference import sections

PAGE = Path(__file__).resolve().parents[2] / "docs" / "peers.md"


def rows() -> list[list[str]]:
    """The cells of every table row below a header (this project, TRL, verl, differences)."""
    out = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) == 4:
            out.append(cells)
    return out


def test_every_setting_named_is_one_of_the_projects():
    keys = {s.key for rows_ in sections().values() for s in rows_}
    named = [t for cells in rows() for t in re.findall(r"`([a-z_]+\.[a-z_*]+)`", cells[0])]
    assert len(named) > 40
    for key in named:
        section, _, name = key.partition(".")
        assert key in keys or (name == "*" and any(k.startswith(section + ".") for k in keys)), key


def test_every_trl_name_is_trls():
    trl = pytest.importorskip("trl")
    peft = pytest.importorskip("peft")
    config = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    trainer = set(inspect.signature(trl.GRPOTrainer.__init__).parameters)
    lora = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    checked = 0
    for cells in rows():
        for token in re.findall(r"`([^`]+)`", cells[1]):
            if token.startswith('"') or token in ("False", "True") or "." in token.split("=")[0]:
                continue  # a value, or a key inside a DeepSpeed config file
            call = re.fullmatch(r"(GRPOTrainer|LoraConfig)\((\w+)=.*\)\)?", token)
            if call:
                owner, name = call.groups()
                assert name in (trainer if owner == "GRPOTrainer" else lora), token
                inner = re.search(r"LoraConfig\((\w+)=", token)
                assert inner is None or inner.group(1) in lora, token
            else:
                assert token.split("=")[0] in config, token
            checked += 1
    assert checked > 30
