"""eval.distribution.guidance: the arms train with every caption, so there is no unconditional path to guide
with; a scale other than 1 is refused naming the field and the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from model.spec import ArmSpec


def test_guidance_other_than_one_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        ArmSpec.model_validate({"eval": {"distribution": {"metrics": ["cmmd"], "guidance": 4.0}}})
    error = info.value.errors()[0]
    assert error["loc"] == ("eval", "distribution", "guidance")
    assert "no caption dropout" in error["msg"] and "set eval.distribution.guidance to 1" in error["msg"]
    assert ArmSpec.model_validate({"eval": {"distribution": {"guidance": 1}}}).eval.distribution.guidance == 1
