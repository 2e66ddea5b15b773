"""Qwen2.5-Math-7B-shaped weight loads into vLLM-CPU engines whose core runs in a child process.

    .venv/bin/python -m bench.weights.bench_7b_shapes [--layers 1] [--samplers 4] [--max-gb 8] [--quick]

The chunks of the 7B layout, then `load_weights` of a few-layer model of 7B's shapes per sampler; the figures:
docs/benchmarks.md, "7B-shaped weight loads".
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import env_defaults

env_defaults(ray=True)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

from exgrpo.transport.gloo import DEFAULT_BUFFER_BYTES  # noqa: E402
from exgrpo.transport.packed import chunk_cuts  # noqa: E402

# Qwen2.5-Math-7B's config.json (Qwen2 architecture); `layers` and `vocab` are what the runs here change
QWEN_7B: dict[str, Any] = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_attention_heads=28,
    num_key_value_heads=4,
    num_hidden_layers=28,
    vocab_size=152064,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)  # Qwen2Config's defaults give the rest (silu, rms_norm_eps 1e-6, no sliding window)
QUICK: dict[str, Any] = dict(hidden_size=256, intermediate_size=1024, num_attention_heads=2, vocab_size=4096)
# vLLM's NCCL engine's default chunk (vllm/distributed/weight_transfer/packed_tensor.py)
VLLM_NCCL_BUFFER_BYTES = 1 << 30
GB = 1e9


def qwen2_config(**changes: Any) -> Any:
    from transformers import Qwen2Config

    config = Qwen2Config(**{**QWEN_7B, **changes})
    config.num_key_value_heads = min(config.num_key_value_heads, config.num_attention_heads)
    return config


def param_shapes(config: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every parameter in `named_parameters` order (what the learner sends), no memory."""
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def chunk_report(buffer_bytes: int, *, layers: int = 28) -> dict[str, Any]:
    """The 7B layout (bf16) cut by `chunk_cuts` at `buffer_bytes`: chunk count, largest chunk and its tensors."""
    shapes = param_shapes(qwen2_config(num_hidden_layers=layers))
    sizes = [2 * int(torch.Size(shape).numel()) for _, shape in shapes]
    cuts = chunk_cuts(sizes, buffer_bytes)
    largest = max(cuts, key=lambda cut: sum(sizes[i] for i in cut))
    chunk_bytes = [sum(sizes[i] for i in cut) for cut in cuts]
    return {
        "two_in_flight_bytes": max(
            (a + b for a, b in zip(chunk_bytes, chunk_bytes[1:], strict=False)), default=0
        ),
        "tensors": len(shapes),
        "bytes": sum(sizes),
        "chunks": len(cuts),
        "largest_bytes": sum(sizes[i] for i in largest),
        "largest_names": [shapes[i][0] for i in largest],
    }


def build_model(out: Path, config: Any) -> int:
    """A random bf16 HF model dir (config, char tokenizer, safetensors); returns its bytes."""
    from safetensors.torch import save_file

    from exgrpo.models.tiny import build_char_tokenizer, save_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    config.dtype = "bfloat16"
    config.architectures = ["Qwen2ForCausalLM"]
    config.save_pretrained(out)
    save_tokenizer(build_char_tokenizer(), out)
    gen = torch.Generator().manual_seed(0)
    state = {}
    for name, shape in param_shapes(config):
        t = torch.empty(shape, dtype=torch.bfloat16)
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        state[name] = t
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() * t.element_size() for t in state.values())


# ----------------------------------------------------------------------------------------- in a sampler process
def _hwm(pid: int | str = "self") -> int:
    """Peak resident bytes of a process (VmHWM: anonymous, file and shared-memory pages)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _served_norm(model: torch.nn.Module) -> float:
    """Runs on the vLLM worker: the served final norm's first value (each load sends a new one)."""
    return float(model.model.norm.weight.detach().flatten()[0])


def _engine(model_dir: str, **kwargs: Any) -> tuple[Any, dict[str, int]]:
    """A child-core engine and its processes ({"core": pid, "worker": pid}: vLLM-CPU runs its worker in a
    process below the engine core's)."""
    import psutil

    from actors.vllm_engine import VLLMEngine

    engine = VLLMEngine(model_dir, dtype="bfloat16", engine_process="child", max_model_len=128, **kwargs)
    procs = {}
    for p in psutil.Process().children(recursive=True):
        if p.name().startswith("VLLM::"):
            procs["core" if "Core" in p.name() else "worker"] = p.pid
    return engine, procs


def _peaks(procs: dict[str, int]) -> dict[str, int]:
    return {"sampler": _hwm(), **{name: _hwm(pid) for name, pid in procs.items()}}


