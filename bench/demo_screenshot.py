"""The README's demo screenshot (docs/screenshots/demo.png): the dashboard's grid page for an `ablate demo`
grid at 1400x900 in headless Chromium, as the dashboard's browser tests open it, and what its first
screen shows (the measurements tests/orchestrator/dashboard/test_first_screen.py asserts), as JSON.

Run a demo first (offline, so LPIPS is the labelled stand-in, as on a machine without the weights), then
point this at its database; it serves that database with the real app on a free loopback port:

    ABLATE_OFFLINE=1 ABLATE_HOME_DIR=/tmp/demo ablate demo
    python bench/demo_screenshot.py --db /tmp/demo/demo.db --out docs/screenshots/demo.png

--records FILE also writes the grid's records as its workers sent them (the test's fixture,
tests/fixtures/demo_grid_records.json), floats to 6 significant digits, paths under `.ablate/`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kit.net import served  # noqa: E402
from tests.orchestrator.dashboard.browser import first_screen, launch_chromium  # noqa: E402

WIDTH, HEIGHT = 1400, 900
# Worker-side keys a stored record does not need to be read again (paths of files left on the node).
DROPPED = {"samples", "checkpoint", "val_flow_definition", "nonfinite"}


def _rounded(value: Any) -> Any:  # noqa: ANN401 - any JSON value
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def grid_records(database_url: str, grid_id: int, home: str) -> dict[str, list[dict[str, Any]]]:
    """Per arm, its records as the worker sent them: stored columns and extra, non-finite values back as
    "nan", the worker's paths under `.ablate/`."""
    from sqlalchemy import select

    from orchestrator.db.models import METRIC_FIELDS, Grid, Metric
    from orchestrator.db.session import session_scope

    out: dict[str, list[dict[str, Any]]] = {}
    with session_scope(database_url) as s:
        for run in s.get(Grid, grid_id).runs:
            rows = s.scalars(select(Metric).where(Metric.run_id == run.id).order_by(Metric.step)).all()
            records = []
            for m in rows:
                extra = dict(m.extra or {})
                record = {"step": m.step, **{k: getattr(m, k) for k in METRIC_FIELDS if getattr(m, k) is not None}}
                record.update(extra.get("nonfinite") or {})
                record.update({k: v for k, v in extra.items() if k not in DROPPED and v is not None})
                if isinstance(record.get("best_checkpoint"), str):
                    record["best_checkpoint"] = record["best_checkpoint"].replace(home, ".ablate")
                records.append({k: _rounded(v) for k, v in record.items()})
            out[run.arm] = records
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", type=Path, default=Path(".ablate/demo.db"), help="the demo's SQLite database")
    parser.add_argument("--grid", type=int, default=None, help="grid id (default: the newest)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots" / "demo.png")
    parser.add_argument("--records", type=Path, default=None, help="also write the grid's records here")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright
    from sqlalchemy import func, select

    from orchestrator.app import create_app
    from orchestrator.db.models import Grid
    from orchestrator.db.session import session_scope
    from orchestrator.settings import Settings

    url = f"sqlite:///{args.db.resolve()}"
    with session_scope(url) as s:
        grid_id = args.grid or s.scalar(select(func.max(Grid.id)))
    if args.records:
        records = grid_records(url, grid_id, str(args.db.resolve().parent))
        args.records.write_text(json.dumps(records, indent=None, separators=(",", ":")) + "\n")
    app = create_app(Settings(database_url=url, home_dir=args.db.resolve().parent), api_token="x" * 32)
    with served(app) as base, sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = launch_chromium(pw, profile, WIDTH, HEIGHT)
        page = context.new_page()
        page.goto(f"{base}/grids/{grid_id}")
        page.wait_for_selector("main#grid[data-ready='true']", timeout=30_000)
        judge = page.evaluate(f"fetch('/api/dashboard/grids/{grid_id}').then(r => r.json()).then(d => d.judge)")
        measured = first_screen(page, judge)
        page.screenshot(path=str(args.out))  # the viewport: what the first screen shows
        context.close()
    print(json.dumps({"grid": grid_id, "judge": judge, "screenshot": str(args.out), **measured}, indent=1))


if __name__ == "__main__":
    main()
