"""A sweep's rented nodes: rent them at fire, give them back at the end, and reap what no sweep owns.

`rent_nodes` takes a schedule's NodeRequest through the provider: the cheapest fitting offers
(`choose_offers`), each rented (create, record, wait until SSH answers), its host key pinned at first
contact (orchestrator/fleet/pinning.py), registered as a node row with the controller's key and
bootstrapped as a registered node would be. An offer that fails on the way (refused, never reachable,
bootstrap failed) is destroyed, recorded `failed`, and the next offer is tried, up to `max_failures`.

`release` destroys every instance of a sweep and waits for the provider to confirm it gone; one that is
not confirmed is marked `destroy_failed` (red on the dashboard) and the reaper keeps trying by its
label. `reap` is the reaper: at start-up and every tick, labelled instances of this controller that no
live sweep owns are destroyed. Every instance carries the label `ablate.<controller>.s<sweep>`.

The sweep's spend is what the instances bill: price per hour x (create -> destroy confirmed), on the
runner's clock (orchestrator/sweeps/budget.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.events import record_sweep_event
from orchestrator.db.models import Node, RentedInstance, Schedule, Sweep
from orchestrator.db.session import session_scope
from orchestrator.fleet.deadman import DeadmanConfig, arm_node
from orchestrator.fleet.errors import error_reason
from orchestrator.fleet.inventory import NodeCreate, add_node
from orchestrator.fleet.pinning import pin_first_contact
from orchestrator.fleet.providers.base import (
    Instance,
    InstanceLabel,
    InstanceState,
    LaunchSpec,
    Offer,
    Provider,
    ProviderError,
)
from orchestrator.fleet.providers.identity import controller_id, controller_public_key
from orchestrator.fleet.providers.lifecycle import Timing, create_or_find, destroy_confirmed, wait_reachable
from orchestrator.fleet.providers.liveness import Downtime
from orchestrator.fleet.providers.offers import choose_offers
from orchestrator.fleet.providers.reaper import to_reap
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.sweeps.budget import budget_end
from orchestrator.sweeps.schedules import aware
from orchestrator.vocabulary import BILLING_RENTED_STATES, RentedState

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class RentingFailed(ProviderError):
    """The sweep could not get the nodes it asked for; the message lists each failed rental."""


@dataclass(frozen=True)
class RentalConfig:
    """How this controller rents. `ssh_key`: its private key (made on first use when absent); the public
    half is the only key let into an instance. `known_hosts_dir`: one known-hosts file per instance."""

    controller_id: str
    ssh_key: Path
    known_hosts_dir: Path
    # A CUDA image with Python of the controller's minor version (bootstrap checks it) and sshd.
    image: str = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    timing: Timing = field(default_factory=Timing)
    # Failed rentals (refused, unreachable, bootstrap failed) a sweep tolerates before it gives up.
    max_failures: int = 3
    # Who logs in: the instance's user (root on Vast and RunPod). The test bed's nodes log in as their
    # own users, which the simulator cannot say through the providers' APIs.
    login_user: Callable[[Instance], str] | None = None
    deadman: DeadmanConfig = field(default_factory=DeadmanConfig)  # each node ends itself after the budget


@dataclass
class _Renting:
    """The bookkeeping of one sweep's rentals: what it got, what failed and why."""

    names: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def rent_nodes(
    database_url: str,
    sweep_id: int,
    request: NodeRequest,
    provider: Provider,
    config: RentalConfig,
    bootstrap: Callable[[str], object],
    clock: Clock,
) -> list[str]:
    """Rent, pin, register and bootstrap `request.nodes` nodes for the sweep; their node names (also
    appended to `Sweep.nodes` one by one, so a failure half-way tears down exactly those). RentingFailed
    after `max_failures` failed rentals; NoFittingOffer when too few offers fit."""
    if provider.name == "static":
        raise RentingFailed("static: registered nodes are not rented; name them in the schedule's nodes instead")
    public_key = controller_public_key(config.ssh_key)
    label = InstanceLabel(config.controller_id, sweep_id)
    spec = LaunchSpec(
        image=config.image,
        disk_gb=request.disk_gb,
        ssh_public_key=public_key,
        label=label,
        env={"ABLATE_SWEEP_ID": str(sweep_id)},
    )
    offers = choose_offers(provider.search(request), request)
    deadline = _deadline(database_url, sweep_id, offers[: request.nodes], config.deadman)
    state = _Renting()
    while len(state.names) < request.nodes:
        if len(state.failures) >= config.max_failures or not offers:
            why = "; ".join(state.failures) or "no offers left"
            raise RentingFailed(
                f"{provider.name}: rented {len(state.names)} of {request.nodes} nodes; "
                f"{len(state.failures)} rentals failed: {why}"
            )
        offer = offers.pop(0)
        bid = offer.price_per_hour if offer.interruptible else None
        try:
            spec_ = _with_bid(spec, bid)
            name = _rent_one(database_url, sweep_id, provider, offer, spec_, config, bootstrap, clock, deadline)
        except Exception as exc:  # noqa: BLE001 - any failure of one rental: record it, try the next offer
            state.failures.append(f"offer {offer.offer_id}: {error_reason(exc)}"[:600])
            continue
        state.names.append(name)
        with session_scope(database_url) as session:
            sweep = session.get_one(Sweep, sweep_id)
            sweep.nodes = [*sweep.nodes, name]
            sweep.price_per_hour = sum(i.price_per_hour for i in _billing(session, sweep_id))
    return state.names


