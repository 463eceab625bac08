"""`ablate offers PROVIDER ...` and `ablate instances [destroy ID]`: what could be rented, what is rented.

Both talk to the providers' APIs with the keys from settings (ABLATE_VAST_API_KEY[_FILE],
ABLATE_RUNPOD_API_KEY[_FILE]); `instances` lists what this controller (ABLATE_CONTROLLER_ID) rented,
on every provider that has a key configured.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli import CLIError, app, service_errors

instances_app = typer.Typer(
    invoke_without_command=True, help="Instances this controller rented (Vast.ai, RunPod), with their cost so far."
)
app.add_typer(instances_app, name="instances")
RENTING = ("vast", "runpod")


@app.command("offers")
def offers(
    provider: Annotated[str, typer.Argument(help="vast, runpod or static")],
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
    from orchestrator.fleet.providers.request import NodeRequest, choose_offers, misfit
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
    table = Table(title=f"instances rented by controller {settings.controller_id!r}")
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
            owned = provider.list_owned(settings.controller_id)
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
) -> None:
    """Destroy one rented instance and wait until the provider confirms it is gone."""
    from orchestrator.fleet.providers import provider_for
    from orchestrator.fleet.providers.lifecycle import Timing, destroy_confirmed
    from orchestrator.settings import load_settings

    if provider not in RENTING:
        raise CLIError(f"--provider must be one of {', '.join(RENTING)}")
    with _provider_errors():
        confirmed = destroy_confirmed(provider_for(provider, load_settings()), instance_id, Timing(poll_s=2.0))
    if not confirmed:
        raise CLIError(f"{provider} instance {instance_id}: destroy NOT confirmed; check the provider's console")
    typer.echo(f"{provider} instance {instance_id} destroyed")


@contextmanager
def _provider_errors() -> Iterator[None]:
    """ProviderError (missing key, SDK failure) as one CLI line."""
    from orchestrator.fleet.providers.base import ProviderError

    try:
        yield
    except ProviderError as exc:
        raise CLIError(str(exc)) from None
