"""A controller that rents, in its own process, for tests that `kill -9` it: the launcher and the sweep
runner of `ablate serve`, without the HTTP API (`python -m tests.cluster.rented_controller`).

Everything comes from the real settings (ABLATE_DATABASE_URL, ABLATE_VAST_API_KEY_FILE, ABLATE_VAST_URL,
ABLATE_CONTROLLER_ID, ABLATE_RENT_SSH_KEY, ABLATE_NODE_* for bootstrap) through `SweepRunner.from_settings`,
as `ablate serve` builds it. Only what the simulator cannot say through the providers' APIs is added:
the test bed's login user of each instance (found by its address, as tests/cluster/testbed.py names
them) and short waits (ABLATE_TEST_POLL_S, ABLATE_TEST_TICK_S).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.db.session import upgrade
from orchestrator.loop import loop_listeners
from orchestrator.runs.launcher import Launcher
from orchestrator.settings import load_settings
from orchestrator.sweeps.runner import SweepRunner
from tests.cluster.rental import BED_TIMING, DEADMAN_MARK, bed_login_user


def controller_env(bed: Any, sim: Any, key: str, controller_id: str, home: Path) -> dict[str, str]:  # noqa: ANN401
    """The settings (environment) of a controller that rents from the simulator `sim` (tests/cluster/
    provider_sim.py) with `key` and bootstraps nodes of `bed` with the bed's Python."""
    key_file = home / "vast_api_key"
    key_file.write_text(key)
    key_file.chmod(0o600)
    return {
        "ABLATE_VAST_API_KEY_FILE": str(key_file),
        "ABLATE_VAST_URL": sim.url,
        "ABLATE_CONTROLLER_ID": controller_id,
        "ABLATE_RENT_SSH_KEY": str(home / "rent_ed25519"),
        "ABLATE_RENT_IMAGE": "ablate/worker:test",
        "ABLATE_NODE_VENV": sys.prefix,
        "ABLATE_NODE_PYTHON": sys.executable,
        "ABLATE_NODE_INSTALL": "[]",
        "ABLATE_NODE_ENV": json.dumps({"PYTHONPATH": str(bed.src)}),  # type: ignore[attr-defined]
        "ABLATE_NODE_COMMAND_TIMEOUT_S": "120",
        "ABLATE_RENT_DEADMAN_COMMAND": f'touch "$HOME/{DEADMAN_MARK}"',  # never `poweroff` on the test bed
        "ABLATE_RENT_DEADMAN_PYTHON": sys.executable,
        "ABLATE_TEST_BED_TAG": bed.tag,
        "ABLATE_TEST_TICK_S": "1.0",
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = load_settings()
    upgrade(settings.database_url)
    launcher = Launcher(settings, listeners=loop_listeners(settings))
    launcher.start()
    runner = SweepRunner.from_settings(settings)
    poll = float(os.environ.get("ABLATE_TEST_POLL_S", "0.2"))
    assert runner.rentals.config is not None
    runner.rentals.config = replace(
        runner.rentals.config,
        timing=replace(BED_TIMING, poll_s=poll),
        login_user=bed_login_user(os.environ["ABLATE_TEST_BED_TAG"]),  # type: ignore[arg-type]
    )
    print(f"controller: pid {os.getpid()} renting from {sorted(runner.rentals.providers)}", flush=True)
    runner.run_forever(interval_s=float(os.environ.get("ABLATE_TEST_TICK_S", "1.0")))


if __name__ == "__main__":
    main()
