"""The gallery of sample images in a real headless Chromium, on a grid whose checkpoints carry them: the arms
side by side at a step, a screenshot taken (ABLATE_UPDATE_SCREENSHOT=1 also copies it to
docs/screenshots/gallery.png for the README)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.orchestrator.dashboard.browser import SCREENSHOTS, drawn_samples, gallery_images, needs_chromium

GALLERY_STEPS = {"A": [10, 20, 30, 40], "B": [10, 20, 30], "C": [10, 20, 30, 40], "D": [10, 20, 30, 40]}
GALLERY_BEST = {"A": 40, "B": 20, "C": 30, "D": 40}
GALLERY_SHOT = SCREENSHOTS / "gallery.png"


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
                manifest = write_samples(folder / run.arm, step, drawn_samples(i, step))
                lpips = 0.8 - step / 100 + 0.05 * i + (0.3 if run.arm == "B" and step > 20 else 0.0)
                s.add(Metric(run_id=run.id, step=step, recon_lpips=lpips, gpu_hours=step / 20, iter_per_sec=3.0,
                             extra={"samples": manifest}))  # fmt: skip
            run.best_step, run.best_value = GALLERY_BEST[run.arm], 0.8 - GALLERY_BEST[run.arm] / 100 + 0.05 * i
            run.state = RunState.completed
        b = grid.runs[1]
        b.state, b.decision, b.decision_step = RunState.stopped, RunDecision.COLLAPSE, 30
        b.decision_reason = "recon_lpips rose 0.3 above its best (step 20) and stayed there"
        return grid.id


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
    images = gallery_images(page)
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
    images = gallery_images(page)
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
    assert all(im["src"].split("/")[5] == "20" for im in gallery_images(page))
    assert page.get_attribute(f"{recon} .marker.selected", "data-step") == "20"
    hours = "figure.chart[data-key='recon_lpips'][data-axis='hours']"
    _click_point(page, f"{hours} .marker.best[data-arm='D']")  # D's best: step 40, 2 GPU-hours
    assert page.inner_text("#gallery-label") == "step 40"

    # Back to step 20 for the picture: the curves, the line at the step, the gallery under them.
    page.click("#gallery-prev")
    page.click("#gallery-prev")
    gallery_images(page)
    page.evaluate("scrollTo(0, 0)")  # else the sticky header is drawn where the page was scrolled to
    bottom = page.eval_on_selector("#gallery", "e => e.getBoundingClientRect().bottom")
    shot = tmp_path / "gallery.png"
    page.screenshot(path=str(shot), full_page=True, clip={"x": 0, "y": 0, "width": 1440, "height": bottom + 12})
    if os.environ.get("ABLATE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, GALLERY_SHOT)
    assert errors == []
    page.close()
