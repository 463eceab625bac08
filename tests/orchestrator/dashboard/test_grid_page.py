"""The grid list and grid page in a real headless Chromium: the published A-D curves imported with `ablate
import`, served by the real app with uvicorn, the grid page loaded and checked (four arms drawn on the canvas,
B's detector stop marked with its reason), a screenshot taken (into the test's temporary directory;
ABLATE_UPDATE_SCREENSHOT=1 also copies it to docs/screenshots/grid.png for the README); live grids, storage and
data alarms, a command arm's own metrics, and the header's counts read as words."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.orchestrator.dashboard.browser import FIXTURE, SCREENSHOTS, drawn_samples, gallery_images, needs_chromium

SCREENSHOT = SCREENSHOTS / "grid.png"
# Okabe-Ito colours the page gives arms by position (static/grid.js PALETTE).
ARM_COLOURS = {"A": (0x00, 0x72, 0xB2), "B": (0xD5, 0x5E, 0x00), "C": (0x00, 0x9E, 0x73), "D": (0xCC, 0x79, 0xA7)}


def _arm_pixels(page, selector: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """How many canvas pixels of the chart have each arm's exact colour (the lines themselves)."""
    return page.eval_on_selector(
        selector,
        """(fig, colours) => {
            const c = fig.querySelector("canvas");
            const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            const out = {};
            for (const [arm, [r, g, b]] of Object.entries(colours)) {
                let n = 0;
                const near = (i) => Math.abs(px[i] - r) < 8 && Math.abs(px[i + 1] - g) < 8
                    && Math.abs(px[i + 2] - b) < 8 && px[i + 3] > 200;
                for (let i = 0; i < px.length; i += 4) if (near(i)) n++;
                out[arm] = n;
            }
            return out;
        }""",
        {arm: list(rgb) for arm, rgb in ARM_COLOURS.items()},
    )


@needs_chromium
def test_grid_list_shows_the_imported_grid(base_url: str, grid_id: int, browser_context, published_curves) -> None:  # type: ignore[no-untyped-def]
    page = browser_context.new_page()
    page.goto(base_url + "/")
    row = page.locator(f"tr[data-grid-id='{grid_id}']")
    assert row.get_attribute("data-state") == "finished"
    assert row.locator("td.arms .chip").all_inner_texts() == ["A", "B", "C", "D"]
    assert "state-stopped" in (row.locator(".chip", has_text="B").get_attribute("class") or "")
    # GPU-hours: the sum of the four arms' final elapsed hours in the fixture.
    hours = sum(arm["checkpoints"][-1]["elapsed_hours"] for arm in published_curves.values())
    assert float(row.locator("td.num").inner_text()) == pytest.approx(hours, abs=0.05)
    page.locator(f"tr[data-grid-id='{grid_id}'] a").click()
    page.wait_for_url(f"**/grids/{grid_id}")
    page.close()


