"""Evaluation: exact Avg@n / Pass@1 / Pass@n from canned responses, and the CLI end to end on builtin:tiny."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch

from actors.engines import Completion, GenerationEngine
from actors.sampling import sample_rewards
from exgrpo.data.readers import read_prompts
from exgrpo.data.templates import render_prompt
from exgrpo.evaluate import main
from exgrpo.evaluation.scores import EvalReport, SamplingSettings, SourceScores, evaluate, format_table
from exgrpo.verify.verifier import Verifier

torch.set_num_threads(1)

# Two sources. alpha: 3 questions, every sample and the greedy decode right.
# beta: "3+4" right in 1 of 4 samples, greedy wrong; "9-4" right in 0 of 4 samples, greedy right.
ROWS = [
    {"qid": "a0", "question": "1+1", "answer": "2", "data_source": "alpha"},
    {"qid": "a1", "question": "2+3", "answer": "5", "data_source": "alpha"},
    {"qid": "a2", "question": "4+4", "answer": "8", "data_source": "alpha"},
    {"qid": "b0", "question": "3+4", "answer": "7", "data_source": "beta"},
    {"qid": "b1", "question": "9-4", "answer": "5", "data_source": "beta"},
]
GREEDY = {
    "1+1": "\\boxed{2}",
    "2+3": "so \\boxed{5}",
    "4+4": "\\boxed{08}",
    "3+4": "\\boxed{6}",
    "9-4": "\\boxed{5}",
}
SAMPLES = {  # cycled when more samples are asked for
    "1+1": ["\\boxed{2}"],
    "2+3": ["\\boxed{5}", "\\boxed{+5}"],
    "4+4": ["\\boxed{8}"],
    "3+4": ["\\boxed{7}", "\\boxed{1}", "no answer", "\\boxed{77}"],
    "9-4": ["\\boxed{4}", "no answer here", "\\boxed{6}", "\\boxed{}"],
}


@dataclass
class CannedEngine:
    """GenerationEngine answering from the tables above (greedy at T = 0), recording each call."""

    calls: list[dict] = field(default_factory=list)
    version: int = 0

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[list[Completion]]:
        assert isinstance(n, int)
        self.calls.append(dict(prompts=list(prompts), n=n, temperature=temperature, top_p=top_p, seed=seed))
        out = []
        for text in prompts:
            question = text.removeprefix("Q: ").removesuffix("\nA: ")  # the plain template
            canned = [GREEDY[question]] if temperature == 0 else SAMPLES[question]
            out.append([_completion(canned[j % len(canned)]) for j in range(n)])
        return out

    def tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(map(ord, text))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return "".join(map(chr, token_ids))

    def load_weights(self, weights, *, version: int) -> None:
        self.version = version

    def checksum(self) -> float:
        return 0.0


def _completion(text: str) -> Completion:
    return Completion(token_ids=(1,), logprobs=(0.0,), text=text, finish_reason="stop")


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "mixed.jsonl"
    lines = [json.dumps(r) for r in ROWS]
    lines.insert(2, '{"qid": "bad", "question": "1+2"}')  # no answer: a bad row (line 2)
    lines.insert(4, "{not json")  # line 4
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def verifier():
    # Every gold is an integer, so all scoring takes the verifier's fast path (no worker starts).
    with Verifier(mode="boxed") as v:
        yield v


def test_canned_scores_exact(data_file: Path, verifier: Verifier) -> None:
    result = read_prompts(data_file)
    assert len(result.prompts) == 5 and [b.row for b in result.skipped] == [2, 4]
    engine = CannedEngine()
    assert isinstance(engine, GenerationEngine)
    report = evaluate(
        engine,
        result.prompts,
        template="plain",
        sampling=SamplingSettings(n=4, temperature=0.6, max_tokens=16, seed=7),
        verifier=verifier,
    )
    # alpha: samples 4/4 right for each question ("+5" = 5); greedy right ("08" = 8)
    assert report.per_source["alpha"] == SourceScores(
        questions=3, avg_at_n=1.0, correct_at_n=1.0, pass_at_1=1.0, pass_at_n=1.0
    )
    # beta: Avg@4 = (1/4 + 0/4) / 2 = 0.125 (no answer at all and "\boxed{}" score 0; note an
    # unboxed final answer such as "5" would score 1: the verifier reads a stated answer without a box);
    # Pass@1 = (0 + 1) / 2 = 0.5 (greedy 6 wrong, greedy 5 right); Pass@4 = (1 + 0) / 2 = 0.5
    assert report.per_source["beta"] == SourceScores(
        questions=2, avg_at_n=0.125, correct_at_n=0.125, pass_at_1=0.5, pass_at_n=0.5
    )
    # pooled over 5 questions: Avg@4 = (3 + 0.25 + 0) / 5 = 0.65; Pass@1 = 4/5; Pass@4 = 4/5
    assert report.overall == SourceScores(
        questions=5, avg_at_n=0.65, correct_at_n=0.65, pass_at_1=0.8, pass_at_n=0.8
    )
    # mean of sources: Avg@4 = (1 + 0.125) / 2 = 0.5625; Pass@1 = Pass@4 = (1 + 0.5) / 2 = 0.75
    assert report.mean_of_sources == SourceScores(
        questions=5, avg_at_n=0.5625, correct_at_n=0.5625, pass_at_1=0.75, pass_at_n=0.75
    )
    assert [(q.qid, q.correct, q.greedy) for q in report.questions] == [
        ("a0", 4, 1.0), ("a1", 4, 1.0), ("a2", 4, 1.0), ("b0", 1, 0.0), ("b1", 0, 1.0)
    ]  # fmt: skip
    # one greedy call (n=1, T=0) and one sampling call (n=4, T=0.6, the given seed), plain-rendered
    greedy_call, sample_call = engine.calls
    assert (greedy_call["n"], greedy_call["temperature"]) == (1, 0.0)
    assert (sample_call["n"], sample_call["temperature"], sample_call["seed"]) == (4, 0.6, 7)
    assert sample_call["prompts"][3] == render_prompt("3+4", template="plain") == "Q: 3+4\nA: "
    # integer golds: every boxed integer is decided on the fast path; the three responses without a
    # usable box ("no answer", "no answer here", an empty box) go to math-verify's own extraction
    stats = verifier.stats()
    assert stats.fast == stats.scored - 3 > 0


def test_chunks_give_the_same_report_and_distinct_seeds(data_file: Path, verifier: Verifier) -> None:
    prompts = read_prompts(data_file).prompts
    sampling = SamplingSettings(n=4, temperature=0.6, max_tokens=16, seed=7)
    whole = evaluate(CannedEngine(), prompts, template="plain", sampling=sampling, verifier=verifier)
    engine = CannedEngine()
    seen: list[tuple[int, int]] = []
    chunked = evaluate(engine, prompts, template="plain", sampling=sampling, verifier=verifier,
                       chunk_size=2, progress=lambda d, t: seen.append((d, t)))  # fmt: skip
    assert chunked == whole
    # chunks start at prompts 0, 2, 4: sampling seeds 7 + 0*4, 7 + 2*4, 7 + 4*4
    assert [c["seed"] for c in engine.calls if c["temperature"] > 0] == [7, 15, 23]
    assert [len(c["prompts"]) for c in engine.calls] == [2, 2, 2, 2, 1, 1]
    assert seen == [(2, 5), (4, 5), (5, 5)]


def test_temperature_zero_reuses_the_greedy_decode(data_file: Path, verifier: Verifier) -> None:
    engine = CannedEngine()
    greedy = SamplingSettings(n=3, temperature=0.0, max_tokens=16)
    report = evaluate(
        engine, read_prompts(data_file).prompts, template="plain", sampling=greedy, verifier=verifier
    )
    assert len(engine.calls) == 1  # greedy only
    # all three "samples" are the greedy decode: 4 of 5 right -> every score 0.8
    assert report.overall == SourceScores(
        questions=5, avg_at_n=0.8, correct_at_n=0.8, pass_at_1=0.8, pass_at_n=0.8
    )


def test_rejects_bad_arguments(data_file: Path, verifier: Verifier) -> None:
    prompts = read_prompts(data_file).prompts
    sampling = SamplingSettings(n=2, temperature=0.6, max_tokens=8)
    with pytest.raises(ValueError, match="no prompts"):
        evaluate(CannedEngine(), [], template="plain", sampling=sampling, verifier=verifier)
    with pytest.raises(ValueError, match="n must be >= 1"):
        evaluate(
            CannedEngine(), prompts, template="plain", sampling=replace(sampling, n=0), verifier=verifier
        )
    with pytest.raises(ValueError, match="think.*boxed"):  # think template, boxed verifier
        evaluate(CannedEngine(), prompts, template="think", sampling=sampling, verifier=verifier)


def test_sample_rewards_is_the_one_generate_verify_loop(data_file: Path, verifier: Verifier) -> None:
    prompts = read_prompts(data_file).prompts
    engine = CannedEngine()
    rewards = sample_rewards(engine, verifier, prompts, n=4, template="plain", max_tokens=16,
                             temperature=0.6, top_p=0.9, seed=11)  # fmt: skip
    assert rewards == [(1.0,) * 4, (1.0,) * 4, (1.0,) * 4, (1.0, 0.0, 0.0, 0.0), (0.0,) * 4]
    (call,) = engine.calls  # one engine call with the given settings, plain-rendered prompts
    assert (call["n"], call["temperature"], call["top_p"], call["seed"]) == (4, 0.6, 0.9, 11)
    assert call["prompts"] == [render_prompt(p.question, template="plain") for p in prompts]
    # T = 0: one greedy decode per prompt, its reward repeated n times
    engine = CannedEngine()
    greedy = sample_rewards(engine, verifier, prompts, n=3, template="plain", max_tokens=16, temperature=0.0)
    assert greedy == [(r,) * 3 for r in (1.0, 1.0, 1.0, 0.0, 1.0)] and engine.calls[0]["n"] == 1
    engine = CannedEngine()
    assert sample_rewards(engine, verifier, [], n=2, template="plain", max_tokens=4, temperature=1.0) == []
    assert engine.calls == []


def test_sample_rewards_checks_engine_and_verifier(data_file: Path, verifier: Verifier) -> None:
    prompts = read_prompts(data_file).prompts

    class Short(CannedEngine):
        def generate(self, prompts, **kwargs):
            return [comps[:1] for comps in super().generate(prompts, **kwargs)]

    with pytest.raises(RuntimeError, match="completions"):
        sample_rewards(Short(), verifier, prompts, n=2, template="plain", max_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="think.*boxed"):
        sample_rewards(
            CannedEngine(), verifier, prompts, n=2, template="think", max_tokens=4, temperature=1.0
        )
    with pytest.raises(ValueError, match="n must be >= 1"):
        sample_rewards(
            CannedEngine(), verifier, prompts, n=0, template="plain", max_tokens=4, temperature=1.0
        )
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        sample_rewards(CannedEngine(), verifier, prompts, n=1, template="plain", max_tokens=4, temperature=-1)


def test_table_lists_sources_then_totals(data_file: Path, verifier: Verifier) -> None:
    sampling = SamplingSettings(n=4, temperature=0.6, max_tokens=16)
    report = evaluate(
        CannedEngine(),
        read_prompts(data_file).prompts,
        template="plain",
        sampling=sampling,
        verifier=verifier,
    )
    lines = format_table(report).splitlines()
    # fractions, as the run prints them (not percent)
    assert lines[0].split() == [
        "data_source",
        "questions",
        "Avg@4",
        "Correct@4",
        "Pass@1",
        "greedy",
        "Pass@4",
    ]
    assert lines[3].split() == ["beta", "2", "0.125", "0.125", "0.500", "0.500"]
    assert lines[5].split() == ["overall", "5", "0.650", "0.650", "0.800", "0.800"]
    assert lines[6].split() == ["mean", "of", "sources", "5", "0.562", "0.562", "0.750", "0.750"]


# --------------------------------------------------------------------------- real engine, CLI


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def test_cli_builtin_task_on_tiny_model(
    cache_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["--model", "builtin:tiny", "--cache-dir", cache_dir, "--data", "builtin:arith", "--num", "3",
            "--n", "2", "--max-tokens", "8", "--engine", "hf"]  # fmt: skip
    assert main(argv) == 0
    out_files = list(tmp_path.glob("eval-tiny-arith.json"))  # default: where it ran, never in the model cache
    assert len(out_files) == 1 and not list(Path(cache_dir).rglob("eval-*.json"))
    payload = json.loads(out_files[0].read_text())
    assert {"model", "data", "engine", "template", "rows", "n", "temperature", "max_tokens", "overall",
            "mean_of_sources", "per_source", "questions"} <= set(payload)  # fmt: skip
    assert (payload["n"], payload["temperature"], payload["max_tokens"]) == (2, 1.0, 8)  # the run's T
    assert payload["rows"] == {"read": 3, "evaluated": 3, "skipped": 0, "skipped_rows": []}
    assert list(payload["per_source"]) == ["arith"]
    assert payload["overall"]["questions"] == 3
    assert set(payload["overall"]) == {"questions", "avg_at_n", "correct_at_n", "pass_at_1", "pass_at_n"}
    assert payload["reward_failures"] == {} and payload["scored"] > 0
    assert [q["qid"] for q in payload["questions"]] == [
        "arith-eval-00000",
        "arith-eval-00001",
        "arith-eval-00002",
    ]
    assert all(0 <= q["correct"] <= 2 for q in payload["questions"])
    assert "overall" in capsys.readouterr().out


def test_cli_file_with_bad_rows(cache_dir: str, data_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    argv = ["--model", "builtin:tiny", "--cache-dir", cache_dir, "--data", str(data_file), "--n", "1",
            "--max-tokens", "4", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads(out.read_text())
    assert (payload["rows"]["read"], payload["rows"]["skipped"]) == (7, 2)
    assert [r["row"] for r in payload["rows"]["skipped_rows"]] == [2, 4]
    assert sorted(payload["per_source"]) == ["alpha", "beta"]
    report_keys = set(EvalReport.__dataclass_fields__)
    assert report_keys <= set(payload)


def test_cli_all_rows_bad_is_an_error(
    cache_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1"}\n{oops\n')
    assert main(["--model", "builtin:tiny", "--cache-dir", cache_dir, "--data", str(bad)]) == 2
    assert "no valid prompt" in capsys.readouterr().err


def test_on_samples_gets_every_prompts_n_completions_and_rewards(data_file: Path, verifier: Verifier) -> None:
    prompts = read_prompts(data_file).prompts
    seen: list[tuple[str, tuple[str, ...], tuple[float, ...]]] = []
    sampling = SamplingSettings(n=4, temperature=0.6, max_tokens=16)
    report = evaluate(CannedEngine(), prompts, template="plain", sampling=sampling, verifier=verifier,
                      chunk_size=2, on_samples=lambda p, s: seen.append((p.qid, s.texts, s.rewards)))  # fmt: skip
    assert [q for q, _, _ in seen] == [p.qid for p in prompts]
    b0 = seen[3]
    assert b0 == ("b0", ("\\boxed{7}", "\\boxed{1}", "no answer", "\\boxed{77}"), (1.0, 0.0, 0.0, 0.0))
    assert [int(sum(r)) for _, _, r in seen] == [q.correct for q in report.questions]
    greedy_only: list[tuple[str, ...]] = []
    greedy = replace(sampling, n=3, temperature=0.0)
    evaluate(CannedEngine(), prompts[:1], template="plain", sampling=greedy, verifier=verifier,
             on_samples=lambda p, s: greedy_only.append(s.texts))  # fmt: skip
    assert greedy_only == [("\\boxed{2}",) * 3]  # T = 0: the greedy decode stands for every sample
    assert format_table(report).splitlines()[-1] == (
        "Avg@4: mean reward; correct = reward > 0.5; Correct@4: share of samples correct; Pass@4: share of "
        "questions with a correct sample; n 4 samples per question at T 0.6 (top-p 1, 16 response tokens); "
        "Pass@1 greedy: share of questions whose greedy decode (T 0) is correct (docs/metrics.md)"
    )


def test_cli_saves_every_sampled_completion(cache_dir: str, tmp_path: Path) -> None:
    out, saved = tmp_path / "res.json", tmp_path / "sub" / "completions.jsonl"
    argv = ["--model", "builtin:tiny", "--cache-dir", cache_dir, "--data", "builtin:arith", "--num", "3",
            "--n", "2", "--max-tokens", "8", "--out", str(out), "--save-completions", str(saved)]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(line) for line in saved.read_text().splitlines()]
    assert [(r["qid"], r["sample"]) for r in rows] == [
        (f"arith-eval-0000{i}", j) for i in range(3) for j in range(2)
    ]
    assert all(set(r) == {"qid", "data_source", "prompt", "completion", "reward", "sample"} for r in rows)
    assert all(r["data_source"] == "arith" and r["prompt"] and r["reward"] in (0.0, 1.0) for r in rows)
    payload = json.loads(out.read_text())  # the eval JSON is unchanged by it
    assert [q["correct"] for q in payload["questions"]] == [
        int(sum(r["reward"] for r in rows if r["qid"] == q["qid"])) for q in payload["questions"]
    ]
    assert not list(saved.parent.glob("*.tmp"))


# --------------------------------------------------------------------------- non-binary rewards, failures


@dataclass
class FixedScorer:
    """A reward of 0.3 for every completion (a custom reward.fn that is not 0 / 1), failing on `fail` of them."""

    value: float = 0.3
    fail: int = 0
    seen: int = 0

    def score_prompts(self, prompts: Sequence, completions: Sequence[str]) -> list[float]:
        out = []
        for _ in completions:
            self.seen += 1
            out.append(0.0 if self.seen <= self.fail else self.value)
        return out

    def stats(self):
        from exgrpo.verify.rewards import RewardStats

        failed = min(self.seen, self.fail)
        return RewardStats(
            scored=self.seen,
            timeouts=0,
            errors=failed,
            failures={"raised": failed} if failed else {},
            first_failures={"raised": "ValueError: boom (qid a0)"} if failed else {},
        )


def test_avg_at_n_is_the_mean_reward_as_in_the_run(data_file: Path) -> None:
    """A reward of 0.3 everywhere: the run's eval/accuracy (the mean reward) is 0.3; so is Avg@n. Before, Avg@n
    counted rewards above 0.5 and said 0."""
    prompts = read_prompts(data_file).prompts
    sampling = SamplingSettings(n=4, temperature=0.6, max_tokens=16)
    report = evaluate(CannedEngine(), prompts, template="plain", sampling=sampling, verifier=FixedScorer())
    assert report.overall.avg_at_n == pytest.approx(0.3)
    assert report.overall.pass_at_1 == 0.0  # greedy decodes of reward 0.3: none correct (was their mean, 0.3)
    assert report.overall.correct_at_n == 0.0 and report.overall.pass_at_n == 0.0  # none above 0.5
    loose = evaluate(CannedEngine(), prompts, template="plain", sampling=sampling, verifier=FixedScorer(),
                     correct_above=0.25)  # fmt: skip
    assert (loose.overall.correct_at_n, loose.overall.pass_at_n, loose.correct_above) == (1.0, 1.0, 0.25)


def test_reward_failures_reach_the_table_and_the_report(data_file: Path) -> None:
    prompts = read_prompts(data_file).prompts
    sampling = SamplingSettings(n=4, temperature=0.6, max_tokens=16)
    report = evaluate(
        CannedEngine(), prompts, template="plain", sampling=sampling, verifier=FixedScorer(fail=5)
    )
    assert report.scored == 25 and report.reward_failures == {"raised": 5}
    assert report.first_reward_failures == {"raised": "ValueError: boom (qid a0)"}
    table = format_table(report).splitlines()
    assert table[-2] == "reward failures: 5 of 25 rewards (20.0%; 5 raised), each scored 0"
    assert table[-1] == "  first raised: ValueError: boom (qid a0)"
    assert report.to_dict()["reward_failures"] == {"raised": 5}


def _run_dir(tmp_path: Path, cache_dir: str) -> Path:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        f"model:\n  path: builtin:tiny\n  cache_dir: {cache_dir}\n  max_response_len: 6\n"
        "data:\n  train: builtin:arith\n  num_eval: 2\nsamplers:\n  temperature: 0.7\n"
        "trainer:\n  eval_samples: 3\n"
    )
    (run / "run.json").write_text("{}")
    return run


def test_like_run_takes_the_runs_settings(cache_dir: str, tmp_path: Path) -> None:
    from exgrpo.evaluate import like_run

    run = _run_dir(tmp_path, cache_dir)
    got = like_run(run)
    assert (got["model"], got["data"], got["num"], got["n"]) == (str(run / "final"), "builtin:arith", 2, 3)
    assert (got["temperature"], got["max_tokens"], got["template"], got["reward_fn"]) == (
        0.7,
        6,
        "plain",
        "math",
    )


def test_cli_run_directory_as_model(
    cache_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(tmp_path, cache_dir)
    # no final model yet: the answer names what to use instead of a long error
    assert main(["--model", str(run), "--data", "builtin:arith", "--cache-dir", cache_dir]) == 2
    assert "is a run directory without a final model" in capsys.readouterr().err
    import shutil

    from exgrpo.models.resolve import resolve_model

    shutil.copytree(resolve_model("builtin:tiny", cache_dir=cache_dir), run / "final")
    out = tmp_path / "res.json"
    assert (
        main(["--like-run", str(run), "--model", str(run), "--out", str(out), "--cache-dir", cache_dir]) == 0
    )
    err = capsys.readouterr().err
    assert "is a run directory; evaluating its final model" in err and "(as run " in err
    payload = json.loads(out.read_text())
    assert (payload["n"], payload["temperature"], payload["max_tokens"]) == (3, 0.7, 6)
    assert payload["model"] == str(run / "final") and payload["like_run"] == str(run)
