"""A deciding grid's look evaluates what the grid decides on: decided on the flow loss, its evaluation
measures the flow loss alone (no LPIPS sampling), is priced for that, and is recorded as such on the
evaluation, the report and the dashboard; `ablate evaluate` (a user's) still measures every metric.

A 2-arm x 2-seed tiny deciding grid trained on the CPU in this process, a migrated database, and the
launcher on a module's real Ray (4 logical GPUs) running the evaluation jobs, and, last, a deciding grid's runs
trained through it, each evaluated inside its training job (runs/in_training.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from model.spec import ArmSpec
from orchestrator.db.models import Evaluation, EvaluationResult, Grid, Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.deciding import DecideSpec, evaluation_job_hours, measures_of
from orchestrator.grids.evaluations import EVERY_METRIC, FLOW_METRICS, EvaluationCreate, create_evaluation
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.budget import evaluation_hours
from orchestrator.results.deciding.decider import action_costs, current_effects, look_state, queue_work
from orchestrator.results.deciding.plan_look import Work
from orchestrator.runs.evaluation_record import refused_rows
from orchestrator.runs.launcher import Launcher
from orchestrator.settings import Settings
from tests.kit.launcher import launcher_settings_for
from tests.kit.polling import wait_for
from tests.kit.settings import tiny_overrides
from tests.kit.trained_runs import train_grid_runs

HELD_OUT, TRAINED_ON, STEPS = 16, 4, 20
LPIPS_KEYS = ("recon_lpips", "text_lpips", "text_manip_delta")


@pytest.fixture(scope="module")
def grid(settings: Settings) -> int:
    overrides = tiny_overrides(STEPS)
    overrides["data"]["held_out"], overrides["eval"]["num_samples"] = HELD_OUT, TRAINED_ON
    decide = {"min_seeds": 2, "max_seeds": 3, "margin": {"val_flow_ivw": 0.0}}
    with session_scope(settings.database_url) as session:
        grid_id = create_grid(session, GridCreate(name="looks", arms=["A", "B"], overrides=overrides,
                                                  decide=decide)).id  # fmt: skip
    train_grid_runs(settings, grid_id)
    return grid_id


def run_until_ended(settings: Settings, ray_cluster: str, tmp_path: Path, eid: int) -> None:
    launcher = Launcher(launcher_settings_for(settings.database_url, tmp_path, ray_cluster, max_retries=1))
    launcher.start()
    try:
        def ended() -> bool:  # the evaluation, and every job of it (a batch's others go on after one failed)
            with session_scope(settings.database_url) as session:
                evaluation = session.get(Evaluation, eid)
                return evaluation.state in ("completed", "failed") and all(
                    j.state not in ("queued", "running") for j in evaluation.results)

        wait_for(ended, f"evaluation {eid} to end", timeout=300, interval=0.5)
    finally:
        launcher.stop()


def test_a_grid_deciding_on_the_flow_loss_measures_it_alone_and_anything_else_measures_everything() -> None:
    assert measures_of(DecideSpec()) == FLOW_METRICS  # the default decides on val_flow_ivw
    assert measures_of(DecideSpec(margin={"val_flow_ivw": 0.0, "val_flow_loss": 0.0})) == FLOW_METRICS
    assert measures_of(DecideSpec(margin={"val_flow_ivw": 0.0, "recon_lpips": 0.01})) == EVERY_METRIC
    assert measures_of(None) == EVERY_METRIC


def test_a_flow_only_record_must_carry_the_flow_loss_and_no_lpips_value() -> None:
    flow = {"val_flow_loss": 0.5, "val_flow_loss_n": 4, "val_flow_loss_samples": [0.5] * 4, "evaluated_images": 4}
    assert refused_rows(flow, 4, None, FLOW_METRICS) is None
    claimed = {**flow, "recon_lpips": 0.3, "recon_lpips_n": 4}
    assert "recon_lpips on an evaluation that asked for val_flow_loss alone" in refused_rows(claimed, 4, None,
                                                                                              FLOW_METRICS)
    assert "no val_flow_loss" in refused_rows({"evaluated_images": 4, "text_lpips": None}, 4, None, FLOW_METRICS)
    lpips_only = {"recon_lpips": 0.3, "recon_lpips_n": 4, "evaluated_images": 4}
    assert refused_rows(lpips_only, 4, None) is None  # a full evaluation: as before


def test_a_looks_evaluation_measures_the_flow_loss_alone_for_less(
    settings: Settings, client: TestClient, grid: int, ray_cluster: str, tmp_path: Path
) -> None:
    with session_scope(settings.database_url) as session:
        g = session.get(Grid, grid)
        spec = ArmSpec.model_validate(g.runs[0].spec)
        flow, full = evaluation_hours(session, g, HELD_OUT), evaluation_hours(session, g, HELD_OUT, EVERY_METRIC)
        assert 0 < flow < full  # priced for the flow loss's 8 passes an image, not the sampler's as well
        per_image = evaluation_job_hours(spec, 1, FLOW_METRICS) - evaluation_job_hours(spec, 0, FLOW_METRICS)
        full_image = evaluation_job_hours(spec, 1) - evaluation_job_hours(spec, 0)
        assert per_image == pytest.approx(full_image * 8 / (4 * spec.eval.sampler_steps + 8))
        # The chooser prices an image of the look's evaluation at its passes' share of training's evaluation.
        state, effects = look_state(session, g), {(e.arm, e.metric, e.against): e for e in current_effects(session, g)}
        assert state.readings
        for r in state.readings:
            full_image = action_costs(effects[r.key()]).image
            assert r.costs.image == pytest.approx(full_image * 8 / (4 * spec.eval.sampler_steps + 8))
        [action] = queue_work(session, g, Work(images=HELD_OUT, hours=flow))
        eid = action["evaluation"]
        assert action["measures"] == ["val_flow_loss"] and "the flow loss alone" in action["words"]
        assert session.get(Evaluation, eid).measures == ["val_flow_loss"]
    view = client.get(f"/api/grids/{grid}/evaluations/{eid}").json()
    assert view["measures"] == ["val_flow_loss"]

    run_until_ended(settings, ray_cluster, tmp_path, eid)
    with session_scope(settings.database_url) as session:
        assert session.get(Evaluation, eid).state == "completed", session.get(Evaluation, eid).error
        jobs = list(session.scalars(select(EvaluationResult).where(EvaluationResult.evaluation_id == eid)))
        assert len(jobs) == 4
        # One worker (one start) scored the 4 runs on the one node, each run's record stored on its own job.
        assert len({job.extra["worker"] for job in jobs}) == 1 and {job.node for job in jobs} == {"local"}
        assert len({job.val_flow_loss for job in jobs}) == 4  # each run's own checkpoint, not one run's 4 times
        for job in jobs:
            assert job.val_flow_loss is not None and job.val_flow_loss_n == HELD_OUT
            assert job.extra["val_flow_ivw_n"] == HELD_OUT  # the decided headline, from the stored grid
            assert all(getattr(job, k) is None and getattr(job, f"{k}_n") is None for k in LPIPS_KEYS)
            assert not any(k.startswith(LPIPS_KEYS) for k in job.extra), sorted(job.extra)
            trained = session.scalars(select(Metric).where(Metric.run_id == job.run_id, Metric.step == STEPS)).one()
            assert job.extra["val_flow_loss_samples"][:TRAINED_ON] == pytest.approx(
                trained.extra["val_flow_loss_samples"], rel=1e-4)  # the same images and noise as training's

    # The report: the flow loss on the evaluation's images, the LPIPS metrics still the training records'.
    report = client.get(f"/api/grids/{grid}/report.json").json()
    assert report["evaluation"]["id"] == eid and report["evaluation"]["measures"] == ["val_flow_loss"]
    ns = {(e["metric"], e["n"]) for e in report["effects"] if e["metric"] in ("val_flow_ivw", "recon_lpips")}
    assert ns == {("val_flow_ivw", HELD_OUT), ("recon_lpips", TRAINED_ON)}, ns
    assert f"Evaluation {eid} measured the flow loss alone" in client.get(f"/api/grids/{grid}/report.md").text
    live = client.get(f"/api/dashboard/grids/{grid}").json()
    assert live["evaluation"]["measures"] == ["val_flow_loss"]


def test_a_batched_run_whose_checkpoint_is_gone_fails_alone_and_the_others_are_stored(
    settings: Settings, grid: int, ray_cluster: str, tmp_path: Path
) -> None:
    with session_scope(settings.database_url) as session:
        g = session.get(Grid, grid)
        user = create_evaluation(session, g, EvaluationCreate(images=8))  # a user's (`ablate evaluate`)
        assert user.measures == list(EVERY_METRIC)  # measures every metric, recorded as such
        eid = user.id
        first = sorted(g.runs, key=lambda r: r.id)[0]
        gone, first_id = Path(first.checkpoint_dir), first.id
    aside = gone.with_name(gone.name + ".aside")
    gone.rename(aside)
    try:
        run_until_ended(settings, ray_cluster, tmp_path, eid)
        with session_scope(settings.database_url) as session:
            evaluation = session.get(Evaluation, eid)
            by_run = {j.run_id: j for j in evaluation.results}
            assert evaluation.state == "failed" and evaluation.error.startswith(f"run {first_id}: ")
            assert by_run[first_id].state == "failed" and f"no checkpoint of step {STEPS}" in by_run[first_id].error
            others = [j for r, j in by_run.items() if r != first_id]
            assert [j.state for j in others] == ["completed"] * 3, [(j.state, j.error) for j in others]
            assert all(j.val_flow_loss_n == 8 and j.recon_lpips_n == 8 for j in others)  # a user's: everything
            assert len({j.extra["worker"] for j in others}) == 1
    finally:
        aside.rename(gone)


def test_a_restarted_controller_adopts_a_batch_with_its_worker(
    settings: Settings, grid: int, ray_cluster: str, tmp_path: Path
) -> None:
    with session_scope(settings.database_url) as session:
        eid = create_evaluation(session, session.get(Grid, grid), EvaluationCreate(images=HELD_OUT)).id

    def jobs() -> list[tuple[str, int, dict]]:
        with session_scope(settings.database_url) as session:
            return [(j.state, j.attempt, dict(j.extra or {})) for j in session.get(Evaluation, eid).results]

    first = Launcher(launcher_settings_for(settings.database_url, tmp_path, ray_cluster, max_retries=1))
    first.start()
    try:  # stopped once the batch is placed, before its records are in: its worker scores on
        placed = wait_for(lambda: (js := jobs()) and all(s == "running" for s, _, _ in js) and js,
                          "the batch placed", timeout=60, interval=0.05)
    finally:
        first.stop()
    assert len({extra["batch_worker"] for _, _, extra in placed}) == 1  # every job names the batch's worker
    run_until_ended(settings, ray_cluster, tmp_path, eid)
    ended = jobs()
    # Adopted whole: no job re-queued (a new attempt, a new worker), every run stored from the one worker.
    assert [(s, a) for s, a, _ in ended] == [("completed", 0)] * 4, ended
    assert len({extra["worker"] for _, _, extra in ended}) == 1
    assert not any("batch_worker" in extra for _, _, extra in ended)  # stored rows carry the record's extra


def test_the_launcher_stores_a_deciding_runs_evaluation_from_its_training_job(
    settings: Settings, ray_cluster: str, tmp_path: Path
) -> None:
    """Through the node's agent and Ray: each run's training job evaluates its last checkpoint on the split's
    images (runs/in_training.py) and the launcher stores it as a completed evaluation job, with no job started."""
    overrides = tiny_overrides(3, checkpoint_every=3, warmup_steps=1)
    overrides["data"]["held_out"], overrides["eval"]["num_samples"] = HELD_OUT, TRAINED_ON
    decide = {"min_seeds": 1, "max_seeds": 2, "margin": {"val_flow_ivw": 0.0}}
    with session_scope(settings.database_url) as session:
        gid = create_grid(session, GridCreate(name="trained-here", arms=["A", "B"], overrides=overrides,
                                              decide=decide)).id  # fmt: skip
    launcher = Launcher(launcher_settings_for(settings.database_url, tmp_path, ray_cluster, max_retries=1))
    launcher.start()
    try:
        def ended() -> bool:
            with session_scope(settings.database_url) as session:
                return all(r.state in ("completed", "failed") for r in session.get(Grid, gid).runs)

        wait_for(ended, "the runs to end", timeout=300, interval=0.5)
    finally:
        launcher.stop()
    with session_scope(settings.database_url) as session:
        g = session.get(Grid, gid)
        assert [r.state for r in g.runs] == ["completed"] * 2, [r.error for r in g.runs]
        [evaluation] = session.scalars(select(Evaluation).where(Evaluation.grid_id == gid)).all()
        assert (evaluation.state, evaluation.images, evaluation.measures) == ("completed", HELD_OUT, ["val_flow_loss"])
        for job in evaluation.results:  # scored by the run's own worker, on its own node
            assert job.extra["in_training"] and job.extra["worker"] == f"ablate-run-{job.run_id}-0"
            assert (job.state, job.node, job.val_flow_loss_n, job.recon_lpips_n) == ("completed", "local", HELD_OUT,
                                                                                     None)  # fmt: skip
