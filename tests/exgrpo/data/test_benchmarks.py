"""`python -m exgrpo.data.benchmarks` on small local copies laid out as each hub source is assumed to be, and
the paper-table preset of `exgrpo.evaluate` (its column order from fake reports; no model)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import huggingface_hub.constants
import pyarrow.parquet as pq
import pytest

from exgrpo import evaluate
from exgrpo.data import benchmarks
from exgrpo.data.readers import read_prompts
from exgrpo.evaluation import paper


def _openr1(i: int) -> dict:
    return {
        "data_source": "openr1",
        "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
        "target": [{"role": "assistant", "content": f"{i} + {i} = \\boxed{{{2 * i}}}"}],
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"index": i},
    }


FIXTURES: dict[str, list[dict]] = {
    "openr1-math-46k": [_openr1(i) for i in range(5)],
    "aime24": [
        {
            "id": 60,
            "problem": "Find x if x^2 = 49 and x > 0.",
            "solution": "So $x = \\boxed{7}$.",
            "url": "u",
        },
        {"id": 61, "problem": "Find y.", "solution": "Then \\boxed{\\frac{1}{2}} is it.", "url": "u"},
    ],
    "aime25": [
        {"problem": "Compute 2^10.", "answer": "1024", "id": "0"},
        {"problem": "Compute 3^3.", "answer": "27", "id": "1"},
        {"problem": "Compute 5!.", "answer": "120", "id": "2"},
    ],
    "amc": [{"id": 0, "question": "What is 1+1?", "answer": 2.0, "url": "u"}],
    "math500": [
        {
            "problem": "Simplify 6/8.",
            "solution": "...",
            "answer": "\\frac{3}{4}",
            "subject": "A",
            "level": 1,
            "unique_id": "a",
        },
        {
            "problem": "What is 9*9?",
            "solution": "...",
            "answer": "81",
            "subject": "A",
            "level": 1,
            "unique_id": "b",
        },
        {
            "problem": "Empty answer.",
            "solution": "...",
            "answer": "",
            "subject": "A",
            "level": 1,
            "unique_id": "c",
        },
    ],
    "minerva": [{"question": "Speed of light in m/s (one digit)?", "answer": "3e8"}] * 2,
    "olympiad_bench": [
        {"id": 1, "question": "Find all n.", "final_answer": ["1", "2"], "is_multiple_answer": True},
        {"id": 2, "question": "Find m.", "final_answer": ["5"], "is_multiple_answer": False},
    ],
    "arc_c": [
        {
            "id": "q1",
            "question": "Which is a gas?",
            "choices": {"text": ["ice", "steam", "rock", "wood"], "label": ["A", "B", "C", "D"]},
            "answerKey": "B",
        },
        {
            "id": "q2",
            "question": "Which is wet?",
            "choices": {"text": ["water", "sand", "salt"], "label": ["1", "2", "3"]},
            "answerKey": "1",
        },
    ],
    "gpqa_diamond": [
        {
            "Question": f"Which particle is {kind}?",
            "Correct Answer": "right",
            "Incorrect Answer 1": "wrong one",
            "Incorrect Answer 2": "wrong two",
            "Incorrect Answer 3": "wrong three",
        }
        for kind in ("charged", "neutral", "heavy", "light")
    ],
    "mmlu_pro": [
        {
            "question_id": 7,
            "question": "Pick the third.",
            "options": [f"option {k}" for k in range(10)],
            "answer": "C",
            "answer_index": 2,
            "cot_content": "",
            "category": "math",
            "src": "s",
        }
    ],
}
EXPECTED_ROWS = {name: len(rows) for name, rows in FIXTURES.items()} | {"math500": 2}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The fixtures as local copies (save_to_disk directories, a DatasetDict for GPQA, parquet for AMC and
    JSON lines for Minerva), built into one output directory."""
    src = tmp_path_factory.mktemp("src")
    for name, rows in FIXTURES.items():
        data = datasets.Dataset.from_list(rows)
        if name == "amc":
            data.to_parquet(str(src / "amc.parquet"))
        elif name == "minerva":
            (src / "minerva.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif name == "gpqa_diamond":
            datasets.DatasetDict({"train": data}).save_to_disk(str(src / name))
        else:
            data.save_to_disk(str(src / name))
    out = tmp_path_factory.mktemp("out")
    assert benchmarks.main(["--out", str(out), "--from-dir", str(src)]) == 0
    return out


def test_every_source_is_written_with_its_rows_columns_and_data_source(built, capsys):
    assert sorted(p.name for p in built.iterdir()) == sorted(f"{s.name}.parquet" for s in benchmarks.SOURCES)
    for name, rows in EXPECTED_ROWS.items():
        table = pq.read_table(built / f"{name}.parquet")
        assert table.column_names == ["qid", "question", "answer", "data_source"], name
        assert table.num_rows == rows, name
        assert set(table.column("data_source").to_pylist()) == {name}
        prompts = read_prompts(str(built / f"{name}.parquet")).prompts  # the project reads it as a plain file
        assert len(prompts) == rows and {p.data_source for p in prompts} == {name}


def test_answers_of_the_math_sources():
    def answers(name):
        rows, _ = benchmarks.adapt_rows(benchmarks.BY_NAME[name], FIXTURES[name])
        return [r["answer"] for r in rows]

    assert answers("openr1-math-46k") == ["0", "2", "4", "6", "8"]
    assert answers("aime24") == ["7", "\\frac{1}{2}"]  # the last \boxed{} of the solution
    assert answers("amc") == ["2.0"]
    assert answers("olympiad_bench") == ["1, 2", "5"]
    rows, skipped = benchmarks.adapt_rows(benchmarks.BY_NAME["math500"], FIXTURES["math500"])
    assert skipped == 1 and [r["qid"] for r in rows] == ["math500-0", "math500-1"]


def test_multiple_choice_rows_are_lettered_and_answered_by_letter(built):
    arc = pq.read_table(built / "arc_c.parquet").to_pylist()
    assert arc[0]["question"] == "Which is a gas?\n\nA. ice\nB. steam\nC. rock\nD. wood"
    assert [r["answer"] for r in arc] == ["B", "A"]  # a digit label becomes the letter of its position
    mmlu = pq.read_table(built / "mmlu_pro.parquet").to_pylist()[0]
    assert mmlu["answer"] == "C" and mmlu["question"].endswith("\nJ. option 9")
    for row in pq.read_table(built / "gpqa_diamond.parquet").to_pylist():
        options = dict(line.split(". ", 1) for line in row["question"].split("\n\n")[1].splitlines())
        assert sorted(options) == ["A", "B", "C", "D"] and options[row["answer"]] == "right"
    again, _ = benchmarks.adapt_rows(benchmarks.BY_NAME["gpqa_diamond"], FIXTURES["gpqa_diamond"])
    assert [r["answer"] for r in again] == [
        r["answer"] for r in pq.read_table(built / "gpqa_diamond.parquet").to_pylist()
    ]


def test_only_and_the_printed_counts(tmp_path, built, capsys):
    src = tmp_path / "src"
    datasets.Dataset.from_list(FIXTURES["aime25"]).save_to_disk(str(src / "aime25"))
    assert benchmarks.main(["--out", str(tmp_path / "o"), "--from-dir", str(src), "--only", "aime25"]) == 0
    out = capsys.readouterr().out
    assert "aime25.parquet" in out and "3 rows" in out and "math-ai/aime25" in out
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["aime25.parquet"]


def test_a_missing_or_misshapen_source_exits_2(tmp_path, capsys):
    assert benchmarks.main(["--out", str(tmp_path / "o"), "--from-dir", str(tmp_path), "--only", "amc"]) == 2
    assert "amc: no local copy" in capsys.readouterr().err
    datasets.Dataset.from_list([{"problem": "x", "answer": "1"}]).save_to_disk(str(tmp_path / "amc"))
    assert benchmarks.main(["--out", str(tmp_path / "o"), "--from-dir", str(tmp_path), "--only", "amc"]) == 2
    err = capsys.readouterr().err
    assert "math-ai/amc23" in err and "KeyError: 'question'" in err and "['answer', 'problem']" in err


def test_offline_and_uncached_hub_source_names_the_id(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", _raise_offline)  # never the network, whatever was imported
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert benchmarks.main(["--out", str(tmp_path / "o"), "--only", "aime24"]) == 2
    err = capsys.readouterr().err
    assert "aime24: cannot load the hub dataset 'math-ai/aime24' (split 'test')" in err
    assert "HF_HUB_OFFLINE is set and it is not in the cache" in err and "--from-dir" in err


def _raise_offline(*args, **kwargs):
    raise ConnectionError("Couldn't reach the hub (offline mode is enabled)")


def test_paper_table_column_order_and_averages():
    scores = {name: 0.1 * (i + 1) for i, (name, _, _) in enumerate(paper.ID_COLUMNS + paper.OOD_COLUMNS)}
    head, values = paper.paper_table(scores).splitlines()
    assert head.split() == [
        "AIME24", "AIME25", "AMC", "MATH-500", "Minerva", "Olympiad", "Avg", "ID",
        "ARC-c", "GPQA", "MMLU-Pro", "Avg", "OOD",
    ]  # fmt: skip
    assert values.split() == [
        "10.0",
        "20.0",
        "30.0",
        "40.0",
        "50.0",
        "60.0",
        "35.0",
        "70.0",
        "80.0",
        "90.0",
        "80.0",
    ]
    del scores["gpqa_diamond"]
    assert paper.paper_table(scores).splitlines()[1].split()[-4:] == ["70.0", "-", "90.0", "-"]


def test_paper_preset_runs_each_file_with_the_paper_settings(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for name, _, _ in paper.ID_COLUMNS + paper.OOD_COLUMNS:
        (data / f"{name}.parquet").write_text("")
    calls = []
    real_main = evaluate.main

    def fake_main(argv):  # one evaluation: writes a fake report where --out says
        args = evaluate._parser().parse_args(argv)
        if args.paper_table:  # the call the test makes; the preset's calls end with --paper-table=
            return real_main(argv)
        assert args.model == "m" and args.template == "think"
        calls.append((Path(args.data).stem, args.n, args.temperature, args.max_tokens))
        Path(args.out).write_text(json.dumps({"overall": {"avg_at_n": 0.5}}))
        return 0

    monkeypatch.setattr(evaluate, "main", fake_main)
    out = tmp_path / "results"
    out.mkdir()
    code = evaluate.main(
        ["--model", "m", "--template", "think", "--paper-table", str(data), "--out", str(out)]
    )
    assert code == 0
    assert calls[:4] == [
        ("aime24", 32, 0.6, 8192),
        ("aime25", 32, 0.6, 8192),
        ("amc", 32, 0.6, 8192),
        ("math500", 1, 0.6, 8192),
    ]
    assert [c[0] for c in calls] == [n for n, _, _ in paper.ID_COLUMNS + paper.OOD_COLUMNS]
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].split()[:3] == ["AIME24", "AIME25", "AMC"] and table[1].split() == ["50.0"] * 11
    assert (out / "paper-table.txt").read_text().strip().splitlines() == table


def test_paper_preset_refuses_its_own_settings_and_missing_files(tmp_path, capsys):
    with pytest.raises(SystemExit):
        evaluate.main(["--model", "m", "--paper-table", str(tmp_path), "--n", "4"])
    assert "sets --n itself" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["--model", "m", "--paper-table", str(tmp_path), "--save-completions", "c.jsonl"])
    assert "--save-completions is one file" in capsys.readouterr().err
    assert evaluate.main(["--model", "m", "--paper-table", str(tmp_path)]) == 2
    assert "missing aime24.parquet" in capsys.readouterr().err