def _with_bid(spec: LaunchSpec, bid: float | None) -> LaunchSpec:
    return replace(spec, bid_per_hour=bid)


def _deadline(database_url: str, sweep_id: int, offers: list[Offer], deadman: DeadmanConfig) -> datetime:
    """When the sweep's nodes end themselves: its budget's end at the chosen offers' price (or
    `without_budget_s` after the fire), plus the grace."""
    with session_scope(database_url) as session:
        sweep = session.get_one(Sweep, sweep_id)
        end = budget_end(sweep, sum(o.price_per_hour for o in offers))
        end = end or aware(sweep.fired_at) + timedelta(seconds=deadman.without_budget_s)
    return end + timedelta(seconds=deadman.grace_s)


def _rent_one(
    database_url: str,
    sweep_id: int,
    provider: Provider,
    offer: Offer,
    spec: LaunchSpec,
    config: RentalConfig,
    bootstrap: Callable[[str], object],
    clock: Clock,
    deadline: datetime,
) -> str:
    """One offer to a bootstrapped node with its dead-man's switch armed, or an exception after the
    instance (if any) was destroyed."""
    created_at = clock()
    with session_scope(database_url) as session:
        recorded = {r.instance_id for r in session.get_one(Sweep, sweep_id).instances if r.provider == provider.name}
    # ProviderError: nothing was made (none labelled for the sweep either), so nothing to destroy.
    made, failed = create_or_find(provider, offer, spec, recorded, config.timing)
    try:  # a row for each, so the spend counts them from before the create
        row_id, *extra = [_record(database_url, sweep_id, provider, offer, spec, i, created_at) for i in made]
    except Exception:
        for unrecorded in made:  # the reaper's otherwise
            destroy_confirmed(provider, unrecorded.instance_id, config.timing)
        raise
    instance = made[0]
    if failed is not None:
        with session_scope(database_url) as session:
            what = f"{provider.name}: create from offer {offer.offer_id} failed ({failed}), but made instance"
            found = f"{what} {instance.instance_id} (found by its label {spec.label.encode()}): adopted"
            sweep = session.get_one(Sweep, sweep_id)
            record_sweep_event(session, sweep, "rented.adopted", found, instance_id=instance.instance_id)
    for row in extra:
        _give_back(database_url, sweep_id, provider, row, config.timing, clock, failed="made twice by one create")
    name = f"{provider.name}-{instance.instance_id}"
    try:
        ready = wait_reachable(provider, instance.instance_id, config.timing)
        host, port = ready.reachable_endpoint or ("", 0)
        pinned = pin_first_contact(host, port, config.known_hosts_dir / f"{name}.known_hosts")
        with session_scope(database_url) as session:
            add_node(
                session,
                NodeCreate(
                    name=name,
                    host=host,
                    port=port,
                    user=config.login_user(ready) if config.login_user else ready.ssh_user,
                    key_path=str(config.ssh_key),
                    known_hosts_path=str(pinned.path),
                    price_per_hour=ready.price_per_hour,
                    gpus=max(1, offer.gpus),  # what the controller rented, never the node's own word
                ),
            )
            row = session.get_one(RentedInstance, row_id)
            row.node_name, row.host_key, row.price_per_hour = name, pinned.fingerprint, ready.price_per_hour
            record_sweep_event(
                session,
                session.get_one(Sweep, sweep_id),
                "rented.host_key_pinned",
                f"{provider.name} instance {instance.instance_id} ({host}:{port}): host key {pinned.key_type} "
                f"{pinned.fingerprint} pinned at first contact, trusted for this instance only",
                instance_id=instance.instance_id,
                fingerprint=pinned.fingerprint,
            )
        armed = arm_node(database_url, name, provider, instance.instance_id, deadline, config.deadman)
        with session_scope(database_url) as session:
            when, iid = f"{armed.deadline:%Y-%m-%d %H:%M:%S} UTC", instance.instance_id
            what = f"{provider.name} instance {iid}: dead-man's switch armed: at {when} it {armed.how}"
            sweep, deadline = session.get_one(Sweep, sweep_id), armed.deadline.isoformat()
            record_sweep_event(session, sweep, "rented.deadman", what, instance_id=iid, deadline=deadline)
        bootstrap(name)
    except Exception as exc:
        _give_back(database_url, sweep_id, provider, row_id, config.timing, clock, failed=error_reason(exc))
        raise
    with session_scope(database_url) as session:
        row = session.get_one(RentedInstance, row_id)
        row.state = RentedState.running
        record_sweep_event(
            session,
            session.get_one(Sweep, sweep_id),
            "rented.running",
            f"{provider.name} instance {instance.instance_id} (offer {offer.offer_id}, {row.gpus}x {row.gpu_name}, "
            f"{row.price_per_hour:.3f}/h) is node {name}",
            instance_id=instance.instance_id,
            node=name,
            price_per_hour=row.price_per_hour,
        )
    return name


