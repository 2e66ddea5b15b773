"""`from exgrpo import train`: the README's Python API example, run as it is written there (a closure reward, a
weighted pair with a lambda, rows in memory, the tiny-cpu config), plus the API's input checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.core.config import ConfigError
from exgrpo.verify import closure
from exgrpo.verify.plugin import resolve

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_a_closure_and_a_weighted_list_travel_by_value():
    limit = 3

    def short(prompt, completion, fields):
        return float(len(completion) <= limit)

    spec = closure.pack(closure.combine([(short, 1.0), (lambda p, c, f: float(f["answer"] in c), 0.5)]))
    assert spec.startswith("cloudpickle:")
    fn = resolve(spec).fn  # what a verifier worker does with the spec
    assert fn("q", "12", {"answer": "12"}) == 1.5 and fn("q", "1234", {"answer": "9"}) == 0.0
    # a worker process that has never seen this test module unpickles it too
    code = "import sys; from exgrpo.verify.plugin import resolve; print(resolve(sys.argv[1]).fn('q', '7', {'answer': '7'}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code, spec], capture_output=True, text=True, cwd="/", env=env, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "1.5", out.stderr[-2000:]


def test_a_closure_gets_the_deadline_isolation_and_failure_counts_of_reward_fn():
    import time

    from exgrpo.core.records import Prompt
    from exgrpo.verify.rewards import make_scorer

    bad = {"raise", "hang"}

    def flaky(prompt, completion, fields):
        if completion == "raise" and completion in bad:
            raise RuntimeError("boom")
        if completion == "hang" and completion in bad:
            time.sleep(60)
        return 0.25 * len(completion)

    scorer = make_scorer(closure.pack(flaky), mode="boxed", timeout_s=2.0, workers=1)
    try:
        scorer.start()
        prompts = [Prompt(qid=str(i), question="q", answer="") for i in range(4)]
        t0 = time.perf_counter()
        assert scorer.score_prompts(prompts, ["ab", "raise", "hang", "abcd"]) == [0.5, 0.0, 0.0, 1.0]
        assert time.perf_counter() - t0 < 30  # the hang was cut at the deadline
        stats = scorer.stats()
        assert (stats.scored, stats.errors, stats.timeouts) == (4, 1, 1)
    finally:
        scorer.close()


def test_rows_may_be_a_datasets_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    from exgrpo.api import _write_rows
    from exgrpo.data.readers import read_prompts

    ds = datasets.Dataset.from_list([{"question": f"q{i}", "answer": str(i), "w": [i, i]} for i in range(3)])
    path = _write_rows(ds, tmp_path / "train.jsonl")
    prompts = read_prompts(path, for_reward_fn=True).prompts
    assert [p.answer for p in prompts] == ["0", "1", "2"] and prompts[2].fields == {"w": [2, 2]}


def test_bad_reward_fns_are_refused_before_anything_starts(tmp_path):
    from exgrpo import train

    with pytest.raises(TypeError, match="neither a callable"):
        train("tiny-cpu", reward_fn=[42])
    with pytest.raises(ConfigError, match="must accept"):
        train("tiny-cpu", reward_fn=lambda completion: 1.0, overrides=[f"logging.run_dir={tmp_path / 'r'}"])
    with pytest.raises(TypeError, match="a list of dicts"):
        train("tiny-cpu", train_data=str(tmp_path / "x.jsonl"))


@pytest.mark.integration
def test_the_readme_example_trains_with_a_closure_and_rows_in_memory(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", readme_example()],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = Path(out.stdout.strip().splitlines()[-1].split()[0])
    if not run_dir.is_absolute():
        run_dir = tmp_path / run_dir
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert len((run_dir / "data" / "train.jsonl").read_text().splitlines()) == 80
    assert len((run_dir / "data" / "eval.jsonl").read_text().splitlines()) == 20
    cfg = (run_dir / "config.yaml").read_text()
    assert "fn: cloudpickle:" in cfg and f"train: {run_dir / 'data' / 'train.jsonl'}" in cfg
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] >= 0]
    assert len(steps) == 2 and all(r["rollout/reward_failures"] == 0 for r in steps)
    # the rewards came from the closure: 0, 0.5, 1 or 1.5 per completion
    assert all(0.0 <= r["rollout/mean_reward"] <= 1.5 for r in steps)


# -- a refused start, a string reward, a bad row: the caller's inputs named, nothing left behind (issue 43) --
ROWS = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(10)]


def _run_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "runs").iterdir()) if (root / "runs").is_dir() else []


def test_a_refused_start_leaves_no_run_directory(tmp_path, monkeypatch):
    from exgrpo import train
    from exgrpo.data.readers import DataError
    from exgrpo.models.resolve import ModelResolveError

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ModelResolveError, match="does not exist"):
        train("tiny-cpu", train_data=ROWS, overrides=[f"model.path={tmp_path / 'no-model'}"])
    assert _run_dirs(tmp_path) == []  # the CLI's rule: a refused start removes the directory it made
    with pytest.raises(DataError):
        train(
            "tiny-cpu",
            train_data=[*ROWS[:3], {"question": "", "answer": "1"}],
            overrides=["data.on_bad_row=error"],
        )
    assert _run_dirs(tmp_path) == []
    given = tmp_path / "mine"  # a directory the caller named and that exists already is theirs: kept
    given.mkdir()
    with pytest.raises(ModelResolveError):
        train(
            "tiny-cpu", train_data=ROWS, overrides=[f"logging.run_dir={given}", "model.path=/no/such/model"]
        )
    assert given.is_dir()


def test_a_string_reward_fn_names_the_override_to_use():
    from exgrpo import train

    with pytest.raises(TypeError) as err:
        train("tiny-cpu", reward_fn="my_rewards.py:score")
    text = str(err.value)
    assert "overrides=['reward.fn=my_rewards.py:score']" in text and "callable" in text
    assert "'m'" not in text  # not a complaint about its first character


def test_a_bad_row_is_named_by_its_index_in_train_data(tmp_path, monkeypatch, caplog):
    from exgrpo import train
    from exgrpo.data.readers import DataError

    monkeypatch.chdir(tmp_path)
    bad = [*ROWS[:3], {"question": "", "answer": "1"}, *ROWS[3:]]
    with pytest.raises(DataError) as err:
        train("tiny-cpu", train_data=bad, overrides=["data.on_bad_row=error"])
    text = str(err.value)
    assert "train_data[3]" in text and "{'question': '', 'answer': '1'}" in text, text
    assert "empty question" in text and "train.jsonl" not in text
    with pytest.raises(DataError, match=r"eval_data\[1\]"):
        train("tiny-cpu", train_data=ROWS, eval_data=[ROWS[0], {"answer": "2", "question": " "}],
              overrides=["data.on_bad_row=error"])  # fmt: skip
    with pytest.raises(DataError) as err:  # no usable column at all: named against train_data too
        train("tiny-cpu", train_data=[{"prompt_text": "2+2"}])
    assert "layout of train_data from its columns" in str(err.value) and "train.jsonl" not in str(err.value)
    assert _run_dirs(tmp_path) == []


def test_a_skipped_row_is_named_in_train_data_and_keeps_the_row_numbers(tmp_path, caplog):
    from exgrpo.api import _check_rows, _write_rows
    from exgrpo.core.config_files import load_config
    from exgrpo.data.readers import read_prompts

    path = _write_rows([*ROWS[:2], {"question": "", "answer": "1"}, ROWS[2]], tmp_path / "train.jsonl")
    with caplog.at_level("WARNING", logger="exgrpo"):
        _check_rows(load_config("tiny-cpu", []), path, "train_data")
    assert (
        "1 of 4 rows of train_data are malformed" in caplog.text
        and "train_data[2] {'question': ''" in caplog.text
    )
    result = read_prompts(path)  # what the run reads: no bad row left to report against the file
    assert not result.skipped and [p.qid for p in result.prompts] == ["train:0", "train:1", "train:3"]
