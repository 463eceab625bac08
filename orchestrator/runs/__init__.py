"""Runs: grids of arms and what happens to each run.

Here: the arm specs and their lineage (`arms`), grids and their validation (`grids`), placing runs on nodes
(`placement`) and the scheduler loop that launches, polls and retries them (`scheduler`), metric ingest
(`ingest`), the collapse detector (`detector`), recorded curves and their importer (`curves`, `importer`),
the run records every reader builds from the rows (`records`), the sample images of each evaluation
(`samples`) and each grid's report (`reports/`).

May import: `orchestrator.db`, the shared top-level modules (settings, vocabulary, messages, storage,
errors, numbers), `fleet` for the nodes it trains on (their agents), the torch-free `model.spec` and
`worker.run_files` at import, and the rest of `model`/`worker` only inside functions (no torch at import).
Never `sweeps`, `api`, `cli` or `dashboard`.
"""
