"""Arm specs: strict validation, the A..I lineage exactly as the README's table, deep-merge resolution."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from arms import ARMS_DIR
from model.spec import ArmSpec
from orchestrator.grids.arms import ArmError, all_arms, changes, deep_merge, resolve
from orchestrator.messages import validation_text


def error_paths(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in e["loc"]) for e in exc.errors()]


def test_misplaced_asymflow_is_an_error_naming_the_key() -> None:
    # The source study's lost arm: an AsymFlow block under the optimizer, silently dropped.
    with pytest.raises(ValidationError) as info:
        resolve("F", {"optimizer": {"asymflow": {"rank": 8}}})
    assert error_paths(info.value) == ["optimizer.asymflow"]
    assert "optimizer.asymflow" in validation_text(info.value)


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"optimzer": {"name": "muon"}}, "optimzer"),
        ({"flow": {"kind": "asymflow", "rnak": 8}}, "flow.rnak"),
        ({"schedule": {"ema": {"decay_rate": 0.9}}}, "schedule.ema.decay_rate"),
        ({"schedule": {"lr": -1e-4}}, "schedule.lr"),
        ({"precision": {"mode": "fp4"}}, "precision.mode"),
        ({"schedule": {"lr": float("nan")}}, "schedule.lr"),
    ],
)
def test_bad_fields_name_their_path(raw: dict, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        resolve(raw)
    assert path in error_paths(info.value)


def test_cross_field_rules() -> None:
    with pytest.raises(ValidationError, match="divisible by heads"):
        resolve("A", {"model": {"size": "tiny", "heads": 3}})
    with pytest.raises(ValidationError, match="must lie within"):
        resolve("B", {"model": {"size": "tiny"}, "tread": {"last_block": 9}})
    with pytest.raises(ValidationError, match="min_lr"):
        resolve("A", {"schedule": {"lr": 1e-7}})


def test_unknown_arm_and_parent() -> None:
    with pytest.raises(ArmError, match="unknown arm 'Z'"):
        resolve("Z")
    with pytest.raises(ArmError, match="unknown parent arm 'Q'"):
        resolve({"parent": "Q"})
    with pytest.raises(ArmError, match="parent must be an arm letter"):
        resolve({"parent": ["A"]})


def test_every_arm_resolves() -> None:
    arms = all_arms()
    assert sorted(arms) == list("ABCDEFGHI")
    for letter, spec in arms.items():
        assert isinstance(spec, ArmSpec) and spec.name == letter


def test_arm_a_is_the_baseline() -> None:
    a = resolve("A")
    assert a.parent is None
    assert (a.optimizer.name, a.optimizer.betas, a.optimizer.weight_decay) == ("adamw", (0.9, 0.95), 0.03)
    assert (a.schedule.lr, a.schedule.min_lr, a.schedule.lr_schedule, a.schedule.warmup_steps) == (
        3e-4, 1e-6, "cosine", 500
    )
    assert (a.flow.kind, a.flow.prediction, a.precision.mode) == ("standard", "x", "bf16")
    assert (a.tread.enabled, a.repa.enabled, a.adaln.kind, a.data.pixel_range) == (False, False, "per_block", "unit")


# The README's table of arms: each arm's parent and the one thing it changes (all else inherited).
LINEAGE = {
    "B": ("A", {"tread.enabled": True}),
    "C": ("B", {"optimizer.name": "muon"}),
    "D": ("C", {"repa.enabled": True}),
    "E": ("D", {"repa.warmdown_end": 0.25}),
    "F": ("E", {"data.pixel_range": "symmetric"}),
    "G": ("F", {"flow.kind": "asymflow"}),
    "H": ("G", {"adaln.kind": "shared"}),
    "I": ("G", {"precision.mode": "fp8"}),
}


@pytest.mark.parametrize("letter", sorted(LINEAGE))
def test_each_arm_changes_exactly_what_its_row_says(letter: str) -> None:
    arms = all_arms()
    parent, expected = LINEAGE[letter]
    assert arms[letter].parent == parent
    assert changes(arms[letter], arms[parent]) == expected


def test_arm_settings_match_design() -> None:
    arms = all_arms()
    b, c, d, e, g, h, i = (arms[x] for x in "BCDEGHI")
    assert (b.tread.rate, b.tread.first_block, b.tread.last_block) == (0.5, 1, None)  # None = depth - 2
    assert c.optimizer.muon.model_dump() == {
        "momentum": 0.95, "nesterov": True, "ns_steps": 5, "adjust_lr_fn": "match_rms_adamw"
    }
    assert (d.repa.weight, d.repa.block, d.repa.warmdown_end) == (0.5, None, None)  # None = depth // 2
    assert e.repa.warmdown_end * e.schedule.steps == 1250
    assert (g.flow.rank, g.precision.mode) == (8, "bf16")
    assert h.adaln.lora_rank == 8
    assert i.precision.fp8_recipe == "tensorwise" and i.precision.fp8_modules  # a module filter, not everything
    # Arms A-E keep [0, 1] pixels on purpose (the study); F fixes it and its children inherit the fix.
    assert [arms[x].data.pixel_range for x in "ABCDEFGHI"] == ["unit"] * 5 + ["symmetric"] * 4


def test_arm_files_name_only_what_they_change() -> None:
    for letter in "BCDEFGHI":
        raw = yaml.safe_load((ARMS_DIR / f"{letter}.yaml").read_text())
        sections = set(raw) - {"name", "parent", "description"}
        assert len(sections) == 1, f"{letter}.yaml changes {sorted(sections)}"


def test_deep_merge_merges_nested_and_replaces_leaves() -> None:
    base = {"schedule": {"lr": 1e-4, "ema": {"decay": 0.9, "enabled": True}}, "tags": [1, 2]}
    over = {"schedule": {"ema": {"decay": 0.99}}, "tags": [3]}
    assert deep_merge(base, over) == {"schedule": {"lr": 1e-4, "ema": {"decay": 0.99, "enabled": True}}, "tags": [3]}
    assert base["schedule"]["ema"]["decay"] == 0.9  # inputs untouched


def test_overrides_merge_through_the_parent_chain() -> None:
    spec = resolve("D", {"model": {"size": "tiny"}, "schedule": {"steps": 300, "ema": {"warmup_steps": 50}}})
    assert (spec.model.size, spec.schedule.steps, spec.schedule.ema.warmup_steps) == ("tiny", 300, 50)
    assert spec.schedule.ema.decay == 0.9999 and spec.schedule.lr == 3e-4  # untouched siblings survive
    assert (spec.tread.enabled, spec.optimizer.name, spec.repa.enabled) == (True, "muon", True)  # from B, C, D


def test_inline_spec_with_parent() -> None:
    spec = resolve({"name": "G-r16", "parent": "G", "flow": {"rank": 16}})
    assert (spec.name, spec.parent, spec.flow.kind, spec.flow.rank) == ("G-r16", "G", "asymflow", 16)


def test_an_inline_arms_own_fields_win_over_the_grid_overrides() -> None:
    """The arm's change is what it tests: a grid-wide lr must not silently replace it; the rest applies."""
    over = {"model": {"size": "tiny"}, "schedule": {"lr": 2e-3, "warmup_steps": 30, "steps": 400}}
    hot = resolve({"name": "A-hot", "parent": "A", "schedule": {"lr": 5e-2, "warmup_steps": 150}}, over)
    assert (hot.schedule.lr, hot.schedule.warmup_steps, hot.schedule.steps, hot.model.size) == (5e-2, 150, 400, "tiny")
    plain = resolve("A", over)  # an arm file's values are adapted by the overrides
    assert (plain.schedule.lr, plain.schedule.warmup_steps) == (2e-3, 30)
