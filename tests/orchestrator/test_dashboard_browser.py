"""The dashboard in a real headless Chromium: the published A-D curves imported with `ablate import`,
served by the real app with uvicorn, the grid page loaded and checked (four arms drawn on the
canvas, B's detector stop marked with its reason), the gallery of sample images on a grid whose
checkpoints carry them, screenshots taken (into the test's temporary directory; ABLATE_UPDATE_SCREENSHOT=1
also copies them to docs/screenshots/grid.png and gallery.png for the README)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
FIXTURE = Path(__file__).parents[1] / "fixtures" / "published_ablation_a_to_d.json"
SCREENSHOT = Path(__file__).parents[2] / "docs" / "screenshots" / "grid.png"
# Okabe-Ito colours the page gives arms by position (static/grid.js PALETTE).
ARM_COLOURS = {"A": (0x00, 0x72, 0xB2), "B": (0xD5, 0x5E, 0x00), "C": (0x00, 0x9E, 0x73), "D": (0xCC, 0x79, 0xA7)}

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium on PATH (apt-get install chromium)")


@pytest.fixture(scope="module")
def grid_id(database_url: str, ablate_cli) -> int:  # type: ignore[no-untyped-def]
    out = ablate_cli(database_url, "import", str(FIXTURE), "--name", "published study A-D (2026)")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[1])  # "grid N 'name': ..."


@pytest.fixture(scope="module")
def base_url(database_url: str) -> Iterator[str]:
    """The real app on a free loopback port, in a thread."""
    import uvicorn

    from orchestrator.app import create_app
    from orchestrator.settings import Settings

    app = create_app(Settings(database_url=database_url), api_token="test-token")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and server.servers):
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            # Offline machine: without these Chromium stalls on refused background connections.
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
            viewport={"width": 1440, "height": 900},
            device_scale_factor=1,
        )
        yield context
        context.close()


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

    # What a laptop screen shows first, plus the row against GPU-hours.
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
    assert page.get_attribute("figure.chart[data-key='recon_lpips'][data-axis='step']", "data-bands") == "2"
    assert "stand-in LPIPS" in page.inner_text("#arms tr[data-arm='A']")
    assert "random (untrained) LPIPS backbone" in page.inner_text("#banners")
    assert "compile: off" in page.inner_text("#banners .banner.fallback[data-arm='B']")
    assert "stand-in LPIPS backbone: A, B" in page.inner_text("figure.chart[data-key='recon_lpips'][data-axis='step']")
    # The lineage table diffs B against A in this grid (both tiny): only TREAD differs.
    assert page.inner_text("#lineage tr[data-arm='B'] ul.changes").strip() == "tread.enabled = true"

    assert "No sample images stored" in page.inner_text("#gallery")

    from worker.samples import write_samples

    with session_scope(database_url) as s:
        latest = checkpoint(run_a, 150)
        latest.extra = {"samples": write_samples(tmp_path, 150, _drawn_samples(0, 150))}
        s.add(latest)
    page.wait_for_function(f"document.querySelector(\"{step_cell}\").textContent === '150'", timeout=20_000)
    # The new checkpoint's images, in A's column (the newest step, still training); B has none yet.
    assert page.inner_text("#gallery-label") == "step 150"
    images = _gallery_images(page)
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
    banner = page.inner_text("#banners .banner.storage[data-arm='A']")
    assert "checkpoints not stored for 22 min" in banner and "bucket unreachable" in banner
    assert "No checkpoint in storage yet" in banner
    assert page.query_selector("#banners .banner.storage[data-arm='B']") is None  # B's checkpoint is stored
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
    assert page.query_selector("#banners .banner.data-wait[data-arm='A']") is None
    banner = page.inner_text("#banners .banner.data-wait[data-arm='B']")
    assert "B waits for data 37% of its time" in banner and DATA_WAIT_FIX in banner
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


# -- the gallery -------------------------------------------------------------------------------------------

GALLERY_STEPS = {"A": [10, 20, 30, 40], "B": [10, 20, 30], "C": [10, 20, 30, 40], "D": [10, 20, 30, 40]}
GALLERY_BEST = {"A": 40, "B": 20, "C": 30, "D": 40}
GALLERY_SHOT = SCREENSHOT.with_name("gallery.png")


def _drawn_samples(arm_index: int, step: int) -> dict:
    """Images in the shape evaluate() keeps them (4 targets with reconstructions and text-only samples,
    2 caption/edit pairs), drawn by the test: real shapes-dataset targets, and "generations" that are
    the targets under noise fading with the step (B's coming back as dithering after step 20)."""
    import numpy as np
    import torch

    from model.data import edit_attrs, render_shapes, shape_attrs

    attrs = [shape_attrs(7, i) for i in range(4)]
    edits = [edit_attrs(a, "colour", np.random.default_rng(i)) for i, a in enumerate(attrs[:2])]
    targets = render_shapes(attrs, 32)
    gen = torch.Generator().manual_seed(1000 * arm_index + step)
    noise = 0.35 * (1 - step / 50) + (0.3 if arm_index == 1 and step > 20 else 0.0)

    def generated(images: torch.Tensor) -> torch.Tensor:
        out = images + noise * torch.randn(images.shape, generator=gen)
        if arm_index == 1 and step > 20:  # B: "structural noise and visual dithering"
            out = (out > torch.rand(images.shape, generator=gen)).float()
        return out.clamp(0, 1)

    caps = [a.caption() for a in attrs]
    pairs = render_shapes(attrs[:2] + edits, 32)
    others = [shape_attrs(9, i) for i in range(4)]
    return {
        "target": list(zip(caps, targets, strict=True)),
        "recon": list(zip(caps, generated(targets), strict=True)),
        "text": [(a.caption(), img) for a, img in zip(others, generated(render_shapes(others, 32)), strict=True)],
        "caption": list(zip(caps[:2], generated(pairs[:2]), strict=True)),
        "edit": [(e.caption(), img) for e, img in zip(edits, generated(pairs[2:]), strict=True)],
    }


@pytest.fixture(scope="module")
def gallery_grid(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> int:
    """A finished four-arm grid whose checkpoints carry sample images, written by the worker's own
    writer into each run's folder: B stopped at step 30 (best 20), the others ran to 40."""
    from orchestrator.db.models import Metric
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.vocabulary import RunDecision, RunState
    from worker.samples import write_samples

    folder = tmp_path_factory.mktemp("gallery-runs")
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="gallery (drawn test images)", arms=list("ABCD"),
                                         overrides={"model": {"size": "tiny"}}))  # fmt: skip
        for i, run in enumerate(grid.runs):
            run.checkpoint_dir = str(folder / run.arm)
            for step in GALLERY_STEPS[run.arm]:
                manifest = write_samples(folder / run.arm, step, _drawn_samples(i, step))
                lpips = 0.8 - step / 100 + 0.05 * i + (0.3 if run.arm == "B" and step > 20 else 0.0)
                s.add(Metric(run_id=run.id, step=step, recon_lpips=lpips, gpu_hours=step / 20, iter_per_sec=3.0,
                             extra={"samples": manifest}))  # fmt: skip
            run.best_step, run.best_value = GALLERY_BEST[run.arm], 0.8 - GALLERY_BEST[run.arm] / 100 + 0.05 * i
            run.state = RunState.completed
        b = grid.runs[1]
        b.state, b.decision, b.decision_step = RunState.stopped, RunDecision.COLLAPSE, 30
        b.decision_reason = "recon_lpips rose 0.3 above its best (step 20) and stayed there"
        return grid.id


