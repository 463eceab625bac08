"""`ablate nodes ...`: register rented GPU nodes, probe them, bootstrap/drain/tear them down.

`nodes list` reads the controller's GET /api/nodes (ABLATE_URL, the token). The commands that change a node
still act on the database directly (ABLATE_DATABASE_URL): SSH keys and known-hosts files are paths on the
controller machine, so they run there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import app, migrated_database_url, service_errors
from orchestrator.cli.remote import JsonOption, UrlOption, controller, print_json
from orchestrator.cli.tables import Column, print_table

nodes_app = typer.Typer(no_args_is_help=True, help="Rented GPU nodes reached over SSH (known host keys only).")
app.add_typer(nodes_app, name="nodes")


@nodes_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="A short unique name, e.g. quad-4090-a")],
    host: Annotated[str, typer.Option(help="Host name or IP address")],
    user: Annotated[str, typer.Option(help="SSH user")],
    key: Annotated[Path, typer.Option(help="Private key file on this machine")],
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
) -> None:
    """Register a node. Its host key must already be in the known-hosts file (`ssh-keyscan`)."""
    from orchestrator.db.session import session_scope
    from orchestrator.fleet.errors import NodeError
    from orchestrator.fleet.inventory import NodeCreate, add_node, key_path_problems

    with service_errors():
        body = NodeCreate(
            gpus=gpus,
            trusted=trusted,
            name=name,
            host=host,
            port=port,
            user=user,
            key_path=str(key),
            known_hosts_path=str(known_hosts) if known_hosts else None,
            price_per_hour=price_per_hour,
        )
        # The operator's own machine: any directory, but the files must exist.
        problems = key_path_problems(body, [Path("/")])
        if problems:
            raise NodeError("; ".join(f"{field}: {msg}" for field, msg in problems.items()))
        with session_scope(migrated_database_url()) as session:
            add_node(session, body)
    typer.echo(f"registered node {name} ({user}@{host}:{port}); check it with `ablate nodes probe {name}`")


@nodes_app.command("set")
def set_(
    name: Annotated[str, typer.Argument(help="Node name")],
    gpus: Annotated[int | None, typer.Option(help="GPUs the node has (it uses the lower of this and its probe)")] = (
        None
    ),
    trusted: Annotated[
        bool | None, typer.Option("--trusted/--untrusted", help="Whether its values may stop arms on other nodes")
    ] = None,
) -> None:
    """Declare what you know of a registered node: its GPU count, whether its values are trusted."""
    from orchestrator.db.session import session_scope
    from orchestrator.fleet.inventory import NodeUpdate, update_node

    with service_errors(), session_scope(migrated_database_url()) as session:
        node = update_node(session, name, NodeUpdate(gpus=gpus, trusted=trusted))
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
def probe(name: Annotated[str, typer.Argument(help="Node name")]) -> None:
    """SSH to the node; print JSON with gpus (nvidia-smi), free disk (GB) and the Python version."""
    from orchestrator.fleet.probe import probe_node

    with service_errors():
        result = probe_node(migrated_database_url(), name)
    typer.echo(json.dumps(result, indent=2))


@nodes_app.command("bootstrap")
def bootstrap(name: Annotated[str, typer.Argument(help="Node name")]) -> None:
    """Install the worker environment and start the node's own Ray (ABLATE_NODE_* settings)."""
    from orchestrator.fleet.bootstrap import BootstrapConfig, bootstrap_node

    with service_errors():
        found = bootstrap_node(migrated_database_url(), name, BootstrapConfig())
    typer.echo(f"node {name} joined with {len(found['gpus'])} GPUs")


@nodes_app.command("drain")
def drain(name: Annotated[str, typer.Argument(help="Node name")]) -> None:
    """Stop the node's own Ray (its arms are re-queued elsewhere); the environment stays for the next bootstrap."""
    from orchestrator.fleet.bootstrap import BootstrapConfig, drain_node

    with service_errors():
        drain_node(migrated_database_url(), name, BootstrapConfig())
    typer.echo(f"node {name} drained")


@nodes_app.command("teardown")
def teardown(name: Annotated[str, typer.Argument(help="Node name")]) -> None:
    """Stop the node's own Ray and delete the node's working directory."""
    from orchestrator.fleet.bootstrap import BootstrapConfig, teardown_node

    with service_errors():
        teardown_node(migrated_database_url(), name, BootstrapConfig())
    typer.echo(f"node {name} torn down")


@nodes_app.command("remove")
def remove(name: Annotated[str, typer.Argument(help="Node name")]) -> None:
    """Forget a node (its command events stay, unlinked). Does not touch the machine."""
    from orchestrator.db.session import session_scope
    from orchestrator.fleet.inventory import remove_node

    with service_errors(), session_scope(migrated_database_url()) as session:
        remove_node(session, name)
    typer.echo(f"removed node {name}")
