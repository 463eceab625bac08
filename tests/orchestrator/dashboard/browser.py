"""What the dashboard's browser tests share: Chromium on PATH and how it is started, the published curves,
the screenshots the README shows, what a grid page's first screen shows, and sample images drawn in the
shape evaluate() keeps them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
FIXTURE = Path(__file__).parents[2] / "fixtures" / "published_ablation_a_to_d.json"
SCREENSHOTS = Path(__file__).parents[3] / "docs" / "screenshots"

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium on PATH (apt-get install chromium)")


def launch_chromium(pw, profile: str, width: int = 1440, height: int = 900):  # type: ignore[no-untyped-def]
    """A headless Chromium context (Playwright's `pw`) with its own profile, at width x height CSS pixels."""
    return pw.chromium.launch_persistent_context(
        profile,
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
        viewport={"width": width, "height": height},
        device_scale_factor=1,
    )


# Where the grid page's answers are, in CSS pixels from the top of the viewport (scrolled to the top):
# each stop line, the judged metric's chart by step, the judged metric's effect rows, the warning lines
# (one <summary> each), and whatever LPIPS chart or stand-in effect row is displayed.
FIRST_SCREEN_JS = """(judge) => {
    window.scrollTo(0, 0);
    const shown = (e) => e.checkVisibility();  // false inside a closed <details> too
    const box = (e) => {
        const r = e.getBoundingClientRect();
        const [top, bottom, left, right] = [r.top, r.bottom, r.left, r.right].map(Math.round);
        return {top, bottom, left, right};
    };
    const all = (sel) => [...document.querySelectorAll(sel)].filter(shown).map(box);
    return {
        scroll_width: document.scrollingElement.scrollWidth,
        stops: all("#banners .banner.stop"),
        judged_chart: all(`figure.chart[data-key='${judge}'][data-axis='step']`),
        judged_effects: all(`#effects tbody tr[data-metric='${judge}']`),
        warning_lines: all("#banners details.notice > summary"),
        lpips_charts: all("figure.chart[data-key$='lpips'], figure.chart[data-key$='text_manip_delta']"),
        standin_effects: all("table.effects tbody tr td.stand-in"),
    };
}"""


def first_screen(page, judge: str) -> dict:  # type: ignore[no-untyped-def]
    """What the grid page shows where (FIRST_SCREEN_JS) and the document's scroll width."""
    return page.evaluate(FIRST_SCREEN_JS, judge)


def drawn_samples(arm_index: int, step: int) -> dict:
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


def gallery_images(page) -> list[dict]:  # type: ignore[no-untyped-def]
    """Every image of the gallery, once all have loaded or failed: arm, src, naturalWidth."""
    page.wait_for_function("[...document.querySelectorAll('#gallery-arms img')].every(i => i.complete)")
    return page.eval_on_selector_all(
        "#gallery-arms img",
        "imgs => imgs.map(i => ({arm: i.closest('.gallery-arm').dataset.arm, kind: i.dataset.kind,"
        " src: new URL(i.src).pathname, width: i.naturalWidth}))",
    )
