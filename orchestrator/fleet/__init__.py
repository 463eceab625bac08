"""The fleet: the machines arms run on.

Here: the node inventory in the database (`inventory`), the SSH shell with its host-key policy and
command records (`shell`), a safe fetch of a node's files (`safe_fetch`), what a node has (`probe`),
how it is installed and its own Ray started and stopped (`bootstrap`), the controller's end of each node's
agent (`agent_link`) and the pool of nodes the launcher trains on (`node_pool`),
and the providers that rent and destroy machines (`providers/`).

May import: `orchestrator.db` and the shared top-level modules. Never `runs`, `sweeps`, `api`, `cli`
or `dashboard`.
"""
