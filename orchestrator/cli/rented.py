"""`ablate offers PROVIDER ...` and `ablate instances [destroy ID]`: what could be rented, what is rented.

Both talk to the providers' APIs with the keys from settings (ABLATE_VAST_API_KEY[_FILE],
ABLATE_RUNPOD_API_KEY[_FILE]); `instances` lists what this controller (ABLATE_CONTROLLER_ID) rented,
on every provider that has a key configured.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli import CLIError, app, migrated_database_url, service_errors
from orchestrator.fleet.providers.request import PROVIDERS, RENTING

if TYPE_CHECKING:
    from orchestrator.settings import Settings

instances_app = typer.Typer(
    invoke_without_command=True, help="Instances this controller rented (Vast.ai, RunPod), with their cost so far."
)
app.add_typer(instances_app, name="instances")


@app.command("offers")
def offers(
    provider: Annotated[str, typer.Argument(help=" or ".join(PROVIDERS))],
    gpu: Annotated[str, typer.Option(help="GPU model as the provider names it, e.g. RTX_4090")],
    gpus: Annotated[int, typer.Option(help="GPUs per node")] = 4,
    max_price: Annotated[float, typer.Option(help="Most per GPU-hour")] = 1.0,
    nodes: Annotated[int, typer.Option(help="Nodes wanted (the table marks the ones a sweep would rent)")] = 1,
    min_reliability: Annotated[float | None, typer.Option(help="Vast reliability floor, 0..1")] = None,
    cuda: Annotated[str | None, typer.Option(help="Lowest CUDA version, e.g. 12.4")] = None,
    disk: Annotated[int, typer.Option(help="Disk GB")] = 100,
    interruptible: Annotated[bool, typer.Option(help="Interruptible (Vast bid) offers")] = False,
) -> None:
    """Offers that fit, cheapest per GPU-hour first; the first NODES are what a sweep would rent."""
    from orchestrator.fleet.providers import provider_for
    from orchestrator.fleet.providers.base import NoFittingOffer
    from orchestrator.fleet.providers.offers import choose_offers, misfit
    from orchestrator.fleet.providers.request import NodeRequest
    from orchestrator.settings import load_settings

    with service_errors(), _provider_errors():
        request = NodeRequest(
            provider=provider,  # type: ignore[arg-type]
            gpu=gpu,
            gpus_per_node=gpus,
            nodes=nodes,
            max_price_per_gpu_hour=max_price,
            min_reliability=min_reliability,
            cuda=cuda,
            disk_gb=disk,
            interruptible=interruptible,
        )
        found = provider_for(provider, load_settings()).search(request)
        try:
            chosen = choose_offers(found, request)[:nodes]
        except NoFittingOffer as exc:
            chosen = []
            typer.echo(str(exc), err=True)
    table = Table(title=f"{provider} offers for {nodes}x {gpus}x {gpu} at <= {max_price}/GPU-h")
    for col in ("offer", "gpus", "gpu", "$/GPU-h", "$/h node", "reliability", "cuda", "where", "fits"):
        table.add_column(col)
    for offer in sorted(found, key=lambda o: o.price_per_gpu_hour):
        reason = misfit(offer, request)
        fits = f"rent ({chosen.count(offer)})" if offer in chosen else ("yes" if reason is None else reason)
        table.add_row(
            offer.offer_id,
            str(offer.gpus),
            offer.gpu_name,
            f"{offer.price_per_gpu_hour:.3f}",
            f"{offer.price_per_hour:.3f}",
            "-" if offer.reliability is None else f"{offer.reliability:.3f}",
            "-" if offer.cuda is None else f"{offer.cuda:g}",
            offer.where,
            fits,
        )
    Console().print(table)


@instances_app.callback()
def instances(ctx: typer.Context) -> None:
    """List what ablate rented now, on every provider with a key configured, with its cost so far."""
    if ctx.invoked_subcommand is not None:
        return
    from orchestrator.fleet.providers import provider_for
    from orchestrator.fleet.providers.credentials import MissingApiKey
    from orchestrator.settings import load_settings

    settings = load_settings()
    ours = _controller_id(settings)
    table = Table(title=f"instances rented by controller {ours!r}")
    for col in ("provider", "id", "sweep", "state", "gpus", "$/h", "cost so far", "ssh"):
        table.add_column(col)
    now, total, asked = time.time(), 0.0, 0
    for name in RENTING:
        with _provider_errors():
            try:
                provider = provider_for(name, settings)
            except MissingApiKey:
                continue  # not configured: nothing can have been rented there
            asked += 1
            owned = provider.list_owned(ours)
        for i in owned:
            cost = i.cost_so_far(now)
            total += cost or 0.0
            table.add_row(
                name,
                i.instance_id,
                str(i.label.sweep_id) if i.label else "-",
                f"{i.state} ({i.status})",
                str(i.gpus),
                f"{i.price_per_hour:.3f}",
                "-" if cost is None else f"{cost:.3f}",
                f"{i.ssh_user}@{i.ssh_host}:{i.ssh_port}" if i.ssh_host else "-",
            )
    if not asked:
        raise CLIError("no provider API key configured: set ABLATE_VAST_API_KEY_FILE or ABLATE_RUNPOD_API_KEY_FILE")
    Console().print(table)
    typer.echo(f"{table.row_count} instance(s), {total:.2f} billed so far")


@instances_app.command("destroy")
def destroy(
    instance_id: Annotated[str, typer.Argument(help="The provider's instance id (`ablate instances`)")],
    provider: Annotated[str, typer.Option(help="vast or runpod")],
    force: Annotated[
        bool, typer.Option("--force", help="Destroy it even if it is not labelled by this controller")
    ] = False,
) -> None:
    """Destroy one instance this controller rented and wait until the provider confirms it is gone. An
    instance labelled by another controller, or not by ablate, is refused unless --force: the account may
    be shared, and an id mistyped by one digit is someone else's machine."""
    from orchestrator.fleet.providers import provider_for
    from orchestrator.fleet.providers.base import InstanceState
    from orchestrator.fleet.providers.lifecycle import Timing, destroy_confirmed
    from orchestrator.settings import load_settings

    if provider not in RENTING:
        raise CLIError(f"--provider must be one of {', '.join(RENTING)}")
    settings = load_settings()
    with _provider_errors():
        rented = provider_for(provider, settings)
        found = rented.describe(instance_id)
        if found.state is InstanceState.gone:
            typer.echo(f"{provider} instance {instance_id} is already gone")
            return
        ours = _controller_id(settings)
        if not force and (found.label is None or found.label.controller_id != ours):
            whose = "no ablate label" if found.label is None else f"label {found.label.encode()}"
            raise CLIError(
                f"{provider} instance {instance_id} has {whose}: not rented by this controller ({ours}); "
                "not destroyed (--force destroys it anyway)"
            )
        confirmed = destroy_confirmed(rented, instance_id, Timing(poll_s=2.0))
    if not confirmed:
        raise CLIError(f"{provider} instance {instance_id}: destroy NOT confirmed; check the provider's console")
    typer.echo(f"{provider} instance {instance_id} destroyed")


def _controller_id(settings: Settings) -> str:
    """ABLATE_CONTROLLER_ID, or the id this installation's database holds (migrated first, as serve does)."""
    from orchestrator.fleet.providers.identity import controller_id

    if settings.controller_id is None:
        migrated_database_url()
    with service_errors():
        return controller_id(settings)


@contextmanager
def _provider_errors() -> Iterator[None]:
    """ProviderError (missing key, SDK failure) as one CLI line."""
    from orchestrator.fleet.providers.base import ProviderError

    try:
        yield
    except ProviderError as exc:
        raise CLIError(str(exc)) from None
