"""The notebook client (`orchestrator.client.Client`) against the app served for real on loopback, over a
real migrated database holding the published A-D study (imported as `ablate import` stores it)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app import create_app
from orchestrator.client import ApiError, Client
from orchestrator.db.session import session_scope
from orchestrator.results.curves import load_curves
from orchestrator.results.importer import import_curves
from orchestrator.results.reports.model import Effect
from orchestrator.settings import Settings
from tests.kit.net import served

FIXTURE = Path(__file__).parents[1] / "fixtures" / "published_ablation_a_to_d.json"
TOKEN = "client-test-token-0123456789"
EFFECT_COLUMNS = [f for f in Effect.model_fields if f not in ("budget", "per_seed")]


@pytest.fixture(scope="module")
def base(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(database_url=database_url, home_dir=tmp_path_factory.mktemp("home"))
    with served(create_app(settings, TOKEN)) as url:
        yield url


@pytest.fixture(scope="module")
def grid_id(database_url: str) -> int:
    with session_scope(database_url) as session:
        return import_curves(session, load_curves(FIXTURE), "published A-D").id


def test_a_notebook_gets_a_grids_effects_as_a_dataframe_in_three_lines(base: str, grid_id: int) -> None:
    from orchestrator.client import Client

    effects = Client(base).effects(grid_id)

    assert list(effects.columns) == EFFECT_COLUMNS
    # B, C and D each against their parent and the control (B's parent is the control): 5 x 3 metrics.
    assert effects.shape == (15, len(EFFECT_COLUMNS))
    c_vs_b = effects[(effects.arm == "C") & (effects.other_arm == "B") & (effects.metric == "recon_lpips")]
    assert len(c_vs_b) == 1 and round(float(c_vs_b["diff"].iloc[0]), 3) == -0.070 and c_vs_b["step"].iloc[0] == 5000
    assert set(effects.reading) == {"no interval"}  # one seed, no per-sample values: said, not guessed


def test_metrics_are_one_row_per_checkpoint(base: str, grid_id: int) -> None:
    curves = load_curves(FIXTURE)
    with Client(base) as client:
        runs = {r.arm: r.id for r in client.grid(grid_id).runs}
        metrics = client.metrics(runs["B"])
    published = next(c for key, c in curves.items() if key.startswith("B")).raw  # the file's checkpoints
    assert list(metrics["step"]) == [c["step"] for c in published]
    assert list(metrics["recon_lpips"]) == pytest.approx([c["recon_lpips"] for c in published])
    assert "extra" not in metrics.columns and {"step", "recon_lpips", "created_at"} <= set(metrics.columns)


def test_without_pandas_the_tables_are_lists_of_dicts(
    base: str, grid_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Client(base) as client:
        frame = client.effects(grid_id)
        monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError, as when absent
        rows = client.effects(grid_id)
        points = client.metrics(client.grid(grid_id).runs[0].id)
    assert isinstance(rows, list) and len(rows) == len(frame) and list(rows[0]) == EFFECT_COLUMNS
    assert [r["diff"] for r in rows] == list(frame["diff"])
    assert isinstance(points, list) and all(isinstance(p, dict) and "step" in p for p in points)


def test_grids_grid_submit_and_stop_with_the_apis_models(base: str, grid_id: int) -> None:
    with Client(base, TOKEN) as client:
        assert grid_id in [g.id for g in client.grids()]
        assert [r.arm for r in client.grid(grid_id).runs] == ["A", "B", "C", "D"]
        created = client.submit({"name": "from a notebook", "arms": ["A", "B"], "seeds": 2})
        assert (created.runs, created.seeds) == (4, 2)
        ids = [r.id for r in client.grid(created.id).runs]
        stopped = client.stop(grid=created.id)
        assert [(s.run_id, s.state, s.outcome) for s in stopped] == [(i, "stopped", "stopped") for i in ids]
        again = client.stop(run_ids=ids[:1], grid=created.id)
        assert [s.outcome for s in again] == ["already_ended"] * 5
        assert again[-1].message == "already stopped: nothing to stop"


def test_an_error_answer_names_the_status_and_the_apis_message(base: str) -> None:
    with Client(base) as reader, Client(base, TOKEN) as client:
        with pytest.raises(ApiError) as missing:
            client.grid(987654)
        assert missing.value.status == 404
        assert str(missing.value) == "GET /api/grids/987654: HTTP 404: no grid with id 987654"
        with pytest.raises(ApiError) as unauthorized:
            reader.submit({"name": "x", "arms": ["A"]})
        assert unauthorized.value.status == 401
        with pytest.raises(ApiError) as invalid:
            client.submit({"name": "x", "arms": ["A", "Q"]})
        assert invalid.value.status == 422 and invalid.value.message.startswith("arms.1: ")
        with pytest.raises(ApiError) as unknown_run:
            client.stop(run_ids=[987654])
        assert (unknown_run.value.status, unknown_run.value.message) == (404, "no run with id 987654")
    with pytest.raises(ApiError) as down, Client("http://127.0.0.1:9") as nowhere:
        nowhere.grids()
    assert down.value.status == 0 and "no ablate server reachable at http://127.0.0.1:9" in str(down.value)