def _mapped_state(model_dir: str) -> dict[str, torch.Tensor]:
    """The model's weights as views of its safetensors file (a private mapping: what a sampler holds is a
    mapping too, of the object store), in the learner's order (the file keeps them sorted by name)."""
    from transformers import AutoConfig

    with open(Path(model_dir) / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        start = f.tell()
        flat = torch.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), dtype=torch.uint8)
    state = {}
    for name, shape in param_shapes(AutoConfig.from_pretrained(model_dir)):
        begin, end = header[name]["data_offsets"]
        state[name] = flat[start + begin : start + end].view(torch.bfloat16).view(shape)
    return state


class _Weights(torch.nn.Module):
    """A learner module's stand-in for `LearnerSource`: the state dict's tensors as parameters, HF names."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, tensor in state.items():
            owner: torch.nn.Module = self
            *path, leaf = name.split(".")
            for part in path:
                owner = owner._modules.setdefault(part, torch.nn.Module())
            owner.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))


def object_store(model_dir: str, repeats: int, barrier: Any = None) -> dict[str, Any]:
    """`VLLMEngine.load_weights` of the whole state dict, alternating the direct load and vLLM's reload."""
    torch.set_num_threads(1)
    state = _mapped_state(model_dir)
    engine, core = _engine(model_dir)
    before = _peaks(core)
    stager, stage = engine._stager, engine._stager.stage
    marks: dict[str, float] = {}

    @contextmanager
    def timed(weights: Any) -> Iterator[Any]:
        t0 = time.perf_counter()
        with stage(weights) as staged:
            marks["written"] = time.perf_counter()
            marks["write_s"] = marks["written"] - t0
            yield staged

    stager.stage = timed
    times: dict[str, list[tuple[float, float, float]]] = {"direct": [], "reload": []}
    if barrier is not None:
        barrier.wait()
    for i in range(2 * repeats):
        path = ("direct", "reload")[i % 2]
        engine.weight_path = path
        value = 1.0 + (i + 1) / 64  # exact in bf16
        state["model.norm.weight"].fill_(value)
        t0 = time.perf_counter()
        engine.load_weights(state, version=i + 1)
        done = time.perf_counter()
        served = engine.llm.apply_model(_served_norm)[0]
        if served != value:
            raise RuntimeError(f"load {i + 1} ({path}) served norm {served}, sent {value}")
        times[path].append((marks["write_s"], done - marks["written"], done - t0))
    return {
        "bytes": stager.reserved,
        "staging_dir": str(stager.directory),
        "times": times,
        "hwm_before": before,
        "hwm": _peaks(core),
    }


