"""Sweeps: a grid run at night on rented nodes.

Here: schedules and their cron arithmetic (`schedules`), the sweep runner's state machine (`runner`)
and the lock that keeps it single (`lock`), budget arithmetic (`budget`), renting a sweep's nodes and
giving them back (`rented`), replacing preempted or lost ones (`preemption`), and copying a sweep's results
back (`copy_back`).

May import: every domain (`grids`, `runs`, `results`, `trackers`, `fleet`), `orchestrator.db` and the
shared top-level modules. Never a surface (`api`, `cli`, `dashboard`).
"""
