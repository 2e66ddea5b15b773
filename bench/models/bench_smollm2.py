"""One ExGRPO step of SmolLM2-135M on gsm, timed part by part, with both generation engines.

    .venv/bin/python -m bench.models.bench_smollm2 [--config configs/smollm2-135m-cpu.yaml] [--engines hf,vllm]
        [--variants "learners.autocast=off;learners.autocast=auto"] [section.key=value ...]

Each part (a `Sampler` per engine, `Learner.update` per variant) in its own spawned process; how it runs:
docs/benchmarks.md, "SmolLM2-135M-Instruct on CPU".
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.common import env_defaults, in_child, stopwatch

env_defaults(vllm_cpu=True, tokenizers=True, torch_extensions=True)

import torch  # noqa: E402

from actors.sampler import EngineSpec, Sampler, SamplerSettings  # noqa: E402
from exgrpo.core.config import Config, EngineKind  # noqa: E402
from exgrpo.core.config_files import load_config  # noqa: E402
from exgrpo.core.records import GenerationRequest, Group, Prompt, TrainBatch  # noqa: E402

if TYPE_CHECKING:
    from learners.learner import Learner
from exgrpo.data.sources import read_source  # noqa: E402
from exgrpo.models.resolve import resolve_model  # noqa: E402
from exgrpo.transport.ranks import free_port  # noqa: E402
from exgrpo.verify.answers import BOX_COMMAND  # noqa: E402

torch.set_num_threads(1)


@dataclass(frozen=True)
class EngineResult:
    """One engine's generate + verify call on B questions x K rollouts."""

    engine: str
    load_s: float  # engine construction (weights, tokenizer; vLLM: KV cache, profiling)
    gen_s: float
    tokens: int
    verify_s: float
    solved: int  # correct rollouts
    boxed: int  # rollouts that wrote \boxed{...} at all
    stopped: int  # rollouts that ended with eos before max_response_len
    rollouts: int
    threads: int  # torch intra-op threads the engine ran on
    groups: tuple[Group, ...]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.gen_s


def model_dir(cfg: Config) -> Path:
    """Where `builtin:smollm2-135m` resolves to, converted once (`resolve_model`)."""
    with stopwatch() as ready:
        target = resolve_model("builtin:smollm2-135m", cache_dir=cfg.model.cache_dir)
    print(f"model: {target} (ready in {ready.s:.1f} s)")
    return target


def run_engine(kind: EngineKind, path: Path, prompts: list[Prompt], *, cfg: Config) -> EngineResult:
    torch.set_num_threads(1)
    with stopwatch() as load:
        sampler = Sampler(
            index=0,
            engine=EngineSpec(kind=kind, model_path=str(path), dtype=cfg.model.dtype),
            settings=SamplerSettings(
                template=cfg.model.template,
                max_response_len=cfg.model.max_response_len,
                temperature=cfg.samplers.temperature,
                top_p=cfg.samplers.top_p,
                verify_timeout_s=cfg.samplers.verify_timeout_s,
                seed=cfg.trainer.seed,
            ),
        )
    sampler.verifier.start()
    sampler.engine.generate([sampler.render(prompts[0])], n=1, max_tokens=8)  # warm-up
    k = cfg.trainer.rollouts_per_question
    requests = [GenerationRequest(request_id=i, prompt=p, n=k) for i, p in enumerate(prompts)]
    result = sampler.generate(requests=requests)
    sampler.close()
    trajectories = [t for g in result.groups for t in g.trajectories]
    return EngineResult(
        engine=kind,
        load_s=load.s,
        gen_s=result.gen_time_s,
        tokens=result.tokens,
        verify_s=result.verify_time_s,
        solved=sum(t.correct for t in trajectories),
        boxed=sum(BOX_COMMAND in t.text for t in trajectories),
        stopped=sum(len(t.response_ids) < cfg.model.max_response_len for t in trajectories),
        rollouts=len(trajectories),
        threads=torch.get_num_threads(),
        groups=result.groups,
    )