@needs_chromium
def test_grid_page_draws_four_arms_and_b_stop(  # type: ignore[no-untyped-def]
    base_url: str, database_url: str, grid_id: int, browser_context, ablate_cli, tmp_path: Path
) -> None:
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{base_url}/grids/{grid_id}")
    page.wait_for_selector("main#grid[data-ready='true']", timeout=20_000)

    recon = "figure.chart[data-key='recon_lpips'][data-axis='step']"
    assert page.get_attribute(recon, "data-drawn") == "A,B,C,D"
    assert page.locator(f"{recon} ul.legend li").evaluate_all("els => els.map(e => e.dataset.arm)") == list("ABCD")
    pixels = _arm_pixels(page, recon)
    assert all(n > 50 for n in pixels.values()), pixels  # every arm's line is on the canvas

    # B's stop marker: at the detector's step, with its decision and reason, in B's colour.
    stop = page.locator(f"{recon} .marker.stop[data-arm='B']")
    assert stop.count() == 1
    assert stop.get_attribute("data-step") == "4000"
    assert stop.get_attribute("data-decision") == "collapse"
    assert "recon_lpips" in (stop.get_attribute("data-reason") or "")
    assert "B stopped @4000: collapse" in stop.inner_text()
    # ... at the right x: left of the 5000 end of the axis, right of B's best (step 3000).
    best = page.locator(f"{recon} .marker.best[data-arm='B']")
    assert best.get_attribute("data-step") == "3000"
    assert best.bounding_box()["x"] < stop.bounding_box()["x"]  # type: ignore[index]
    # No other arm is stopped; every arm has a best-checkpoint star.
    assert page.locator(f"{recon} .marker.stop").count() == 1
    assert page.locator(f"{recon} .marker.best").count() == 4

    # The same curves against GPU-hours, the paired differences against A, throughput.
    assert page.get_attribute("figure.chart[data-key='recon_lpips'][data-axis='hours']", "data-drawn") == "A,B,C,D"
    assert page.get_attribute("figure.chart[data-key='paired_recon_lpips']", "data-drawn") == "B,C,D"
    assert page.get_attribute("figure.chart[data-key='iter_per_sec']", "data-drawn") == "A,B,C,D"
    # The fixture has no SEs and no samples/s: said, not faked.
    assert "no SE stored" in page.inner_text("figure.chart[data-key='paired_recon_lpips'] figcaption")
    assert "no data" in page.inner_text("figure.chart[data-key='samples_per_sec']")

    # Arms table: state badges and B's decision; the lineage table: what B changes against A.
    assert page.locator("#arms tr[data-arm='B'] .badge").first.inner_text() == "stopped"
    assert page.locator("#arms tr[data-arm='A'] .badge").first.inner_text() == "completed"
    assert "tread.enabled" in page.inner_text("#lineage tr[data-arm='B']")
    assert "optimizer" in page.inner_text("#lineage tr[data-arm='C']")
    assert "B stopped at step 4000 (collapse)" in page.inner_text("#banners")

    # Detector warnings on secondary metrics, exactly as `ablate replay` gives them (C: text_lpips,
    # D: text_manip_delta, A and B: none), in the notes as warnings: no stop banner, no stop marker.
    replay = ablate_cli(database_url, "replay", str(FIXTURE))
    assert replay.returncode == 0, replay.stderr
    expected = {line["arm"].split("_")[0]: line["warnings"] for line in map(json.loads, replay.stdout.splitlines())}
    shown = {
        arm: page.locator(f"#arms tr[data-arm='{arm}'] .tag.warning").evaluate_all("els => els.map(e => e.title)")
        for arm in "ABCD"
    }
    assert shown == {arm: [f"detector warning (not a stop): {w}" for w in ws] for arm, ws in expected.items()}
    assert shown["A"] == [] and len(shown["C"]) == 1 and "text_lpips worsened" in shown["C"][0]
    assert page.inner_text("#arms tr[data-arm='C'] .tag.warning").startswith("⚠ text_lpips worsened 3 checkpoints")
    assert page.locator("#banners [data-arm='C'], #banners [data-arm='D']").count() == 0
    assert page.locator("#arms tr[data-arm='C'] .badge").first.inner_text() == "completed"

    # What a laptop screen shows first: the stop, the judged chart and its difference, the effects.
    shot = tmp_path / "grid.png"
    page.screenshot(path=str(shot), full_page=True, clip={"x": 0, "y": 0, "width": 1440, "height": 1090})
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("ABLATE_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
    assert errors == []
    page.close()


def test_metrics_csv_export(base_url: str, grid_id: int, published_curves: dict) -> None:
    import csv
    import io

    import httpx

    resp = httpx.get(f"{base_url}/api/grids/{grid_id}/metrics.csv")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/csv")
    assert "attachment" in resp.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    assert len(rows) == sum(len(a["checkpoints"]) for a in published_curves.values())
    assert [r["arm"] for r in rows[::10]] == list("ABCD")
    b4000 = next(r for r in rows if r["arm"] == "B" and r["step"] == "4000")
    src = next(c for c in published_curves["B_tread_adamw"]["checkpoints"] if c["step"] == 4000)
    assert float(b4000["recon_lpips"]) == src["recon_lpips"]
    assert float(b4000["gpu_hours"]) == src["elapsed_hours"]
    assert (b4000["state"], b4000["decision"], b4000["decision_step"]) == ("stopped", "collapse", "4000")
    assert b4000["recon_lpips_se"] == ""  # absent, not zero
    assert json.loads(b4000["extra"])["wall_time_iso"] == src["wall_time_iso"]
    assert httpx.get(f"{base_url}/api/grids/999999/metrics.csv").status_code == 404


@needs_chromium
def test_live_grid_updates_and_labels_standins(  # type: ignore[no-untyped-def]
    base_url: str, database_url: str, browser_context, tmp_path: Path
) -> None:
    """A running grid: the page polls and redraws when a checkpoint lands (its sample images join the
    gallery), SE bands are drawn where SEs exist, and a stand-in LPIPS backbone and a recorded fallback
    are labelled."""
    from orchestrator.db.models import Metric, Run
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.vocabulary import RunState

    def checkpoint(run_id: int, step: int) -> Metric:
        v = 0.9 - step / 10_000
        return Metric(
            run_id=run_id,
            step=step,
            recon_lpips=v,
            recon_lpips_se=0.01,
            text_lpips=v + 0.02,
            text_lpips_se=0.01,
            gpu_hours=step / 1000,
            iter_per_sec=2.0,
            samples_per_sec=32.0,
            lpips_backbone="random_standin",
        )

    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="live", arms=["A", "B"], overrides={"model": {"size": "tiny"}}))
        for run in grid.runs:
            run.state = RunState.running
            s.add_all([checkpoint(run.id, 50), checkpoint(run.id, 100)])
        grid.runs[1].fallbacks = ["compile: off (no C compiler for inductor)"]
        grid.runs[0].checkpoint_dir = str(tmp_path)
        gid, run_a = grid.id, grid.runs[0].id

    page = browser_context.new_page()
    page.goto(f"{base_url}/grids/{gid}")
    page.wait_for_selector("main#grid[data-ready='true']")
    assert page.is_visible("#live")
    step_cell = "#arms tr[data-arm='A'] td:nth-child(3)"
    assert page.inner_text(step_cell) == "100"
    assert "stand-in LPIPS" in page.inner_text("#arms tr[data-arm='A']")
    standin = "#banners details.notice[data-kind='standin'][data-arms='A,B']"
    assert "random (untrained) LPIPS backbone" in page.text_content(f"{standin} li[data-arm='A']")
    fallback = "#banners details.notice[data-kind='fallback'][data-arms='B']"
    assert "compile: off" in page.inner_text(f"{fallback} summary")
    page.click(f"{fallback} summary")  # opened by the reader: it stays open when the page redraws below
    assert "1 fallback" in page.inner_text("#arms tr[data-arm='B'] .tag.fallback")
    # Stand-in LPIPS charts: folded, drawn once opened (with SE bands where SEs exist).
    recon = "figure.chart[data-key='recon_lpips'][data-axis='step']"
    assert page.locator(recon).count() == 0
    page.click("#standin-charts > summary")
    assert page.get_attribute(recon, "data-bands") == "2"
    assert "stand-in LPIPS backbone: A, B" in page.inner_text(recon)
    # The lineage table diffs B against A in this grid (both tiny): only TREAD differs.
    assert page.inner_text("#lineage tr[data-arm='B'] ul.changes").strip() == "tread.enabled = true"

    assert "No sample images stored" in page.inner_text("#gallery")

    from worker.samples import write_samples

    with session_scope(database_url) as s:
        latest = checkpoint(run_a, 150)
        latest.extra = {"samples": write_samples(tmp_path, 150, drawn_samples(0, 150))}
        s.add(latest)
    page.wait_for_function(f"document.querySelector(\"{step_cell}\").textContent === '150'", timeout=20_000)
    assert page.get_attribute(fallback, "open") is not None
    # The new checkpoint's images, in A's column (the newest step, still training); B has none yet.
    assert page.inner_text("#gallery-label") == "step 150"
    images = gallery_images(page)
    assert {im["arm"] for im in images} == {"A"} and all(im["width"] > 0 for im in images)
    assert all(im["src"] == f"/api/runs/{run_a}/samples/150/{im['kind']}_{im['src'][-5]}.png" for im in images)
    assert page.locator(".gallery-arm[data-arm='A'] .mark.latest").count() == 1
    assert "no sample images stored" in page.inner_text(".gallery-arm[data-arm='B']")

    with session_scope(database_url) as s:
        for run in s.get(Run, run_a).grid.runs:
            run.state = RunState.completed
    page.wait_for_selector("#live", state="hidden", timeout=20_000)
    assert page.inner_text("#arms tr[data-arm='B'] .badge") == "completed"
    page.close()


