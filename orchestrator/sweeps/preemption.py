"""Preempted or lost rented nodes: found every tick, destroyed, and replaced while the budget allows.

An interruptible instance (a Vast bid) can be taken back by the provider at any moment: Vast then
reports it `stopped` while it was meant to run. Any instance's host can also drop off (Vast `offline`)
and come back. Every tick of a running sweep describes each of its rented instances and judges the
reading (orchestrator/fleet/providers/liveness.py): taken back or gone at once, otherwise only after
enough readings other than running over enough time, stricter for interruptible nodes than for
on-demand ones; the first such reading is an event (`rented.down`), a recovery too (`rented.up`). A
node judged preempted or lost is marked `preempted` (event `rented.preempted`), destroyed until the
provider confirms it (a stopped Vast instance still bills for its disk), and its node row and its place
in the sweep's nodes are dropped. Its runs need nothing from here: their Ray worker died with the
machine, so the launcher's lost-worker path re-queues them and they resume from checkpoint storage
on whatever node has room.

A replacement is rented through the same path as at fire (`rent_nodes`: offers, pin, bootstrap, join)
when the budget allows: the sweep has no budget, or what is left of it pays the sweep's nodes with the
replacement for at least `REPLACEMENT_MIN_S`. At most `RentalConfig.max_failures` replacements per
sweep, so a provider that preempts everything it rents cannot make the runner rent forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import func, select

from orchestrator.db.events import record_sweep_event
from orchestrator.db.models import Event, Node, RentedInstance, Schedule, Sweep
from orchestrator.db.session import session_scope
from orchestrator.fleet.errors import error_reason
from orchestrator.fleet.providers.base import Provider, ProviderError
from orchestrator.fleet.providers.lifecycle import destroy_confirmed
from orchestrator.fleet.providers.liveness import Verdict, judge
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.sweeps.budget import spend
from orchestrator.sweeps.rented import Rentals, rent_nodes
from orchestrator.vocabulary import RentedState

log = logging.getLogger(__name__)

# A replacement is worth renting only if the budget left pays for this long on the sweep's nodes.
REPLACEMENT_MIN_S = 600.0


def _event(sweep_id: int, kind: str, message: str, database_url: str, **data: object) -> None:
    """The sweep's event, in a session of its own (this module calls providers between database writes)."""
    with session_scope(database_url) as session:
        record_sweep_event(session, session.get_one(Sweep, sweep_id), kind, message, **data)


def watch_preemption(rentals: Rentals, sweep_id: int, bootstrap: Callable[[str], object]) -> list[str]:
    """Describe each running instance of the sweep; handle each one preempted (see the module's doc).
    The node names that were lost. Never raises: a provider that cannot be asked is asked next tick."""
    with session_scope(rentals.database_url) as session:
        rows = [
            (r.id, r.provider, r.instance_id, r.state)
            for r in session.scalars(
                select(RentedInstance).where(
                    RentedInstance.sweep_id == sweep_id,
                    (RentedInstance.state == RentedState.running)
                    | ((RentedInstance.state == RentedState.preempted) & RentedInstance.destroy_confirmed_at.is_(None)),
                )
            )
        ]
        raw = session.get_one(Schedule, session.get_one(Sweep, sweep_id).schedule_id).request
    interruptible = bool(raw and NodeRequest.model_validate(raw).interruptible)
    lost: list[str] = []
    for row_id, name, instance_id, state in rows:
        provider = rentals.providers.get(name)
        if provider is None or rentals.config is None:
            continue
        if state == RentedState.preempted:  # the controller died before the destroy (so before any replacement)
            _destroy(rentals, sweep_id, provider, row_id, "preempted earlier")
            _replace(rentals, sweep_id, provider, bootstrap)
            continue
        try:
            instance = provider.describe(instance_id)
        except ProviderError as exc:
            log.warning("sweep %s: cannot describe %s instance %s: %s", sweep_id, name, instance_id, exc)
            continue
        before = rentals.downtime.pop(row_id, None)
        judged = judge(instance, interruptible, before, rentals.clock())
        if judged.verdict in (Verdict.up, Verdict.down):
            if judged.downtime is not None:
                rentals.downtime[row_id] = judged.downtime
            if (judged.verdict is Verdict.down) != (before is not None):  # went down, or came back
                kind = "rented.down" if before is None else "rented.up"
                what = f"{name} instance {instance_id}: {judged.reason}"
                _event(sweep_id, kind, what, rentals.database_url, instance_id=instance_id, status=instance.status)
            continue
        node = _preempted(rentals, sweep_id, provider, row_id, f"{judged.verdict}: {judged.reason}")
        if node is not None:
            lost.append(node)
        _replace(rentals, sweep_id, provider, bootstrap)
    return lost


