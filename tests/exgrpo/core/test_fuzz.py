"""Fuzzing the two doors bad input comes through: the config loader and the dataset readers.

Config: any text as a YAML file, any override string, any nested mapping either loads or raises a
`ConfigError` with a message. Data: any bytes in a .jsonl/.json/.parquet file either load or raise a
`DataError`; every non-blank JSON line is accounted for (a prompt or a reported bad row), never dropped
silently. No other exception type may escape (that would be a traceback of an internal error).
"""

from __future__ import annotations

import contextlib
import io
import json
import string
from dataclasses import fields
from pathlib import Path
from typing import get_type_hints

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from exgrpo.core.config import Config, ConfigError, from_dict
from exgrpo.core.config_files import load_config, parse_override
from exgrpo.data.readers import DataError, read_prompts

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

SECTIONS = [f.name.rstrip("_") for f in fields(Config)]
KEYS = [(name.rstrip("_"), sub.name) for name, cls in get_type_hints(Config).items() for sub in fields(cls)]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=12))
yaml_scalars = st.one_of(
    st.sampled_from(
        [
            "1",
            "0",
            "-1",
            "1e-4",
            "0.5",
            "nan",
            ".inf",
            "-.inf",
            "true",
            "null",
            "~",
            "[1, 2]",
            "{a: 1}",
            "''",
            "yes",
            "2020-01-01",
            "0x10",
            "1_000",
            "!!binary aGk=",
            "[",
            "{",
            ": :",
            "- -",
            "'",
            '"',
            "*a",
            "&a 1",
            "!!python/object:os.system x",
            "1e400",
            "99999999999999999999",
        ]
    ),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)


def _loads_or_config_error(fn, *args):
    try:
        cfg = fn(*args)
    except ConfigError as err:
        assert str(err).strip(), "a ConfigError must say what is wrong"
        return None
    assert isinstance(cfg, Config)
    return cfg


@FUZZ
@given(text=st.text(max_size=200))
def test_any_text_as_a_config_file(tmp_path, text):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    _loads_or_config_error(load_config, path)


@FUZZ
@given(data=st.binary(max_size=200))
def test_any_bytes_as_a_config_file(tmp_path, data):
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    _loads_or_config_error(load_config, path)


@FUZZ
@given(sec_key=st.sampled_from(KEYS), raw=yaml_scalars)
def test_any_value_for_a_known_key(sec_key, raw):
    section, key = sec_key
    _loads_or_config_error(load_config, None, [f"{section}.{key}={raw}"])


@FUZZ
@given(text=st.text(max_size=40))
def test_any_override_string(text):
    _loads_or_config_error(load_config, None, [text])
    with contextlib.suppress(ConfigError):
        parse_override(text)


@FUZZ
@given(
    data=st.dictionaries(
        st.one_of(st.sampled_from(SECTIONS), st.text(max_size=8), st.integers()),
        st.one_of(
            json_values,
            st.dictionaries(
                st.one_of(st.sampled_from([k for _, k in KEYS]), st.integers()), scalars, max_size=4
            ),
        ),
        max_size=4,
    )
)
def test_any_mapping(data):
    _loads_or_config_error(from_dict, data)


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2",
        "a: [",
        "trainer: 3",
        "{1: 2}",
        "trainer: {1: 2}",
        "!!python/object:x {}",
        "trainer:\n  steps: 1e400",
        "trainer: {steps: .nan}",
        "- 1\n- 2",
    ],
)
def test_known_bad_config_files(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path)


def test_config_path_errors(tmp_path):
    for bad in (str(tmp_path), "no/such/file.yaml", "nul\x00byte.yaml"):
        with pytest.raises(ConfigError):
            load_config(bad)


# --------------------------------------------------------------------------- data readers


def _reads_or_data_error(path: Path, **kw):
    try:
        result = read_prompts(path, **kw)
    except DataError as err:
        assert str(err).strip()
        return None
    assert result.prompts
    return result