def _record(
    database_url: str,
    sweep_id: int,
    provider: Provider,
    offer: Offer,
    spec: LaunchSpec,
    instance: Instance,
    created_at: datetime,
) -> int:
    """The new rental's row (state renting); its id."""
    with session_scope(database_url) as session:
        row = RentedInstance(
            sweep_id=sweep_id,
            provider=provider.name,
            instance_id=instance.instance_id,
            offer_id=offer.offer_id,
            gpu_name=offer.gpu_name,
            gpus=offer.gpus,
            price_per_hour=instance.price_per_hour or offer.price_per_hour,
            label=spec.label.encode(),
            state=RentedState.renting,
            created_at=created_at,
        )
        session.add(row)
        session.flush()
        return row.id


def _give_back(
    database_url: str,
    sweep_id: int,
    provider: Provider,
    row_id: int,
    timing: Timing,
    clock: Clock,
    failed: str | None = None,
) -> str | None:
    """Destroy one recorded instance until confirmed; forget its node row and pinned key. Returns the
    problem (destroy not confirmed) or None. `failed`: why the rental is abandoned (state `failed`)."""
    with session_scope(database_url) as session:
        row = session.get_one(RentedInstance, row_id)
        instance_id, node_name = row.instance_id, row.node_name
    confirmed = destroy_confirmed(provider, instance_id, timing)
    with session_scope(database_url) as session:
        sweep, row = session.get_one(Sweep, sweep_id), session.get_one(RentedInstance, row_id)
        row.last_error = failed
        if confirmed:
            row.state = RentedState.failed if failed else RentedState.destroyed
            row.destroy_confirmed_at = clock()
            if node_name is not None:
                node = session.scalar(select(Node).where(Node.name == node_name))
                if node is not None:
                    session.delete(node)  # the machine is gone; its events keep the history
                row.node_name = None
            what = f"failed ({failed}); destroyed" if failed else "destroyed"
            record_sweep_event(session, sweep, "rented.destroyed", f"{provider.name} instance {instance_id} {what}")
            return None
        row.state = RentedState.destroy_failed
        problem = (
            f"{provider.name} instance {instance_id}: destroy NOT confirmed -- IT MAY STILL BE BILLING; "
            "the reaper retries every tick (`ablate instances` shows it)"
        )
        row.last_error = "; ".join(filter(None, [failed, problem]))
        record_sweep_event(session, sweep, "rented.destroy_failed", problem, instance_id=instance_id)
        return problem


def _billing(session: Session, sweep_id: int) -> list[RentedInstance]:
    return list(
        session.scalars(
            select(RentedInstance).where(
                RentedInstance.sweep_id == sweep_id, RentedInstance.state.in_(BILLING_RENTED_STATES)
            )
        )
    )


def release(
    database_url: str,
    sweep_id: int,
    providers: Mapping[str, Provider],
    timing: Timing,
    clock: Clock,
    controller_id: str,
) -> list[str]:
    """Destroy every instance the sweep rented (recorded, or only labelled: a create the controller did
    not live to record); the problems, one per instance whose destroy was not confirmed. Never raises."""
    with session_scope(database_url) as session:
        rows = [(r.id, r.provider, r.instance_id) for r in _billing(session, sweep_id)]
    problems: list[str] = []
    for row_id, name, _ in rows:
        provider = providers.get(name)
        if provider is None:
            problems.append(f"{name}: no API key configured, cannot destroy its instances -- THEY MAY STILL BILL")
            continue
        if (problem := _give_back(database_url, sweep_id, provider, row_id, timing, clock)) is not None:
            problems.append(problem)
    recorded = {(name, iid) for _, name, iid in rows}
    for name, provider in providers.items():
        try:
            owned = provider.list_owned(controller_id)
        except ProviderError as exc:
            problems.append(f"{name}: cannot list instances to release sweep {sweep_id}: {exc}")
            continue
        for instance in owned:
            mine = instance.label is not None and instance.label.sweep_id == sweep_id
            if mine and (name, instance.instance_id) not in recorded and instance.state is not InstanceState.gone:
                if not destroy_confirmed(provider, instance.instance_id, timing):
                    problems.append(f"{name} instance {instance.instance_id}: destroy NOT confirmed")
    return problems


