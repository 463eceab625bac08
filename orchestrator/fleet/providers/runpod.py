"""RunPod through its official SDK (`runpod`), whose pod calls are GraphQL over requests
(POST <RUNPOD_API_BASE_URL>/graphql).

Calls used (and served by tests/cluster/provider_sim.py): get_gpus and get_gpu (GPU types and their
per-GPU prices: RunPod has no machine offers, so an Offer is a GPU type in the SECURE or COMMUNITY
cloud and RunPod picks the machine), create_pod (podFindAndDeployOnDemand), get_pod, get_pods,
terminate_pod.

RunPod has no labels: a pod's name carries the InstanceLabel. The controller's SSH public key goes in
the pod's PUBLIC_KEY variable, which RunPod's images add to root's authorized_keys. The SDK reads its
base URL from the RUNPOD_API_BASE_URL variable at each call and, for create/terminate, its key from
the module global `runpod.api_key`; this module sets both, since those are the SDK's only knobs.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from orchestrator.fleet.providers.base import (
    Instance,
    InstanceLabel,
    InstanceState,
    LaunchSpec,
    Offer,
    ProviderError,
    sdk_errors,
)
from orchestrator.fleet.providers.offers import gpu_key
from orchestrator.fleet.providers.request import NodeRequest

NAME = "runpod"
CLOUDS = ("SECURE", "COMMUNITY")
# CUDA versions RunPod hosts advertise; a request's floor becomes allowedCudaVersions (those >= it).
CUDA_VERSIONS = ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7", "12.8", "12.9", "13.0")
# The SDK writes env values into the GraphQL text between double quotes, unescaped: allow only what
# cannot break out of them.
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
_ENV_VALUE = re.compile(r'^[^"\\\n\r]{0,4096}$')
_SDK_LOCK = threading.Lock()  # runpod.api_key is a module global


@dataclass
class RunPodProvider:
    """RunPod, one account (one API key). `api_url` None: the SDK's default (https://api.runpod.io)."""

    api_key: str = field(repr=False)
    api_url: str | None = None
    name: str = NAME

    def _sdk(self) -> ModuleType:
        try:
            import runpod
        except ImportError:
            raise ProviderError(
                "runpod: the runpod SDK is not installed: `pip install --no-deps runpod==1.12.0` "
                "(its own requirements pull its serverless stack: FastAPI[all], boto3, watchdog)"
            ) from None
        if self.api_url is not None:
            os.environ["RUNPOD_API_BASE_URL"] = self.api_url
        runpod.api_key = self.api_key  # create_pod / terminate_pod take no key argument
        return runpod

    def _errors(self, operation: str):  # noqa: ANN202 - a context manager
        return sdk_errors(NAME, operation, self.api_key)

    # -- the Provider calls ------------------------------------------------------------------------------

    def search(self, request: NodeRequest) -> list[Offer]:
        with _SDK_LOCK, self._errors("list GPU types"):
            sdk = self._sdk()
            types = [t for t in sdk.get_gpus(api_key=self.api_key) if _same_gpu(t, request.gpu)]
            details = [sdk.get_gpu(t["id"], request.gpus_per_node, api_key=self.api_key) for t in types]
        offers = []
        for gpu in details:
            if (gpu.get("maxGpuCount") or 0) < request.gpus_per_node:
                continue
            for cloud in CLOUDS:
                price = gpu.get("securePrice" if cloud == "SECURE" else "communityPrice")
                if not gpu.get("secureCloud" if cloud == "SECURE" else "communityCloud") or not price:
                    continue
                offers.append(
                    Offer(
                        provider=NAME,
                        offer_id=f"{cloud}:{gpu['id']}",
                        gpu_name=str(gpu["id"]),
                        gpus=request.gpus_per_node,
                        price_per_hour=float(price) * request.gpus_per_node,
                        # RunPod places the pod only on hosts with an allowed CUDA version (create passes
                        # the floor on as allowedCudaVersions), so the offer meets the floor by construction.
                        cuda=float(request.cuda) if request.cuda else None,
                        capacity=None,
                        where=cloud.lower(),
                    )
                )
        return offers

    def create(self, offer: Offer, spec: LaunchSpec) -> Instance:
        cloud, _, gpu_type = offer.offer_id.partition(":")
        if cloud not in CLOUDS or not gpu_type:
            raise ProviderError(f"runpod: offer id {offer.offer_id!r} is not CLOUD:GPU_TYPE")
        if spec.onstart:
            raise ProviderError(
                "runpod: pods take no start command here (docker_args replaces the image's); "
                "install what must run at start over SSH"
            )
        env = {"PUBLIC_KEY": spec.ssh_public_key, **spec.env}
        for key, value in env.items():
            if not _ENV_NAME.match(key) or not _ENV_VALUE.match(value):
                raise ProviderError(f"runpod: env {key!r} must be NAME=VALUE without quotes, backslashes or newlines")
        allowed = [v for v in CUDA_VERSIONS if float(v) >= offer.cuda] if offer.cuda is not None else None
        with _SDK_LOCK, self._errors(f"create a pod of {offer.gpus}x {gpu_type} ({cloud})"):
            made = self._sdk().create_pod(
                name=spec.label.encode(),
                image_name=spec.image,
                gpu_type_id=gpu_type,
                cloud_type=cloud,
                gpu_count=offer.gpus,
                container_disk_in_gb=spec.disk_gb,
                env=env,
                ports="22/tcp",
                support_public_ip=True,
                start_ssh=True,
                allowed_cuda_versions=allowed,
            )
        if not isinstance(made, dict) or not made.get("id"):
            raise ProviderError(f"runpod: no pod was deployed: {str(made)[:300]}")
        return self.describe(str(made["id"]))

    def describe(self, instance_id: str) -> Instance:
        if not re.match(r"^[A-Za-z0-9]{1,64}$", instance_id):
            raise ProviderError(f"runpod: {instance_id!r} is not a pod id")
        with _SDK_LOCK, self._errors(f"get pod {instance_id}"):
            pod = self._sdk().get_pod(instance_id, api_key=self.api_key)
        if not pod:
            return Instance(NAME, instance_id, InstanceState.gone, "gone", None, 0.0)
        return _instance(pod)

    def destroy(self, instance_id: str) -> None:
        try:
            if not re.match(r"^[A-Za-z0-9]{1,64}$", instance_id):
                raise ProviderError(f"runpod: {instance_id!r} is not a pod id")
            with _SDK_LOCK, self._errors(f"terminate pod {instance_id}"):
                self._sdk().terminate_pod(instance_id)
        except ProviderError:
            if self.describe(instance_id).state is not InstanceState.gone:
                raise

    def list_owned(self, controller_id: str) -> list[Instance]:
        with _SDK_LOCK, self._errors("get pods"):
            pods = self._sdk().get_pods(api_key=self.api_key)
        owned = [_instance(p) for p in pods or []]
        return [i for i in owned if i.label is not None and i.label.controller_id == controller_id]


