"""`python -m exgrpo.run`: config -> Ray -> actors -> driver.

    python -m exgrpo.run                                  # embedded default (configs/default.yaml)
    python -m exgrpo.run --config configs/tiny-cpu.yaml trainer.steps=5
    python -m exgrpo.run --print-config | --dry-run
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python -m exgrpo.run --config tiny-cpu

With RAY_ADDRESS set (as under `ray job submit`) it attaches to that cluster, otherwise it starts
a local one. This module is the one place where roles become Ray actors.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.config import Config, ConfigError, load_config

log = logging.getLogger("exgrpo")

# Environment every actor starts with (DESIGN.md 7: one torch thread per process; vLLM CPU settings).
ACTOR_ENV = {
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
    "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(Path("~/.cache/exgrpo/torch_extensions").expanduser())),
}


@dataclass
class System:
    """The live actors of one run."""

    cfg: Config
    model_path: str
    replay: Any  # ShardedReplay
    samplers: Any  # SamplerPool
    learners: Any  # LearnerGroup
    controller: Any  # Controller actor handle

    def shutdown(self) -> None:
        import ray

        self.samplers.shutdown()
        self.learners.shutdown()
        for s in self.replay.shards:
            ray.kill(s)
        ray.kill(self.controller)


def init_ray(cfg: Config) -> None:
    import ray

    if ray.is_initialized():
        return
    runtime_env = {"env_vars": ACTOR_ENV}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env, namespace="exgrpo")
        return
    s, lr = cfg.samplers, cfg.learners
    needed = s.num * s.num_cpus + lr.num * lr.num_cpus
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster (see README on token auth)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(needed + 0.999)), runtime_env=runtime_env,
             namespace="exgrpo", include_dashboard=False, configure_logging=False, log_to_driver=True)


def build_system(cfg: Config, *, model_path: str) -> System:
    """Start replay shards, samplers, learners and the scaling controller as named actors."""
    import ray

    from actors.pool import SamplerPool
    from actors.sampler import EngineSpec, Sampler
    from buffers.shard import ReplayShard
    from buffers.sharded import ShardedReplay
    from exgrpo.controller import Controller
    from exgrpo.launch import remote_actor
    from learners.group import LearnerGroup

    K = cfg.trainer.rollouts_per_question
    r = cfg.replay
    uniform = r.question_selection == "uniform"
    shards = [remote_actor(ReplayShard, name=f"exgrpo-replay-{i}", num_cpus=0, k_rollouts=K,
                           max_trajectories_per_question=r.max_trajectories_per_question, mu=r.mu, sigma=r.sigma,
                           uniform=uniform, seed=cfg.trainer.seed + i) for i in range(r.num_shards)]
    ray.get([s.ping.remote() for s in shards])
    replay = ShardedReplay(shards=shards, k_rollouts=K, mu=r.mu, sigma=r.sigma, uniform=uniform)
    s = cfg.samplers
    spec = EngineSpec(kind=s.engine, model_path=model_path, dtype=cfg.model.dtype, seed=cfg.trainer.seed,
                      gpu_memory_utilization=s.gpu_memory_utilization)

    def spawn(index: int) -> Any:
        return remote_actor(Sampler, name=f"exgrpo-sampler-{index}", num_cpus=s.num_cpus, num_gpus=s.num_gpus,
                            index=index, engine=spec, template=cfg.model.template, max_response_len=cfg.model.max_response_len,
                            temperature=s.temperature, top_p=s.top_p, verify_timeout_s=s.verify_timeout_s,
                            replay=replay, seed=cfg.trainer.seed)

    samplers = SamplerPool(spawn=spawn, num=s.num, requests_per_call=s.requests_per_call)
    ray.get([h.ping.remote() for h in samplers.handles()])
    learners = LearnerGroup(num=cfg.learners.num, make_actor=remote_actor, model_path=model_path,
                            learner_cfg=cfg.learners, loss_cfg=cfg.loss, max_response_len=cfg.model.max_response_len,
                            seed=cfg.trainer.seed, dtype=cfg.model.dtype)
    controller = remote_actor(Controller, name="exgrpo-controller", num_cpus=0, samplers=s.num)
    return System(cfg=cfg, model_path=model_path, replay=replay, samplers=samplers, learners=learners,
                  controller=controller)


def copy_tokenizer(model_path: str, out_dir: Path) -> None:
    """Make a saved model directory self-contained (engines and evaluation load the tokenizer from it)."""
    for f in Path(model_path).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
            shutil.copy2(f, out_dir / f.name)


def make_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.logging.run_dir or f"runs/{dt.datetime.now():%Y%m%d-%H%M%S}").expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    return run_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exgrpo.run", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML file or packaged config name (default: the embedded default)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the placement plan, start nothing")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint "
                        "(its config.yaml is used; overrides such as trainer.steps=40 still apply)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. replay.rho=0.25 trainer.steps=10")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.resume:
        if args.config:
            parser.error("--resume uses the run's own config.yaml; pass changes as overrides instead of --config")
        args.config = str(Path(args.resume) / "config.yaml")
        args.overrides = [*args.overrides, f"logging.run_dir={args.resume}"]
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    from exgrpo.plan import placement_plan

    if args.dry_run:
        print(placement_plan(cfg))
        return 0
    return train(cfg, resume=bool(args.resume))


def train(cfg: Config, *, resume: bool = False) -> int:
    import ray

    from exgrpo.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
    from exgrpo.data.sources import load_prompts
    from exgrpo.driver import Driver
    from exgrpo.metrics import MetricsLogger, read_jsonl
    from exgrpo.models.resolve import resolve_model
    from exgrpo.report import Progress, write_report

    t_start = time.perf_counter()
    run_dir = make_run_dir(cfg)
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        print(f"error: no complete checkpoint under {run_dir}/checkpoints", file=sys.stderr)
        return 2
    model_path = str(ckpt / "model") if ckpt else str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
    train_set, eval_set = load_prompts(cfg)
    log.info("run dir %s; model %s; %d train / %d eval questions", run_dir, model_path, len(train_set), len(eval_set))
    init_ray(cfg)
    system = build_system(cfg, model_path=model_path)
    logger = MetricsLogger(run_dir, ray_metrics=cfg.logging.ray_metrics)
    progress = Progress(total=cfg.trainer.steps, enabled=cfg.logging.progress)
    def checkpointer(drv: Driver) -> None:
        path, seconds = save_checkpoint(run_dir, driver=drv, learners=system.learners, replay=system.replay,
                                        model_path=model_path, keep=cfg.trainer.keep_checkpoints)
        log.info("checkpoint %s written in %.2f s", path, seconds)

    driver = Driver(cfg=cfg, samplers=system.samplers, replay=system.replay, learners=system.learners,
                    train=train_set, evaluation=eval_set, logger=logger, progress=progress.update,
                    controller=system.controller, checkpointer=checkpointer)
    try:
        if ckpt is not None:
            t0 = time.perf_counter()
            restore_checkpoint(ckpt, driver=driver, learners=system.learners, replay=system.replay)
            driver.broadcast()  # samplers loaded the checkpoint's weights; tag them with its version
            progress.skip(driver.step)
            log.info("resumed from %s at step %d (policy version %d); restore took %.2f s", ckpt, driver.step,
                     driver.version, time.perf_counter() - t0)
        driver.train()
        system.learners.save(path=str(run_dir / "final"))
        copy_tokenizer(model_path, run_dir / "final")
    finally:
        progress.close()
        logger.close()
        system.shutdown()
    write_report(run_dir, records=read_jsonl(logger.path), evals=driver.eval_history,
                 wall_s=time.perf_counter() - t_start, plots=cfg.logging.plots)
    if not os.environ.get("RAY_ADDRESS"):
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
