"""`ablate plan` as a user runs it: the issue's measured quad night as a what-if, and bad options as one
clear line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.orchestrator.test_cli import ablate

MEASURED = ["--hours", "A=6.66,B=3.18,C=3.18,D=3.18", "--scaling", "2=2.04,4=3.98"]


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    path = tmp_path / "quad.yaml"
    path.write_text("name: quad\narms: [A, B, C, D]\ngpus_per_arm: auto\n")
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # No database at all: the plan still comes, from the given hours, and asks nothing of a controller.
    return {"ABLATE_DATABASE_URL": f"sqlite:///{tmp_path}/none/x.db", "ABLATE_HOME_DIR": str(tmp_path / "h")}


def test_the_measured_quad_night_plans_within_2_percent_of_its_bound(grid: Path, env: dict[str, str]) -> None:
    proc = ablate("plan", str(grid), "--gpus", "4", *MEASURED, env=env, cwd=grid.parent)
    assert proc.returncode == 0, proc.stderr
    # Every arm's hours given: no complaint about rates or a database (issue 64 item 6).
    assert "no measured rates" not in proc.stderr and "database" not in proc.stderr, proc.stderr
    lines = proc.stdout.strip().splitlines()
    night = float(lines[-1].split()[1])
    assert lines[-1] == f"night {night:.2f} h; lower bound 3.97 h"  # 16.2 GPU-h at the best (2-GPU) scaling
    assert abs(night - 4.05) / 4.05 <= 0.02
    rows = {r.split("│")[1].strip(): [c.strip() for c in r.split("│")[2:]] for r in lines if r.count("│") > 5}
    assert set(rows) == set("ABCD") and {r[6] for r in rows.values()} == {"given"}
    assert sum(int(r[0]) for r in rows.values()) > 4  # some arm takes more than one GPU


def test_three_seeds_plan_within_3_percent_of_12_2_hours(grid: Path, env: dict[str, str]) -> None:
    proc = ablate("plan", str(grid), "--gpus", "4", "--seeds", "3", *MEASURED, env=env, cwd=grid.parent)
    assert proc.returncode == 0, proc.stderr
    night = float(proc.stdout.strip().splitlines()[-1].split()[1])
    assert abs(night - 12.2) / 12.2 <= 0.03


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hours", "A=x"], "error: --hours: 'A=x' is not ARM=NUMBER with a positive number"),
        (["--hours", "A=-1"], "error: --hours: 'A=-1' is not ARM=NUMBER with a positive number"),
        (["--hours", "Z=1"], "error: --hours: Z is not an arm of quad.yaml (its arms: A, B, C, D)"),
        (["--scaling", "1=1"], "error: --scaling: '1' is not a GPU count of 2 or more"),
        (["--scaling", "2"], "error: --scaling: '2' is not GPUS=NUMBER with a positive number"),
    ],
)
def test_bad_what_ifs_are_one_line_naming_the_option(
    grid: Path, env: dict[str, str], args: list[str], message: str
) -> None:
    proc = ablate("plan", grid.name, "--gpus", "4", *args, env=env, cwd=grid.parent)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr
