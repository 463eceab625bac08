"""The training loop on CPU: every arm trains, a tiny run learns, resume is bit-identical,
checkpoints rotate with best.pt kept, should_stop writes a final checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from model.evaluate import NO_EDITS_NOTE
from model.spec import ArmSpec
from orchestrator.grids.arms import deep_merge, resolve
from tests.kit.settings import QUICK
from worker import checkpoint as ckpt
from worker.train import LPIPS_STANDIN_FALLBACK, REPA_STANDIN_FALLBACK, TrainError, train_arm


def spec_for(arm: str, **over: Any) -> ArmSpec:
    return resolve(arm, deep_merge(QUICK, over))


@pytest.mark.parametrize("arm", list("ABCDEFGHI"))
def test_every_arm_trains_20_steps(arm: str, tmp_path: Path) -> None:
    records = list(train_arm(spec_for(arm), tmp_path))
    assert [r["step"] for r in records] == [20]
    rec = records[0]
    assert rec["final"] is True
    assert math.isfinite(rec["train_loss"]) and math.isfinite(rec["grad_norm"])
    assert math.isfinite(rec["recon_lpips"]) and rec["recon_lpips_n"] == 2
    assert rec["lpips_backbone"] == "random_standin"
    assert Path(rec["checkpoint"]).exists() and (tmp_path / "best.pt").exists()
    # Both stand-ins are recorded as run fallbacks, the REPA one only where REPA (and so a teacher) is on.
    assert LPIPS_STANDIN_FALLBACK in rec["fallbacks"]
    assert (REPA_STANDIN_FALLBACK in rec["fallbacks"]) == (arm >= "D")
    if arm >= "D":
        assert rec["repa_teacher"] == "random_standin"
    if arm == "I":
        assert rec["precision"] == "fp8" and rec["fp8_linears"]
        assert all(n.endswith(("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")) for n in rec["fp8_linears"])
    else:
        assert rec["precision"] == "fp32" and rec["fp8_linears"] == []
        assert any("bf16 autocast not used on CPU" in f for f in rec["fallbacks"])


def test_tiny_run_learns(tmp_path: Path) -> None:
    """Loss falls and recon LPIPS improves over the first checkpoint."""
    spec = spec_for(
        "A",
        data={"num_images": 512, "held_out": 8},
        schedule={"steps": 150, "batch_size": 16, "lr": 1e-3, "warmup_steps": 15, "checkpoint_every": 25,
                  "ema": {"warmup_steps": 25, "decay": 0.95}},
        eval={"num_samples": 8, "sampler_steps": 4},
    )
    records = list(train_arm(spec, tmp_path))
    assert [r["step"] for r in records] == [25, 50, 75, 100, 125, 150]
    first, last = records[0], records[-1]
    assert last["train_loss"] < 0.7 * first["train_loss"]
    assert min(r["recon_lpips"] for r in records[1:]) < first["recon_lpips"]
    assert last["recon_lpips"] < first["recon_lpips"]
    # the held-out flow loss falls too, and every record carries it whole (EMA weights, stated)
    assert last["val_flow_loss"] < first["val_flow_loss"]
    for r in records:
        assert r["val_flow_loss_n"] == 8 and len(r["val_flow_loss_samples"]) == 8 and r["val_flow_loss_se"] > 0
        assert len(r["val_flow_loss_by_t"]) == 8 and r["eval_weights"] == "ema"
    # metrics.jsonl mirrors the records; only the last two periodic checkpoints plus best.pt remain.
    lines = [json.loads(x) for x in (tmp_path / ckpt.METRICS_NAME).read_text().splitlines()]
    assert [x["step"] for x in lines] == [25, 50, 75, 100, 125, 150]
    assert [s for s, _ in ckpt.periodic_checkpoints(tmp_path)] == [125, 150]
    best = min(records, key=lambda r: r["recon_lpips"])
    assert ckpt.load(tmp_path / ckpt.BEST_NAME)["step"] == best["step"] == last["best_step"]
    assert last["iter_per_sec"] > 0 and last["samples_per_sec"] == pytest.approx(16 * last["iter_per_sec"])
    assert last["peak_memory_gb"] > 0 and last["wall_time_s"] > 0
    state = ckpt.load(Path(last["checkpoint"]))
    assert state["spec"] == spec.model_dump(mode="json")
    assert state["versions"]["torch"] == torch.__version__ and "git" in state


def _final_state(out: Path) -> dict[str, Any]:
    return ckpt.load(ckpt.latest_checkpoint(out))


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


# C: TREAD + Muon; G: REPA + AsymFlow + symmetric pixels; I: FP8 (the saved FP8 set is reused)
@pytest.mark.parametrize("arm", ["C", "G", "I"])
def test_resume_is_bit_identical(arm: str, tmp_path: Path) -> None:
    spec = spec_for(arm, schedule={"steps": 8, "checkpoint_every": 4})
    full = [r["train_loss"] for r in train_arm(spec, tmp_path / "full")]
    # Interrupted after the first checkpoint (the generator is abandoned), then resumed.
    gen = train_arm(spec, tmp_path / "split")
    first = next(gen)
    gen.close()
    assert first["step"] == 4
    rest = list(train_arm(spec, tmp_path / "split"))
    assert [r["step"] for r in rest] == [8] and rest[0]["resumed_from_step"] == 4
    assert [first["train_loss"], rest[0]["train_loss"]] == full
    a, b = _final_state(tmp_path / "full"), _final_state(tmp_path / "split")
    for key in ("model", "ema", "optimizers", "text_encoder", "projector", "rng", "basis"):
        _assert_same(a[key], b[key], key)
    assert a["record"]["recon_lpips"] == b["record"]["recon_lpips"]


def test_should_stop_writes_final_checkpoint(tmp_path: Path) -> None:
    spec = spec_for("A", schedule={"steps": 50, "checkpoint_every": 4})
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 6  # true before step 7

    records = list(train_arm(spec, tmp_path, should_stop=stop))
    assert [(r["step"], r["final"]) for r in records] == [(4, False), (6, True)]
    assert ckpt.load(ckpt.latest_checkpoint(tmp_path))["step"] == 6
    # The checkpoint cannot be resumed under a different schedule (the cosine lr depends on steps).
    done = spec_for("A", schedule={"steps": 6, "checkpoint_every": 4})
    with pytest.raises(TrainError, match="schedule"):
        list(train_arm(done, tmp_path))


def test_resume_refuses_other_spec(tmp_path: Path) -> None:
    list(train_arm(spec_for("A", schedule={"steps": 2, "checkpoint_every": 2}), tmp_path))
    with pytest.raises(TrainError, match="different spec.*optimizer"):
        list(train_arm(spec_for("C", schedule={"steps": 2, "checkpoint_every": 2}), tmp_path))
    again = list(train_arm(spec_for("A", schedule={"steps": 2, "checkpoint_every": 2}), tmp_path))
    assert [(r["step"], r["final"]) for r in again] == [(2, True)]


def test_grad_accum_and_lr_explode_hook(tmp_path: Path) -> None:
    spec = spec_for(
        "C",
        schedule={"steps": 4, "checkpoint_every": 2, "grad_accum": 2, "lr": 1e-3, "min_lr": 1e-3,
                  "warmup_steps": 0, "lr_explode_after": 2, "lr_explode_factor": 50.0},
    )
    records = list(train_arm(spec, tmp_path))
    assert [r["lr"] for r in records] == [pytest.approx(1e-3), pytest.approx(5e-2)]
    assert all(math.isfinite(r["train_loss"]) for r in records)
    state = ckpt.load(Path(records[-1]["checkpoint"]))
    assert len(state["optimizers"]) == 2  # Muon + AdamW
    assert all(g["lr"] == pytest.approx(5e-2) for o in state["optimizers"] for g in o["param_groups"])


def test_imagefolder_without_caption_edits_records_the_skip(tmp_path: Path) -> None:
    """Captions with no colour word and no `edit` field admit no edit: text_manip_delta is None with a
    fallback on every record (the first included), and the other metrics are still measured."""
    import numpy as np
    from PIL import Image

    root = tmp_path / "folder"
    root.mkdir()
    rng = np.random.default_rng(0)
    lines = []
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (40, 36, 3), dtype=np.uint8)).save(root / f"img{i}.png")
        lines.append({"file": f"img{i}.png", "caption": f"a photo of thing number {i}"})
    (root / "captions.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    spec = spec_for(
        "A",
        data={"dataset": "imagefolder", "path": str(root), "held_out": 2},
        schedule={"steps": 4, "checkpoint_every": 2},
    )
    records = list(train_arm(spec, tmp_path / "out"))
    assert [r["step"] for r in records] == [2, 4]
    for rec in records:
        assert rec["text_manip_delta"] is None and rec["text_manip_delta_se"] is None
        assert rec["text_manip_delta_n"] is None and rec["text_manip_note"] == NO_EDITS_NOTE
        assert rec["fallbacks"].count(NO_EDITS_NOTE) == 1
        assert math.isfinite(rec["recon_lpips"]) and math.isfinite(rec["text_lpips"]) and rec["recon_lpips_n"] == 2
    lines_out = [json.loads(x) for x in (tmp_path / "out" / ckpt.METRICS_NAME).read_text().splitlines()]
    assert all(NO_EDITS_NOTE in x["fallbacks"] and x["text_manip_delta"] is None for x in lines_out)


def test_resume_reuses_the_saved_fp8_set(tmp_path: Path) -> None:
    """A resumed FP8 run converts the linears its checkpoint names (no re-selection), and says so."""
    spec = spec_for("I", schedule={"steps": 4, "checkpoint_every": 2})
    gen = train_arm(spec, tmp_path)
    first = next(gen)
    gen.close()
    assert first["fp8_autotune"] == "skipped: not CUDA" and len(first["fp8_linears"]) > 2
    path = Path(first["checkpoint"])
    state = ckpt.load(path)
    assert state["fp8_linears"] == first["fp8_linears"]
    # Stand in for a set a GPU autotune narrowed: the resume must convert exactly this subset.
    subset = sorted(first["fp8_linears"])[:2]
    ckpt.save_atomic({**state, "fp8_linears": subset}, path)
    rest = list(train_arm(spec, tmp_path))
    assert [r["step"] for r in rest] == [4] and rest[0]["resumed_from_step"] == 2
    assert sorted(rest[0]["fp8_linears"]) == subset and math.isfinite(rest[0]["train_loss"])
    assert rest[0]["fp8_autotune"].startswith("reused from checkpoint: 2 of ")
    assert any(f.startswith("fp8 set reused from checkpoint: 2 of ") for f in rest[0]["fallbacks"])
    assert sorted(ckpt.load(Path(rest[0]["checkpoint"]))["fp8_linears"]) == subset


def test_resume_is_bit_identical_with_loader_workers(tmp_path: Path) -> None:
    """Two loader worker processes, a micro-batch below the batch, a resume between: the same run as
    one with the loading in the training thread."""
    spec = spec_for("B", schedule={"steps": 6, "checkpoint_every": 3, "micro_batch": 2}, data={"loader_workers": 2})
    inline = spec.model_copy(update={"data": spec.data.model_copy(update={"loader_workers": 0})})
    full = list(train_arm(inline, tmp_path / "inline"))
    gen = train_arm(spec, tmp_path / "split")
    first = next(gen)
    gen.close()
    rest = list(train_arm(spec, tmp_path / "split"))
    assert [first["train_loss"], rest[0]["train_loss"]] == [r["train_loss"] for r in full]
    a, b = _final_state(tmp_path / "inline"), _final_state(tmp_path / "split")
    for key in ("model", "ema", "optimizers", "rng"):
        _assert_same(a[key], b[key], key)
    rec = rest[0]
    assert (rec["micro_batch"], rec["grad_accum"], rec["micro_batch_how"]) == (2, 2, "checkpoint")
    assert (first["micro_batch_how"], first["loader_workers"], full[0]["loader_workers"]) == ("spec", 2, 0)
    # measured over the steady-state steps, like iter/s: none in the 3 steps after a restart
    assert 0 <= full[-1]["data_wait_fraction"] <= 1 and rec["data_wait_fraction"] is None
    assert rec["skipped_images"] == 0
    assert rec["compiled"] is False and rec["compile_s"] is None  # CPU: compile off by default


def test_defaults_on_cpu_train_the_whole_batch_with_one_loader_worker(tmp_path: Path) -> None:
    (rec,) = list(train_arm(spec_for("A", schedule={"steps": 4, "checkpoint_every": 4}), tmp_path))
    assert (rec["micro_batch"], rec["grad_accum"], rec["micro_batch_how"]) == (4, 1, "cpu: the whole batch")
    assert rec["loader_workers"] == 1 and 0 <= rec["data_wait_fraction"] <= 1


def test_deterministic_mode_holds_for_the_run_and_is_restored_after(tmp_path: Path) -> None:
    """precision.deterministic turns torch's deterministic algorithms on while the run trains (TREAD's
    scatter, attention and the optimizer step included: no op raises), records it, and gives the process
    back its own setting when the run ends."""
    assert not torch.are_deterministic_algorithms_enabled()
    spec = spec_for("B", schedule={"steps": 4, "checkpoint_every": 2}, precision={"deterministic": True})
    seen = []
    records = []
    for rec in train_arm(spec, tmp_path):
        seen.append(torch.are_deterministic_algorithms_enabled())
        records.append(rec)
    assert seen == [True, True] and [r["deterministic"] for r in records] == [True, True]
    assert not torch.are_deterministic_algorithms_enabled()
    (plain,) = list(train_arm(spec_for("B", schedule={"steps": 2, "checkpoint_every": 2}), tmp_path / "plain"))
    assert plain["deterministic"] is False


def test_a_checkpoint_from_before_a_new_spec_field_resumes_and_a_real_change_is_still_refused(tmp_path: Path) -> None:
    from worker.train import check_resumable

    spec = resolve("A", {"model": {"size": "tiny"}})
    older = spec.model_dump(mode="json")
    del older["data"]["max_unreadable"]  # written before the field existed
    check_resumable(older, spec, tmp_path / "ckpt.pt")  # its default fills in: no difference
    older["optimizer"]["weight_decay"] = 0.1
    with pytest.raises(TrainError, match="sections differ: optimizer"):
        check_resumable(older, spec, tmp_path / "ckpt.pt")
