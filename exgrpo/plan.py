"""The placement plan of a config: which actors start, with which resources (`--dry-run`)."""

from __future__ import annotations

from exgrpo.config import Config


def placement_plan(cfg: Config) -> str:
    s, lr, r = cfg.samplers, cfg.learners, cfg.replay
    rows = [(f"exgrpo-learner-{i}", lr.num_cpus, lr.num_gpus, "placement group 'learners' (PACK)") for i in range(lr.num)]
    rows += [(f"exgrpo-sampler-{i}", s.num_cpus, s.num_gpus, f"engine={s.engine}") for i in range(s.num)]
    rows += [(f"exgrpo-replay-{i}", 0, 0, "replay shard") for i in range(r.num_shards)]
    rows += [("exgrpo-controller", 0, 0, "scaling controller")]
    width = max(len(n) for n, *_ in rows)
    lines = [f"{'actor':<{width}}  {'CPUs':>5}  {'GPUs':>5}  notes"]
    lines += [f"{n:<{width}}  {c:>5g}  {g:>5g}  {note}" for n, c, g, note in rows]
    total_cpu = sum(c for _, c, _, _ in rows)
    total_gpu = sum(g for _, _, g, _ in rows)
    lines.append(f"total: {total_cpu:g} CPUs, {total_gpu:g} GPUs; learner ZeRO stage {lr.zero_stage}, "
                 f"weight sync {cfg.async_.weight_sync}, max staleness {cfg.async_.max_staleness}")
    return "\n".join(lines)
