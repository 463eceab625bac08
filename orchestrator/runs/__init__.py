"""Runs: the live loop, from a queued run to its stored checkpoints and the detector's decision.

Here: the launcher that places, polls, stops and retries runs (`launcher`), placing a run on a node
(`placement`), a command arm's code shipped to its node (`command_code`), metric ingest and the ranges a
node's numbers must keep (`ingest`, `metric_ranges`), the collapse detector and the series it reads
(`detector`, `series_track`), and the controller's side of checkpoint storage (`storage`).

May import: `orchestrator.db`, the shared top-level modules, `grids` for a run's spec, `fleet` for the
nodes it trains on, the torch-free `model.spec` and `worker.run_files` at import, and the rest of
`model`/`worker` only inside functions (no torch at import). Never `results`, `trackers` (the server hands
the launcher a forwarder), `sweeps` or a surface.
"""
