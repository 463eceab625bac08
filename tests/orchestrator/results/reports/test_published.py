"""The published study through the real commands: `ablate import` of its curves, then `ablate report`
reproduces its numbers (B best 0.907 at step 3000, 1.016 final, stopped at 4000; C 0.946 final; D 0.927)
and labels every comparison independent without an interval (the fixture has no per-sample values or SEs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parents[3] / "fixtures" / "published_ablation_a_to_d.json"


@pytest.fixture(scope="module")
def report_dir(database_url: str, ablate_cli, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    imported = ablate_cli(database_url, "import", str(FIXTURE), "--name", "published A-D")
    assert imported.returncode == 0, imported.stderr
    grid_id = imported.stdout.split()[1]
    out = tmp_path_factory.mktemp("report")
    made = ablate_cli(database_url, "report", grid_id, "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert made.stdout.split() == [str(out / f"report.{ext}") for ext in ("json", "md", "html")]
    return out


def test_the_report_reproduces_the_published_numbers(report_dir: Path) -> None:
    report = json.loads((report_dir / "report.json").read_text())
    arms = {a["arm"]: a for a in report["arms"]}
    b = arms["B"]
    assert (b["best_step"], round(b["best_value"], 3), round(b["final_value"], 3)) == (3000, 0.907, 1.016)
    assert b["detector"]["stopped"] and b["detector"]["decision"] == "collapse" and b["detector"]["step"] == 4000
    assert b["detector"]["kept_step"] == 3000 and b["detector"]["gpu_hours_saved"] > 0
    assert round(arms["C"]["final_value"], 3) == 0.946
    assert round(arms["D"]["final_value"], 3) == round(arms["D"]["best_value"], 3) == 0.927
    assert not any(arms[a]["detector"]["stopped"] for a in "ACD")
    summary = report["summary"]
    assert [r["arm"] for r in summary["ranking"]] == ["B", "D", "C", "A"]  # by best recon LPIPS
    assert summary["stopped"][0].startswith("B: collapse at step 4000")
    # effects at the final checkpoint, 3 metrics: B (parent A = control) 3, C and D (parent and control) 6 each
    assert summary["comparisons"] == 15 and summary["with_interval"] == 0
    assert report["seeds"] == 1 and all(e["k"] == 1 and e["reading"] == "no interval" for e in report["effects"])
    comparisons = [c for a in report["arms"] for c in a["comparisons"] if c["diff"] is not None]
    assert comparisons and all(c["pairing"] == "independent" and c["low"] is None for c in comparisons)
    assert all(c["verdict"] == "no interval" for c in comparisons)
    c_vs_b = next(c for c in arms["C"]["comparisons"]
                  if (c["other_arm"], c["at"], c["metric"]) == ("B", "final", "recon_lpips"))  # fmt: skip
    assert c_vs_b["step"] == 5000 and round(c_vs_b["diff"], 3) == -0.070


def test_markdown_and_html_lead_with_the_effects_table(report_dir: Path) -> None:
    """One row per arm, metric and comparator, no sentence per comparison; then the stops. The study ran one
    seed per arm, and the report says so plainly."""
    md = (report_dir / "report.md").read_text()
    assert md.index("## Effects") < md.index("## Summary") < md.index("## B")
    one_seed = "| 1 | 25 | - | evaluation images and noise only (one training seed) |"
    assert f"| C | recon LPIPS | parent | 5000 | B: -0.0698 | no interval {one_seed}" in md
    assert f"| C | recon LPIPS | control | 5000 | A: +0.0111 | no interval {one_seed}" in md
    assert "One training seed per arm: each interval covers evaluation noise only" in md
    assert "no interval: no" not in md and "(independent;" not in md  # the per-comparison prose is gone
    assert md.count("| recon LPIPS |") == 5 and md.count("| text LPIPS |") == 5  # B (parent = control), C, D
    assert "Detector: **collapse at step 4000**" in md and "kept step 3000" in md
    html = (report_dir / "report.html").read_text()
    assert html.index("<table class=effects>") < html.index("<h2>Summary</h2>") < html.index("<h2>B")
    assert "<svg" in html and "<polyline" in html  # the curves, inline
    # a forest plot per metric measured and comparator, titled by what its rows are
    assert 'class=forest data-metric="recon_lpips" data-against="parent"' in html
    assert 'class=forest data-metric="recon_lpips" data-against="control"' in html
    assert "recon LPIPS: arm − its parent at the final checkpoint" in html
    # Self-contained: nothing to fetch (the only URL is the SVG namespace, which is a name, not a request).
    assert "<script" not in html and "<link" not in html
    assert re.findall(r"""(?:src|href)=["']?https?:""", html) == []
