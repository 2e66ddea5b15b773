"""The memory plan's arithmetic (exgrpo/runtime/memory_plan.py) and its command line (exgrpo/plan.py)."""

from __future__ import annotations

import json

import pytest

from exgrpo import plan as plan_cli
from exgrpo.core.config_files import load_config
from exgrpo.runtime.longest_call import ASSUMED_GPU_TOKENS_PER_S, longest_call
from exgrpo.runtime.memory_plan import (
    GIB,
    KNOWN,
    PACKED_BUFFER_BYTES,
    Shape,
    learner_peak,
    learner_terms,
    plan,
    read_shape,
    render,
)

QWEN_1_5B = KNOWN["qwen2.5-math-1.5b"]
QWEN_7B = KNOWN["qwen2.5-math-7b"]


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
    """docs/benchmarks.md ("GPU learner and HF generate"): 53.5 GiB for the 1.5B shape, bf16, one rank,
    4 x (256 + 1024) tokens, full logits (ZeRO-1 on one rank partitions nothing: the plan is ZeRO-0's, which bf16
    configs may not use)."""
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
    terms = learner_terms(cfg, QWEN_1_5B, on_gpu=True, chunked=False)
    peak = learner_peak(terms) / GIB
    assert (
        terms["adamw_step"] > 0 and terms["transfer"] > 0
    )  # phases of their own, below forward/backward here
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
    assert "checkpoints: 99.3 GiB (106.6 GB) each" in out and "longest sampler call:" in out
    off = ["learners.gradient_checkpointing=off", "learners.zero_stage=2"]
    assert run.main(["--config", "configs/qwen2.5-math-7b.yaml", "--dry-run", *off]) == 2
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out and "memory plan does not fit" in captured.err
    run.main(["--config", "configs/tiny-cpu.yaml", "--dry-run"])
    assert "memory plan" not in capsys.readouterr().out  # CPU runs: not planned against a GPU


def test_deepspeed_and_vllm_terms_by_zero_stage():
    """ZeRO-3's live parameters (DeepSpeed's stage3_max_live_parameters 1e9 + stage3_prefetch_bucket_size 5e7),
    the gathered lm_head and its gradient, AdamW's step temporary, rank 0's packed-broadcast buffers (vLLM 0.32:
    two of 1 GiB) and ZeRO-3's full gather, each where it exists."""
    shape, b = QWEN_7B, 2
    head = shape.vocab * shape.hidden * b
    chunk = PACKED_BUFFER_BYTES + head  # the embedding is the largest tensor
    base = ["learners.num=4", "learners.num_gpus=1", "samplers.engine=vllm", "samplers.num_gpus=1"]
    coll = "async.weight_sync=collective"
    z3 = learner_terms(load_config("configs/qwen2.5-math-7b.yaml", base), shape, on_gpu=True)
    assert z3["zero3_live"] == (10**9 + 5 * 10**7) * b
    assert z3["lm_head"] == 2 * head  # gathered weight + its full gradient
    assert z3["adamw_step"] == 4 * shape.params // 4  # one float32 temporary the size of the partition
    assert z3["transfer"] == 3 * chunk  # two buffers in flight + the gathered copies being packed
    assert z3["full_gather"] == shape.params * b - shape.params * b // 4
    z2 = learner_terms(
        load_config("configs/qwen2.5-math-7b.yaml", [*base, "learners.zero_stage=2"]), shape, on_gpu=True
    )
    assert z2["zero3_live"] == 0 and z2["full_gather"] == 0 and z2["lm_head"] == head
    assert z2["transfer"] == 2 * chunk
    z1 = learner_terms(
        load_config("configs/qwen2.5-math-7b.yaml", [*base, "learners.zero_stage=1"]), shape, on_gpu=True
    )
    assert z1["lm_head"] == 0  # the whole gradient is already counted
    store = learner_terms(
        load_config("configs/qwen2.5-math-7b.yaml", [*base, "async.weight_sync=object_store"]),
        shape,
        on_gpu=True,
    )
    assert store["transfer"] == 0  # no NCCL broadcast from rank 0
    assert (
        learner_terms(load_config("configs/qwen2.5-math-7b.yaml", [*base, coll]), shape, on_gpu=False)[
            "transfer"
        ]
        == 0
    )  # CPU learners: gloo's host chunks


