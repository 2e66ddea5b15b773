"""What `bench_elastic` watches, does and measures: the nodes the autoscaler launches (`NodeWatch`), the CPU their
processes take from this machine (`NodeCpu`), each step's live samplers (`StepTrace`, an observer of the driver),
the preemptions (`Chaos`, a thread of its own that kills nodes from `pool.nodes()`), a run's figures
(`ElasticRun`), and from them the time until the pool was back at its count, a killed node's replacement and
preemption's throughput budget. Used by bench/system/bench_elastic.py only.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from exgrpo.loop.observer import Observer


class NodeWatch(threading.Thread):
    """Polls the GCS every 0.25 s: when each worker node was first seen alive and when it was last seen."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.joined: dict[str, float] = {}  # node id -> monotonic time first seen alive
        self.gone: dict[str, float] = {}  # node id -> monotonic time first seen dead or missing
        self.stop = threading.Event()

    def run(self) -> None:
        import ray

        while not self.stop.wait(0.25):
            try:
                nodes = ray.nodes()
            except Exception:  # noqa: BLE001 - a missed poll is retried
                continue
            now, alive = time.monotonic(), set()
            for n in nodes:
                if n["Resources"].get("sampler_node") and n["Alive"]:
                    alive.add(n["NodeID"])
                    self.joined.setdefault(n["NodeID"], now)
            for node in set(self.joined) - alive - set(self.gone):
                self.gone[node] = now

    def joins(self, t0: float, t1: float) -> list[float]:
        return sorted(t for t in self.joined.values() if t0 <= t <= t1)


