"""Each provider through its real SDK (vastai, runpod) against the provider simulator on loopback:
search, create, describe, list what this controller owns, destroy; the bill; the steps the sweep runner
takes per rental (create, wait until SSH answers, destroy until confirmed); and the API key kept out of
every error, log record, printed line and repr."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.fleet.providers import provider_for
from orchestrator.fleet.providers.base import (
    Instance,
    InstanceLabel,
    InstanceState,
    LaunchSpec,
    Offer,
    Provider,
    ProviderError,
)
from orchestrator.fleet.providers.credentials import MissingApiKey, api_key
from orchestrator.fleet.providers.lifecycle import Timing, create_or_find, destroy_confirmed, wait_reachable
from orchestrator.fleet.providers.offers import choose_offers
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.settings import Settings
from tests.cluster.provider_hooks import SshBanner, ssh_banner_hooks
from tests.cluster.provider_sim import ProviderSim
from tests.cluster.provider_wire import runpod_gpu, vast_offer

# The SDKs install apart from the project (their declared requirements conflict; README's first command).
pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")
pytest.importorskip("runpod", reason="the runpod SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-live-0123456789abcdefSECRET"  # what must never show
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ7controllerkeyforthetests ablate-controller"
FAST = Timing(reachable_s=3.0, poll_s=0.1, destroy_s=3.0, connect_s=0.5)
VAST_OFFERS = [
    vast_offer(101, dph_total=1.60),  # 0.40 per GPU-hour
    vast_offer(102, dph_total=1.20, reliability=0.90),  # cheapest, unreliable
    vast_offer(103, dph_total=1.40),  # 0.35: the cheapest reliable one
    vast_offer(104, dph_total=2.40),  # 0.60: over the cap
    vast_offer(105, gpu_name="RTX 3090", dph_total=0.8),
    vast_offer(106, gpus=2, dph_total=0.6),
]
RUNPOD_GPUS = [runpod_gpu("NVIDIA GeForce RTX 4090", secure=0.69, community=0.34), runpod_gpu("NVIDIA A40", 0.4, 0.35)]


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderSim]:
    # runpod reads its base URL from the environment at each call; monkeypatch restores it afterwards.
    monkeypatch.setenv("RUNPOD_API_BASE_URL", "http://127.0.0.1:9")
    with ProviderSim(KEY, vast_offers=VAST_OFFERS, runpod_gpus=RUNPOD_GPUS) as s:
        yield s


def _settings(sim: ProviderSim, **extra: object) -> Settings:
    values: dict[str, object] = {
        "vast_api_key": KEY,
        "runpod_api_key": KEY,
        "vast_url": sim.url,
        "runpod_api_url": sim.url,
        "controller_id": "night",
    }
    return Settings(**{**values, **extra})  # type: ignore[arg-type]


def _spec(sweep_id: int = 7, controller: str = "night") -> LaunchSpec:
    return LaunchSpec(
        image="ablate/worker:test",
        disk_gb=100,
        ssh_public_key=PUBKEY,
        label=InstanceLabel(controller, sweep_id),
        env={"ABLATE_SWEEP": str(sweep_id)},
    )


REQUESTS = {
    "vast": NodeRequest(
        provider="vast",
        gpu="RTX_4090",
        gpus_per_node=4,
        nodes=2,
        max_price_per_gpu_hour=0.45,
        min_reliability=0.95,
        cuda="12.2",
    ),
    "runpod": NodeRequest(
        provider="runpod",
        gpu="NVIDIA GeForce RTX 4090",
        gpus_per_node=4,
        nodes=2,
        max_price_per_gpu_hour=0.45,
        cuda="12.4",
    ),
}


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_search_create_describe_list_destroy_through_the_sdk(sim: ProviderSim, name: str) -> None:
    provider = provider_for(name, _settings(sim))
    chosen = choose_offers(provider.search(REQUESTS[name]), REQUESTS[name])
    if name == "vast":  # the cheapest reliable 4x4090 under the cap, then the next
        assert [o.offer_id for o in chosen] == ["103", "101"]
    else:  # community cloud at 0.34/GPU-h (secure 0.69 is over the cap), one GPU type for both nodes
        assert [o.offer_id for o in chosen] == ["COMMUNITY:NVIDIA GeForce RTX 4090"] * 2
        assert chosen[0].price_per_hour == pytest.approx(4 * 0.34)

    made = [provider.create(chosen[0], _spec(7)), provider.create(chosen[1], _spec(8))]
    assert all(i.state in (InstanceState.pending, InstanceState.running) for i in made)
    first = provider.describe(made[0].instance_id)
    assert first.label == InstanceLabel("night", 7)
    assert first.price_per_hour == pytest.approx(chosen[0].price_per_hour)
    assert first.gpus == 4 and first.ssh_user == "root"
    assert (first.ssh_host, first.ssh_port) == ("192.0.2.1", 22)  # the simulator's default: answers nothing
    # The controller's key reached the instance: Vast by attach_ssh, RunPod as PUBLIC_KEY.
    assert [sim.instances[i.instance_id].ssh_keys for i in made] == [[PUBKEY], [PUBKEY]]
    assert sim.instances[made[0].instance_id].env["ABLATE_SWEEP"] == "7"

    # Another controller's instance on the same account is not ours.
    anyone = REQUESTS[name].model_copy(update={"min_reliability": None, "nodes": 1})
    other = provider.create(choose_offers(provider.search(anyone), anyone)[0], _spec(9, "day"))
    owned = provider.list_owned("night")
    assert sorted(i.instance_id for i in owned) == sorted(i.instance_id for i in made)
    assert [i.instance_id for i in provider.list_owned("day")] == [other.instance_id]

    for instance in [*made, other]:
        provider.destroy(instance.instance_id)
        assert provider.describe(instance.instance_id).state is InstanceState.gone
    provider.destroy(made[0].instance_id)  # already gone: no error
    assert provider.list_owned("night") == [] and sim.live() == []
    assert sim.bill() > 0
    assert {h.get("Authorization") for _, _, h in sim.requests} == {f"Bearer {KEY}"}


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_the_bill_is_per_second_at_the_offer_price(sim: ProviderSim, name: str) -> None:
    provider = provider_for(name, _settings(sim))
    offer = choose_offers(provider.search(REQUESTS[name]), REQUESTS[name])[0]
    instance = provider.create(offer, _spec())
    record = sim.instances[instance.instance_id]
    provider.destroy(instance.instance_id)
    assert record.ended is not None
    assert sim.bill() == pytest.approx(offer.price_per_hour * (record.ended - record.created) / 3600)


def _create(provider: Provider, offer: Offer) -> Instance:
    """The runner's create (orchestrator/sweeps/rented.py): the instance it made, the create having succeeded."""
    made, failed = create_or_find(provider, offer, _spec(), set(), FAST)
    assert failed is None and len(made) == 1
    return made[0]


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_an_instance_that_never_answers_ssh_is_refused_then_destroyed_until_confirmed(
    sim: ProviderSim, name: str
) -> None:
    provider = provider_for(name, _settings(sim))
    offer = choose_offers(provider.search(REQUESTS[name]), REQUESTS[name])[0]
    instance = _create(provider, offer)
    with pytest.raises(ProviderError, match="not reachable after 3 s"):
        wait_reachable(provider, instance.instance_id, FAST)
    assert sim.live() != []  # refusing it destroys nothing: the runner gives it back (test_rented_sweeps.py)
    assert destroy_confirmed(provider, instance.instance_id, FAST)
    assert sim.live() == [] and provider.list_owned("night") == []


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_wait_reachable_returns_once_ssh_answers(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", "http://127.0.0.1:9")
    banner = SshBanner()
    try:
        with ProviderSim(KEY, VAST_OFFERS, RUNPOD_GPUS, hooks=ssh_banner_hooks(banner), boot_s=0.5) as sim:
            provider = provider_for(name, _settings(sim))
            offer = choose_offers(provider.search(REQUESTS[name]), REQUESTS[name])[0]
            instance = wait_reachable(provider, _create(provider, offer).instance_id, FAST)
            assert instance.state is InstanceState.running
            assert instance.reachable_endpoint == ("127.0.0.1", banner.port)
            assert destroy_confirmed(provider, instance.instance_id, FAST)
            assert sim.live() == []
    finally:
        banner.close()


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_the_api_key_appears_in_no_error_log_output_or_repr(
    sim: ProviderSim, name: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, the SDKs' and urllib3's included
    provider = provider_for(name, _settings(sim))
    texts = [repr(provider), str(provider), repr(_settings(sim)), str(_settings(sim).model_dump())]
    offer = choose_offers(provider.search(REQUESTS[name]), REQUESTS[name])[0]
    failures: list[BaseException] = []

    def attempt(call: object) -> None:
        try:
            call()  # type: ignore[operator]
        except ProviderError as exc:
            failures.append(exc)

    attempt(lambda: provider.describe("99999999"))  # unknown: gone, or an error
    attempt(lambda: wait_reachable(provider, _create(provider, offer).instance_id, FAST))  # unreachable
    gone_id = "999" if name == "vast" else "SECURE:NVIDIA H100 80GB HBM3"
    attempt(lambda: provider.create(replace(offer, offer_id=gone_id), _spec()))  # 404 / no such GPU type
    wrong = provider_for(name, _settings(sim, vast_api_key=KEY + "x", runpod_api_key=KEY + "x"))
    attempt(lambda: wrong.search(REQUESTS[name]))  # 401 from the simulator
    attempt(lambda: wrong.destroy("12345"))
    dead = provider_for(name, _settings(sim, vast_url="http://127.0.0.1:9", runpod_api_url="http://127.0.0.1:9"))
    attempt(lambda: dead.list_owned("night"))  # connection refused
    for instance in provider.list_owned("night"):
        provider.destroy(instance.instance_id)
    destroy_confirmed(wrong, "12345", FAST)  # logs an error line

    assert len(failures) >= 5  # unreachable, no such offer, 401 x2, connection refused
    assert any("401" in str(f) or "Unauthorized" in str(f) for f in failures)
    for exc in failures:
        assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)  # no request held
        texts += [str(exc), repr(exc)]
    out, err = capfd.readouterr()
    texts += [out, err, caplog.text, *(r.getMessage() for r in caplog.records)]
    assert any("destroy of instance" in t for t in texts)  # the log lines were captured at all
    for text in texts:
        assert KEY not in text


def test_keys_come_from_settings_a_file_must_be_private(tmp_path: Path) -> None:
    key_file = tmp_path / "vast_key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o644)
    with pytest.raises(MissingApiKey, match=r"readable by others \(mode 644\); `chmod 600"):
        api_key(Settings(vast_api_key_file=key_file), "vast")
    key_file.chmod(0o600)
    assert api_key(Settings(vast_api_key_file=key_file), "vast") == KEY
    with pytest.raises(MissingApiKey, match="ABLATE_RUNPOD_API_KEY_FILE"):
        api_key(Settings(), "runpod")
    with pytest.raises(MissingApiKey, match="both ABLATE_VAST_API_KEY and ABLATE_VAST_API_KEY_FILE"):
        api_key(Settings(vast_api_key=KEY, vast_api_key_file=key_file), "vast")


def test_provider_errors_name_the_provider(sim: ProviderSim) -> None:
    provider: Provider = provider_for("vast", _settings(sim))
    offer = choose_offers(provider.search(REQUESTS["vast"]), REQUESTS["vast"])[0]
    provider.create(offer, _spec())
    with pytest.raises(ProviderError, match=r"^vast: create instance from offer 103 failed: HTTPError: 404"):
        provider.create(offer, _spec())  # a Vast offer is one machine: rented already
    for instance in provider.list_owned("night"):
        provider.destroy(instance.instance_id)


@pytest.mark.parametrize(
    ("name", "interruptible", "reads"),
    [
        ("vast", True, (InstanceState.interrupted, "stopped")),  # a bid stopped while meant to run: outbid
        ("vast", False, (InstanceState.stopped, "stopped")),  # on-demand: Vast never takes it back
        ("runpod", False, (InstanceState.stopped, "EXITED")),
    ],
)
def test_a_preempted_instance_reads_as_the_provider_documents_and_bills_until_destroyed(
    sim: ProviderSim, name: str, interruptible: bool, reads: tuple[InstanceState, str]
) -> None:
    provider = provider_for(name, _settings(sim))
    request = REQUESTS[name].model_copy(update={"interruptible": interruptible})
    offer = choose_offers(provider.search(request), request)[0]
    made = provider.create(offer, replace(_spec(), bid_per_hour=offer.price_per_hour if interruptible else None))
    sim.preempt(made.instance_id)  # Vast: actual_status stopped (intended running); RunPod: desiredStatus EXITED
    seen = provider.describe(made.instance_id)
    assert (seen.state, seen.status) == reads
    assert seen.reachable_endpoint is None
    assert [i.instance_id for i in provider.list_owned("night")] == [made.instance_id]  # still billing
    assert sim.instances[made.instance_id].live
    assert destroy_confirmed(provider, made.instance_id, FAST)
    assert provider.describe(made.instance_id).state is InstanceState.gone and sim.live() == []


def test_a_host_offline_reads_unreachable_and_running_again_once_back(sim: ProviderSim) -> None:
    provider = provider_for("vast", _settings(sim))
    made = provider.create(choose_offers(provider.search(REQUESTS["vast"]), REQUESTS["vast"])[0], _spec())
    sim.set_offline(made.instance_id, True)  # Vast computes `offline` from missed heartbeats
    seen = provider.describe(made.instance_id)
    assert (seen.state, seen.status) == (InstanceState.unreachable, "offline")
    sim.set_offline(made.instance_id, False)
    assert provider.describe(made.instance_id).state is InstanceState.running
    provider.destroy(made.instance_id)
