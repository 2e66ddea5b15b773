"""`datasets` as a data source: a `save_to_disk` directory (`DIR`, `DIR@split`) and `hf:org/name[:config][@split]`
from a real offline hub cache built here (`$HF_HOME/hub/datasets--ORG--NAME/snapshots/<commit>/` plus
`refs/main`; `HF_HOME` and `HF_HUB_OFFLINE=1` in the subprocess's environment from its start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.data.hf_datasets import is_dataset_spec, parse_hf
from exgrpo.data.readers import DataError, read_prompts
from exgrpo.data.sources import read_source

datasets = pytest.importorskip("datasets")
ROOT = Path(__file__).resolve().parents[3]
COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def rows(n: int, start: int = 0) -> list[dict]:
    return [
        {"question": f"What is {i} + 1?", "answer": str(i + 1), "extra": i} for i in range(start, start + n)
    ]


def test_specs_are_parsed():
    assert parse_hf("hf:open-r1/OpenR1-Math-220k") == ("open-r1/OpenR1-Math-220k", None, "train")
    assert parse_hf("hf:org/name:default@test") == ("org/name", "default", "test")
    assert not is_dataset_spec("data/train.jsonl") and is_dataset_spec("hf:org/name")
    with pytest.raises(DataError, match="hf:org/name"):
        parse_hf("hf:a/b/c")


def test_a_save_to_disk_directory_and_its_splits(tmp_path):
    datasets.Dataset.from_list(rows(6)).save_to_disk(str(tmp_path / "one"))
    both = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows(6)), "test": datasets.Dataset.from_list(rows(3, 100))}
    )
    both.save_to_disk(str(tmp_path / "both"))
    one = read_prompts(tmp_path / "one")
    assert (
        len(one.prompts) == 6 and one.prompts[2].question == "What is 2 + 1?" and one.prompts[2].answer == "3"
    )
    assert read_source(str(tmp_path / "one"), split="train", num=0).name == "one"
    assert len(read_prompts(tmp_path / "both").prompts) == 6  # the train split
    test = read_prompts(f"{tmp_path / 'both'}@test", for_reward_fn=True)
    assert [p.answer for p in test.prompts] == ["101", "102", "103"] and test.prompts[0].fields == {
        "extra": 100
    }
    assert test.prompts[0].data_source == "both-test"
    with pytest.raises(DataError, match="splits"):
        read_prompts(f"{tmp_path / 'both'}@validation")


def build_dataset_cache(hf_home: Path) -> None:
    cached = hf_home / "hub" / "datasets--acme--sums"
    snapshot = cached / "snapshots" / COMMIT / "data"
    snapshot.mkdir(parents=True)
    for split, part in (("train", rows(30)), ("test", rows(10, 30))):
        (snapshot / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text(COMMIT)


READ = (
    "import sys; from exgrpo.data.readers import read_prompts; r = read_prompts(sys.argv[1]); "
    "print(len(r.prompts), r.prompts[0].qid, r.prompts[0].answer)"
)


def test_hub_datasets_from_an_offline_cache(tmp_path):
    build_dataset_cache(tmp_path / "hf")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    }

    def read(spec: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", READ, spec], env=env, capture_output=True, text=True, timeout=300
        )

    train, test, missing = read("hf:acme/sums"), read("hf:acme/sums@test"), read("hf:acme/absent")
    assert train.returncode == 0 and train.stdout.split() == ["30", "sums-train:0", "1"], train.stderr[-2000:]
    assert test.returncode == 0 and test.stdout.split() == ["10", "sums-test:0", "31"], test.stderr[-2000:]
    assert missing.returncode != 0
    assert "dataset 'hf:acme/absent' is not in the hub cache" in missing.stderr
    assert "HF_HUB_OFFLINE is set" in missing.stderr