class NodeCpu(threading.Thread):
    """Polls the worker nodes' processes (`FakeAutoscaler.node_processes`) every 0.5 s: when each started and
    its CPU seconds in its first `window_s` seconds, a node's launch (its raylet, agents, prestarted workers and
    the sampler's worker starting). On one machine that CPU is taken from the run being measured; on a cluster it
    runs on the new host."""

    def __init__(self, fa: Any, window_s: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.fa, self.window_s = fa, window_s
        self.procs: dict[tuple[int, float], tuple[float, float]] = {}  # (pid, created) -> (start, CPU s)
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.stop.wait(0.5):
            now = time.monotonic()
            offset = now - time.time()
            for p in self.fa.node_processes():
                try:
                    with p.oneshot():
                        created, t = p.create_time(), p.cpu_times()
                except psutil.Error:  # gone since the listing
                    continue
                if now - (created + offset) <= self.window_s:  # still launching
                    self.procs[(p.pid, created)] = (created + offset, t.user + t.system)

    def cpu_s(self, t0: float, t1: float) -> float:
        """Launch CPU seconds of the node processes that started between t0 and t1 (monotonic)."""
        return sum(cpu for start, cpu in self.procs.values() if t0 <= start <= t1)


Arm = Literal["fixed", "elastic"]


@dataclass(frozen=True)
class ElasticRun:
    """One run of `bench_elastic`: a row of its table; `dataclasses.asdict` is its JSON."""

    arm: Arm
    samplers: int  # fixed: the count; elastic: the most it may grow to
    settle_s: float  # waiting for the idle nodes of the run before to go (not timed)
    start_s: float  # a fixed count's samplers starting (from one) before its first step
    preempt: bool
    steps: int
    wall_s: float  # start_s included
    groups_per_s: float  # trained groups per second of wall_s
    lost: int  # questions per step x steps - groups trained
    preempted: int  # nodes killed
    preempted_samplers: int
    samplers_over_time: tuple[int, ...]  # live samplers after each step
    step_times: tuple[float, ...]  # s into the run of each step record
    decisions: tuple[tuple[int, int, int, str], ...]  # the fleet's (step, old, new, reason)
    first_growth_step: int | None  # elastic: the step whose record first raised the target
    growth_node_joins_s: tuple[float, ...]  # node joins after the ask (fixed) or the decision (elastic)
    at_target_s: float | None  # s into the run when as many samplers served as the target
    kills: tuple[dict[str, float], ...]  # {at_s, nodes, samplers, live}
    replace_node_s: tuple[float, ...]  # a killed node -> a new worker node alive
    node_cpu_s: float | None  # launch CPU seconds of the node processes started during the run
    replacement_cpu_s: float | None  # ... of those started after the first kill (the replacements)
    recover_s: tuple[float, ...]  # a kill -> the pool back at its count
    seen_lost_s: tuple[float, ...]  # a kill -> the pool saw its samplers lost
    round: int = 0  # the repeat (--repeats) it belongs to; the sweep's runs are round 0

    @property
    def name(self) -> str:
        return "elastic" if self.arm == "elastic" else str(self.samplers)


class StepTrace(Observer):
    """An observer of the driver that only watches: after each step record, its step, the live samplers, the
    target and the monotonic time (`changed` is notified, for `Chaos`)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.steps: list[int] = []
        self.samplers: list[int] = []
        self.times: list[float] = []
        self.targets: list[float] = []
        self.changed = threading.Condition()

    def on_step(self, *, record: dict[str, Any]) -> None:
        from exgrpo.core import metric_names as M

        live = len(self.pool.members())
        with self.changed:
            self.times.append(time.monotonic())
            self.samplers.append(live)
            self.targets.append(float(record.get(M.SAMPLERS_TARGET, live)))
            self.steps.append(int(record[M.STEP]))
            self.changed.notify_all()


class Chaos(threading.Thread):
    """Preemption, a driver of its own beside the run's observers: after every `every`-th step that `trace`
    records (step > 0), it kills a quarter (at least one) of the live nodes: the worker nodes of `fa` that run a
    live sampler (`pool.nodes()`), or, without an autoscaler, the live sampler actors. `stop` ends it."""

    def __init__(self, trace: StepTrace, pool: Any, every: int, fa: Any = None) -> None:
        super().__init__(daemon=True)
        self.trace, self.pool, self.every, self.fa = trace, pool, every, fa
        self.kills: list[dict[str, Any]] = []  # {t, nodes, samplers, live}
        self.stop = threading.Event()

    @property
    def killed(self) -> int:
        return sum(k["nodes"] for k in self.kills)

    def run(self) -> None:
        seen, trace = 0, self.trace
        while not self.stop.is_set():
            with trace.changed:
                if len(trace.steps) <= seen:
                    trace.changed.wait(timeout=0.25)
                new = list(zip(trace.steps[seen:], trace.samplers[seen:], strict=True))
            seen += len(new)
            for step, live in new:
                if self.every and step > 0 and step % self.every == 0:
                    self.strike(live)

    def strike(self, live: int) -> None:
        """Kill a quarter (at least one) of the live nodes now; `live`: the samplers at the step that asked."""
        t = time.monotonic()
        if self.fa is None:
            import ray

            members = list(self.pool.members().values())
            victims = members[: max(1, math.ceil(len(members) / 4))]
            for handle in victims:
                ray.kill(handle, no_restart=True)
            self.kills.append({"t": t, "nodes": len(victims), "samplers": len(victims), "live": live})
            return
        workers = {n["NodeID"] for n in self.fa.worker_nodes()}
        per_node = Counter(node for node in self.pool.nodes().values() if node in workers)
        if not per_node:
            return
        nodes = sorted(per_node)[: max(1, math.ceil(len(per_node) / 4))]
        for node in nodes:
            self.fa.kill_node(node)
        self.kills.append(
            {"t": t, "nodes": len(nodes), "samplers": sum(per_node[n] for n in nodes), "live": live}
        )


def at_target(trace: StepTrace, m0: float) -> float | None:
    """Seconds after m0 of the first step record with as many live samplers as a target above one; None if never."""
    rows = zip(trace.times, trace.samplers, trace.targets, strict=True)
    return next((round(t - m0, 1) for t, live, tgt in rows if live >= tgt and tgt > 1), None)


def recoveries(trace: StepTrace, kills: list[dict[str, Any]], end: float) -> list[float]:
    """For each kill, the seconds until the pool was back at its count: the first step record, after the one
    where the pool had noticed the deaths (fewer live samplers), with as many live samplers as before the kill
    (or the target, if it shrank since); the run's end if never."""
    out = []
    rows = list(zip(trace.times, trace.samplers, trace.targets, strict=True))
    for k in kills:
        after = [(t, live, tgt) for t, live, tgt in rows if t > k["t"]]
        noticed = next((i for i, (_, live, _) in enumerate(after) if live < k["live"]), 0)
        back = next((t for t, live, tgt in after[noticed:] if live >= min(k["live"], tgt)), end)
        out.append(back - k["t"])
    return out


def detections(lost_at: list[float], kills: list[dict[str, Any]]) -> list[float]:
    """For each kill, the seconds until the pool saw a sampler of it lost (its first loss after the kill)."""
    out = []
    for k in kills:
        seen = [t for t in lost_at if t >= k["t"]]
        if seen:
            out.append(min(seen) - k["t"])
    return out


def replacements(nodes: NodeWatch | None, kills: list[dict[str, Any]], end: float) -> list[float]:
    """For each killed node, the seconds until a new worker node joined (first kill first)."""
    if nodes is None:
        return []
    times = sorted(k["t"] for k in kills for _ in range(k["nodes"]))
    out, joins = [], nodes.joins(times[0] if times else end, end)
    for t in times:
        later = [j for j in joins if j > t]
        if later:
            out.append(later[0] - t)
            joins.remove(later[0])
    return out


def budget(run: ElasticRun) -> float:
    """Preemption's budget: sum over kills of (samplers killed / live before) x (s until back), over the wall."""
    pairs = zip(run.kills, run.recover_s, strict=True)
    return sum(k["samplers"] / max(1, k["live"]) * r for k, r in pairs) / run.wall_s


def span(xs: list[float], digits: int = 1) -> str:
    if not xs:
        return "none"
    f = f".{digits}f"
    return f"mean {sum(xs) / len(xs):{f}} s (min {min(xs):{f}}, max {max(xs):{f}}, n {len(xs)})"


def preemption_lines(runs: list[ElasticRun], cores: int) -> None:
    """Each round's preempted runs against the same round's unpreempted run of the same arm: the throughput
    lost, its budget and, where measured, the loss with the replacement nodes' launch CPU taken off; with
    several rounds, their mean and standard error."""
    over: dict[str, list[tuple[float, float, float | None]]] = {}
    for pre in (r for r in runs if r.preempt):
        if not pre.kills:  # e.g. elastic never grew past the head's sampler: nothing to compare
            print(f"# with preemption (round {pre.round}): {pre.name}: no node was preempted")
            continue
        base = next(
            r
            for r in runs
            if not r.preempt and r.arm == pre.arm and r.samplers == pre.samplers and r.round == pre.round
        )
        lost, b = 1 - pre.groups_per_s / base.groups_per_s, budget(pre)
        print(
            f"# with preemption (round {pre.round}): {pre.name} at {pre.groups_per_s:.2f} groups/s, lost "
            f"{lost:.0%} of its unpreempted throughput; budget (preempted share x time back, over the wall) "
            f"{b:.0%}: {'within' if lost <= b else 'OVER'}"
        )
        net = None
        if pre.replacement_cpu_s is not None:
            # an estimate: the run is CPU-bound on this machine, so CPU the new nodes took is time it lost
            share = pre.replacement_cpu_s / cores / pre.wall_s
            net = lost - share
            print(
                f"#   its replacement nodes' processes took {pre.replacement_cpu_s:.1f} CPU-s of the {cores} cores "
                f"({share:.0%} of the wall); lost without them (on a cluster a node boots on its own host; "
                f"an estimate) {net:.0%}: {'within' if net <= b else 'OVER'}"
            )
        over.setdefault(pre.name, []).append((lost, b, net))
    for arm, xs in over.items():
        if len(xs) > 1:
            d = [lost - b for lost, b, _ in xs]
            dn = [net - b for _, b, net in xs if net is not None]
            print(
                f"# with preemption, {arm} over {len(xs)} rounds: lost - budget {mean_se(d)}"
                + (f"; without the replacements' launches {mean_se(dn)}" if dn else "")
            )


def mean_se(xs: list[float]) -> str:
    m = sum(xs) / len(xs)
    se = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) ** 0.5 if len(xs) > 1 else 0.0
    return f"{m:+.0%} ± {se:.0%}"