def in_process_learner(path: str | Path, *, cfg: Config) -> Learner:
    """The production learner at world size 1, in this process on one torch thread (not set up yet)."""
    from learners.learner import Learner

    torch.set_num_threads(1)
    return Learner(
        model_path=str(path),
        learner=cfg.learners,
        loss=cfg.loss,
        max_response_len=cfg.model.max_response_len,
        master_port=free_port(),
        seed=cfg.trainer.seed,
        dtype=cfg.model.dtype,
    )


def run_update(path: Path, groups: tuple[Group, ...], *, cfg: Config) -> tuple[float, dict[str, float], str]:
    """(setup seconds, update metrics, what it computed in) of one in-process learner at world size 1; the
    update runs twice on the same groups and the second is timed (the first pays one-time costs)."""
    learner = in_process_learner(path, cfg=cfg)
    with stopwatch() as setup:
        compute = learner.setup()
    learner.update(TrainBatch(groups=groups, version=0, clip=True))
    return setup.s, learner.update(TrainBatch(groups=groups, version=1, clip=True)).metrics, compute


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/smollm2-135m-cpu.yaml")
    parser.add_argument(
        "--engines", default="hf,vllm", help="comma-separated engine kinds, run in this order"
    )
    parser.add_argument("--no-update", action="store_true", help="skip the learner update")
    parser.add_argument(
        "--variants",
        default="",
        help="learner settings to time the update under, one per ';', each a '+'-joined list of overrides "
        "(learners.autocast=auto+learners.lora_rank=16); default: the config's own",
    )
    parser.add_argument(
        "overrides", nargs="*", help="config overrides (section.key=value), as exgrpo.run takes"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    b, k, r = cfg.trainer.questions_per_step, cfg.trainer.rollouts_per_question, cfg.model.max_response_len
    path = model_dir(cfg)
    prompts = list(read_source(cfg.data.train, split="train", num=b, seed=cfg.data.seed).prompts[:b])
    print(f"B={b} K={k} max_response_len={r} template={cfg.model.template} T={cfg.samplers.temperature}")
    results: list[EngineResult] = []
    for kind in args.engines.split(","):
        results.append(in_child(run_engine, kind, path, prompts, cfg=cfg))
    print(
        f"{'engine':8}{'threads':>8}{'load s':>8}{'gen s':>8}{'tokens':>8}{'tok/s':>8}{'verify s':>9}  solved/boxed/eos"
    )
    for e in results:
        print(
            f"{e.engine:8}{e.threads:8d}{e.load_s:8.1f}{e.gen_s:8.1f}{e.tokens:8d}{e.tokens_per_s:8.1f}"
            f"{e.verify_s:9.2f}  {e.solved}/{e.rollouts} / {e.boxed} / {e.stopped}"
        )
    if args.no_update:
        return
    update_s = 0.0
    for variant in args.variants.split(";") if args.variants else [""]:
        extra = [o for o in variant.split("+") if o]
        vcfg = load_config(args.config, [*args.overrides, *extra])
        setup_s, metrics, compute = in_child(run_update, path, results[0].groups, cfg=vcfg)
        update_s = update_s or metrics["learner/update_time_s"]  # the step split below: the first variant's
        print(
            f"learner [{' '.join(extra) or 'as configured'}]: {compute}; setup {setup_s:.1f} s, second update "
            f"{metrics['learner/update_time_s']:.1f} s on {int(metrics['learner/tokens'])} response tokens "
            f"(ZeRO {vcfg.learners.zero_stage}, micro-batch {vcfg.learners.micro_batch_size}, LoRA rank "
            f"{vcfg.learners.lora_rank}), grad norm {metrics['learner/grad_norm']:.3g}, loss "
            f"{metrics['learner/loss']:.3g}"
        )
    for e in results:
        total = e.gen_s + e.verify_s + update_s
        print(
            f"step with {e.engine}: generation {e.gen_s:.1f} s ({e.gen_s / total:.0%}), verification "
            f"{e.verify_s:.2f} s ({e.verify_s / total:.1%}), update {update_s:.1f} s ({update_s / total:.0%}), "
            f"total {total:.1f} s (sequential; async sampling overlaps generation with the update)"
        )


if __name__ == "__main__":
    main()