def _gallery_images(page) -> list[dict]:  # type: ignore[no-untyped-def]
    """Every image of the gallery, once all have loaded or failed: arm, src, naturalWidth."""
    page.wait_for_function("[...document.querySelectorAll('#gallery-arms img')].every(i => i.complete)")
    return page.eval_on_selector_all(
        "#gallery-arms img",
        "imgs => imgs.map(i => ({arm: i.closest('.gallery-arm').dataset.arm, kind: i.dataset.kind,"
        " src: new URL(i.src).pathname, width: i.naturalWidth}))",
    )


def _click_point(page, marker: str) -> None:  # type: ignore[no-untyped-def]
    """A user's click on the curve point under `marker` (a ★ sits on its point): move there, then click."""
    page.locator(marker).scroll_into_view_if_needed()
    box = page.locator(marker).bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x - 20, y)
    page.mouse.move(x, y, steps=4)
    page.mouse.click(x, y)


@needs_chromium
def test_gallery_shows_the_arms_side_by_side_at_a_step(  # type: ignore[no-untyped-def]
    base_url: str, gallery_grid: int, browser_context, tmp_path: Path
) -> None:
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{base_url}/grids/{gallery_grid}")
    page.wait_for_selector("main#grid[data-ready='true']")
    columns = page.locator("#gallery-arms .gallery-arm")
    assert columns.evaluate_all("els => els.map(e => e.dataset.arm)") == list("ABCD")

    # The newest step first: A, C, D at 40 (A's final and best); B stopped at 30, so none, said why.
    assert page.get_attribute("#gallery", "data-step") == "40"
    images = _gallery_images(page)
    assert {im["arm"] for im in images} == {"A", "C", "D"}
    assert all(im["src"].split("/")[5] == "40" and im["width"] > 0 for im in images), images
    assert len([im for im in images if im["arm"] == "A"]) == 16  # 4 targets, recons, texts; 2 pairs
    assert "stopped at step 30" in page.inner_text(".gallery-arm[data-arm='B']")
    assert page.locator(".gallery-arm[data-arm='A'] .mark.best").count() == 1
    assert page.locator(".gallery-arm[data-arm='A'] .mark.final").count() == 1
    assert page.locator(".gallery-arm[data-arm='C'] .mark").count() == 1  # final only: its best is step 30

    # The step picker (the slider, by keyboard) moves every column to that step.
    page.focus("#gallery-step")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    assert page.inner_text("#gallery-label") == "step 20"
    images = _gallery_images(page)
    assert [im["arm"] for im in images[::16]] == list("ABCD")
    assert all(im["src"].split("/")[5] == "20" and im["width"] > 0 for im in images), images
    assert page.locator(".gallery-arm:has(.mark.best)").evaluate_all("els => els.map(e => e.dataset.arm)") == ["B"]
    # Each reconstruction beside its target; text-only samples and caption/edit pairs labelled.
    a = ".gallery-arm[data-arm='A']"
    pair = page.locator(f"{a} [data-group='recon'] .pair").first
    assert pair.locator("img").evaluate_all("els => els.map(e => e.dataset.kind)") == ["target", "recon"]
    assert pair.locator("figcaption").all_inner_texts() == ["target", "recon"]
    assert "text only" in page.inner_text(f"{a} [data-group='text'] h3")
    assert page.locator(f"{a} [data-group='text'] figcaption").first.inner_text().startswith("a ")
    manip = page.locator(f"{a} [data-group='manipulation'] .pair").first
    assert manip.locator("img").evaluate_all("els => els.map(e => e.dataset.kind)") == ["caption", "edit"]
    assert "→" in (manip.get_attribute("title") or "")
    assert "target (held-out image)" in (pair.locator("img").first.get_attribute("title") or "")

    # Each arm at its own best: B's column shows step 20, A's step 40, each marked ★.
    page.click("#gallery button[data-mode='best']")
    assert columns.evaluate_all("els => els.map(e => e.dataset.step)") == ["40", "20", "30", "40"]
    assert page.locator(".gallery-arm .mark.best").count() == 4

    # Clicking a curve's point picks that checkpoint: B's best star (step 20) on the step chart, then a
    # point against GPU-hours (x is hours there: the step comes from the point).
    recon = "figure.chart[data-key='recon_lpips'][data-axis='step']"
    _click_point(page, f"{recon} .marker.best[data-arm='B']")
    assert page.get_attribute("#gallery", "data-mode") == "step"
    assert page.input_value("#gallery-step") == "1" and page.inner_text("#gallery-label") == "step 20"
    assert all(im["src"].split("/")[5] == "20" for im in _gallery_images(page))
    assert page.get_attribute(f"{recon} .marker.selected", "data-step") == "20"
    hours = "figure.chart[data-key='recon_lpips'][data-axis='hours']"
    _click_point(page, f"{hours} .marker.best[data-arm='D']")  # D's best: step 40, 2 GPU-hours
    assert page.inner_text("#gallery-label") == "step 40"

    # Back to step 20 for the picture: the curves, the line at the step, the gallery under them.
    page.click("#gallery-prev")
    page.click("#gallery-prev")
    _gallery_images(page)
    page.evaluate("scrollTo(0, 0)")  # else the sticky header is drawn where the page was scrolled to
    bottom = page.eval_on_selector("#gallery", "e => e.getBoundingClientRect().bottom")
    shot = tmp_path / "gallery.png"
    page.screenshot(path=str(shot), full_page=True, clip={"x": 0, "y": 0, "width": 1440, "height": bottom + 12})
    if os.environ.get("ABLATE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, GALLERY_SHOT)
    assert errors == []
    page.close()


@needs_chromium
def test_report_and_flow_loss_in_the_browser(  # type: ignore[no-untyped-def]
    base_url: str, database_url: str, grid_id: int, browser_context, tmp_path: Path
) -> None:
    """The published study's report opens with the effects table, draws every text of its SVGs inside
    the picture (the curve's step labels were cut off), and a stand-in grid's dashboard draws
    val_flow_loss with SE bands, names it the judge, and draws its per-timestep curves when opened."""
    page = browser_context.new_page()
    page.goto(f"{base_url}/api/grids/{grid_id}/report.html")
    first = page.eval_on_selector("body", "b => b.querySelector('h2').textContent")
    # header + 3 metrics for B (its parent is the control), C and D (against parent and control)
    assert first == "Effects" and page.locator("table.effects tr").count() == 16
    outside = page.evaluate("""() => [...document.querySelectorAll('svg')].flatMap((svg) => {
        const box = svg.getBoundingClientRect();
        return [...svg.querySelectorAll('text')].map((t) => [t.textContent, t.getBoundingClientRect()])
          .filter(([, r]) => r.left < box.left || r.right > box.right || r.top < box.top || r.bottom > box.bottom)
          .map(([s]) => s);
    })""")
    assert outside == []
    assert page.locator("svg text", has_text="5000").count() >= 1  # the last step's label, drawn
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)

    from orchestrator.db.models import Metric
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.vocabulary import RunState

    def checkpoint(run_id: int, step: int, shift: float) -> Metric:
        loss = [0.5 + shift + 0.01 * i - step / 1000 for i in range(8)]
        by_t = [sum(loss) / 8 + 0.1 * (k - 4) for k in range(8)]
        return Metric(run_id=run_id, step=step, recon_lpips=0.2, lpips_backbone="random_standin",
                      val_flow_loss=sum(loss) / 8, val_flow_loss_se=0.01, val_flow_loss_n=8,
                      extra={"val_flow_loss_samples": loss, "val_flow_loss_by_t": by_t})  # fmt: skip

    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="flow", arms=["A", "B"], overrides={"model": {"size": "tiny"}}))
        for shift, run in zip((0.0, 0.1), grid.runs, strict=True):
            run.state = RunState.completed
            s.add_all([checkpoint(run.id, step, shift) for step in (50, 100, 150)])
        gid = grid.id
    page.goto(f"{base_url}/grids/{gid}")
    page.wait_for_selector("main#grid[data-ready='true']")
    chart = "figure.chart[data-key='val_flow_loss'][data-axis='step']"
    assert page.get_attribute(chart, "data-bands") == "2"
    assert "the detector's judge for A, B" in page.inner_text(chart)
    assert "held-out flow loss" in page.inner_text("#banners")
    assert page.get_attribute("figure.chart[data-key='paired_val_flow_loss']", "data-drawn") == "B"
    # The judge leads: the arms table shows the flow loss, and the effects table reads one seed as such.
    assert page.inner_text("#arms tr[data-arm='A'] td.judged").startswith("0.385")
    effect = page.inner_text("#effects tbody tr[data-arm='B'][data-metric='val_flow_loss']")
    assert "one seed: training noise not measured" in effect and "distinguishable" not in effect
    assert "stand-in" in page.inner_text("#effects tbody tr[data-arm='B'][data-metric='recon_lpips']")
    assert page.locator("figure.chart[data-key='val_flow_loss_by_t']").count() == 0  # on demand only
    page.click("#flow-by-t summary")
    by_t = "figure.chart[data-key='val_flow_loss_by_t']"
    page.wait_for_selector(f"{by_t}[data-drawn='A,B']")
    assert "A @150, B @150" in page.inner_text(by_t)
    page.screenshot(path=str(tmp_path / "flow.png"), full_page=True)
    page.close()
