"""Issue 34: a prompt within `model.max_prompt_len` leaves every engine the full response budget.

The length task's data (docs/examples/length) under the default `model.max_prompt_len=32` and
`model.max_response_len=16`: `exgrpo.data.lengths` keeps the prompts within 32 tokens (the longest at the
limit), and the HF and vLLM (CPU) engines, built as a sampler builds them (`make_engine` with the run's
`max_model_len` = 48), generate from the same prompts. Greedy responses have the same lengths on both
engines, and no sampled response stops for "length" before `max_response_len` tokens. Before the rule, a
38-token prompt left vLLM 10 tokens of context and its responses were cut to that while HF gave 16; the
last check shows those prompts would still be cut, i.e. that this test sees a context-filled prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from actors.factory import make_engine
from actors.sampler_common import EngineSpec, engine_kwargs
from exgrpo.core.config import EngineKind, ModelConfig
from exgrpo.core.positions import context_len
from exgrpo.core.records import Prompt
from exgrpo.data.lengths import check_prompt_lengths, prompt_tokens
from exgrpo.data.templates import render_prompt
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

DATA = Path(__file__).resolve().parents[2] / "docs/examples/length/train.jsonl"
MODEL = ModelConfig(max_prompt_len=32, max_response_len=16)  # context 48, as the failing run had


def engine(kind: EngineKind, path: Path) -> Any:
    """The engine a sampler of this run builds (`Sampler.__init__`): `make_engine` with the run's context."""
    spec = EngineSpec(kind=kind, model_path=str(path), dtype=MODEL.dtype, max_model_len=context_len(MODEL))
    return make_engine(spec.kind, spec.model_path, dtype=spec.dtype, seed=0, **engine_kwargs(spec))


def test_hf_and_vllm_give_the_same_response_lengths_for_prompts_at_the_limit(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path / "tiny", spec=TinyModelSpec(init_std=0.3))  # peaked: greedy is stable
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    prompts = [Prompt(qid=r["qid"], question=r["question"], answer=str(r["length"])) for r in rows]
    got = check_prompt_lengths(
        prompts,
        template=MODEL.template,
        tokenizer=tokenizer,
        limit=MODEL.max_prompt_len,
        policy="skip",
        what="t",
    )
    assert got.long  # the data set does hold prompts longer than the budget (the failing run's)
    sizes = {p.qid: prompt_tokens(p, template=MODEL.template, tokenizer=tokenizer) for p in got.kept}
    at_limit = sorted(got.kept, key=lambda p: -sizes[p.qid])[:12]  # the longest kept: 32 tokens or close
    assert sizes[at_limit[0].qid] == MODEL.max_prompt_len
    texts = [render_prompt(p.question, template=MODEL.template, tokenizer=tokenizer) for p in at_limit]
    print(f"prompt lengths: {[sizes[p.qid] for p in at_limit]}")

    hf, vllm = engine("hf", path), engine("vllm", path)
    assert [len(hf.tokenize(t)) for t in texts] == [len(vllm.tokenize(t)) for t in texts]
    budget = MODEL.max_response_len
    lengths: dict[str, list[int]] = {}
    for name, eng in (("hf", hf), ("vllm", vllm)):
        greedy = eng.generate(texts, n=1, max_tokens=budget, temperature=0.0, seed=0)
        lengths[name] = [len(c[0].token_ids) for c in greedy]
        sampled = [
            c for cs in eng.generate(texts, n=8, max_tokens=budget, temperature=1.0, seed=7) for c in cs
        ]
        for c in sampled + [c[0] for c in greedy]:  # a "length" stop is the full budget, never a context cut
            assert len(c.token_ids) == budget if c.finish_reason == "length" else len(c.token_ids) <= budget
        full = sum(len(c.token_ids) == budget for c in sampled)
        print(f"{name}: greedy lengths {lengths[name]}; sampled {full}/{len(sampled)} at {budget} tokens")
    assert lengths["vllm"] == lengths["hf"]
    assert budget in lengths["hf"]

    # what the rule keeps out: a longer prompt leaves vLLM less than the budget (HF would still give 16)
    long_texts = [
        render_prompt(p.question, template=MODEL.template, tokenizer=tokenizer)
        for p in prompts
        if p.qid in {q for q, _ in got.long[:4]}
    ]
    cut = [len(c[0].token_ids) for c in vllm.generate(long_texts, n=1, max_tokens=budget, temperature=0.0)]
    print(f"vllm, prompts of {[len(vllm.tokenize(t)) for t in long_texts]} tokens (over the limit): {cut}")
    assert cut and max(cut) < budget
    assert all(n <= context_len(MODEL) - len(vllm.tokenize(t)) for n, t in zip(cut, long_texts, strict=True))
