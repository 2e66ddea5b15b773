"""bench/learner/profile_step.py on a tiny random Qwen2: the floor on tiny shapes, the profile's parts of a real
learner update (they add up to the profiled ops' time), the part of known op names, and `--help`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "learners"))  # tiny_qwen2, as the learner tests import it

from tiny_qwen2 import save_tiny_qwen2  # noqa: E402

from bench.learner import profile_step as P  # noqa: E402
from exgrpo.core.config_files import load_config  # noqa: E402


def test_the_floor_on_tiny_shapes_is_positive() -> None:
    shapes = [P.Shape("a", 32, 48, 2), P.Shape("head", 32, 64, 1, head=True)]
    fl = P.floor(shapes, tokens=16, bf16_tokens=8, cap_s=1.0, min_s=0.01)
    assert all(rate > 0 for rate in fl["float32"].values())
    assert all(rate is None or rate > 0 for rate in fl["bfloat16"].values())
    assert fl["bfloat16"]["a"] is not None  # the first shape is always measured
    rate = P.model_rate(shapes, fl["float32"])
    assert rate is not None and min(fl["float32"].values()) <= rate <= max(fl["float32"].values())
    assert P.model_rate(shapes, {"a": 1.0, "head": None}) is None


def test_model_shapes_count_smollm2s_matmul_parameters(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, '
        '"num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152}'
    )
    shapes = P.model_shapes(tmp_path)
    assert sum(s.params for s in shapes if not s.head) == 30 * (
        2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    )
    assert [s.params for s in shapes if s.head] == [576 * 49152]


class _Event:
    def __init__(self, name: str, self_us: float, parent: _Event | None = None) -> None:
        self.name, self.self_cpu_time_total, self.cpu_parent, self.flops = name, self_us, parent, 0
        self.cpu_time_total = self_us


def test_parts_of_known_ops() -> None:
    step = _Event(P.OPTIMIZER_MARK, 1.0)
    sdpa = _Event("aten::scaled_dot_product_attention", 1.0)
    cases = {
        "matmuls": _Event("aten::addmm", 1.0),
        "elementwise": _Event("aten::silu_backward", 1.0),
        "casts/copies": _Event("aten::copy_", 1.0),
        "softmax": _Event("aten::_log_softmax_backward_data", 1.0),
        "optimizer": _Event("aten::mul_", 1.0, step),
        "attention": _Event("aten::bmm", 1.0, sdpa),
        "other": _Event("autograd::engine::evaluate_function: MmBackward0", 1.0),
    }
    assert {part: P.part_of(e) for part, e in cases.items()} == {part: part for part in cases}


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory) -> tuple[dict, int]:
    path = save_tiny_qwen2(tmp_path_factory, seed=0, name="tiny-profile")
    cfg = load_config(
        ROOT / "configs" / "smollm2-135m-cpu.yaml", ["learners.lora_rank=4", "learners.lora_alpha=8"]
    )
    groups, candidates = P.synthetic_groups(b=2, k=4, prompt_len=5, max_len=8, vocab=64, rho=0.5)
    return P.profile_learner(path, groups, candidates, cfg=cfg), len(candidates)


def test_a_tiny_updates_parts_add_up_to_the_profiled_ops(tiny_profile: tuple[dict, int]) -> None:
    result, candidates = tiny_profile
    parts = result["parts"]
    assert set(parts) == set(P.PARTS) and all(s >= 0 for s in parts.values())
    assert sum(parts.values()) == pytest.approx(result["ops_s"], rel=0.01)
    assert 0 < result["ops_s"] <= result["profiled_s"] * 1.01
    assert parts["matmuls"] > 0 and parts["optimizer"] > 0 and result["flops"] > 0
    assert result["update_s"] > 0 and result["entropy_s"] > 0 and result["weight_sums_s"] > 0
    assert result["profiled_cpu_s"] > 0 and 0 < result["update_cpu_s"] <= result["update_s"] * 1.5
    assert candidates == 4  # one replay group of the two, 4 candidates


def test_the_report_prints_every_part(tiny_profile: tuple[dict, int], capsys) -> None:
    result, candidates = tiny_profile
    line = P.report("tiny", result, fp32=10.0, bf16=None, minimum=1e6, candidates=candidates)
    out = capsys.readouterr().out
    assert all(part in out for part in P.PARTS) and "outside ops" in out
    assert line.startswith("summary [tiny]: update") and "biggest part" in line


def test_help(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        P.build_parser().parse_args(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--no-sampler" in out and "--variants" in out