@needs_chromium
def test_unstored_checkpoints_and_a_second_node_are_shown(base_url: str, database_url: str, browser_context) -> None:  # type: ignore[no-untyped-def]
    """A run whose newest checkpoint has not reached checkpoint storage for longer than the alarm time
    (15 min by default) gets a red banner with the last upload error; a run resumed on another node
    names both nodes."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.db.models import Event
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.vocabulary import RunState

    now = datetime.now(UTC)
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="storage", arms=["A", "B"], overrides={"model": {"size": "tiny"}}))
        a, b = grid.runs
        for run in grid.runs:
            run.state, run.checkpoint_url = RunState.running, f"s3://bucket/run-{run.id}"
        b.nodes, b.retries = ["node0 (10.1.0.11)", "node1 (10.1.0.12)"], 1
        s.flush()
        s.add_all([
            Event(run_id=a.id, grid_id=grid.id, kind="checkpoint", time=now - timedelta(minutes=22), data={"step": 10}),
            Event(run_id=a.id, grid_id=grid.id, kind="checkpoint.store_failed", time=now - timedelta(minutes=1),
                  data={"step": 10, "seq": 1, "attempt": 0, "error": "EndpointConnectionError: bucket unreachable"}),
            Event(run_id=b.id, grid_id=grid.id, kind="checkpoint", time=now - timedelta(minutes=22), data={"step": 10}),
            Event(run_id=b.id, grid_id=grid.id, kind="checkpoint.stored", time=now - timedelta(minutes=21),
                  data={"step": 10, "seq": 1, "attempt": 0}),
        ])
        gid = grid.id

    page = browser_context.new_page()
    page.goto(f"{base_url}/grids/{gid}")
    page.wait_for_selector("main#grid[data-ready='true']")
    storage = "#banners details.notice[data-kind='storage']"
    assert page.get_attribute(storage, "data-arms") == "A"  # B's checkpoint is stored
    assert "Checkpoints not stored (A)" in page.inner_text(f"{storage} summary")
    banner = page.text_content(f"{storage} li[data-arm='A']")
    assert "checkpoints not stored for 22 min" in banner and "bucket unreachable" in banner
    assert "No checkpoint in storage yet" in banner
    assert "checkpoints unstored 22 min" in page.inner_text("#arms tr[data-arm='A']")
    assert "nodes: node0 (10.1.0.11) → node1 (10.1.0.12)" in page.inner_text("#arms tr[data-arm='B']")
    page.close()


@needs_chromium
def test_an_arm_waiting_for_data_is_flagged_with_the_fix(base_url: str, database_url: str, browser_context) -> None:  # type: ignore[no-untyped-def]
    """Each arm's data wait and micro-batch x accumulation in the arms table; an arm waiting more than
    10% of its time gets a banner with the fix in words; skipped images are counted."""
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.results.data_feed import DATA_WAIT_FIX
    from orchestrator.runs.ingest import ingest

    def record(wait: float, skipped: int) -> dict:
        return {"step": 10, "recon_lpips": 0.6, "data_wait_fraction": wait, "micro_batch": 8, "grad_accum": 32,
                "skipped_images": skipped, "skipped_files": [f"bad{i}.jpg" for i in range(skipped)]}  # fmt: skip

    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="data wait", arms=["A", "B"], overrides={"model": {"size": "tiny"}}))
        a, b = grid.runs
        ingest(s, a, [record(0.021, 0)], detect=False)
        ingest(s, b, [record(0.37, 3)], detect=False)
        gid = grid.id

    page = browser_context.new_page()
    page.goto(f"{base_url}/grids/{gid}")
    page.wait_for_selector("main#grid[data-ready='true']")
    assert page.inner_text("#arms tr[data-arm='A'] td.data-wait") == "2.1%"
    assert page.inner_text("#arms tr[data-arm='B'] td.data-wait") == "37%"
    assert page.inner_text("#arms tr[data-arm='A'] td.micro") == "8 × 32"
    waiting = "#banners details.notice[data-kind='data-wait']"
    assert page.get_attribute(waiting, "data-arms") == "B"  # A waits 2.1%: no warning
    assert DATA_WAIT_FIX in page.inner_text(f"{waiting} summary")
    assert "B: waits for data 37% of its time" in page.text_content(f"{waiting} li[data-arm='B']")
    assert page.inner_text("#arms tr[data-arm='B'] .tag.skipped") == "3 images skipped"
    assert page.query_selector("#arms tr[data-arm='A'] .tag.skipped") is None
    page.close()


def test_a_command_arm_s_own_metrics_are_charted_by_name(base_url: str, database_url: str, browser_context) -> None:  # type: ignore[no-untyped-def]
    """A command arm's metrics (its script's names, kept in Metric.extra) each get a chart by step; its
    PNGs are in the gallery."""
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, PathPolicy, create_grid
    from orchestrator.runs.ingest import ingest

    mine = {"name": "mine", "code": "/srv/code/t", "command": ["python", "t.py"], "detector": {"metric": "val_loss"}}
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="own metrics", arms=["A", mine], overrides={"model": {"size": "tiny"}}),
                           paths=PathPolicy(allow_commands=True, command_dirs=[Path("/srv/code")]))  # fmt: skip
        a, command = grid.runs
        ingest(s, a, [{"step": 10, "recon_lpips": 0.6}], detect=False)
        own = {"dir": "samples/step_0000030", "files": [{"file": "own_0.png", "kind": "own", "index": 0,
                                                         "caption": "grid.png", "bytes": 70}]}  # fmt: skip
        ingest(s, command, [{"step": s_, "val_loss": 1 / s_, "train_loss": 2 / s_} for s_ in (10, 20)]
               + [{"step": 30, "val_loss": 1 / 30, "train_loss": 2 / 30, "samples": own}], detect=False)  # fmt: skip
        gid, command_id = grid.id, command.id

    page = browser_context.new_page()
    page.goto(f"{base_url}/grids/{gid}")
    page.wait_for_selector("main#grid[data-ready='true']")
    own = "figure.chart[data-key='own_val_loss'][data-axis='step']"
    page.wait_for_selector(f"{own}[data-drawn]")
    assert page.get_attribute(own, "data-drawn") == "mine"
    assert page.get_attribute("figure.chart[data-key='own_train_loss']", "data-drawn") == "mine"
    assert "val_loss" in page.inner_text(f"{own} figcaption")
    assert page.get_attribute("figure.chart[data-key='recon_lpips'][data-axis='step']", "data-drawn") == "A"
    # Its PNGs in the gallery, as a built-in arm's samples are, captioned with the file's name.
    img = page.wait_for_selector("#gallery img[data-kind='own']", state="attached")  # no file: not shown
    assert img.get_attribute("src").endswith(f"/api/runs/{command_id}/samples/30/own_0.png")
    assert "grid.png" in img.get_attribute("title")
    page.close()


@needs_chromium
def test_a_distribution_metric_is_charted_naming_its_standin_extractor(  # type: ignore[no-untyped-def]
    base_url: str, database_url: str, browser_context
) -> None:
    """CMMD (kept in Metric.extra at the checkpoints its pass measured) gets charts by step, GPU-hours and paired
    against the control, their note naming the extractor and that a stand-in is descriptive; DINO-MMD, not
    measured, gets none."""
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.runs.ingest import ingest

    label = "clip-vit-l-14-336 small random stand-in (no weights)"
    dist = {"eval": {"distribution": {"metrics": ["cmmd"], "samples": 32}}, "model": {"size": "tiny"}}
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="cmmd", arms=[{"parent": "A", "name": "base", **dist},
                                                            {"parent": "A", "name": "worse", **dist}]))  # fmt: skip
        for run, shift in zip(grid.runs, (0.0, 0.5), strict=True):
            ingest(s, run, [{"step": step, "gpu_hours": step / 100, "cmmd": 2 + shift - step / 20, "cmmd_se": 0.05,
                             "cmmd_n": 32, "cmmd_extractor": label, "cmmd_samples": [2 + shift - step / 20] * 32}
                            for step in (10, 20)], detect=False)  # fmt: skip
        gid = grid.id

    page = browser_context.new_page()
    page.goto(f"{base_url}/grids/{gid}")
    page.wait_for_selector("main#grid[data-ready='true']")
    cmmd = "figure.chart[data-key='cmmd'][data-axis='step']"
    page.wait_for_selector(f"{cmmd}[data-drawn]")
    assert page.get_attribute(cmmd, "data-drawn") == "base,worse"
    assert f"{label}: stand-in extractor: descriptive" in page.inner_text(f"{cmmd} figcaption")
    assert page.get_attribute("figure.chart[data-key='cmmd'][data-axis='hours']", "data-drawn") == "base,worse"
    assert page.get_attribute("figure.chart[data-key='paired_cmmd']", "data-drawn") == "worse"
    assert page.locator("figure.chart[data-key='dino_mmd']").count() == 0
    page.close()


@needs_chromium
def test_the_header_counts_one_arm_and_one_seed_in_the_singular(  # type: ignore[no-untyped-def]
    base_url: str, database_url: str, browser_context
) -> None:
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid

    tiny = {"model": {"size": "tiny"}}
    with session_scope(database_url) as s:
        one = create_grid(s, GridCreate(name="one arm", arms=["A"], overrides=tiny)).id
        seeded = create_grid(s, GridCreate(name="one arm, seeds", arms=["A"], seeds=2, overrides=tiny)).id
    page = browser_context.new_page()
    said = {}
    for grid_id in (one, seeded):
        page.goto(f"{base_url}/grids/{grid_id}")
        page.wait_for_selector("main#grid[data-ready='true']", timeout=20_000)
        said[grid_id] = page.inner_text("#grid-meta")
    assert said[one].startswith("1 arm (1 queued)"), said[one]
    assert said[seeded].startswith("1 arm x 2 seeds = 2 runs (2 queued)"), said[seeded]