class _Client:
    """vLLM's weight-sync client protocol straight onto one engine (the sampler actor's part, without Ray)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.version = engine, 0

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.engine.init_weight_transfer(init_info)

    def start_weight_update(self) -> None:
        self.engine.start_weight_update()

    def update_weights(self, update_info: dict) -> None:
        self.engine.update_weights(update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.engine.finish_weight_update(version=self.version)


def collective(model_dir: str, repeats: int) -> dict[str, Any]:
    """Our gloo engine through vLLM's weight-transfer API: trainer (this process) to the child core's worker."""
    from exgrpo.transport.gloo import GlooTrainerInitInfo, GlooTrainerWeightTransferEngine
    from exgrpo.transport.vllm_api import LearnerSource

    torch.set_num_threads(1)
    module = _Weights(_mapped_state(model_dir))
    engine, core = _engine(model_dir, weight_transfer="gloo")
    before = _peaks(core)
    client = _Client(engine)
    info = GlooTrainerInitInfo(world_size=2, group_name="bench-7b", timeout_s=1200.0, rank=0)
    trainer = GlooTrainerWeightTransferEngine.trainer_init(info, client=client, source=LearnerSource(module))
    seconds = []
    for i in range(repeats):
        client.version = i + 1
        value = 1.0 + (i + 1) / 64
        with torch.no_grad():
            module.get_parameter("model.norm.weight").fill_(value)
        t0 = time.perf_counter()
        trainer.send_weights()
        seconds.append(time.perf_counter() - t0)
        served = engine.llm.apply_model(_served_norm)[0]
        if served != value:
            raise RuntimeError(f"update {i + 1} served norm {served}, sent {value}")
    trainer.shutdown()
    nbytes = sum(p.numel() * p.element_size() for p in module.parameters())
    return {
        "bytes": nbytes,
        "seconds": seconds,
        "hwm_before": before,
        "hwm": _peaks(core),
    }


def _run(target: Any, queue: Any, *args: Any) -> None:
    """A sampler process: its result on `queue`, then gone at once, as Ray ends an actor (the engine's reaper
    stops its core; a normal exit would wait for the core, which vLLM leaves running)."""
    try:
        result = target(*args)
    except BaseException as err:
        result = {"error": f"{type(err).__name__}: {err}"}
    queue.put(result)
    queue.close()
    queue.join_thread()
    os._exit(0)


def in_processes(target: Any, args: tuple, count: int = 1) -> list[dict[str, Any]]:
    """target(*args[, barrier]) in `count` spawned sampler processes at once (not daemons: each starts its
    own engine core); their results in order of completion."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    extra = (ctx.Barrier(count),) if count > 1 else ()
    procs = [ctx.Process(target=_run, args=(target, queue, *args, *extra)) for _ in range(count)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError("; ".join(errors))
    return results


# ------------------------------------------------------------------------------------------------- printing
def _gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


def _rss(result: dict[str, Any]) -> str:
    b, h = result["hwm_before"], result["hwm"]
    return ", ".join(f"{k} {_gb(h[k])} ({_gb(b[k])} before the loads)" for k in h)


def print_object_store(label: str, result: dict[str, Any]) -> None:
    n = result["bytes"]
    print(
        f"{label}: {_gb(n)} staged in {result['staging_dir']} (the staging file's size, its peak)", flush=True
    )
    for path, rows in result["times"].items():
        write, load, total = (statistics.median(col) for col in zip(*rows, strict=True))
        print(
            f"  {path:<6} staging write {n / write / GB:5.2f} GB/s ({write:6.2f} s)  map+load "
            f"{n / load / GB:5.2f} GB/s ({load:6.2f} s)  load_weights {total:6.2f} s  (median of {len(rows)})",
            flush=True,
        )
    first = result["times"]["direct"][0][0]
    print(
        f"  the first load's staging write (it reserves the file): {n / first / GB:5.2f} GB/s ({first:.2f} s)"
    )
    print(f"  peak RSS: {_rss(result)}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=1, help="decoder layers of the served model")
    parser.add_argument("--vocab", type=int, default=QWEN_7B["vocab_size"])
    parser.add_argument("--repeats", type=int, default=3, help="loads per path")
    parser.add_argument("--samplers", type=int, default=4, help="samplers loading at once")
    parser.add_argument("--max-gb", type=float, default=8.0, help="memory the samplers at once may take")
    parser.add_argument("--skip-collective", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a narrow model, one repeat")
    parser.add_argument("--workdir", default=None, help="where the model is written (default: a temp dir)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    for label, size in (
        ("gloo DEFAULT_BUFFER_BYTES", DEFAULT_BUFFER_BYTES),
        ("vLLM NCCL", VLLM_NCCL_BUFFER_BYTES),
    ):
        r = chunk_report(size)
        print(
            f"7B layout, {r['tensors']} tensors, {_gb(r['bytes'])} bf16; {label} {size / 2**20:.0f} MiB: "
            f"{r['chunks']} chunks, largest {r['largest_bytes'] / 2**20:.1f} MiB ({', '.join(r['largest_names'])}); "
            f"two consecutive chunks at most {r['two_in_flight_bytes'] / 2**20:.1f} MiB",
            flush=True,
        )
    changes = {"num_hidden_layers": args.layers, "vocab_size": args.vocab}
    if args.quick:
        changes |= QUICK
        args.repeats = 1
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        model_dir = Path(tmp) / "model"
        nbytes = build_model(model_dir, qwen2_config(**changes))
        print(f"served model: {args.layers} layer(s), {changes}, {_gb(nbytes)} bf16", flush=True)
        one = in_processes(object_store, (str(model_dir), args.repeats))[0]
        print_object_store("object store, 1 sampler", one)
        per = sum(one["hwm"].values())
        need = args.samplers * per
        if args.samplers > 1 and need > args.max_gb * GB:
            print(
                f"{args.samplers} samplers at once: not run, they would take about {_gb(need)} "
                f"({_gb(per)} each: the peak RSS of a sampler, its core and worker) > --max-gb {args.max_gb:g}",
                flush=True,
            )
        elif args.samplers > 1:
            t0 = time.perf_counter()
            many = in_processes(object_store, (str(model_dir), args.repeats), count=args.samplers)
            print(
                f"{args.samplers} samplers at once ({time.perf_counter() - t0:.0f} s with their starts):",
                flush=True,
            )
            for i, result in enumerate(many):
                print_object_store(f"sampler {i}", result)
        if not args.skip_collective:
            coll = in_processes(collective, (str(model_dir), args.repeats))[0]
            med = statistics.median(coll["seconds"])
            print(
                f"collective (gloo, {DEFAULT_BUFFER_BYTES >> 20} MiB chunks), 1 sampler: {_gb(coll['bytes'])} in "
                f"{med:.2f} s = {coll['bytes'] / med / GB:.2f} GB/s (median of {len(coll['seconds'])})\n"
                f"  peak RSS: {_rss(coll)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
