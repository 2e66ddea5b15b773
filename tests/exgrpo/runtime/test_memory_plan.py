"""The memory plan's arithmetic (exgrpo/runtime/memory_plan.py) and its command line (exgrpo/plan.py)."""

from __future__ import annotations

import json

import pytest

from exgrpo import plan as plan_cli
from exgrpo.core.config_files import load_config
from exgrpo.runtime.memory_plan import GIB, KNOWN, Shape, learner_terms, plan, read_shape

QWEN_1_5B = KNOWN["qwen2.5-math-1.5b"]
GPU = ["learners.num_gpus=1", "samplers.num_gpus=1"]


def test_parameter_counts_match_the_published_sizes():
    assert abs(QWEN_1_5B.params - 1.54e9) < 0.01e9
    assert abs(KNOWN["qwen2.5-math-7b"].params - 7.62e9) < 0.01e9
    assert abs(KNOWN["llama-3.1-8b"].params - 8.03e9) < 0.01e9


def test_zero_stages_divide_what_they_partition():
    shape = Shape(64, 128, 2, 4, 2, 1000, False)
    terms = {
        z: learner_terms(
            load_config(None, ["learners.num=4", f"learners.zero_stage={z}"]), shape, on_gpu=True
        )
        for z in range(4)
    }
    p = shape.params
    assert terms[0]["optimizer"] == 8 * p and terms[1]["optimizer"] == 2 * p  # float32: two moments
    assert terms[1]["gradients"] == 4 * p and terms[2]["gradients"] == p
    assert terms[2]["weights"] == 4 * p and terms[3]["weights"] == p


def test_checkpointing_and_chunking_shrink_what_they_should():
    base = ["model.max_prompt_len=256", "model.max_response_len=4096", "learners.micro_batch_size=4"]
    off = learner_terms(
        load_config(None, [*base, "learners.gradient_checkpointing=off"]), QWEN_1_5B, on_gpu=True
    )
    on = learner_terms(
        load_config(None, [*base, "learners.gradient_checkpointing=on"]), QWEN_1_5B, on_gpu=True
    )
    assert on["activations"] < off["activations"] / 10
    cfg = load_config(None, [*base, "learners.logits_chunk_tokens=512"])
    chunked = learner_terms(cfg, QWEN_1_5B, on_gpu=True)
    whole = learner_terms(cfg, QWEN_1_5B, on_gpu=True, chunked=False)
    assert chunked["logits"] == 512 * QWEN_1_5B.vocab * 20  # CHUNK_BYTES, measured on CPU
    assert whole["logits"] > 30 * chunked["logits"]
    auto = learner_terms(load_config(None, base), QWEN_1_5B, on_gpu=False)
    assert auto["activations"] == off["activations"]  # auto: off on CPU


def test_the_recorded_h200_peak_is_predicted_within_five_percent():
    """docs/gpu.md: 53.5 GiB for the 1.5B shape, bf16, one rank, 4 x (256 + 1024) tokens, full logits (ZeRO-1 on
    one rank partitions nothing: the plan is ZeRO-0's, which bf16 configs may not use)."""
    cfg = load_config(
        "configs/qwen2.5-math-1.5b.yaml",
        [
            "learners.num=1",
            "learners.zero_stage=1",
            "learners.gradient_checkpointing=off",
            "learners.micro_batch_size=4",
            "model.max_prompt_len=256",
            "model.max_response_len=1024",
        ],
    )
    peak = sum(learner_terms(cfg, QWEN_1_5B, on_gpu=True, chunked=False).values()) / GIB
    assert abs(peak - 53.5) / 53.5 < 0.05, peak


def test_an_unfitting_plan_names_the_knob(capsys):
    over = [
        "--config",
        "configs/qwen2.5-math-7b.yaml",
        "learners.num=1",
        "learners.zero_stage=1",
        "learners.gradient_checkpointing=off",
    ]
    assert plan_cli.main(over) == 2
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "learners.gradient_checkpointing=on" in out
    assert "learners.zero_stage=3" in out
    assert plan_cli.main(["--config", "configs/qwen2.5-math-7b.yaml"]) == 0
    assert "plan: fits" in capsys.readouterr().out


def test_a_tiny_budget_is_solved_for():
    cfg = load_config("configs/qwen2.5-math-1.5b.yaml", ["learners.gradient_checkpointing=off"])
    p = plan(cfg, QWEN_1_5B, device_gib=80)
    assert not p.fits
    budget = [k for k in p.knobs if "max_tokens_per_micro_batch" in k]
    assert budget
    n = int(budget[0].split("=")[1].split()[0])
    ok = load_config(
        "configs/qwen2.5-math-1.5b.yaml",
        ["learners.gradient_checkpointing=off", f"learners.max_tokens_per_micro_batch={n}"],
    )
    assert plan(ok, QWEN_1_5B).fits


def test_shapes_are_read_from_config_json(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 1000,
                "tie_word_embeddings": True,
            }
        )
    )
    assert read_shape(str(tmp_path)) == Shape(64, 128, 2, 4, 2, 1000, True, False, 0)
    with pytest.raises(ValueError, match="--shape"):
        read_shape(str(tmp_path / "missing"))


def test_bad_input_exits_2(capsys):
    assert plan_cli.main(["--config", "configs/qwen2.5-math-7b.yaml", "learners.num=0"]) == 2
    assert plan_cli.main(["--config", "configs/tiny-cpu.yaml", "--gpu-memory-gib", "-1"]) == 2
    assert plan_cli.main(["--config", "configs/tiny-cpu.yaml", "model.path=/nowhere/Mystery-3B"]) == 2
    assert "--shape" in capsys.readouterr().err


def test_dry_run_prints_the_plan_and_refuses_an_unfitting_one(capsys):
    from exgrpo import run

    run.main(["--config", "configs/qwen2.5-math-7b.yaml", "--dry-run"])  # exit 2 here anyway: no GPUs
    out = capsys.readouterr().out
    assert "memory plan (80 GiB per GPU" in out and "plan: fits" in out
    off = ["learners.gradient_checkpointing=off", "learners.zero_stage=2"]
    assert run.main(["--config", "configs/qwen2.5-math-7b.yaml", "--dry-run", *off]) == 2
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out and "memory plan does not fit" in captured.err
    run.main(["--config", "configs/tiny-cpu.yaml", "--dry-run"])
    assert "memory plan" not in capsys.readouterr().out  # CPU runs: not planned against a GPU
