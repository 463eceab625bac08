"""The grid page's first screen at 1400x900 in a real headless Chromium, for the README's demo grid:
arms/demo.yaml as `ablate demo` submits it, its records those of a real offline demo run
(tests/fixtures/demo_grid_records.json, written by bench/demo_screenshot.py --records), ingested as the
launcher ingests them, so the detector stops A-lr500x itself. Without scrolling: the stop (decision,
step, reason, the kept checkpoint), the judged metric's chart (the held-out flow loss's headline, before
any stand-in LPIPS chart) and its effects; warnings one line per distinct message naming its arms;
stand-in charts and effect rows folded under a line that says why; no horizontal scroll."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.orchestrator.dashboard.browser import first_screen, needs_chromium

DEMO_RECORDS = Path(__file__).parents[2] / "fixtures" / "demo_grid_records.json"
WIDTH, HEIGHT = 1400, 900


@pytest.fixture(scope="module")
def demo_grid_id(database_url: str) -> int:
    from orchestrator.cli.demo import demo_grid
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.runs.ingest import ingest
    from orchestrator.vocabulary import STOP_DECISIONS, RunState

    records = json.loads(DEMO_RECORDS.read_text())
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(**demo_grid()))
        for run in grid.runs:
            ingest(s, run, records[run.arm])  # the detector judges each checkpoint, as the launcher has it
            run.state = RunState.stopped if run.decision in STOP_DECISIONS else RunState.completed
        return grid.id


@needs_chromium
def test_the_demo_grid_s_first_screen_answers(base_url: str, demo_grid_id: int, browser_context) -> None:  # type: ignore[no-untyped-def]
    from model.flow_headline import HEADLINE
    from worker.train_parts import LPIPS_STANDIN_FALLBACK

    detail = httpx.get(f"{base_url}/api/dashboard/grids/{demo_grid_id}").json()
    assert detail["judge"] == HEADLINE  # stand-in LPIPS: the detector judges the flow loss's headline
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    page.goto(f"{base_url}/grids/{demo_grid_id}")
    page.wait_for_selector("main#grid[data-ready='true']", timeout=20_000)
    shown = first_screen(page, HEADLINE)

    # The stop, whole, on the first screen: the detector's decision, step, reason and the checkpoint kept.
    assert page.inner_text("#grid-state") == "finished"
    assert "4 completed, 1 stopped" in page.inner_text("#grid-meta")
    stop = page.locator("#banners .banner.stop")
    assert stop.count() == 1 and stop.get_attribute("data-arm") == "A-lr500x"
    words = stop.inner_text()
    assert "A-lr500x stopped at step 150 (diverged)" in words and "val_flow_ivw=nan" in words
    assert "Best checkpoint kept: step 100" in words and ".ablate/runs/5/best.pt" in words
    assert len(shown["stops"]) == 1 and shown["stops"][0]["bottom"] <= HEIGHT

    # The judged metric's chart, every arm drawn, and the stop marked on it, within the first 900 px.
    judged = f"figure.chart[data-key='{HEADLINE}'][data-axis='step']"
    assert page.get_attribute(judged, "data-drawn") == "A,B,C,D,A-lr500x"
    assert page.locator(f"{judged} .marker.stop[data-arm='A-lr500x']").get_attribute("data-step") == "150"
    assert len(shown["judged_chart"]) == 1 and shown["judged_chart"][0]["bottom"] <= HEIGHT

    # Its effects: every comparison of the judged headline, first in the table, within the first 900 px.
    headline = [e for e in detail["effects"] if e["metric"] == HEADLINE and not e["standin"]]
    assert len(headline) >= 4 and len(shown["judged_effects"]) == len(headline)
    assert all(row["bottom"] <= HEIGHT for row in shown["judged_effects"])
    first_rows = page.locator("#effects tbody tr").evaluate_all("rows => rows.map(r => r.dataset.metric)")
    assert first_rows[: len(headline)] == [HEADLINE] * len(headline)

    # No horizontal scroll at 1400 px (the arms table's notes column overflowed it).
    assert shown["scroll_width"] <= WIDTH

    # Warnings grouped: one line per distinct message (the stand-in LPIPS line stands for its fallback).
    fallbacks = {f for arm in detail["runs"] for f in arm["fallbacks"] if f != LPIPS_STANDIN_FALLBACK}
    assert len(fallbacks) == 2  # bf16 on CPU (every arm), REPA's stand-in teacher (D)
    assert len(shown["warning_lines"]) == len(fallbacks) + 1
    lines = page.locator("#banners details.notice")
    arms_of = dict(zip(lines.evaluate_all("ls => ls.map(l => l.querySelector('summary').textContent)"),
                       lines.evaluate_all("ls => ls.map(l => l.dataset.arms)"), strict=True))  # fmt: skip
    assert sorted(arms_of.values()) == ["A,B,C,D,A-lr500x", "A,B,C,D,A-lr500x", "D"]
    standin = next(s for s in arms_of if s.startswith("Stand-in LPIPS (A, B, C, D, A-lr500x)"))
    assert "no LPIPS weights" in standin and "ABLATE_LPIPS_WEIGHTS=alexnet.pth" in standin
    # ... each one's details one click away.
    repa = page.locator("#banners details.notice[data-arms='D']")
    assert not repa.locator("li").is_visible()
    repa.locator("summary").click()
    assert repa.locator("li[data-arm='D']").is_visible() and "repa teacher" in repa.locator("li").inner_text()

    # Stand-in charts and effect rows: none displayed, folded under one line each that says why and how.
    assert shown["lpips_charts"] == [] and shown["standin_effects"] == []
    standin_rows = sum(e["standin"] for e in detail["effects"])
    assert standin_rows == 15
    for fold in ("#standin-charts", "#effects-standin"):
        summary = page.inner_text(f"{fold} > summary")
        assert "no real weights" in summary and "ABLATE_LPIPS_WEIGHTS=alexnet.pth" in summary, summary
    assert page.inner_text("#effects-standin > summary").startswith(f"{standin_rows} stand-in LPIPS row(s) folded")
    # Opened, they come after the judged chart, drawn at full width.
    page.click("#standin-charts > summary")
    page.click("#effects-standin > summary")
    page.wait_for_selector("figure.chart[data-key='recon_lpips'][data-axis='step'][data-drawn]")
    opened = first_screen(page, HEADLINE)
    # by step and paired (the demo's runs trained on the CPU: no charts against GPU-hours, and a line says why)
    assert len(opened["lpips_charts"]) == 6 and len(opened["standin_effects"]) == standin_rows
    assert "the runs recorded 0 GPU-hours (they trained on the CPU" in page.inner_text("#no-gpu-hours")
    # ... and the runs table's GPU-h column says CPU, not a "0.0" that reads as free (issue 64 item 7)
    gpu_h = page.locator("#arms tbody tr td:nth-child(7)").all_inner_texts()
    assert gpu_h and set(gpu_h) == {"CPU"}, gpu_h
    assert min(c["top"] for c in opened["lpips_charts"]) > opened["judged_chart"][0]["bottom"]
    assert min(c["right"] - c["left"] for c in opened["lpips_charts"]) > 400
    assert opened["scroll_width"] <= WIDTH
    assert errors == []
    page.close()
