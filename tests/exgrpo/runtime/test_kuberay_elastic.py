"""deploy/kuberay's elastic RayJob (no Kubernetes here): in-tree autoscaling on, learners on one fixed
on-demand pod that holds their placement group, a sampler group whose min/max replicas bound what the run's
autoscale policy may ask for, each pod holding one sampler, and the spot options documented in the group."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from exgrpo.core.config_files import load_config
from exgrpo.runtime.elastic import dry_run_line, sampler_bundle

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "deploy" / "kuberay" / "qwen2.5-math-7b-elastic-rayjob.yaml"


def spec() -> dict:
    return yaml.safe_load(MANIFEST.read_text())["spec"]


def config():
    words = shlex.split(spec()["entrypoint"])
    assert words[:4] == ["python", "-m", "exgrpo.run", "--config"]
    return load_config(words[4], words[5:])


def groups() -> dict[str, dict]:
    return {g["groupName"]: g for g in spec()["rayClusterSpec"]["workerGroupSpecs"]}


def test_in_tree_autoscaling_and_the_sampler_group_bounds_the_policy():
    cfg, cluster = config(), spec()["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True
    s, g = cfg.samplers, groups()["samplers"]
    assert s.autoscale and 1 <= s.autoscale_min <= s.autoscale_max
    assert g["minReplicas"] < g["maxReplicas"]
    bundle = sampler_bundle(s)
    params = g["rayStartParams"]
    per_pod = min(float(params["num-gpus"]) // bundle["GPU"], float(params["num-cpus"]) // bundle["CPU"])
    assert per_pod == 1 and g["maxReplicas"] * per_pod >= s.autoscale_max
    assert g["minReplicas"] * per_pod <= s.autoscale_min
    assert "8 samplers" in (dry_run_line(cfg) or "") and "8 GPU" in (dry_run_line(cfg) or "")


def test_learners_on_a_fixed_on_demand_pod_and_samplers_may_go_on_spot():
    cfg, g = config(), groups()
    learners = g["learners"]
    assert learners["minReplicas"] == learners["maxReplicas"] == learners["replicas"] == 1
    assert float(learners["rayStartParams"]["num-gpus"]) == cfg.learners.num * cfg.learners.num_gpus
    assert learners["template"]["spec"]["nodeSelector"] == {"exgrpo.io/capacity": "on-demand"}
    assert "nodeSelector" not in g["samplers"]["template"]["spec"]  # an option, commented in the manifest
    text = MANIFEST.read_text()
    assert "# tolerations:" in text and "# nodeSelector: {cloud.google.com/gke-spot" in text
    assert spec()["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
