"""The import direction of the packages (docs/architecture.md, "Packages"), read from the source.

Every import is read (module level, inside functions and under TYPE_CHECKING alike) and checked against
the layers below, lowest first. A module may import its own package and any layer below its own; it may
not import a layer above, nor a peer in the same layer (the roles never import each other: what two roles
share lives below them). Any import cycle between modules fails too.

The pure half is also imported for real with Ray, vLLM and DeepSpeed blocked, so the loop and its tests
run anywhere and the learner imports without Ray.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("exgrpo", "actors", "buffers", "learners")

# Lowest first. Packages in one tuple are peers: none imports another.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("exgrpo.core",),  # records, roles (Protocols), config, algorithm, selection, metric names, fileio
    ("exgrpo.verify",),  # the verifier, answer extraction, its worker pool
    ("exgrpo.data",),  # readers, builtin tasks, templates, prompt stream
    ("exgrpo.transport",),  # weights from learners to samplers: the seam both sides import
    ("actors", "buffers", "learners", "exgrpo.models", "exgrpo.loop"),  # the roles and the loop
    ("exgrpo.evaluation", "exgrpo.reporting"),  # measuring models; showing runs
    ("exgrpo.runtime",),  # Ray environment, assembly, the training recipe
    (
        "exgrpo.run",
        "exgrpo.scale",
        "exgrpo.evaluate",
        "exgrpo.cold_start",
        "exgrpo.plan",
        "exgrpo.experiments",
        "exgrpo.api",
    ),  # the command lines and the Python entry point
)
TOP_LEVEL = ("exgrpo",)  # `exgrpo/__init__.py`: imports nothing but, on first use, the Python entry point
TOP_LEVEL_MAY_IMPORT = (
    "exgrpo.api",
)  # `from exgrpo import train` (a module __getattr__: `import exgrpo` stays light)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports, anywhere in the file."""
    me = module_name(path)
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".") if is_pkg else me.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import mod` names a module; `from mod import name` names the module itself
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] in PACKAGES)
    out.discard(me)
    return out


def import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    modules = {module_name(p) for p in files}
    return {module_name(p): read_imports(p, modules) for p in files}


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer index, package) of the longest package prefix that owns `module`."""
    best: tuple[int, str] | None = None
    for i, layer in enumerate(LAYERS):
        for pkg in layer:
            if (module == pkg or module.startswith(pkg + ".")) and (best is None or len(pkg) > len(best[1])):
                best = (i, pkg)
    return best


def direction_violations(graph: Mapping[str, set[str]]) -> list[str]:
    out = []
    for src, deps in sorted(graph.items()):
        if src in TOP_LEVEL:
            out += [
                f"{src} -> {d}: the top-level package imports nothing"
                for d in sorted(deps - set(TOP_LEVEL_MAY_IMPORT))
            ]
            continue
        have = layer_of(src)
        if have is None:
            out.append(f"{src}: in no layer (add its package to LAYERS)")
            continue
        for dep in sorted(deps):
            if dep in TOP_LEVEL:
                continue
            want = layer_of(dep)
            if want is None:
                out.append(f"{src} -> {dep}: {dep} is in no layer")
            elif want[1] == have[1]:
                continue  # inside one package
            elif want[0] > have[0]:
                out.append(f"{src} -> {dep}: goes up ({have[1]} is below {want[1]})")
            elif want[0] == have[0]:
                out.append(f"{src} -> {dep}: peers ({have[1]} and {want[1]}) never import each other")
    return out


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_go_one_way():
    assert direction_violations(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def harness_imports(source: str) -> list[str]:
    """The imports of `bench` (the benchmarks and the simulated cluster) in one module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "bench"]
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == "bench"
        ):
            found.append(node.module or "")
    return found


def test_the_package_never_imports_the_harness():
    """bench/ (the simulated cluster and the sweep analyses included) sits above every package and is not
    installed with them (pyproject.toml's packages.find): no installed module may import it."""
    assert harness_imports("import os\nfrom bench.sim.cluster import SimCluster\n") == ["bench.sim.cluster"]
    found = {
        p.relative_to(ROOT).as_posix(): harness_imports(p.read_text())
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
    }
    assert {path: mods for path, mods in found.items() if mods} == {}


def test_the_checks_catch_a_planted_upward_import_and_cycle():
    graph = import_graph()
    assert "exgrpo.loop.driver" in graph["exgrpo.runtime.recipe"]  # the reader sees real imports
    assert "exgrpo.transport.vllm_api" in graph["learners.learner"]  # ... function-level ones too
    planted = {k: set(v) for k, v in graph.items()}
    planted["exgrpo.core.records"].add("exgrpo.loop.driver")  # up: core -> loop (and a cycle)
    planted["actors.sampler"].add("learners.learner")  # peers: a role importing another
    found = direction_violations(planted)
    assert "exgrpo.core.records -> exgrpo.loop.driver: goes up (exgrpo.core is below exgrpo.loop)" in found
    assert any(v.startswith("actors.sampler -> learners.learner: peers") for v in found)
    assert any("exgrpo.core.records" in c and "exgrpo.loop.driver" in c for c in cycles(planted))


# ---------------------------------------------------------------------------------- the pure half
PURE = [
    "exgrpo.core.records",
    "exgrpo.core.roles",
    "exgrpo.core.config",
    "exgrpo.core.algorithm",
    "exgrpo.core.selection",
    "exgrpo.core.metric_names",
    "exgrpo.verify.verifier",
    "exgrpo.data.readers",
    "exgrpo.data.tasks",
    "exgrpo.data.templates",
    "exgrpo.data.stream",
    "exgrpo.data.sources",
    "exgrpo.transport.packed",
    "exgrpo.loop.driver",
    "exgrpo.loop.observer",
    "exgrpo.loop.checkpoint",
    "buffers.experience",
    "buffers.shard",
    "buffers.sharded",
    "learners.learner",
    "learners.update",
]
HEAVY = ("ray", "vllm", "deepspeed")

SCRIPT = textwrap.dedent("""
    import importlib, sys, traceback
    heavy, modules = sys.argv[1].split(","), sys.argv[2].split(",")
    for name in heavy:
        sys.modules[name] = None  # `import name` (and any name.sub) now raises ImportError
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException:
            print(f"FAIL {name}: {traceback.format_exc()}")
        else:
            print(f"OK {name}")
    print("LOADED", ",".join(sorted(m for m in sys.modules if m.split(".")[0] in heavy and sys.modules[m])))
""")


def _run(modules: list[str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(HEAVY), ",".join(modules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_blocker_works():
    assert "FAIL ray" in _run(["ray"])


def test_pure_modules_import_without_ray_vllm_deepspeed():
    stdout = _run(PURE)
    for module in PURE:
        assert f"OK {module}" in stdout, stdout
    assert stdout.strip().endswith("LOADED"), stdout  # nothing heavy slipped in by another name


def test_importing_a_task_does_not_start_the_verifier():
    """Data takes string helpers from `verify.answers`; the verifier's pool (atexit and fork hooks) stays out."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, exgrpo.data.tasks, exgrpo.data.readers; "
            "print(sorted(m for m in sys.modules if m.startswith('exgrpo.verify')))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['exgrpo.verify', 'exgrpo.verify.answers']"


def test_trl_is_a_bench_baseline_only():
    """trl (the optional `bench` extra) is the peer baseline of bench/peers/bench_trl.py, never a runtime import."""
    pattern = re.compile(r"^\s*(import|from)\s+trl\b", re.M)
    offenders = [
        str(p.relative_to(ROOT))
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if pattern.search(p.read_text())
    ]
    assert offenders == []
    assert pattern.search(
        (ROOT / "bench" / "peers" / "bench_trl.py").read_text()
    )  # the pattern does find an import
