"""deploy/kuberay: the 7B recipe's RayJob checked against the recipe (no Kubernetes here): its entrypoint loads,
its cluster offers what the recipe's placement plan asks for, and the run dir and hub cache are on the volume
every pod mounts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import tomllib
import yaml

from exgrpo.core.config_files import load_config
from exgrpo.runtime.resources import plan_resources

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "deploy" / "kuberay" / "qwen2.5-math-7b-rayjob.yaml"


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def entry_config():
    words = shlex.split(manifest()["spec"]["entrypoint"])
    assert words[:5] == ["python", "-m", "exgrpo.run", "--config", "configs/qwen2.5-math-7b.yaml"]
    assert (ROOT / words[4]).is_file()
    return load_config(words[4], words[5:])


def pods() -> list[tuple[dict, dict, int]]:
    """(rayStartParams, pod spec, replicas) of the head and every worker group."""
    cluster = manifest()["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    out = [(head["rayStartParams"], head["template"]["spec"], 1)]
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] == group["replicas"] == group["maxReplicas"]  # no autoscaling mid-run
        out.append((group["rayStartParams"], group["template"]["spec"], group["replicas"]))
    return out


def test_the_cluster_offers_what_the_recipe_plans():
    cfg = entry_config()
    plan = plan_resources(cfg)
    cpus = sum(float(params.get("num-cpus", 0)) * n for params, _, n in pods())
    gpus = sum(float(params.get("num-gpus", 0)) * n for params, _, n in pods())
    assert cpus >= plan.cpus and gpus >= plan.gpus, (cpus, gpus, plan.cpus, plan.gpus)
    largest = max(float(params.get("num-gpus", 0)) for params, _, _ in pods())
    # the learner group is one PACK placement group: its ranks fit one node (NCCL within the node)
    assert largest >= cfg.learners.num * cfg.learners.num_gpus
    for params, spec, _ in pods():  # Ray's numbers are what the container gets
        for c in spec["containers"]:
            limits = c["resources"]["limits"]
            assert float(limits.get("nvidia.com/gpu", 0)) == float(params.get("num-gpus", 0))
            assert float(params.get("num-cpus", 0)) <= float(limits["cpu"])


def test_the_versions_match_the_project():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ray_version = next(re.search(r"==([\d.]+)", d).group(1) for d in deps if d.startswith("ray["))  # type: ignore[union-attr]
    assert manifest()["spec"]["rayClusterSpec"]["rayVersion"] == ray_version
    dockerfile = (ROOT / "deploy" / "kuberay" / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{ray_version}-py311-gpu" in dockerfile and ".[gpu]" in dockerfile
    for _, spec, _ in pods():
        for c in spec["containers"]:
            assert (
                c["workingDir"] == "/home/ray/exgrpo"
            )  # where the image holds configs/ (the entrypoint's path)
    assert "WORKDIR /home/ray/exgrpo" in dockerfile


def test_run_dir_hub_cache_and_data_are_on_the_volume_every_pod_mounts():
    cfg = entry_config()
    assert cfg.model.path == "Qwen/Qwen2.5-Math-7B"  # a hub id: the driver downloads it into HF_HOME
    shared = set()
    for _, spec, _ in pods():
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v
        }
        for c in spec["containers"]:
            mounts = {m["mountPath"]: claims[m["name"]] for m in c["volumeMounts"] if m["name"] in claims}
            env = {e["name"]: e.get("value") for e in c["env"]}
            on_volume = {
                what: next(
                    (f"{claim}:{p}" for p, claim in mounts.items() if str(path).startswith(p + "/")), None
                )
                for what, path in (
                    ("run_dir", cfg.logging.run_dir),
                    ("hf_home", env["HF_HOME"]),
                    ("data", cfg.data.train),
                )
            }
            assert all(on_volume.values()), on_volume
            shared.add(tuple(sorted(on_volume.items())))
    assert len(shared) == 1  # the same claim and paths in every pod
    assert Path(cfg.logging.run_dir).is_absolute()
