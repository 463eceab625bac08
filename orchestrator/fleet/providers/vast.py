"""Vast.ai through its official SDK (`vastai.VastAI`), which speaks Vast's REST API with requests.

Calls used (and served by tests/cluster/provider_sim.py): search_offers (POST /api/v0/bundles/),
create_instance (PUT /api/v0/asks/<offer>/), attach_ssh (POST /api/v0/instances/<id>/ssh/),
show_instance (GET /api/v0/instances/<id>/), show_instances (GET /api/v1/instances/),
destroy_instance (DELETE /api/v0/instances/<id>/).

The controller's SSH public key is attached to the one instance (attach_ssh), not to the account, so
no other machine of the account learns it. Vast logs in as root. The SDK is imported when a provider
is built, not when this module is: the API starts without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.fleet.providers.base import (
    Instance,
    InstanceLabel,
    InstanceState,
    LaunchSpec,
    Offer,
    ProviderError,
    sdk_errors,
)
from orchestrator.fleet.providers.request import NodeRequest

if TYPE_CHECKING:
    from vastai import VastAI

NAME = "vast"
# actual_status as Vast reports it -> what the runner acts on; None while the contract is being set up.
_STATES = {
    None: InstanceState.pending,
    "created": InstanceState.pending,
    "loading": InstanceState.pending,
    "scheduling": InstanceState.pending,
    "running": InstanceState.running,
    "rebooting": InstanceState.pending,
    "exited": InstanceState.stopped,  # the container's process exited
    "stopped": InstanceState.stopped,  # interrupted instead when an outbid bid (`_state`)
    "offline": InstanceState.unreachable,  # no heartbeat from the host: computed by Vast, often brief
    "unknown": InstanceState.unreachable,
}


@dataclass
class VastProvider:
    """Vast.ai, one account (one API key). `server_url` None: the SDK's default (console.vast.ai)."""

    api_key: str = field(repr=False)
    server_url: str | None = None
    name: str = NAME
    # Seconds one request may take (the SDK's own default); the SDK retries a timed-out one, a create too.
    timeout_s: float = 120.0
    _client: VastAI | None = field(default=None, repr=False)

    @property
    def client(self) -> VastAI:
        if self._client is None:
            try:
                from vastai import VastAI
            except ImportError:
                raise ProviderError(
                    "vast: the vastai SDK is not installed: `pip install --no-deps vastai==1.9.1` "
                    "(its own requirements pin cryptography and pillow; the SDK class needs only requests)"
                ) from None
            # An explicit key: the SDK then never looks at VAST_API_KEY or ~/.config/vastai.
            self._client = VastAI(api_key=self.api_key, server_url=self.server_url, retry=3, quiet=True)
            self._client.client.timeout = self.timeout_s  # VastAI takes no timeout; its VastClient does
        return self._client

    def _errors(self, operation: str):  # noqa: ANN202 - a context manager
        return sdk_errors(NAME, operation, self.api_key)

    # -- the Provider calls ------------------------------------------------------------------------------

    def search(self, request: NodeRequest) -> list[Offer]:
        query: dict[str, Any] = {
            "gpu_name": {"eq": request.gpu.replace("_", " ")},  # the API spells models with spaces
            "num_gpus": {"eq": request.gpus_per_node},
            "dph_total": {"lte": request.max_price_per_node_hour},
            "disk_space": {"gte": request.disk_gb},
        }
        if request.min_reliability is not None:
            query["reliability"] = {"gte": request.min_reliability}
        if request.cuda is not None:
            query["cuda_max_good"] = {"gte": float(request.cuda)}
        kind = "bid" if request.interruptible else "on-demand"
        with self._errors("search offers"):
            rows = self.client.search_offers(query=query, type=kind, order="dph_total", storage=request.disk_gb)
        if not isinstance(rows, list):
            raise ProviderError(f"vast: search offers answered {type(rows).__name__}, not a list of offers")
        return [_offer(row, request.interruptible) for row in rows]

    def create(self, offer: Offer, spec: LaunchSpec) -> Instance:
        with self._errors(f"create instance from offer {offer.offer_id}"):
            made = self.client.create_instance(
                id=int(offer.offer_id),
                image=spec.image,
                disk=spec.disk_gb,
                env=dict(spec.env),
                label=spec.label.encode(),
                onstart_cmd=spec.onstart,
                price=spec.bid_per_hour if offer.interruptible else None,
                ssh=True,
                direct=True,
            )
        if not isinstance(made, dict) or not made.get("success") or not made.get("new_contract"):
            raise ProviderError(f"vast: offer {offer.offer_id} was not rented: {str(made)[:300]}")
        instance_id = str(made["new_contract"])
        try:
            with self._errors(f"attach the controller's SSH key to instance {instance_id}"):
                self.client.attach_ssh(int(instance_id), spec.ssh_public_key)
            return self.describe(instance_id)
        except ProviderError as exc:
            # Rented but unusable: it must not bill on. The caller learns the id either way.
            self._destroy_quietly(instance_id)
            raise ProviderError(f"{exc} (instance {instance_id} destroyed)") from None

    def describe(self, instance_id: str) -> Instance:
        with self._errors(f"show instance {instance_id}"):
            row = self.client.show_instance(int(instance_id))
        if row is None:
            return Instance(NAME, str(instance_id), InstanceState.gone, "gone", None, 0.0)
        return _instance(row)

    def destroy(self, instance_id: str) -> None:
        try:
            with self._errors(f"destroy instance {instance_id}"):
                self.client.destroy_instance(int(instance_id))
        except ProviderError:
            # Already gone (404) is what destroy wants; anything else is a destroy not confirmed.
            if self.describe(instance_id).state is not InstanceState.gone:
                raise

    def list_owned(self, controller_id: str) -> list[Instance]:
        with self._errors("show instances"):
            rows = self.client.show_instances()
        owned = [_instance(row) for row in rows]
        return [i for i in owned if i.label is not None and i.label.controller_id == controller_id]

    def _destroy_quietly(self, instance_id: str) -> None:
        try:
            self.destroy(instance_id)
        except ProviderError:
            pass  # the reaper finds it by its label on the next tick


