"""The deployment examples in deploy/ are ones a user can apply: the Ray cluster launcher
YAMLs pass Ray's own config preparation and validation (what `ray up` runs before it
contacts a cloud) and have a reserved node type, a spot one with the `preemptible` resource,
and token authentication on every node; the KubeRay RayCluster parses, has the fields
KubeRay requires, and its spot group's preStop hook is an `rlboost notice` this release's
command line accepts."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from rlboost.cli import build_parser
from rlboost.recipes import get_recipe

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
LAUNCHERS = {"aws": DEPLOY / "aws" / "rlboost-spot.yaml", "gcp": DEPLOY / "gcp" / "rlboost-spot.yaml"}


def _ray_checked(path: Path) -> dict:
    config = yaml.safe_load(path.read_text())
    prepared = prepare_config(copy.deepcopy(config))  # the defaults of the provider merged in, as `ray up` does
    validate_config(prepared)
    return config


@pytest.mark.parametrize("cloud", sorted(LAUNCHERS))
def test_each_launcher_yaml_passes_ray_s_own_validation(cloud):
    config = _ray_checked(LAUNCHERS[cloud])
    types = config["available_node_types"]
    qwen = get_recipe("qwen3_gpu")
    reserved = [t for t in types.values() if t.get("resources", {}).get("reserved", 0) > 0]
    spot = [t for t in types.values() if t.get("resources", {}).get("preemptible", 0) > 0]
    assert len(reserved) == 1 and len(spot) == 1
    assert reserved[0]["resources"]["reserved"] >= qwen.trainer.world_size + qwen.cluster.reserved_instances
    assert spot[0]["min_workers"] == 0  # the autoscaler adds them when the run asks
    assert spot[0]["resources"]["preemptible"] * spot[0]["max_workers"] >= qwen.cluster.max_preemptible
    node = spot[0]["node_config"]
    if cloud == "aws":
        assert node["InstanceMarketOptions"]["MarketType"] == "spot"
        assert "InstanceMarketOptions" not in reserved[0]["node_config"]
    else:
        assert node["scheduling"]["provisioningModel"] == "SPOT"
        assert "provisioningModel" not in reserved[0]["node_config"]["scheduling"]
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert all("export RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)
    assert "~/.ray/auth_token" in config["file_mounts"].values()  # the token reaches every node


def test_ray_s_validation_is_no_formality():
    config = yaml.safe_load(LAUNCHERS["aws"].read_text())
    config["max_worker"] = 3  # a typo Ray's schema refuses
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(config))


def test_the_kuberay_cluster_has_its_fields_and_a_pre_stop_notice():
    manifest = yaml.safe_load((DEPLOY / "kuberay" / "rlboost-raycluster.yaml").read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"
    spec = manifest["spec"]
    assert spec["authOptions"]["mode"] == "token" and spec["rayVersion"] >= "2.52"
    head = spec["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict) and head["template"]["spec"]["containers"][0]["image"]
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    for group in groups.values():
        assert {"groupName", "rayStartParams", "template", "minReplicas", "maxReplicas"} <= set(group)
        assert group["template"]["spec"]["containers"][0]["image"]
    spot = next(g for g in groups.values() if "preemptible" in g["rayStartParams"].get("resources", ""))
    assert "reserved" in groups["reserved-gpu"]["rayStartParams"]["resources"]
    pod = spot["template"]["spec"]
    command = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["rlboost", "notice"]
    args = build_parser().parse_args(command[1:])  # a command this release runs
    assert args.wait and 0 < args.grace < pod["terminationGracePeriodSeconds"]