@FUZZ
@given(
    data=st.binary(max_size=300),
    suffix=st.sampled_from([".jsonl", ".json", ".parquet"]),
    on_bad_row=st.sampled_from(["skip", "error"]),
)
def test_any_bytes_as_a_data_file(tmp_path, data, suffix, on_bad_row):
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(data)
    _reads_or_data_error(path, on_bad_row=on_bad_row)


ROW_KEYS = [
    "question",
    "answer",
    "qid",
    "id",
    "prompt",
    "reward_model",
    "target",
    "problem",
    "data_source",
    "extra_info",
]
rows = st.dictionaries(st.sampled_from(ROW_KEYS), json_values, max_size=5)
good_rows = st.fixed_dictionaries(
    {
        "question": st.text(string.printable, min_size=1, max_size=10),
        "answer": st.one_of(st.integers(), st.text(string.digits, min_size=1, max_size=4)),
    }
)


@FUZZ
@given(
    lines=st.lists(
        st.one_of(
            rows.map(json.dumps), good_rows.map(json.dumps), json_values.map(json.dumps), st.text(max_size=20)
        ),
        max_size=12,
    )
)
def test_every_json_line_is_a_prompt_or_a_reported_bad_row(tmp_path, lines):
    assume(all("\n" not in line and "\r" not in line for line in lines))
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    result = _reads_or_data_error(path)
    if result is not None:  # nothing lost: every non-blank line is accounted for
        assert len(result.prompts) + len(result.skipped) == sum(1 for line in lines if line.strip())


def _parquet_bytes(records) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), buf)
    return buf.getvalue()


VALID_PARQUET = _parquet_bytes(
    [{"qid": f"q{i}", "question": f"{i}+1", "answer": str(i + 1)} for i in range(20)]
)


@FUZZ
@given(
    cut=st.integers(0, len(VALID_PARQUET)),
    flips=st.lists(st.tuples(st.integers(0, len(VALID_PARQUET) - 1), st.integers(1, 255)), max_size=4),
)
def test_corrupted_parquet(tmp_path, cut, flips):
    data = bytearray(VALID_PARQUET)
    for pos, x in flips:
        data[pos] ^= x
    path = tmp_path / "bad.parquet"
    path.write_bytes(bytes(data[:cut] if cut < len(data) // 2 else data))
    result = _reads_or_data_error(path)
    if result is not None:
        assert len(result.prompts) + len(result.skipped) <= 20


@FUZZ
@given(
    records=st.lists(
        st.fixed_dictionaries(
            {
                "question": st.one_of(st.none(), st.text(max_size=8)),
                "answer": st.one_of(st.none(), st.text(max_size=4)),
                "qid": st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
            }
        ),
        min_size=1,
        max_size=10,
    )
)
def test_parquet_rows_are_prompts_or_reported_bad_rows(tmp_path, records):
    path = tmp_path / "rows.parquet"
    path.write_bytes(_parquet_bytes(records))
    result = _reads_or_data_error(path)
    if result is not None:
        assert len(result.prompts) + len(result.skipped) == len(records)


def test_known_bad_json_lines_are_counted(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [
        b'{"question": "1+1", "answer": 2}',
        b"[" * 100000,
        b'{"question": "x", "answer": NaN}',
        b"\xff\xfe not utf-8",
        b'{"question": "2+2", "answer": "4"}',
        b"   ",
        '{"question": "3+3 \u2028 in a string", "answer": "6"}'.encode(),
    ]
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines))
    result = read_prompts(path)
    assert [p.answer for p in result.prompts] == ["2", "4", "6"]
    assert [b.row for b in result.skipped] == [1, 2, 3]
    assert "nested too deeply" in result.skipped[0].reason and "finite" in result.skipped[1].reason
    assert "not UTF-8" in result.skipped[2].reason
    with pytest.raises(DataError, match="3 of 6 rows .* are malformed"):
        read_prompts(path, on_bad_row="error")


def test_deeply_nested_json_array_file(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("[" * 100000)
    with pytest.raises(DataError):
        read_prompts(path)
