"""reward.fn: a user's reward function found from its spec, run in isolated workers under the deadline."""

from __future__ import annotations

import logging
import textwrap

import pytest

from exgrpo.core.config import ConfigError
from exgrpo.core.config_files import load_config
from exgrpo.core.records import Prompt
from exgrpo.data.readers import read_prompts
from exgrpo.verify.plugin import RewardError, resolve
from exgrpo.verify.rewards import FunctionReward, make_scorer, row_fields
from exgrpo.verify.verifier import Verifier

REWARDS = """
import math, time

def length(prompt, completion, fields):
    n = int(fields["length"])
    return max(0.0, 1.0 - abs(len(completion) - n) / n)

def echo_answer(prompt, completion, fields):
    return float(completion == fields["answer"]) + 0.25 * (fields["qid"] == "q1")

def raises(prompt, completion, fields):
    raise RuntimeError("boom")

def nan(prompt, completion, fields):
    return math.nan

def text(prompt, completion, fields):
    return "1.0"

def hangs(prompt, completion, fields):
    if completion == "hang":
        while True:
            time.sleep(0.01)
    return 1.0

def two_args(prompt, completion):
    return 1.0
"""


@pytest.fixture()
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(REWARDS))
    return path


def _prompts(n: int, **fields) -> list[Prompt]:
    return [Prompt(qid=f"q{i}", question=f"question {i}", answer="ab", fields=dict(fields)) for i in range(n)]


def test_a_function_from_a_file_scores_in_workers(reward_file):
    with FunctionReward(f"{reward_file}:length", timeout_s=5.0) as reward:
        values = reward.score_prompts(_prompts(3, length=4), ["abcd", "ab", ""])
        assert values == [1.0, 0.5, 0.0]
        assert reward.stats().errors == 0


def test_the_function_sees_the_question_answer_qid_and_columns(reward_file):
    prompts = _prompts(2)
    assert row_fields(prompts[1]) == {"answer": "ab", "qid": "q1", "data_source": "default"}
    with FunctionReward(f"{reward_file}:echo_answer") as reward:
        assert reward.score_prompts(prompts, ["ab", "ab"]) == [1.0, 1.25]


@pytest.mark.parametrize("name", ["raises", "nan", "text"])
def test_a_failing_function_scores_zero_and_is_counted(reward_file, name):
    with FunctionReward(f"{reward_file}:{name}") as reward:
        assert reward.score_prompts(_prompts(2), ["x", "y"]) == [0.0, 0.0]
        assert reward.stats().errors == 2
        assert reward.stats().scored == 2


def test_a_hanging_function_is_killed_at_the_deadline(reward_file):
    with FunctionReward(f"{reward_file}:hangs", timeout_s=1.0) as reward:
        reward.start()
        assert reward.score_prompts(_prompts(3), ["ok", "hang", "ok"]) == [1.0, 0.0, 1.0]
        assert reward.stats().timeouts == 1
        assert reward.score_prompts(_prompts(1), ["ok"]) == [1.0]  # its worker was replaced
        stats = reward.stats()
        assert stats.failures == {"timed out": 1}
        assert stats.first_failures == {"timed out": "no reply within 1 s (qid q1)"}


def test_the_first_failure_of_each_kind_keeps_its_text_and_qid(reward_file, caplog):
    """Before: the worker dropped the exception (a bare `e`), so nothing could say what went wrong."""
    pool_log = logging.getLogger("exgrpo.verify.pool")
    pool_log.addHandler(caplog.handler)  # directly: an earlier CLI test may have stopped "exgrpo" propagating
    try:
        with (
            FunctionReward(f"{reward_file}:raises") as reward,
            caplog.at_level("INFO", logger="exgrpo.verify.pool"),
        ):
            reward.score_prompts(_prompts(3), ["x", "y", "z"])
            stats = reward.stats()
    finally:
        pool_log.removeHandler(caplog.handler)
    assert stats.failures == {"raised": 3}
    assert stats.first_failures == {"raised": "RuntimeError: boom (qid q0)"}
    logged = list({id(r): r.getMessage() for r in caplog.records if "boom" in r.getMessage()}.values())
    assert len(logged) == 1 and "raised (qid q0): RuntimeError: boom" in logged[0]  # once, not per row
    with FunctionReward(f"{reward_file}:text") as reward:
        reward.score_prompts(_prompts(2), ["x", "y"])
        assert reward.stats().first_failures == {"not a number": "returned str '1.0' (qid q0)"}


def test_a_module_on_the_path_is_found_by_its_dotted_name(reward_file, monkeypatch):
    monkeypatch.syspath_prepend(str(reward_file.parent))
    resolved = resolve("my_rewards:length")
    assert resolved.import_root == str(reward_file.parent)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the workers find it through the import root alone
    with FunctionReward("my_rewards:length") as reward:
        assert reward.score_prompts(_prompts(1, length=2), ["ab"]) == [1.0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("missing.py:f", "no such file"),
        ("{file}:nothere", "has no 'nothere'; its functions: echo_answer, hangs, length"),
        ("{file}:two_args", "must accept (prompt, completion, fields)"),
        ("{file}", "must look like package.module:function"),
    ],
)
def test_bad_specs_fail_with_their_reason(reward_file, spec, message):
    with pytest.raises(RewardError, match=None) as err:
        resolve(spec.format(file=reward_file))
    assert message in str(err.value)


def test_config_checks_the_form_and_math_stays_the_default():
    assert load_config(None).reward.fn == "math"
    assert load_config(None, ["reward.fn=my_rewards:length"]).reward.fn == "my_rewards:length"
    with pytest.raises(ConfigError, match="reward.fn='length' must be 'math'"):
        load_config(None, ["reward.fn=length"])
    assert isinstance(make_scorer("math", mode="think", timeout_s=1.0), Verifier)


def test_rows_keep_their_columns_for_a_reward_function(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(
        '{"question": "say hi", "length": 2, "tags": ["a"]}\n'
        '{"question": "say more", "answer": "x", "length": 8}\n'
        '{"answer": "x"}\n'
    )
    result = read_prompts(data, for_reward_fn=True)
    assert [p.fields for p in result.prompts] == [{"length": 2, "tags": ["a"]}, {"length": 8}]
    assert [p.answer for p in result.prompts] == ["", "x"]
    assert len(result.skipped) == 1 and "missing question" in result.skipped[0].reason
    plain = read_prompts(data)  # the math verifier needs the answer and no other column
    assert [p.qid for p in plain.prompts] == ["rows:1"] and plain.prompts[0].fields == {}


def test_a_sampler_sends_each_kind_of_failure_to_the_driver_once(reward_file):
    from actors.sampler import new_failure_notes

    noted: set[str] = set()
    with FunctionReward(f"{reward_file}:raises") as reward:
        reward.score_prompts(_prompts(2), ["x", "y"])
        assert new_failure_notes(reward, noted) == (("raised", "RuntimeError: boom (qid q0)"),)
        reward.score_prompts(_prompts(2), ["x", "y"])
        assert new_failure_notes(reward, noted) == ()  # already sent