def _preempted(rentals: Rentals, sweep_id: int, provider: Provider, row_id: int, why: str) -> str | None:
    """Record the preemption, destroy until confirmed, drop the node; its node name."""
    assert rentals.config is not None
    db = rentals.database_url
    with session_scope(db) as session:
        row = session.get_one(RentedInstance, row_id)
        row.state, iid, node_name = RentedState.preempted, row.instance_id, row.node_name
        sweep = session.get_one(Sweep, sweep_id)
        if node_name is not None:
            sweep.nodes = [n for n in sweep.nodes if n != node_name]  # the sweep's teardown skips it
            node = session.scalar(select(Node).where(Node.name == node_name))
            if node is not None:
                session.delete(node)  # the machine is gone; its events keep the history
        row.node_name = None
    _event(
        sweep_id,
        "rented.preempted",
        f"{provider.name} instance {iid} (node {node_name}) {why}; "
        "its runs re-queue and resume from checkpoint storage; destroying it (a stopped instance may bill disk)",
        db,
        instance_id=iid,
        node=node_name,
    )
    _destroy(rentals, sweep_id, provider, row_id, why)
    return node_name


def _destroy(rentals: Rentals, sweep_id: int, provider: Provider, row_id: int, why: str) -> None:
    """Destroy a preempted instance until confirmed (`destroy_failed` when not: red, the reaper retries)."""
    assert rentals.config is not None
    db = rentals.database_url
    with session_scope(db) as session:
        iid = session.get_one(RentedInstance, row_id).instance_id
    confirmed = destroy_confirmed(provider, iid, rentals.config.timing)
    with session_scope(db) as session:
        row = session.get_one(RentedInstance, row_id)
        if confirmed:
            row.destroy_confirmed_at = rentals.clock()
        else:
            row.state = RentedState.destroy_failed  # red; the reaper retries by its label
            row.last_error = f"preempted ({why}); destroy NOT confirmed -- IT MAY STILL BE BILLING"
        sweep = session.get_one(Sweep, sweep_id)
        sweep.price_per_hour = sum(
            r.price_per_hour for r in sweep.instances if r.state in (RentedState.running, RentedState.renting)
        )
    verdict = "destroyed" if confirmed else "destroy NOT confirmed -- IT MAY STILL BE BILLING"
    kind = "rented.destroyed" if confirmed else "rented.destroy_failed"
    _event(sweep_id, kind, f"{provider.name} instance {iid} (preempted) {verdict}", db, instance_id=iid)


def replacement_allowed(rentals: Rentals, sweep_id: int, price_per_hour: float) -> str | None:
    """Why no replacement may be rented (None: it may). `price_per_hour`: what the replacement would bill."""
    assert rentals.config is not None
    now = rentals.clock()
    with session_scope(rentals.database_url) as session:
        sweep = session.get_one(Sweep, sweep_id)
        replaced = session.scalar(
            select(func.count())
            .select_from(Event)
            .where(Event.kind == "rented.replacement", Event.grid_id == sweep.grid_id)
        )
        if replaced >= rentals.config.max_failures:
            return f"{replaced} replacements already rented for this sweep (limit {rentals.config.max_failures})"
        if sweep.budget is None:
            return None
        left = sweep.budget - spend(sweep, now)
        burn = sweep.price_per_hour + price_per_hour
        if left <= burn * REPLACEMENT_MIN_S / 3600:
            return (
                f"budget left {max(left, 0):.2f} of {sweep.budget:g} does not pay {REPLACEMENT_MIN_S:g} s "
                f"of the sweep's nodes with a replacement ({burn:.3f}/h)"
            )
    return None


def _replace(rentals: Rentals, sweep_id: int, provider: Provider, bootstrap: Callable[[str], object]) -> None:
    """Rent one node in place of a preempted one when the budget allows; events say what happened."""
    assert rentals.config is not None
    db = rentals.database_url
    with session_scope(db) as session:
        sweep = session.get_one(Sweep, sweep_id)
        raw = session.get_one(Schedule, sweep.schedule_id).request
    if raw is None:
        return
    request = NodeRequest.model_validate({**raw, "nodes": 1})
    # The node price the sweep was paying: what the replacement would cost at most.
    price = request.max_price_per_gpu_hour * request.gpus_per_node if request.max_price_per_gpu_hour else 0.0
    why_not = replacement_allowed(rentals, sweep_id, price)
    if why_not is not None:
        _event(sweep_id, "rented.no_replacement", f"no replacement rented: {why_not}", db)
        return
    try:
        names = rent_nodes(db, sweep_id, request, provider, rentals.config, bootstrap, rentals.clock)
    except Exception as exc:  # noqa: BLE001 - the sweep goes on with the nodes it has
        _event(sweep_id, "rented.no_replacement", f"no replacement rented: {error_reason(exc)}"[:2000], db)
        return
    _event(sweep_id, "rented.replacement", f"node {names[0]} rented in place of a preempted one", db, node=names[0])
