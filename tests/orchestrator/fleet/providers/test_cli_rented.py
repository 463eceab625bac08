"""`ablate offers` and `ablate instances [destroy]` against the provider simulator, through the real SDKs;
`instances` through a controller that holds the keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from orchestrator.cli import _register, app
from orchestrator.fleet.providers.base import InstanceLabel, LaunchSpec
from orchestrator.fleet.providers.vast import VastProvider
from tests.cluster.provider_sim import ProviderSim
from tests.cluster.provider_wire import vast_offer
from tests.kit.net import controller_env, free_port

# The SDKs install apart from the project (their declared requirements conflict; README's first command).
pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")
pytest.importorskip("runpod", reason="the runpod SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-cli-0123456789abcdef"
_register()


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderSim]:
    offers = [
        vast_offer(301, dph_total=1.6),
        vast_offer(302, dph_total=1.4),
        vast_offer(303, dph_total=2.4),
        vast_offer(304, gpus=2, dph_total=0.6),
    ]
    with ProviderSim(KEY, vast_offers=offers) as s:
        for var in ("ABLATE_RUNPOD_API_KEY", "ABLATE_RUNPOD_API_KEY_FILE", "ABLATE_VAST_API_KEY_FILE"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("ABLATE_VAST_API_KEY", KEY)
        monkeypatch.setenv("ABLATE_VAST_URL", s.url)
        monkeypatch.setenv("ABLATE_CONTROLLER_ID", "night")
        yield s


@pytest.fixture
def served(sim: ProviderSim, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A controller with the simulator's key and ABLATE_CONTROLLER_ID (its settings read them now, after
    `sim`), named in ABLATE_URL and ABLATE_API_TOKEN; this process's own key is gone, so only it can rent."""
    with controller_env(database_url, tmp_path / "controller") as env:
        monkeypatch.delenv("ABLATE_VAST_API_KEY")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield


def test_offers_prints_the_fitting_offers_cheapest_first(sim: ProviderSim) -> None:
    out = CliRunner().invoke(
        app,
        ["offers", "vast", "--gpu", "RTX_4090", "--gpus", "4", "--max-price", "0.45", "--nodes", "1"],
        env={"COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if line.strip().startswith("│ 30")]
    assert [r.split("│")[1].strip() for r in rows] == ["302", "301"]  # 303 is over the cap: not asked for
    assert "rent (1)" in rows[0] and "yes" in rows[1]
    assert KEY not in out.output


@pytest.mark.usefixtures("served")
def test_instances_lists_ours_with_cost_and_destroy_ends_one(sim: ProviderSim) -> None:
    provider = VastProvider(KEY, server_url=sim.url)
    spec = LaunchSpec(image="img", disk_gb=50, ssh_public_key="ssh-ed25519 AAAA test", label=InstanceLabel("night", 5))
    ours = provider.create(next(o for o in provider.search(_request()) if o.offer_id == "302"), spec)
    runner = CliRunner()
    listed = runner.invoke(app, ["instances"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert ours.instance_id in listed.output and "1 instance(s)" in listed.output
    gone = runner.invoke(app, ["instances", "destroy", ours.instance_id, "--provider", "vast"])
    assert gone.exit_code == 0, gone.output
    assert f"vast instance {ours.instance_id} destroyed" in gone.output
    assert sim.live() == []
    assert "0 instance(s)" in runner.invoke(app, ["instances"]).output


def _request():  # noqa: ANN202
    from orchestrator.fleet.providers.request import NodeRequest

    return NodeRequest(provider="vast", gpu="RTX_4090", gpus_per_node=4, max_price_per_gpu_hour=0.45)


@pytest.mark.usefixtures("served")
def test_destroy_refuses_an_instance_not_labelled_by_this_controller_unless_forced(sim: ProviderSim) -> None:
    provider = VastProvider(KEY, server_url=sim.url)
    offers = {o.offer_id: o for o in provider.search(_request())}

    def spec(controller: str) -> LaunchSpec:
        key = "ssh-ed25519 AAAA test"
        return LaunchSpec(image="img", disk_gb=50, ssh_public_key=key, label=InstanceLabel(controller, 5))

    theirs = provider.create(offers["302"], spec("day")).instance_id  # another controller on the shared account
    persons = provider.create(offers["301"], spec("night")).instance_id
    sim.instances[persons].label = "my-notebook"  # someone's own instance, relabelled in the provider's console
    runner = CliRunner()
    for iid, why in ((theirs, "has label ablate.day.s5"), (persons, "has no ablate label")):
        refused = runner.invoke(app, ["instances", "destroy", iid, "--provider", "vast"])
        said = str(refused.exception)  # a CLIError: `ablate` prints it as one line, exit code 2
        assert refused.exit_code != 0 and why in said and "not rented by this controller (night)" in said
        assert "--force destroys it anyway" in said and sim.instances[iid].live
    forced = runner.invoke(app, ["instances", "destroy", theirs, "--provider", "vast", "--force"])
    assert forced.exit_code == 0, forced.output
    assert not sim.instances[theirs].live and sim.instances[persons].live


@pytest.mark.usefixtures("served")
def test_instances_as_json_are_the_controller_s(sim: ProviderSim) -> None:
    provider = VastProvider(KEY, server_url=sim.url)
    spec = LaunchSpec(image="img", disk_gb=50, ssh_public_key="ssh-ed25519 AAAA test", label=InstanceLabel("night", 7))
    ours = provider.create(next(o for o in provider.search(_request()) if o.offer_id == "302"), spec)
    out = CliRunner().invoke(app, ["instances", "--json"])
    assert out.exit_code == 0, out.output
    found = json.loads(out.output)
    assert (found["controller_id"], found["providers"]) == ("night", ["vast"])
    assert [(i["instance_id"], i["sweep_id"]) for i in found["instances"]] == [(ours.instance_id, 7)]
    auth = {"Authorization": f"Bearer {os.environ['ABLATE_API_TOKEN']}"}
    unknown = httpx.delete(f"{os.environ['ABLATE_URL']}/api/instances/aws/{ours.instance_id}", headers=auth)
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["path", "provider"]
    assert sim.instances[ours.instance_id].live


@pytest.mark.parametrize("args", [("instances",), ("instances", "destroy", "42", "--provider", "vast")])
def test_without_a_controller_instances_say_where_they_looked(args: tuple[str, ...], tmp_path: Path) -> None:
    home = tmp_path / ".ablate"
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "ABLATE_URL": f"http://127.0.0.1:{free_port()}",
           "ABLATE_API_TOKEN": "a-token-of-sixteen-chars", "ABLATE_HOME_DIR": str(home),
           "ABLATE_DATABASE_URL": f"sqlite:///{home / 'ablate.db'}"}  # fmt: skip
    env.pop("ABLATE_CONTROLLER_ID", None)  # the id was read from the local database: no more
    proc = subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", *args], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "no ablate server reachable" in line and "ABLATE_URL" in line and "--url" in line, line
    assert not list(tmp_path.rglob("*.db")), "no command that asks a controller writes a database here"
