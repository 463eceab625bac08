"""Grids: a grid body turned into runs' specs, before anything trains.

Here: the arm files and their lineage (`arms`), a command arm resolved from its grid entry (`command_arms`),
the GPUs each arm gets (`gpu_share`), training-seed replicates and what they cost (`replicates`), the
trackers a grid may name (`tracker_choice`), the submit answer's warning on a decided metric its nodes would
measure with a stand-in (`standin_decisions`), and the grid service that validates a body and stores one
queued run per arm and seed, and stops runs (`service`).

May import: `orchestrator.db`, the shared top-level modules and the torch-free `model.spec` and
`model.extractors.registry` / `pinned_files` (where extractor weights lie). Never the live
loop (`runs`), the read side (`results`), `trackers`, `fleet`, `sweeps` or a surface (api, cli, dashboard).
"""
