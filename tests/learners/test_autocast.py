"""CPU bfloat16 autocast of a float32 learner (`learners.autocast`): the choice and its sentence, and an update
under it that stays within bfloat16's tolerance of float32 with log-probs from a float32 lm_head."""

from __future__ import annotations

import numpy as np
import torch
from test_learner import MAX_LEN, _groups, model_path  # noqa: F401  (the module-scoped model fixture)

from exgrpo.core import metric_names as M
from exgrpo.core import precision
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.records import TrainBatch
from learners.learner import Learner

CPU = torch.device("cpu")


def test_the_choice_follows_the_cpu_flags_device_and_dtype(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n")
    assert precision.cpu_bf16_flags(str(cpuinfo)) == ["avx512_bf16"]
    assert precision.cpu_bf16_flags(str(tmp_path / "missing")) == []
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ["avx512_bf16"])
    on, why = precision.autocast_choice("auto", device=CPU, dtype="float32")
    assert on and "bfloat16 autocast" in why and "avx512_bf16" in why
    assert precision.autocast_choice("off", device=CPU, dtype="float32") == (
        False,
        "float32 (learners.autocast=off)",
    )
    assert not precision.autocast_choice("auto", device=CPU, dtype="bfloat16")[
        0
    ]  # bf16 weights: nothing to cast
    assert not precision.autocast_choice("bfloat16", device=torch.device("cuda", 0), dtype="float32")[0]
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: [])
    on, why = precision.autocast_choice("auto", device=CPU, dtype="float32")
    assert not on and "no avx512_bf16" in why
    on, why = precision.autocast_choice("bfloat16", device=CPU, dtype="float32")  # asked for: runs, emulated
    assert on and "emulated" in why
    full = precision.autocast_choice("bfloat16", device=CPU, dtype="float32", chunked=False)[1]
    assert "lm_head in bfloat16" in full  # the full-logits path computes lm_head inside the model's forward


def _update(path: str, autocast: str) -> tuple[str, float]:
    learner = Learner(
        model_path=path,
        learner=LearnerConfig(lr=1e-3, micro_batch_size=3, autocast=autocast, logits_chunk_tokens=4),
        loss=LossConfig(),
        max_response_len=MAX_LEN,
    )
    compute = learner.setup()
    return compute, learner.update(TrainBatch(groups=_groups(3), version=0, clip=True)).metrics[M.GRAD_NORM]


def test_an_autocast_update_stays_within_bf16_tolerance_of_float32(model_path):  # noqa: F811
    compute32, norm32 = _update(model_path, "off")
    compute16, norm16 = _update(model_path, "bfloat16")
    assert compute32.startswith("float32") and compute16.startswith("bfloat16 autocast")
    np.testing.assert_allclose(norm16, norm32, rtol=0.05)  # bfloat16 matmuls: ~3 significant digits
    assert norm16 != norm32  # the autocast really ran


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path, capsys):
    import os
    import time

    from learners.modeling import clear_stale_build_lock

    lock = tmp_path / "lock"
    lock.touch()
    assert not clear_stale_build_lock(str(lock)) and lock.exists()  # a build may be running
    old = time.time() - 3600
    os.utime(lock, (old, old))
    assert clear_stale_build_lock(str(lock)) and not lock.exists()
    assert "build lock 3600 s old" in capsys.readouterr().err
    assert not clear_stale_build_lock(str(lock))  # none there