def _offer(row: dict[str, Any], interruptible: bool) -> Offer:
    price = float(row.get("min_bid") or row["dph_total"]) if interruptible else float(row["dph_total"])
    reliability = row.get("reliability", row.get("reliability2"))
    return Offer(
        provider=NAME,
        offer_id=str(row["id"]),
        gpu_name=str(row["gpu_name"]),
        gpus=int(row["num_gpus"]),
        price_per_hour=price,
        reliability=float(reliability) if reliability is not None else None,
        cuda=float(row["cuda_max_good"]) if row.get("cuda_max_good") is not None else None,
        disk_gb=float(row["disk_space"]) if row.get("disk_space") is not None else None,
        interruptible=interruptible,
        capacity=1,
        where=str(row.get("geolocation") or ""),
    )


def _instance(row: dict[str, Any]) -> Instance:
    status = row.get("actual_status")
    host, port = _ssh_endpoint(row)
    return Instance(
        provider=NAME,
        instance_id=str(row["id"]),
        state=_state(row),
        status=str(status or "creating"),
        label=InstanceLabel.decode(row.get("label")),
        price_per_hour=float(row.get("dph_total") or 0.0),
        gpus=int(row.get("num_gpus") or 0),
        gpu_name=str(row.get("gpu_name") or ""),
        ssh_host=host,
        ssh_port=port,
        ssh_user="root",
        offer_id=str(row["ask_contract_id"]) if row.get("ask_contract_id") is not None else None,
        started_at=float(row["start_date"]) if row.get("start_date") else None,
    )


def _state(row: dict[str, Any]) -> InstanceState:
    """Vast documents that an outbid interruptible instance "moves to stopped (not destroyed)": a bid
    stopped while its renter still wants it running was taken back; anything else stopped was not."""
    state = _STATES.get(row.get("actual_status"), InstanceState.unknown)
    if state is InstanceState.stopped and row.get("is_bid") and row.get("intended_status") == "running":
        return InstanceState.interrupted
    return state


def _ssh_endpoint(row: dict[str, Any]) -> tuple[str | None, int | None]:
    """Direct SSH (the host's public IP and the port mapped to 22) when published, else Vast's SSH proxy."""
    mapped = (row.get("ports") or {}).get("22/tcp") or []
    if row.get("public_ipaddr") and mapped:
        return str(row["public_ipaddr"]).strip(), int(mapped[0]["HostPort"])
    if row.get("ssh_host") and row.get("ssh_port"):
        return str(row["ssh_host"]), int(row["ssh_port"])
    return None, None
