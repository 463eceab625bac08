"""NodeRequest validation (each refusal names its field; request.py) and the offer choice (offers.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.fleet.providers.base import InstanceLabel, NoFittingOffer, Offer
from orchestrator.fleet.providers.offers import choose_offers, misfit
from orchestrator.fleet.providers.request import NodeRequest


def _request(**overrides: object) -> NodeRequest:
    values: dict[str, object] = {
        "provider": "vast",
        "gpu": "RTX_4090",
        "gpus_per_node": 4,
        "nodes": 2,
        "max_price_per_gpu_hour": 0.45,
    }
    return NodeRequest(**{**values, **overrides})


def _offer(offer_id: str, price_per_gpu: float, **overrides: object) -> Offer:
    values: dict[str, object] = {
        "provider": "vast",
        "offer_id": offer_id,
        "gpu_name": "RTX 4090",
        "gpus": 4,
        "price_per_hour": price_per_gpu * 4,
        "reliability": 0.99,
        "cuda": 12.4,
        "disk_gb": 500.0,
    }
    return Offer(**{**values, **overrides})  # type: ignore[arg-type]


def _field_of(exc: ValidationError) -> list[tuple[object, ...]]:
    return [tuple(e["loc"]) for e in exc.errors()]


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"provider": "runpod", "min_reliability": 0.95}, "min_reliability", "only Vast.ai publishes"),
        ({"provider": "runpod", "interruptible": True}, "interruptible", "on-demand pods only"),
        ({"provider": "static", "interruptible": True}, "interruptible", "not interruptible"),
        ({"max_price_per_gpu_hour": 0}, "max_price_per_gpu_hour", "greater than 0"),
        ({"gpus_per_node": 0}, "gpus_per_node", "greater than or equal to 1"),
        ({"cuda": "twelve"}, "cuda", "pattern"),
        ({"provider": "aws"}, "provider", "'static', 'vast' or 'runpod'"),
        ({"gpu": 'RTX 4090"; rm'}, "gpu", "pattern"),
        ({"max_price": 0.4}, "max_price", "Extra inputs are not permitted"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(overrides: dict, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _request(**overrides)
    assert _field_of(caught.value) == [(field,)]
    assert words in str(caught.value)


def test_the_cheapest_fitting_offers_come_first_ties_broken_by_reliability_then_id() -> None:
    offers = [
        _offer("30", 0.40),
        _offer("10", 0.30, reliability=0.95),
        _offer("11", 0.30, reliability=0.99),
        _offer("12", 0.30, reliability=0.99),
        _offer("99", 0.20, gpus=2, price_per_hour=0.40),  # cheap but a 2-GPU node
        _offer("98", 0.46),  # over the cap by 0.01 per GPU-hour
    ]
    chosen = choose_offers(offers, _request())
    assert [o.offer_id for o in chosen] == ["11", "12", "10", "30"]


def test_each_constraint_rejects_what_misses_it() -> None:
    request = _request(min_reliability=0.98, cuda="12.2", disk_gb=200)
    assert misfit(_offer("1", 0.3), request) is None
    assert misfit(_offer("1", 0.3, gpu_name="RTX 3090"), request) == "another GPU model"
    assert misfit(_offer("1", 0.3, reliability=0.97), request) == "below the reliability floor"
    assert misfit(_offer("1", 0.3, cuda=12.1), request) == "CUDA too old"
    assert misfit(_offer("1", 0.3, cuda=None), request) == "CUDA too old"
    assert misfit(_offer("1", 0.3, disk_gb=100.0), request) == "too little disk"
    assert misfit(_offer("1", 0.3, interruptible=True), request) == "interruptible"
    assert misfit(_offer("1", 0.46), request) == "over the price cap"
    assert misfit(_offer("1", 0.45), request) is None  # the cap itself is allowed


def test_gpu_names_match_across_spellings() -> None:
    request = _request()
    for name in ("RTX 4090", "rtx_4090", "NVIDIA GeForce RTX 4090"):
        assert misfit(_offer("1", 0.3, gpu_name=name), request) is None, name
    assert misfit(_offer("1", 0.3, gpu_name="RTX 40900"), request) == "another GPU model"


def test_an_offer_without_a_capacity_limit_fills_every_node() -> None:
    gpu_type = _offer("COMMUNITY:NVIDIA GeForce RTX 4090", 0.34, provider="runpod", reliability=None, capacity=None)
    request = _request(provider="runpod", nodes=3)
    assert [o.offer_id for o in choose_offers([gpu_type], request)] == [gpu_type.offer_id] * 3


def test_too_few_fitting_offers_say_why_the_others_did_not_fit() -> None:
    offers = [_offer("1", 0.30), _offer("2", 0.52), _offer("3", 0.60), _offer("4", 0.2, gpus=2, price_per_hour=0.4)]
    with pytest.raises(NoFittingOffer) as caught:
        choose_offers(offers, _request(nodes=2))
    message = str(caught.value)
    assert "1 of 2 4x RTX_4090 nodes" in message
    assert "2 over the price cap" in message and "1 not 4 GPUs" in message
    assert "cheapest seen 0.200/GPU-h" in message


def test_labels_round_trip_and_foreign_labels_are_not_ours() -> None:
    label = InstanceLabel("night-1", 42)
    assert label.encode() == "ablate.night-1.s42"
    assert InstanceLabel.decode(label.encode()) == label
    for foreign in (None, "", "my-notebook", "ablate.night-1.s42.extra", "ablate.Night.s1", "xablate.a.s1"):
        assert InstanceLabel.decode(foreign) is None, foreign
    with pytest.raises(ValueError, match="controller_id"):
        InstanceLabel("Bad Id", 1)
