"""Sweeps: a grid run at night on rented nodes.

Here: schedules and their cron arithmetic (`schedules`), the sweep runner's state machine (`runner`)
and the lock that keeps it single (`lock`), budget arithmetic (`budget`), and copying a sweep's results
back (`copy_back`).

May import: `runs`, `fleet`, `orchestrator.db` and the shared top-level modules. Never `api`, `cli`
or `dashboard`.
"""
