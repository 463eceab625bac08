"""eval.distribution in the arm spec (model/spec.py): what it accepts, and each bad value refused naming its field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from model.spec import DESCRIPTIVE_METRICS, DISTRIBUTION_METRICS, ArmSpec


def _arm(distribution: dict, held_out: int = 64) -> ArmSpec:
    return ArmSpec.model_validate({"data": {"held_out": held_out}, "eval": {"distribution": distribution}})


def test_the_done_when_spec_is_accepted_and_off_by_default():
    arm = _arm({"metrics": ["cmmd", "fd_dinov2"], "samples": 32})
    assert arm.eval.distribution.metrics == ["cmmd", "fd_dinov2"]
    assert arm.eval.distribution.samples == 32
    assert ArmSpec().eval.distribution.metrics == []  # no pass unless asked: it costs GPU time
    assert set(DESCRIPTIVE_METRICS) == {"fid"} and "fid" in DISTRIBUTION_METRICS


@pytest.mark.parametrize(
    ("distribution", "loc"),
    [
        ({"metrics": ["cmmd", "kid"]}, ("eval", "distribution", "metrics", 1)),
        ({"metrics": ["cmmd"], "samples": 0}, ("eval", "distribution", "samples")),
        ({"metrics": ["cmmd"], "samples": 5000}, ("eval", "distribution", "samples")),
        ({"metrics": ["cmmd"], "every": 0}, ("eval", "distribution", "every")),
        ({"metrics": ["cmmd"], "sampler_steps": 0}, ("eval", "distribution", "sampler_steps")),
        ({"metrics": ["cmmd"], "guidance": 0.5}, ("eval", "distribution", "guidance")),
        ({"metrics": ["cmmd"], "reference": "x"}, ("eval", "distribution", "reference")),
        ({"metrics": "cmmd"}, ("eval", "distribution", "metrics")),
    ],
)
def test_bad_values_name_their_field(distribution: dict, loc: tuple):
    with pytest.raises(ValidationError) as err:
        _arm(distribution)
    assert loc in [e["loc"] for e in err.value.errors()]


def test_a_metric_named_twice_is_refused_saying_which():
    with pytest.raises(ValidationError, match="names 'cmmd' twice"):
        _arm({"metrics": ["cmmd", "cmmd"]})


def test_more_samples_than_held_out_images_is_refused_naming_both_fields():
    """The reference set is held-out real images, at least as many as the samples."""
    with pytest.raises(ValidationError, match=r"eval\.distribution\.samples \(128\) exceeds data\.held_out \(64\)"):
        _arm({"metrics": ["cmmd"], "samples": 128})
    assert _arm({"metrics": ["cmmd"], "samples": 128}, held_out=128).eval.distribution.samples == 128
    assert _arm({"samples": 128}).eval.distribution.samples == 128  # no metrics: no pass, no reference needed
