"""Whether an autoscaler can add nodes (`exgrpo.runtime.elastic.autoscaler_from_status`), what the sampler pool's
request says on a cluster without one, and the dry run's line on the autoscale policy's largest target
(`exgrpo.runtime.clusters.autoscale_reach`): all without Ray."""

from __future__ import annotations

import json
import logging

import pytest

from exgrpo import run
from exgrpo.core.config_files import load_config
from exgrpo.runtime import clusters
from exgrpo.runtime.elastic import AUTOSCALER, NONE, UNKNOWN, ClusterRequest, autoscaler_from_status


def status(*types: str) -> str:
    """The autoscaler monitor's status JSON (the fields read), with one node of each type."""
    mapping = {f"id{i}": t for i, t in enumerate(types)}
    return json.dumps(
        {"autoscaler_report": {"active_nodes": {t: 1 for t in types}, "node_type_mapping": mapping}}
    )


def test_the_read_only_provider_is_no_autoscaler_and_a_cluster_config_is_one():
    assert autoscaler_from_status(status("node_7278f9de87ec")) == (
        NONE,
        [],
    )  # a local cluster, ray start by hand
    assert autoscaler_from_status(status("ray.head.default", "sampler")) == (
        AUTOSCALER,
        ["ray.head.default", "sampler"],
    )
    assert autoscaler_from_status(None) == (UNKNOWN, [])
    assert autoscaler_from_status(b"{}") == (UNKNOWN, [])
    assert autoscaler_from_status(json.dumps({"autoscaler_report": {}})) == (UNKNOWN, [])


def test_asks_without_an_autoscaler_are_quiet_after_one_warning(caplog):
    asked = []
    req = ClusterRequest(
        {"CPU": 1.0}, request=lambda bundles: asked.append(len(bundles)), status=lambda: (NONE, [])
    )
    with caplog.at_level(logging.DEBUG, logger="exgrpo"):
        req(3)
        req(2)
        req(0)
    assert asked == [3, 2, 0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no autoscaler can add nodes to this Ray cluster" in warnings[0]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.levelno != logging.WARNING)


def test_asks_with_an_autoscaler_are_logged_and_the_end_is_a_release(caplog):
    req = ClusterRequest(
        {"CPU": 1.0},
        request=lambda bundles: None,
        status=lambda: (AUTOSCALER, ["ray.head.default", "sampler"]),
    )
    with caplog.at_level(logging.INFO, logger="exgrpo"):
        req(2)
        req(0)
    text = caplog.text
    assert "an autoscaler runs on this Ray cluster (its nodes now: ray.head.default, sampler)" in text
    assert "asked Ray's autoscaler for 2 sampler bundles of {'CPU': 1.0}" in text
    assert "released the run's request to Ray's autoscaler" in text and "0 sampler bundles" not in text


def cfg(*over: str):
    return load_config(
        "tiny-cpu", ["samplers.autoscale=true", "samplers.autoscale_max=4", "samplers.num_cpus=1", *over]
    )


def test_reach_counts_the_samplers_the_cluster_holds_and_says_what_adds_the_rest():
    c = cfg()  # 1 learner x 1 CPU + samplers x 1 CPU
    line = clusters.autoscale_reach(c, {"CPU": 3.0}, [], autoscaler=("local", []))
    assert "holds 2 of autoscale_max=4 samplers" in line and "a local cluster has no autoscaler" in line
    assert "set samplers.autoscale_max=2" in line
    line = clusters.autoscale_reach(c, {"CPU": 3.0}, [{"CPU": 3.0}], autoscaler=(NONE, []))
    assert "no autoscaler can add nodes there" in line
    line = clusters.autoscale_reach(c, {"CPU": 2.0}, [], autoscaler=(AUTOSCALER, ["ray.head.default"]))
    assert "holds 1 of autoscale_max=4" in line and "need nodes from its autoscaler" in line
    line = clusters.autoscale_reach(c, {"CPU": 2.0}, [], autoscaler=(UNKNOWN, []))
    assert "was not readable" in line
    line = clusters.autoscale_reach(c, {"CPU": 5.0}, [], autoscaler=("local", []))
    assert "holds all autoscale_max=4 samplers" in line and "reachable" in line
    assert (
        clusters.autoscale_reach(load_config("tiny-cpu"), {"CPU": 2.0}, [], autoscaler=("local", [])) is None
    )


@pytest.fixture
def _no_skip(monkeypatch):
    monkeypatch.delenv("EXGRPO_SKIP_RESOURCE_CHECK", raising=False)


def test_the_dry_run_prints_the_reach_of_the_cluster_at_ray_address(monkeypatch, capsys, _no_skip):
    def two_cpus(address):
        return {"CPU": 2.0, "GPU": 0.0}, [{"CPU": 2.0, "GPU": 0.0}], (NONE, [])

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(clusters, "cluster_totals", two_cpus)
    over = ["samplers.num=1", "samplers.num_cpus=1", "samplers.autoscale=true", "samplers.autoscale_max=4"]
    assert run.main(["--dry-run", "--config", "tiny-cpu", *over]) == 0
    out = capsys.readouterr().out
    assert "fits the Ray cluster at 10.0.0.1:6379: the plan needs 2 of 2 CPUs" in out
    assert "the cluster as it is holds 1 of autoscale_max=4 samplers" in out
    assert "no autoscaler can add nodes there" in out and "set samplers.autoscale_max=1" in out
