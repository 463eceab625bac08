"""`ablate nodes ...`: register rented GPU nodes, probe them, bootstrap/drain/tear them down.

Every command asks the controller's REST API under /api/nodes (ABLATE_URL or --url, the token): the
controller holds the nodes and does their SSH work, so key and known-hosts files are paths on the
controller machine, under its ABLATE_SSH_KEY_DIRS.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli import app
from orchestrator.cli.remote import JsonOption, UrlOption, controller, print_json
from orchestrator.cli.tables import Column, print_table

if TYPE_CHECKING:
    from orchestrator.api.schemas import NodePublic
    from orchestrator.client import NodeAction

NameArgument = Annotated[str, typer.Argument(help="Node name")]

nodes_app = typer.Typer(no_args_is_help=True, help="Rented GPU nodes reached over SSH (known host keys only).")
app.add_typer(nodes_app, name="nodes")


@nodes_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="A short unique name, e.g. quad-4090-a")],
    host: Annotated[str, typer.Option(help="Host name or IP address")],
    user: Annotated[str, typer.Option(help="SSH user")],
    key: Annotated[Path, typer.Option(help="Private key file on the controller machine (under ABLATE_SSH_KEY_DIRS)")],
    gpus: Annotated[
        int, typer.Option(help="GPUs the node has: it uses the lower of this and its probe (its own nvidia-smi)")
    ],
    port: Annotated[int, typer.Option(help="SSH port")] = 22,
    known_hosts: Annotated[
        Path | None, typer.Option(help="known_hosts file holding the node's host key (default ~/.ssh/known_hosts)")
    ] = None,
    price_per_hour: Annotated[float, typer.Option(help="What the node costs per hour (budget units)")] = 0.0,
    trusted: Annotated[
        bool, typer.Option(help="Its values may stop arms on other nodes (the stall rule against its control)")
    ] = False,
    url: UrlOption = None,
) -> None:
    """Register a node. Its host key must already be in the known-hosts file (`ssh-keyscan`)."""
    body = {
        "name": name,
        "host": host,
        "port": port,
        "user": user,
        "key_path": _controller_path(key),
        "known_hosts_path": _controller_path(known_hosts) if known_hosts else None,
        "price_per_hour": price_per_hour,
        "gpus": gpus,
        "trusted": trusted,
    }
    with controller(url, token_needed=True) as client:
        node = client.add_node(body)
    typer.echo(f"registered node {node.name} ({node.user}@{node.host}:{node.port}); "
               f"check it with `ablate nodes probe {node.name}`")


def _controller_path(path: Path) -> str:
    """A relative path made absolute here (the controller's working directory is not this shell's); `~` is
    left for the controller to expand, as its home is the one meant."""
    return str(path if path.is_absolute() or str(path).startswith("~") else path.absolute())


@nodes_app.command("set")
def set_(
    name: NameArgument,
    gpus: Annotated[int | None, typer.Option(help="GPUs the node has (it uses the lower of this and its probe)")] = (
        None
    ),
    trusted: Annotated[
        bool | None, typer.Option("--trusted/--untrusted", help="Whether its values may stop arms on other nodes")
    ] = None,
    url: UrlOption = None,
) -> None:
    """Declare what you know of a registered node: its GPU count, whether its values are trusted."""
    body = {k: v for k, v in {"gpus": gpus, "trusted": trusted}.items() if v is not None}
    with controller(url, token_needed=True) as client:
        node = client.update_node(name, body)
    shown = f"{node.declared_gpus or 'no'} GPUs declared, {'trusted' if node.trusted else 'not trusted'}"
    typer.echo(f"node {name}: {shown}")


@nodes_app.command("list")
def list_(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Registered nodes with their state, price and GPUs from the last probe (GET /api/nodes)."""
    from orchestrator.fleet.inventory import state_text

    columns = [
        Column("name"),
        Column("address", priority=2),
        Column("state"),
        Column("price/h", priority=3, justify="right"),
        Column("gpus", priority=1),
        Column("last probe", priority=4),
    ]
    with controller(url, token_needed=True) as client:
        found = client.nodes()
    if as_json:
        print_json(found)
        return
    rows = []
    for n in found:
        gpus = ", ".join(sorted({g.name for g in n.gpus}))
        gpus = f"{len(n.gpus)}x {gpus}" if n.gpus else "-"
        gpus += f" (declared {n.declared_gpus or '-'})" + (", trusted" if n.trusted else "")
        rows.append(
            [
                n.name,
                f"{n.user}@{n.host}:{n.port}",
                state_text(n.state, n.state_detail),
                f"{n.price_per_hour:g}",
                gpus,
                n.last_probe.get("probed_at", "-"),
            ]
        )
    print_table("nodes", columns, rows)


@nodes_app.command("probe")
def probe(name: NameArgument, url: UrlOption = None) -> None:
    """The controller SSHes to the node; prints JSON with gpus (nvidia-smi), free disk (GB) and the Python
    version."""
    with controller(url, token_needed=True, timeout=None) as client:
        print_json(client.probe_node(name))


def _act(name: str, action: NodeAction, url: str | None) -> NodePublic:
    """The controller runs the node's commands over SSH; the answer comes when they have ended."""
    with controller(url, token_needed=True, timeout=None) as client:
        return client.node_action(name, action)


@nodes_app.command("bootstrap")
def bootstrap(name: NameArgument, url: UrlOption = None) -> None:
    """Install the worker environment and start the node's own Ray (the controller's ABLATE_NODE_* settings)."""
    node = _act(name, "bootstrap", url)
    typer.echo(f"node {name} joined with {len(node.gpus)} GPUs")


@nodes_app.command("drain")
def drain(name: NameArgument, url: UrlOption = None) -> None:
    """Stop the node's own Ray (its arms are re-queued elsewhere); the environment stays for the next bootstrap."""
    _act(name, "drain", url)
    typer.echo(f"node {name} drained")


@nodes_app.command("teardown")
def teardown(name: NameArgument, url: UrlOption = None) -> None:
    """Stop the node's own Ray and delete the node's working directory."""
    _act(name, "teardown", url)
    typer.echo(f"node {name} torn down")


@nodes_app.command("remove")
def remove(name: NameArgument, url: UrlOption = None) -> None:
    """Forget a node (its command events stay, unlinked). Does not touch the machine."""
    with controller(url, token_needed=True) as client:
        client.remove_node(name)
    typer.echo(f"removed node {name}")
