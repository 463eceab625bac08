"""A stand-in for Vast.ai's and RunPod's HTTP APIs on loopback, for the official SDKs to talk to.

It serves exactly the subset that orchestrator/fleet/providers/{vast,runpod}.py call through the SDKs
(pointed here by their base-URL settings: vastai's server_url, runpod's RUNPOD_API_BASE_URL):

  Vast REST   POST /api/v0/bundles/ (search offers)      PUT /api/v0/asks/<offer>/ (create)
              POST /api/v0/instances/<id>/ssh/ (key)     GET /api/v0/instances/<id>/ (show)
              GET /api/v1/instances/ (list)              DELETE /api/v0/instances/<id>/ (destroy)
  RunPod      POST /graphql: gpuTypes (list, and one type with prices), podFindAndDeployOnDemand,
              pod(input: {podId}), myself { pods }, podTerminate

Every request must carry `Authorization: Bearer <api_key>` (401 otherwise), or the key the provider
scoped to one instance (Vast's CONTAINER_API_KEY, RunPod's RUNPOD_API_KEY; `scoped_env`), which may only
describe or destroy that instance (403 for anything else); `SimInstance.ended_by` says which key ended it.
Instances bill per second from create until destroy at their hourly price (`bill()`). What creating an instance means is
pluggable (`Hooks`): by default it only records it, at an address that answers nothing (TEST-NET-1);
tests/cluster/provider_hooks.py has the others (an SSH banner on loopback; a namespace node per instance).
`create_faults` makes a create the provider accepted answer 500, or nothing until the client times out:
the instance exists and bills, but its reply is lost.
Everything behind this HTTP API (SSH, bootstrap, Ray) is real in the tests that use it.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.cluster.provider_wire import lowest_price, offer_matches, query_enum, query_field, query_number

UNREACHABLE = ("192.0.2.1", 22)  # TEST-NET-1: routed nowhere, so SSH never answers
HOLD = 0  # a route's "status" for a reply held back until the simulator closes (a create that times out)


@dataclass
class SimInstance:
    provider: str  # "vast" | "runpod"
    id: str
    label: str  # Vast label / RunPod pod name
    gpu_name: str
    gpus: int
    price_per_hour: float
    offer_id: str
    image: str
    disk_gb: float
    env: dict[str, str]
    created: float = field(default_factory=time.time)
    ended: float | None = None
    ssh_host: str | None = None
    ssh_port: int | None = None
    ssh_keys: list[str] = field(default_factory=list)
    ready_at: float = 0.0  # when it turns from loading to running
    handle: Any = None  # what the create hook made (a test bed node)
    scoped_key: str = field(default_factory=lambda: "scoped-" + secrets.token_hex(12))
    ended_by: str | None = None  # "account" | "scoped": whose key destroyed it
    preempted: float | None = None  # when the provider took it back (interruptible): stopped, still billing disk
    bid: bool = False  # rented at a bid price (Vast interruptible)
    offline: bool = False  # the host lost contact with the provider (`set_offline`)

    def scoped_env(self) -> dict[str, str]:
        """What the provider puts into the instance's environment: its id and its own scoped key."""
        if self.provider == "vast":
            return {"CONTAINER_ID": self.id, "CONTAINER_API_KEY": self.scoped_key}
        return {"RUNPOD_POD_ID": self.id, "RUNPOD_API_KEY": self.scoped_key}

    @property
    def live(self) -> bool:
        return self.ended is None

    def cost(self, now: float | None = None) -> float:
        end = self.ended if self.ended is not None else (now or time.time())
        return self.price_per_hour * max(0.0, end - self.created) / 3600.0


@dataclass
class Hooks:
    """What creating, keying and destroying an instance does beyond the simulator's own record."""

    on_create: Callable[[SimInstance], tuple[str, int]] = lambda inst: UNREACHABLE
    on_ssh_key: Callable[[SimInstance, str], None] = lambda inst, key: None
    on_destroy: Callable[[SimInstance], None] = lambda inst: None
    on_preempt: Callable[[SimInstance], None] = lambda inst: None  # the machine goes down (not removed)


