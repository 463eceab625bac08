"""A schedule's request for rented nodes, and the provider names (the one list of them).

`NodeRequest` is what a schedule says instead of naming nodes ("two 4x RTX 4090 nodes from Vast, at
most 0.45 per GPU-hour"); every field is validated and a field that the chosen provider cannot honour
is refused naming that field, never ignored. Which offers fit it is offers.py's choice.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# Every provider, here only: the request's field, provider_for, the CLI and the reaper read this.
ProviderName = Literal["static", "vast", "runpod"]
PROVIDERS: tuple[str, ...] = get_args(ProviderName)
REGISTERED = "static"  # nodes the operator registered: listed, never rented or destroyed
RENTING: tuple[str, ...] = tuple(p for p in PROVIDERS if p != REGISTERED)  # rented through an API key


class NodeRequest(BaseModel):
    """What to rent for one sweep. Prices are per GPU-hour so that a cap reads the same for 1 or 8 GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: ProviderName
    # The GPU model as the provider names it: Vast "RTX_4090" (underscores or spaces), RunPod's GPU type
    # id "NVIDIA GeForce RTX 4090". Matched case-insensitively with "_" and " " alike.
    gpu: Annotated[str, Field(min_length=2, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$")]
    # One arm per GPU: the study's node was a quad.
    gpus_per_node: Annotated[int, Field(ge=1, le=16)] = 4
    nodes: Annotated[int, Field(ge=1, le=32)] = 1
    # The cap the researcher writes ("at most 0.45 per GPU-hour"); the node's price is gpus x this at most.
    max_price_per_gpu_hour: Annotated[float, Field(gt=0, le=100)]
    # Vast's host reliability score (0..1). None: no floor. Only Vast publishes one.
    min_reliability: Annotated[float, Field(ge=0, le=1)] | None = None
    # Container disk in GB: the image, the prepared data shards and the checkpoints of four arms.
    disk_gb: Annotated[int, Field(ge=10, le=8192)] = 100
    # Lowest CUDA version the host driver must support ("12.4"); None: any.
    cuda: Annotated[str, Field(pattern=r"^\d{1,2}\.\d$")] | None = None
    # Interruptible (Vast bid) instances are cheaper and can be preempted: arms resume from checkpoints.
    interruptible: bool = False

    @field_validator("min_reliability")
    @classmethod
    def _reliability_is_vast_only(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("provider") != "vast":
            provider = info.data.get("provider")
            raise ValueError(f"only Vast.ai publishes a reliability score; leave it unset for {provider}")
        return v

    @field_validator("interruptible")
    @classmethod
    def _interruptible_supported(cls, v: bool, info: ValidationInfo) -> bool:
        provider = info.data.get("provider")
        if v and provider == "runpod":
            # runpod.create_pod deploys on-demand pods only (podFindAndDeployOnDemand); no spot call.
            raise ValueError("the runpod SDK rents on-demand pods only; set interruptible: false")
        if v and provider == "static":
            raise ValueError("registered static nodes are not interruptible; set interruptible: false")
        return v

    @property
    def max_price_per_node_hour(self) -> float:
        return self.max_price_per_gpu_hour * self.gpus_per_node
