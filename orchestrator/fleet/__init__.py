"""The fleet: the machines arms run on.

Here: the node inventory in the database (`inventory`), the SSH shell with its host-key policy and
command records (`shell`), safe copy-back of a node's files (`copy_back`), what a node has (`probe`),
how it joins and leaves the Ray cluster (`bootstrap`), the Ray head and node sessions (`ray_cluster`),
and the providers that rent and destroy machines (`providers/`).

May import: `orchestrator.db` and the shared top-level modules. Never `runs`, `sweeps`, `api`, `cli`
or `dashboard`.
"""
