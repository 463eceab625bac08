"""Replicates (`seeds: N`): each arm runs N times, seeds differing only in training, on one held-out split;
the report's effects are the mean of the per-seed paired differences with a t-interval over the seeds.
Real tiny arms trained on the CPU, records ingested into a migrated database, the report over the API."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from scipy import stats

from model.data import build_dataset
from model.spec import ArmSpec
from orchestrator.db.models import Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.results.reports.effects import effect_reading
from orchestrator.results.reports.stats import Difference, across_seeds
from orchestrator.runs.ingest import insert_metrics
from orchestrator.settings import Settings
from tests.kit.crossed_by_hand import crossed_by_hand
from tests.kit.settings import AUTH, tiny_overrides
from worker.train import train_arm


def test_without_per_image_values_the_across_seed_interval_adds_one_seeds_evaluation_se() -> None:
    """By hand: three per-seed differences with their evaluation SEs but no per-image values (an old grid, an
    imported study): the seeds' spread of the mean plus the mean evaluation variance, t on Satterthwaite's
    df, so the images' noise the seeds share is not left out; without SEs, the seeds-only interval says so."""
    diffs, ses = (-0.0356, -0.0103, -0.0067), (0.0085, 0.0070, 0.0061)
    per_seed = [Difference(d, se, d - 0.01, d + 0.01, "independent", 64) for d, se in zip(diffs, ses, strict=True)]
    effect = across_seeds(per_seed)
    assert effect is not None and effect.k == 3 and effect.interval == "independent"
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    seeds_var, eval_var = sd**2 / 3, sum(s**2 for s in ses) / 3
    df = (seeds_var + eval_var) ** 2 / (seeds_var**2 / 2 + eval_var**2 / 63)
    half = stats.t.ppf(0.975, df) * math.sqrt(seeds_var + eval_var)
    assert effect.diff == pytest.approx(mean) and effect.df == pytest.approx(df)
    assert (effect.low, effect.high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert effect.seed_sd == pytest.approx(sd) and effect.eval_se == pytest.approx(sum(ses) / 3)
    bare = across_seeds([Difference(d, None, None, None, "independent", None) for d in diffs])
    assert bare is not None and bare.interval == "seeds only"
    assert bare.high - bare.low == pytest.approx(2 * 4.302652729911275 * sd / math.sqrt(3))  # type: ignore[operator]
    # The seed-0 interval alone excludes zero; across the three seeds it does not.
    assert effect_reading(1, -0.0523, -0.0190) == "one seed: training noise not measured"
    assert effect_reading(3, effect.low, effect.high) == "within noise"
    assert effect_reading(3, -0.05, -0.01) == "distinguishable across seeds"


def test_two_training_seeds_share_the_held_out_images_and_differ_in_training() -> None:
    base = ArmSpec.model_validate({"name": "A", **tiny_overrides(10)})
    seeds = [base.model_copy(update={"data": base.data.model_copy(update={"seed": s, "split_seed": 0})})
             for s in (0, 1)]  # fmt: skip
    held = [build_dataset(s).held_out(2)[0] for s in seeds]
    assert torch.equal(held[0], held[1])
    # A spec saved before the split existed (data.seed meant both) keeps its own split: seed 1's differs.
    old = ArmSpec.model_validate({"name": "A", **tiny_overrides(10), "data": {**tiny_overrides(10)["data"], "seed": 1}})
    assert old.data.split_seed is None and old.data.dataset_seed() == 1
    assert not torch.equal(build_dataset(old).held_out(2)[0], held[0])


@pytest.mark.parametrize("seeds", [0, 17, "three"])
def test_seeds_out_of_range_is_a_422_naming_the_field(client: TestClient, seeds: object) -> None:
    resp = client.post("/api/grids", json={"name": "bad", "arms": ["A"], "seeds": seeds}, headers=AUTH)
    assert resp.status_code == 422
    assert [e["loc"] for e in resp.json()["detail"]] == [["body", "seeds"]]


@pytest.fixture(scope="module")
def grid(client: TestClient, settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict:
    overrides = tiny_overrides(20)
    overrides["eval"]["num_samples"] = overrides["data"]["held_out"] = 4
    body = {"name": "replicated", "arms": ["A", "B"], "overrides": overrides, "seeds": 2}
    resp = client.post("/api/grids", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.text
    created = resp.json()
    detail = client.get(f"/api/grids/{created['id']}").json()
    with session_scope(settings.database_url) as session:
        for row in detail["runs"]:
            run = session.get(Run, row["id"])
            out = tmp_path_factory.mktemp(f"run-{run.arm}-{run.seed}")
            insert_metrics(session, run.id, list(train_arm(ArmSpec.model_validate(run.spec), out)))
            run.checkpoint_dir, run.state = str(out), "completed"
    return {"created": created, "detail": detail}


def test_a_grid_with_two_seeds_queues_every_arm_twice_and_says_what_it_costs(grid: dict) -> None:
    created, runs = grid["created"], grid["detail"]["runs"]
    assert (created["runs"], created["seeds"]) == (4, 2) and grid["detail"]["seeds"] == 2
    assert created["cost"].startswith("2 arms x 2 seeds = 4 runs, about ") and created["projected_gpu_hours"] > 0
    # Seed-major: both arms' seed 0 first, so a night cut short still holds a complete comparison.
    assert [(r["arm"], r["seed"]) for r in runs] == [("A", 0), ("B", 0), ("A", 1), ("B", 1)]


def test_seeds_differ_in_training_only(grid: dict, settings: Settings) -> None:
    with session_scope(settings.database_url) as session:
        runs = {(r.arm, r.seed): r for r in session.query(Run).filter(Run.grid_id == grid["created"]["id"])}
        data = {k: (r.spec["data"]["seed"], r.spec["data"]["split_seed"]) for k, r in runs.items()}
        assert data == {("A", 0): (0, 0), ("B", 0): (0, 0), ("A", 1): (1, 0), ("B", 1): (1, 0)}
        last = {k: session.query(Metric).filter(Metric.run_id == r.id).order_by(Metric.step.desc()).first()
                for k, r in runs.items()}  # fmt: skip
        assert last[("A", 0)].train_loss != last[("A", 1)].train_loss  # other init, data order and noise
    # The same held-out targets: the first sample image of each seed of A is the same file, byte for byte.
    targets = [Path(runs[("A", s)].checkpoint_dir) for s in (0, 1)]
    pngs = [sorted(t.rglob("*target*0*.png")) for t in targets]
    assert pngs[0] and pngs[0][0].read_bytes() == pngs[1][0].read_bytes()


def test_the_report_gives_each_effect_across_seeds(client: TestClient, grid: dict, settings: Settings) -> None:
    report = client.get(f"/api/grids/{grid['created']['id']}/report.json").json()
    assert report["seeds"] == 2 and report["judge"] == "val_flow_ivw"
    effect = next(e for e in report["effects"] if (e["arm"], e["metric"]) == ("B", "val_flow_loss"))
    assert effect["k"] == 2 and effect["against"] == "parent" and [s["seed"] for s in effect["per_seed"]] == [0, 1]
    # By hand from the stored per-sample values: the 2 seeds x 4 images table of paired differences, crossed.
    with session_scope(settings.database_url) as session:
        runs = {(r.arm, r.seed): r.id for r in session.query(Run).filter(Run.grid_id == grid["created"]["id"])}

        def final(arm: str, seed: int) -> list[float]:
            m = session.query(Metric).filter(Metric.run_id == runs[(arm, seed)]).order_by(Metric.step.desc()).first()
            return m.extra["val_flow_loss_samples"]

        table = [[b - a for a, b in zip(final("A", s), final("B", s), strict=True)] for s in (0, 1)]
    diffs = [sum(row) / 4 for row in table]
    hand = crossed_by_hand(table)
    assert effect["diff"] == pytest.approx(hand["mean"]) and effect["seed_sd"] == pytest.approx(
        abs(diffs[0] - diffs[1]) / math.sqrt(2))
    assert (effect["low"], effect["high"]) == (pytest.approx(hand["low"]), pytest.approx(hand["high"]))
    assert effect["interval"] == "crossed" and effect["n"] == 4 and effect["df"] == pytest.approx(hand["df"])
    shares = effect["budget"]
    assert shares["seeds"] + shares["images"] + shares["rest"] == pytest.approx(1)
    assert [o["action"] for o in shares["narrowing"]] == ["seed", "images"]
    assert effect["reading"] in ("within noise", "distinguishable across seeds")
    md = client.get(f"/api/grids/{grid['created']['id']}/report.md").text
    assert "| B | held-out flow loss (plain mean) | parent | 20 | A: " in md
    assert "training seeds (k=2) and evaluation images (n=4), crossed" in md and "+1 seed per arm: ±" in md
    assert "## Appendix: each seed's interval (evaluation noise only)" in md
    assert "## Appendix: held-out flow loss at each timestep" in md
    assert "## B, seed 1" in md