def _same_gpu(gpu_type: dict[str, Any], wanted: str) -> bool:
    return gpu_key(wanted) in (gpu_key(str(gpu_type.get("id", ""))), gpu_key(str(gpu_type.get("displayName", ""))))


def _instance(pod: dict[str, Any]) -> Instance:
    desired = pod.get("desiredStatus")
    runtime = pod.get("runtime")
    if desired == "RUNNING":
        state = InstanceState.running if runtime else InstanceState.pending
    elif desired in ("EXITED", "STOPPED"):
        state = InstanceState.stopped
    elif desired == "TERMINATED":
        state = InstanceState.gone
    else:
        state = InstanceState.unknown
    host = port = None
    for p in (runtime or {}).get("ports") or []:
        if p.get("privatePort") == 22 and p.get("isIpPublic") and p.get("type") == "tcp":
            host, port = str(p["ip"]), int(p["publicPort"])
    return Instance(
        provider=NAME,
        instance_id=str(pod["id"]),
        state=state,
        status=str(desired) if runtime or desired != "RUNNING" else "STARTING",
        label=InstanceLabel.decode(pod.get("name")),
        price_per_hour=float(pod.get("costPerHr") or 0.0),
        gpus=int(pod.get("gpuCount") or 0),
        gpu_name=str((pod.get("machine") or {}).get("gpuDisplayName") or ""),
        ssh_host=host,
        ssh_port=port,
        ssh_user="root",
        started_at=time.time() - float(pod["uptimeSeconds"]) if pod.get("uptimeSeconds") is not None else None,
    )
