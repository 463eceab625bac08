"""The `static` provider: nodes the operator rented by hand and registered (`ablate nodes add`).

Behaviour as before providers existed: "renting" a registered node only hands back its SSH endpoint,
"destroying" it leaves the machine alone (leaving Ray is the runner's teardown, the machine is the
operator's), and nothing static is ever reaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.fleet.providers.base import Instance, InstanceState, LaunchSpec, Offer, ProviderError
from orchestrator.fleet.providers.request import NodeRequest

NAME = "static"


@dataclass
class StaticProvider:
    database_url: str
    name: str = NAME

    def _nodes(self) -> list[Any]:
        from orchestrator.db.session import session_scope
        from orchestrator.fleet.inventory import list_nodes

        with session_scope(self.database_url) as session:
            nodes = list_nodes(session)
            session.expunge_all()  # plain records past the session
        return nodes

    def _node(self, name: str) -> Any:
        for node in self._nodes():
            if node.name == name:
                return node
        return None

    def search(self, request: NodeRequest) -> list[Offer]:
        return [_offer(node) for node in self._nodes()]

    def create(self, offer: Offer, spec: LaunchSpec) -> Instance:
        instance = self.describe(offer.offer_id)
        if instance.state is InstanceState.gone:
            raise ProviderError(f"static: no registered node named {offer.offer_id!r}; `ablate nodes list`")
        return instance

    def describe(self, instance_id: str) -> Instance:
        node = self._node(instance_id)
        if node is None:
            return Instance(NAME, instance_id, InstanceState.gone, "not registered", None, 0.0)
        return Instance(
            provider=NAME,
            instance_id=node.name,
            state=InstanceState.running,
            status=str(node.state),
            label=None,
            price_per_hour=float(node.price_per_hour),
            gpus=node.usable_gpus,
            gpu_name=_gpu_name(node),
            ssh_host=node.host,
            ssh_port=int(node.port),
            ssh_user=node.user,
            offer_id=node.name,
        )

    def destroy(self, instance_id: str) -> None:
        """Nothing to end: the operator rented this machine and ends the rental."""

    def list_owned(self, controller_id: str) -> list[Instance]:
        return []  # registered nodes carry no label and are never reaped


def _gpu_name(node: Any) -> str:
    gpus = node.gpus or []
    return str(gpus[0].get("name", "")) if gpus else ""


def _offer(node: Any) -> Offer:
    # An unprobed node has no GPU list yet: 0 GPUs, which fits no request until `ablate nodes probe`; a
    # probe never counts past what the operator declared (Node.usable_gpus).
    return Offer(
        provider=NAME,
        offer_id=node.name,
        gpu_name=_gpu_name(node),
        gpus=node.usable_gpus,
        price_per_hour=float(node.price_per_hour),
        capacity=1,
        where=node.host,
    )