def test_the_peak_is_the_persistent_terms_plus_the_largest_phase():
    cfg = load_config("configs/qwen2.5-math-7b.yaml")
    t = learner_terms(cfg, QWEN_7B, on_gpu=True)
    persistent = t["weights"] + t["gradients"] + t["optimizer"] + t["reference"]
    forward_backward = t["activations"] + t["logits"] + t["zero3_live"] + t["lm_head"]
    assert forward_backward > max(t["adamw_step"], t["transfer"], t["full_gather"])
    assert learner_peak(t) == persistent + forward_backward < sum(t.values())
    p = plan(cfg, QWEN_7B)
    assert p.learner_peak == learner_peak(t) and p.fits
    text = render(p, title="t")
    assert "adamw_step" in text and "optimizer step" in text and "weight push (rank 0)" in text


def test_the_sampler_receive_buffers_lie_outside_gpu_memory_utilization():
    cfg = load_config("configs/qwen2.5-math-7b.yaml")
    p = plan(cfg, QWEN_7B)
    receive = 2 * (PACKED_BUFFER_BYTES + QWEN_7B.vocab * QWEN_7B.hidden * 2)
    assert p.sampler["receive"] == receive
    assert (
        p.sampler_peak == int(0.85 * 80 * GIB) + receive
    )  # weights + overhead + KV = the utilization's share
    assert "outside gpu_memory_utilization" in render(p, title="t")
    greedy = plan(
        load_config("configs/qwen2.5-math-7b.yaml", ["samplers.gpu_memory_utilization=0.99"]), QWEN_7B
    )
    assert not greedy.fits and "lower samplers.gpu_memory_utilization" in render(greedy, title="t")
    store = plan(load_config("configs/qwen2.5-math-7b.yaml", ["async.weight_sync=object_store"]), QWEN_7B)
    assert store.sampler["receive"] == 0


def test_checkpoint_size_and_count():
    """A 7B ZeRO-3 checkpoint: HF weights (2 bytes/param) + fp32 master and two moments (12 bytes/param)."""
    cfg = load_config("configs/qwen2.5-math-7b.yaml")
    p = plan(cfg, QWEN_7B)
    one = sum(p.checkpoint.values())
    assert one == 14 * QWEN_7B.params and abs(one / 1e9 - 106.6) < 0.1
    assert p.checkpoints_kept == cfg.trainer.keep_checkpoints == 3
    text = render(p, title="t")
    assert f"{one / GIB:.1f} GiB" in text and f"keeps {3 * one / GIB:.1f} GiB" in text
    z2 = plan(load_config("configs/qwen2.5-math-7b.yaml", ["learners.zero_stage=2"]), QWEN_7B)
    assert (
        sum(z2.checkpoint.values()) == 16 * QWEN_7B.params
    )  # DeepSpeed's model-states file holds the module
    lora = plan(
        load_config("configs/qwen2.5-math-7b.yaml", ["learners.zero_stage=2", "learners.lora_rank=8"]),
        QWEN_7B,
    )
    assert sum(lora.checkpoint.values()) == 2 * QWEN_7B.params  # the merged weights; the adapters are tiny


def test_the_longest_call_against_the_weight_timeout():
    recipe = load_config("configs/qwen2.5-math-7b.yaml")
    tokens = 32 * 8 * 8192
    line = longest_call(recipe)
    assert f"= {tokens} generated tokens" in line and "warning" not in line
    assert (
        tokens / ASSUMED_GPU_TOKENS_PER_S <= recipe.async_.weight_timeout_s
    )  # the recipe's own timeout fits it
    short = longest_call(load_config("configs/qwen2.5-math-7b.yaml", ["async.weight_timeout_s=300"]))
    assert "warning: longer than async.weight_timeout_s=300" in short
    assert "async.weight_timeout_s=2700" in short and "samplers.requests_per_call=3" in short
    fixed = load_config(
        "configs/qwen2.5-math-7b.yaml", ["async.weight_timeout_s=300", "samplers.requests_per_call=3"]
    )
    assert "warning" not in longest_call(fixed)
    for name in ("qwen2.5-math-1.5b", "llama3.1-8b"):
        assert "warning" not in longest_call(load_config(f"configs/{name}.yaml"))
    assert "no rate assumed" in longest_call(load_config("configs/tiny-cpu.yaml"))