class ProviderSim:
    """Both APIs on one loopback port (`url`); use as a context manager."""

    def __init__(
        self,
        api_key: str,
        vast_offers: list[dict] | None = None,
        runpod_gpus: list[dict] | None = None,
        hooks: Hooks | None = None,
        boot_s: float = 0.0,
        first_vast_id: int = 7001,
        host: str = "127.0.0.1",
    ) -> None:
        self.api_key = api_key
        self.vast_offers = {str(o["id"]): dict(o) for o in vast_offers or []}
        self.runpod_gpus = list(runpod_gpus or [])
        self.hooks = hooks or Hooks()
        self.boot_s = boot_s  # seconds an instance stays "loading" after create
        self.instances: dict[str, SimInstance] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers): what the SDKs sent
        self._lock = threading.Lock()
        self._by = "account"  # whose key the request being routed carries (set under the lock)
        self._next_vast_id = first_vast_id  # a test with several simulators against one DB keeps ids apart
        # What the next successful creates answer once the instance exists (it bills either way): "500" an
        # internal error, "timeout" nothing until the simulator closes. An accepted create whose reply is lost.
        self.create_faults: list[str] = []
        self._released = threading.Event()  # ends held replies
        handler = type("Handler", (_Handler,), {"sim": self})
        # `host`: the test bed's bridge address where rented nodes call the API themselves (the dead-man's switch)
        self._server = ThreadingHTTPServer((host, 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="provider-sim", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ProviderSim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        for inst in list(self.instances.values()):  # a test that failed midway leaves no namespace behind
            if inst.live:
                self._end(inst)

    # -- the bill ------------------------------------------------------------------------------------

    def bill(self) -> float:
        now = time.time()
        return sum(i.cost(now) for i in self.instances.values())

    def live(self) -> list[SimInstance]:
        return [i for i in self.instances.values() if i.live]

    def preempt(self, instance_id: str) -> SimInstance:
        """The provider takes an interruptible instance back: Vast reports it `stopped` while it was meant to
        run (what Vast documents for an outbid bid), RunPod `EXITED`; it keeps billing (disk) until
        destroyed; the machine behind it goes down."""
        with self._lock:
            inst = self.instances[instance_id]
            assert inst.live and inst.preempted is None, f"instance {instance_id} is not running"
            inst.preempted = time.time()
            self.hooks.on_preempt(inst)
            return inst

    def set_offline(self, instance_id: str, offline: bool) -> None:
        """The host loses (True) or regains (False) contact with the provider: Vast reports `offline`, which
        it computes from missed heartbeats; the machine itself runs on."""
        with self._lock:
            self.instances[instance_id].offline = offline

    # -- state changes (called by the handler under the lock) --------------------------------------------

    def _create(self, inst: SimInstance) -> SimInstance:
        self.instances[inst.id] = inst
        inst.ready_at = inst.created + self.boot_s
        inst.ssh_host, inst.ssh_port = self.hooks.on_create(inst)
        for key in inst.ssh_keys:
            self.hooks.on_ssh_key(inst, key)
        return inst

    def _end(self, inst: SimInstance, by: str = "account") -> None:
        inst.ended, inst.ended_by = time.time(), by
        self.hooks.on_destroy(inst)

    def _faulted(self, code: int, payload: Any) -> tuple[int, Any]:  # noqa: ANN401
        """A successful create's answer: its own, or the next of `create_faults`."""
        fault = self.create_faults.pop(0) if self.create_faults else None
        if fault == "500":
            return 500, {"success": False, "error": "server_error", "msg": "internal server error"}
        if fault == "timeout":
            return HOLD, None
        return code, payload

    def _status(self, inst: SimInstance) -> str:
        if inst.preempted is not None:
            return "stopped"
        if inst.offline:
            return "offline"
        return "running" if time.time() >= inst.ready_at else "loading"

    # -- Vast ------------------------------------------------------------------------------------------

    def vast_search(self, q: dict[str, Any]) -> dict:
        rows = [o for o in self.vast_offers.values() if offer_matches(o, q)]
        for col, direction in q.get("order") or []:
            rows.sort(key=lambda r, c=col: r.get(c) or 0, reverse=direction == "desc")
        if q.get("limit"):
            rows = rows[: int(q["limit"])]
        return {"offers": rows}

    def vast_create(self, offer_id: str, body: dict[str, Any]) -> tuple[int, dict]:
        offer = self.vast_offers.get(offer_id)
        if offer is None or offer["rented"]:
            return 404, {"success": False, "error": "no_such_ask", "msg": f"offer {offer_id} is not available"}
        offer["rented"] = True  # a Vast offer is one machine: rented once
        price = float(body["price"]) if body.get("price") is not None else float(offer["dph_total"])
        inst = SimInstance(
            provider="vast",
            id=str(self._next_vast_id),
            label=body.get("label") or "",
            gpu_name=offer["gpu_name"],
            gpus=int(offer["num_gpus"]),
            price_per_hour=price,
            offer_id=offer_id,
            image=body.get("image") or "",
            disk_gb=float(body.get("disk") or 10),
            env={k: str(v) for k, v in (body.get("env") or {}).items()},
            bid=body.get("price") is not None,
        )
        self._next_vast_id += 1
        self._create(inst)
        return self._faulted(200, {"success": True, "new_contract": int(inst.id)})

    def vast_row(self, inst: SimInstance) -> dict:
        return {
            "id": int(inst.id),
            "ask_contract_id": int(inst.offer_id),
            "label": inst.label or None,
            "actual_status": self._status(inst),
            "intended_status": "running",
            "cur_state": "stopped" if inst.preempted is not None else "running",
            "is_bid": inst.bid,
            "dph_total": inst.price_per_hour,
            "num_gpus": inst.gpus,
            "gpu_name": inst.gpu_name,
            "image_uuid": inst.image,
            "disk_space": inst.disk_gb,
            "public_ipaddr": inst.ssh_host,
            "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst.ssh_port)}]},
            "ssh_host": inst.ssh_host,
            "ssh_port": inst.ssh_port,
            "start_date": inst.created,
            "extra_env": [[k, v] for k, v in inst.env.items()],
        }

    def vast_instance(self, iid: str) -> SimInstance | None:
        inst = self.instances.get(iid)
        return inst if inst is not None and inst.provider == "vast" and inst.live else None

    # -- RunPod ------------------------------------------------------------------------------------------

    def graphql(self, query: str) -> dict:
        if "podFindAndDeployOnDemand" in query:
            return self._runpod_deploy(query)
        if "podTerminate" in query:
            pod_id = query_field(query, "podId")
            inst = self.instances.get(pod_id or "")
            if inst is None or inst.provider != "runpod" or not inst.live:
                return {"errors": [{"message": f"pod {pod_id} not found"}]}
            self._end(inst, self._by)
            return {"data": {"podTerminate": None}}
        if re.search(r"\bpod\(input:", query):
            inst = self.instances.get(query_field(query, "podId") or "")
            live = inst is not None and inst.provider == "runpod" and inst.live
            return {"data": {"pod": self._pod(inst) if live else None}}
        if "myself" in query and "pods" in query:
            pods = [self._pod(i) for i in self.instances.values() if i.provider == "runpod" and i.live]
            return {"data": {"myself": {"pods": pods}}}
        if "gpuTypes(input:" in query:
            wanted = query_field(query, "id")
            types = [{**g, "lowestPrice": lowest_price(g)} for g in self.runpod_gpus if g["id"] == wanted]
            return {"data": {"gpuTypes": types}}
        if "gpuTypes" in query:
            return {
                "data": {"gpuTypes": [{k: g[k] for k in ("id", "displayName", "memoryInGb")} for g in self.runpod_gpus]}
            }
        return {"errors": [{"message": "the provider simulator does not serve this query"}]}

    def _runpod_deploy(self, query: str) -> dict:
        gpu_id, cloud = query_field(query, "gpuTypeId"), query_enum(query, "cloudType")
        count = int(query_number(query, "gpuCount") or 1)
        gpu = next((g for g in self.runpod_gpus if g["id"] == gpu_id), None)
        price = None if gpu is None else gpu["securePrice" if cloud == "SECURE" else "communityPrice"]
        if gpu is None or price is None or count > gpu["maxGpuCount"]:
            return {
                "errors": [
                    {"message": "There are no longer any instances available with the requested specifications."}
                ]
            }
        env = dict(re.findall(r'\{ key: "([^"]*)", value: "([^"]*)" \}', query))
        inst = SimInstance(
            provider="runpod",
            id=secrets.token_hex(7),
            label=query_field(query, "name") or "",
            gpu_name=gpu_id or "",
            gpus=count,
            price_per_hour=float(price) * count,
            offer_id=f"{cloud}:{gpu_id}",
            image=query_field(query, "imageName") or "",
            disk_gb=float(query_number(query, "containerDiskInGb") or 0),
            env=env,
            ssh_keys=[env["PUBLIC_KEY"]] if env.get("PUBLIC_KEY") else [],
        )
        self._create(inst)
        pod = {"id": inst.id, "imageName": inst.image, "env": [f"{k}={v}" for k, v in env.items()], "machineId": "m1"}
        return {"data": {"podFindAndDeployOnDemand": {**pod, "machine": {"podHostId": f"{inst.id}-64410"}}}}

    def _pod(self, inst: SimInstance) -> dict:
        up = self._status(inst) == "running"  # a preempted pod has no runtime
        ports = [
            {"ip": inst.ssh_host, "isIpPublic": True, "privatePort": 22, "publicPort": inst.ssh_port, "type": "tcp"}
        ]
        return {
            "id": inst.id,
            "name": inst.label,
            "desiredStatus": "EXITED" if inst.preempted is not None else "RUNNING",
            "costPerHr": inst.price_per_hour,
            "gpuCount": inst.gpus,
            "imageName": inst.image,
            "containerDiskInGb": inst.disk_gb,
            "env": [f"{k}={v}" for k, v in inst.env.items()],
            "uptimeSeconds": int(time.time() - inst.created),
            "runtime": {"ports": ports} if up else None,
            "machine": {"gpuDisplayName": inst.gpu_name},
        }


class _Handler(BaseHTTPRequestHandler):
    sim: ProviderSim

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # quiet: pytest shows failures, not every request

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else {}

    def _send(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        sim = self.sim
        parts = urlsplit(self.path)
        sim.requests.append((method, parts.path, dict(self.headers)))
        body = self._body()
        auth = self.headers.get("Authorization") or ""
        scoped = next((i for i in list(sim.instances.values()) if auth == f"Bearer {i.scoped_key}"), None)
        if auth != f"Bearer {sim.api_key}" and scoped is None:
            self._send(401, {"success": False, "error": "auth_error", "msg": "invalid API key"})
            return
        if scoped is not None and not _only_about(scoped, method, parts.path, body):
            self._send(403, {"success": False, "error": "forbidden", "msg": "this key manages one instance only"})
            return
        with sim._lock:
            sim._by = "account" if scoped is None else "scoped"
            code, payload = self._route(method, parts.path, parse_qs(parts.query), body)
        if code == HOLD:
            sim._released.wait()  # the client times out first; the connection closes unanswered
            return
        self._send(code, payload)

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        sim = self.sim
        if method == "POST" and path == "/graphql":
            answer = sim.graphql(query := body.get("query", ""))
            deployed = "podFindAndDeployOnDemand" in query and "data" in answer
            return sim._faulted(200, answer) if deployed else (200, answer)
        if method == "POST" and path == "/api/v0/bundles/":
            return 200, sim.vast_search(body)
        if method == "GET" and path == "/api/v1/instances/":
            rows = [sim.vast_row(i) for i in sim.instances.values() if i.provider == "vast" and i.live]
            return 200, {"instances": rows, "next_token": None, "total_instances": len(rows)}
        if m := re.fullmatch(r"/api/v0/asks/(\d+)/", path):
            if method == "PUT":
                return sim.vast_create(m[1], body)
        if m := re.fullmatch(r"/api/v0/instances/(\d+)/ssh/", path):
            inst = sim.vast_instance(m[1])
            if method == "POST" and inst is not None:
                inst.ssh_keys.append(body["ssh_key"])
                sim.hooks.on_ssh_key(inst, body["ssh_key"])
                return 200, {"success": True}
            return 404, {"success": False, "msg": "no such instance"}
        if m := re.fullmatch(r"/api/v0/instances/(\d+)/", path):
            inst = sim.vast_instance(m[1])
            if method == "GET":
                return 200, {"instances": sim.vast_row(inst) if inst is not None else None}
            if method == "DELETE":
                if inst is None:
                    return 404, {"success": False, "msg": "no such instance"}
                sim._end(inst, sim._by)
                return 200, {"success": True}
        return 404, {"success": False, "msg": f"the provider simulator does not serve {method} {path}"}

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's names
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")


def _only_about(inst: SimInstance, method: str, path: str, body: Any) -> bool:  # noqa: ANN401
    """Whether a request made with `inst`'s scoped key only describes or destroys `inst` itself."""
    if path == f"/api/v0/instances/{inst.id}/":
        return method in ("GET", "DELETE")
    query = body.get("query", "") if method == "POST" and path == "/graphql" and isinstance(body, dict) else ""
    return bool(re.search(r"\b(podTerminate|pod)\(input:", query)) and query_field(query, "podId") == inst.id
