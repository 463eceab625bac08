"""The fleet: the machines arms run on.

Here: the node inventory in the database (`inventory`), the SSH shell with its host-key policy and
command records (`shell`), host keys pinned at a rented machine's first contact (`pinning`), a safe fetch
of a node's files (`safe_fetch`), what a node has (`probe`), how it is installed and its own Ray started
and stopped (`bootstrap`), a command arm's code copied onto it (`code_upload`), the controller's end of
each node's agent (`agent_link`) and the pool of nodes the launcher trains on (`node_pool`), the dead-man's
switch armed on a rented node (`deadman`) and the copy of it that runs there (`deadman_node`), the fleet's
errors (`errors`), and the providers that rent and destroy machines (`providers/`).

May import: `orchestrator.db` and the shared top-level modules. Never `grids`, `runs`, `results`,
`trackers`, `sweeps` or a surface (`api`, `cli`, `dashboard`).
"""