def reap(
    database_url: str, providers: Mapping[str, Provider], controller_id: str, timing: Timing, clock: Clock
) -> list[str]:
    """Destroy this controller's labelled instances that no live sweep owns; what was destroyed or not,
    each also an event (a crash between create and record, a destroy that failed before)."""
    with session_scope(database_url) as session:
        live = set(session.scalars(select(Sweep.id).where(Sweep.under_way)))
    done: list[str] = []
    for name, provider in providers.items():
        try:
            doomed = to_reap(provider.list_owned(controller_id), controller_id, live)
        except ProviderError as exc:
            log.warning("reaper: cannot list %s instances: %s", name, exc)
            continue
        for reap_ in doomed:
            iid, label = reap_.instance.instance_id, reap_.instance.label
            confirmed = destroy_confirmed(provider, iid, timing)
            with session_scope(database_url) as session:
                row = session.scalar(
                    select(RentedInstance).where(RentedInstance.provider == name, RentedInstance.instance_id == iid)
                )
                if row is not None and confirmed:
                    row.state, row.destroy_confirmed_at = RentedState.destroyed, clock()
                    node = session.scalar(select(Node).where(Node.name == row.node_name)) if row.node_name else None
                    if node is not None:
                        session.delete(node)
                verdict = "destroyed" if confirmed else "destroy NOT confirmed -- IT MAY STILL BE BILLING"
                message = f"reaper: {name} instance {iid}: {reap_.reason}; {verdict}"
                sweep = session.get(Sweep, label.sweep_id) if label is not None else None
                record_sweep_event(session, sweep, "rented.reaped", message, instance_id=iid)
            done.append(message)
    return done


@dataclass
class Rentals:
    """The sweep runner's handle on renting: the providers with a key, how to rent, the runner's clock."""

    database_url: str
    providers: dict[str, Provider]
    config: RentalConfig | None
    clock: Clock
    # Rented instance row id -> its readings other than running so far (preemption.py); a restart
    # forgets them, which only keeps a node longer.
    downtime: dict[int, Downtime] = field(default_factory=dict)

    def reap(self) -> list[str]:
        if not self.providers or self.config is None:
            return []
        return reap(self.database_url, self.providers, self.config.controller_id, self.config.timing, self.clock)

    def rent(self, sweep_id: int, request: NodeRequest, bootstrap: Callable[[str], object]) -> list[str]:
        provider = self.providers.get(request.provider)
        if provider is None or self.config is None:
            var = f"ABLATE_{request.provider.upper()}_API_KEY_FILE"
            raise RentingFailed(f"{request.provider}: no API key configured for renting; set {var}")
        # What an interrupted earlier attempt of this sweep rented (a controller killed mid-provisioning).
        self.release(sweep_id)
        return rent_nodes(self.database_url, sweep_id, request, provider, self.config, bootstrap, self.clock)

    def release(self, sweep_id: int) -> list[str]:
        """Destroy what the sweep rented (nothing for a sweep on registered nodes); the problems."""
        with session_scope(self.database_url) as session:
            sweep = session.get_one(Sweep, sweep_id)
            rents = session.get_one(Schedule, sweep.schedule_id).request is not None or bool(sweep.instances)
        if not rents:
            return []
        if self.config is None:
            return ["this runner has no rental settings: the sweep's instances were not destroyed"]
        timing, cid = self.config.timing, self.config.controller_id
        return release(self.database_url, sweep_id, self.providers, timing, self.clock, cid)


def rental_config(settings: Any) -> RentalConfig:  # noqa: ANN401 - orchestrator.settings.Settings
    """How this controller rents, from its settings (orchestrator/settings.py, "rented nodes")."""
    ssh_dir = settings.home_dir / "ssh"
    return RentalConfig(
        controller_id=controller_id(settings),
        ssh_key=settings.rent_ssh_key or ssh_dir / "rent_ed25519",
        known_hosts_dir=ssh_dir / "rented_known_hosts",
        image=settings.rent_image,
        deadman=DeadmanConfig(
            command=settings.rent_deadman_command,
            grace_s=settings.rent_deadman_grace_s,
            without_budget_s=settings.rent_deadman_without_budget_s,
            python=settings.rent_deadman_python,
            enabled=settings.rent_deadman_enabled,
        ),
    )
