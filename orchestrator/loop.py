"""The launcher as a controller runs it: with the listeners that follow it (the tracker forwarder, the report
writer), wired here so the live loop (runs/) imports neither. `ablate serve` and `ablate demo` use
`loop_listeners`; `python -m orchestrator.loop` runs the launcher alone in the foreground (tests kill -9 it).
"""

from __future__ import annotations

import logging

from orchestrator.runs.launcher import LoopListener
from orchestrator.settings import Settings


def loop_listeners(settings: Settings) -> list[LoopListener]:
    """What follows the launcher in a controller: the tracker forwarder, the decision pass of deciding grids
    and the report writer (in that order: a look that queues more work comes before the report it delays)."""
    from orchestrator.results.deciding.decider import Decider
    from orchestrator.results.reports.write import ReportWriter
    from orchestrator.trackers.forwarder import Forwarder

    return [Forwarder(settings), Decider(settings), ReportWriter(settings)]


def main() -> None:
    from orchestrator.db.session import upgrade
    from orchestrator.runs.launcher import Launcher
    from orchestrator.settings import load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = load_settings()
    upgrade(settings.database_url)
    launcher = Launcher(settings, listeners=loop_listeners(settings))
    try:
        launcher.run_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
