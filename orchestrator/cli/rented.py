"""`ablate offers PROVIDER ...` and `ablate instances [destroy ID]`: what could be rented, what is rented.

`offers` asks a provider's API with the key from this machine's settings (ABLATE_VAST_API_KEY[_FILE],
ABLATE_RUNPOD_API_KEY[_FILE]); it reads no controller state. `instances` asks the controller's REST API
(GET /api/instances, DELETE /api/instances/{provider}/{id}; ABLATE_URL or --url, the token): what the
controller rented, on every provider it has a key for, under its own id.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli import CLIError, app, service_errors
from orchestrator.cli.remote import JsonOption, UrlOption, controller, print_json
from orchestrator.fleet.providers.request import PROVIDERS, RENTING

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
def instances(ctx: typer.Context, url: UrlOption = None, as_json: JsonOption = False) -> None:
    """List what the controller rented now, on every provider it has a key for, with its cost so far."""
    if ctx.invoked_subcommand is not None:
        return
    with controller(url, token_needed=True, timeout=None) as client:  # each provider is asked in turn
        found = client.instances()
    if not found.providers:
        raise CLIError("the controller has no provider API key configured: set ABLATE_VAST_API_KEY_FILE or "
                       "ABLATE_RUNPOD_API_KEY_FILE where it runs")
    if as_json:
        print_json(found)
        return
    table = Table(title=f"instances rented by controller {found.controller_id!r}")
    for col in ("provider", "id", "sweep", "state", "gpus", "$/h", "cost so far", "ssh"):
        table.add_column(col)
    for i in found.instances:
        table.add_row(
            i.provider,
            i.instance_id,
            "-" if i.sweep_id is None else str(i.sweep_id),
            f"{i.state} ({i.status})",
            str(i.gpus),
            f"{i.price_per_hour:.3f}",
            "-" if i.cost_so_far is None else f"{i.cost_so_far:.3f}",
            i.ssh or "-",
        )
    Console().print(table)
    total = sum(i.cost_so_far or 0.0 for i in found.instances)
    typer.echo(f"{table.row_count} instance(s), {total:.2f} billed so far")


@instances_app.command("destroy")
def destroy(
    instance_id: Annotated[str, typer.Argument(help="The provider's instance id (`ablate instances`)")],
    provider: Annotated[str, typer.Option(help="vast or runpod")],
    force: Annotated[
        bool, typer.Option("--force", help="Destroy it even if it is not labelled by this controller")
    ] = False,
    url: UrlOption = None,
) -> None:
    """Destroy one instance the controller rented and wait until the provider confirms it is gone. An
    instance labelled by another controller, or not by ablate, is refused unless --force: the account may
    be shared, and an id mistyped by one digit is someone else's machine."""
    if provider not in RENTING:
        raise CLIError(f"--provider must be one of {', '.join(RENTING)}")
    with controller(url, token_needed=True, timeout=None) as client:  # until the provider confirms
        done = client.destroy_instance(provider, instance_id, force)
    if done.outcome == "already_gone":
        typer.echo(f"{provider} instance {instance_id} is already gone")
    else:
        typer.echo(f"{provider} instance {instance_id} destroyed")


@contextmanager
def _provider_errors() -> Iterator[None]:
    """ProviderError (missing key, SDK failure) as one CLI line."""
    from orchestrator.fleet.providers.base import ProviderError

    try:
        yield
    except ProviderError as exc:
        raise CLIError(str(exc)) from None
