"""The arm spec: the contract between the REST API, the arm files, the run launcher and the trainer.

Every section forbids unknown keys. The source study lost its AsymFlow arm because a config block
nested under the wrong key was silently ignored; here that is a validation error naming the key.

Defaults are arm A (the study's baseline). Arms B..I in `arms/*.yaml` name a parent and change
only what they change. This module imports no torch: the controller imports it at start-up.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from model.command_spec import COMMAND_ENDS, MAX_ARM_GPUS, CommandEnd, CommandSpec  # noqa: F401 - part of the arm spec
from model.flow_headline import HEADLINE
from model.strict import Strict

# Upper bounds are far above any real run and keep absurd values (hidden 4e21, steps 1e18) from
# being stored and then failing only on the worker after using up its retries.
PositiveInt = Annotated[int, Field(gt=0, le=10**9)]
NonNegInt = Annotated[int, Field(ge=0, le=10**9)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]  # torch and numpy seeds are 64-bit
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
# A pretrained network's stand-in (REPA's teacher, LPIPS's backbone): seeded random weights, only where a
# spec names it, and this label on every run and metric it touched; model/, worker/ and orchestrator/ import it.
STANDIN = "random_standin"

MAX_HIDDEN, MAX_DEPTH, MAX_HEADS, MAX_PATCH, MAX_RESOLUTION = 16384, 512, 256, 128, 8192
MAX_UNREADABLE = 0.01  # data.max_unreadable and `ablate data prepare --max-unreadable` default


class SizePreset(Strict):
    hidden: Annotated[int, Field(gt=0, le=MAX_HIDDEN)]
    depth: Annotated[int, Field(gt=0, le=MAX_DEPTH)]
    heads: Annotated[int, Field(gt=0, le=MAX_HEADS)]
    patch: Annotated[int, Field(gt=0, le=MAX_PATCH)]
    resolution: Annotated[int, Field(gt=0, le=MAX_RESOLUTION)]  # native image side in pixels
    text_tokens: Annotated[int, Field(gt=0, le=4096)]  # caption length the cross-attention sees


# seed: the study's 239M NanoDiT (4096 image tokens). small: a quick GPU arm. tiny: CPU tests and the demo.
SIZES: dict[str, SizePreset] = {
    "seed": SizePreset(hidden=768, depth=18, heads=12, patch=16, resolution=1024, text_tokens=128),
    "small": SizePreset(hidden=384, depth=12, heads=6, patch=8, resolution=256, text_tokens=64),
    "tiny": SizePreset(hidden=64, depth=4, heads=4, patch=4, resolution=32, text_tokens=16),
}


class ModelSpec(Strict):
    size: Literal["seed", "small", "tiny"] = "seed"
    # Explicit dims override the preset one by one (None = the preset's value).
    hidden: Annotated[int, Field(gt=0, le=MAX_HIDDEN)] | None = None
    depth: Annotated[int, Field(gt=0, le=MAX_DEPTH)] | None = None
    heads: Annotated[int, Field(gt=0, le=MAX_HEADS)] | None = None
    patch: Annotated[int, Field(gt=0, le=MAX_PATCH)] | None = None
    mlp_ratio: Annotated[float, Field(gt=0, le=64)] = 4.0  # FFN width / hidden, as in DiT
    # pooled reference-image tokens for reconstruction conditioning
    identity_tokens: Annotated[int, Field(ge=0, le=4096)] = 16

    def dims(self) -> SizePreset:
        """The preset with explicit dims applied."""
        preset = SIZES[self.size]
        over = {k: getattr(self, k) for k in ("hidden", "depth", "heads", "patch") if getattr(self, k)}
        return preset.model_copy(update=over)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSpec:
        d = self.dims()
        if d.hidden % d.heads:
            raise ValueError(f"hidden ({d.hidden}) must be divisible by heads ({d.heads})")
        return self


PATH_DATASETS = ("imagefolder", "webdataset", "prepared")  # the kinds that read data.path
DATA_URL_SCHEMES = ("file", "s3", "sftp")  # the stores checkpoints use (worker/checkpoint_store.py)


class DataSpec(Strict):
    # imagefolder: images + captions.jsonl, or Hugging Face metadata.jsonl / metadata.csv; webdataset: *.tar
    # shards; prepared: the output of `ablate data prepare` (uint8 at the training resolution, memory-mapped).
    dataset: Literal["shapes", "digits", "imagefolder", "webdataset", "prepared"] = "shapes"
    path: str | None = None  # the directory of an imagefolder, webdataset or prepared dataset
    # prepared shards on durable storage instead of a path (fsspec: s3://bucket/prefix, sftp://user@host/abs,
    # file:///abs), read with the checkpoint store's options: each node fetches them once into its data cache,
    # verified against the manifest's checksums before training starts (worker/data_fetch.py).
    url: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    # metadata.jsonl / metadata.csv: the column with the captions (None = the first of caption, text)
    caption_column: Annotated[str, Field(min_length=1)] | None = None
    # Loader worker processes that decode and resize off the training thread. auto: this arm's share of
    # the node's CPUs (CPUs / GPUs of the node) less one for the training thread, 1..8; 1 on CPU
    # training. 0 loads in the training thread (debugging only: the GPU waits for every batch).
    loader_workers: Literal["auto"] | Annotated[int, Field(ge=0, le=64)] = "auto"
    resolution: Annotated[int, Field(gt=0, le=MAX_RESOLUTION)] | None = None  # None = the size's native one
    # unit = [0, 1] (the study's A-E, reproduced on purpose); symmetric = [-1, 1] (arm F's fix).
    pixel_range: Literal["unit", "symmetric"] = "unit"
    # learned: built-in tokenizer + embedding; minilm: offline all-MiniLM-L6-v2 token states;
    # precomputed: embeddings stored with the dataset (e.g. T5 states computed elsewhere).
    text_encoder: Literal["learned", "minilm", "precomputed"] = "learned"
    num_images: PositiveInt = 4096  # procedural datasets: how many training images to draw
    held_out: PositiveInt = 64  # images kept out of training for evaluation
    # Share of the images that may be unreadable (left out and named on the run): a few damaged photos
    # should not end a night, but past 1% it is more likely the wrong folder or a half-finished copy.
    max_unreadable: Fraction = MAX_UNREADABLE
    # The training seed: initialisation, data order, flow noise and timesteps, TREAD routing. A grid's
    # replicates (`seeds: N`) differ only here.
    seed: Seed = 0
    # The dataset's identity: which images are held out (and a procedural set's items). None: data.seed,
    # which meant both before replicates existed, so a saved spec resumes exactly as it trained.
    split_seed: Seed | None = None

    def dataset_seed(self) -> int:
        """The seed of the held-out split (split_seed, else the training seed)."""
        return self.seed if self.split_seed is None else self.split_seed

    @model_validator(mode="after")
    def _path_datasets_need_path(self) -> DataSpec:
        if self.url is not None:
            scheme = self.url.split("://", 1)[0] if "://" in self.url else ""
            if scheme not in DATA_URL_SCHEMES:
                raise ValueError(
                    f"data.url {self.url!r} must start with one of {', '.join(s + '://' for s in DATA_URL_SCHEMES)}"
                )
            if self.dataset != "prepared":
                raise ValueError(
                    "data.url holds prepared shards: set data.dataset 'prepared' (make them with ablate data prepare)"
                )
            if self.path:
                raise ValueError("set data.path or data.url, not both (a node caches data.url where it chooses)")
            return self
        if self.dataset in PATH_DATASETS and not self.path:
            what = {
                "imagefolder": "a directory with images and captions.jsonl (or metadata.jsonl / metadata.csv)",
                "webdataset": "a directory of WebDataset *.tar shards",
                "prepared": "a directory written by `ablate data prepare` (or data.url: the same on storage)",
            }[self.dataset]
            raise ValueError(f"dataset {self.dataset!r} needs data.path: {what}")
        if self.caption_column is not None and self.dataset != "imagefolder":
            raise ValueError("data.caption_column applies only to dataset 'imagefolder' (Hugging Face metadata)")
        return self


class MuonSpec(Strict):
    momentum: Fraction = 0.95
    nesterov: bool = True
    ns_steps: PositiveInt = 5
    adjust_lr_fn: Literal["original", "match_rms_adamw"] = "match_rms_adamw"


class OptimizerSpec(Strict):
    # muon: torch.optim.Muon on 2-D hidden weights, AdamW on embeddings, norms, biases and output.
    name: Literal["adamw", "muon"] = "adamw"
    betas: tuple[Fraction, Fraction] = (0.9, 0.95)
    weight_decay: Annotated[float, Field(ge=0)] = 0.03
    eps: PositiveFloat = 1e-8
    grad_clip: Annotated[float, Field(ge=0)] = 1.0  # 0 disables clipping
    muon: MuonSpec = MuonSpec()


class EMASpec(Strict):
    enabled: bool = True
    decay: Fraction = 0.9999
    warmup_steps: NonNegInt = 500  # decay ramps as min(decay, (1+s)/(10+s)) until here


class TrainingSchedule(Strict):
    steps: Annotated[int, Field(gt=0, le=10**8)] = 5000
    # global batch per optimizer step, whatever the micro-batch: the arms of a grid compare at equal batch
    batch_size: Annotated[int, Field(gt=0, le=65536)] = 256
    # Images per forward/backward. auto: the largest divisor of batch_size that fits the GPU, found by
    # trial steps at start (the seed-size batch of 256 in one micro-batch runs out of memory on 80 GB);
    # the whole batch on CPU. An int fixes it. Gradient accumulation = batch_size / micro_batch.
    micro_batch: Literal["auto"] | Annotated[int, Field(gt=0, le=65536)] = "auto"
    # Legacy way to fix the micro-batch (batch_size / grad_accum); None = from micro_batch.
    grad_accum: PositiveInt | None = None
    lr: PositiveFloat = 3e-4
    min_lr: Annotated[float, Field(ge=0)] = 1e-6
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: NonNegInt = 500
    ema: EMASpec = EMASpec()
    checkpoint_every: PositiveInt = 500  # evaluation + checkpoint interval in optimizer steps
    # A real lr spike: multiply the lr by this from optimizer step lr_explode_after on (the collapse
    # detector's tests, and the demo's broken arm: arms/demo.yaml).
    lr_explode_after: NonNegInt | None = None
    lr_explode_factor: PositiveFloat = 1.0

    @model_validator(mode="after")
    def _consistent(self) -> TrainingSchedule:
        if self.grad_accum is not None:
            if self.batch_size % self.grad_accum:
                raise ValueError(f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum})")
            if self.micro_batch != "auto" and self.micro_batch * self.grad_accum != self.batch_size:
                raise ValueError(
                    f"micro_batch ({self.micro_batch}) x grad_accum ({self.grad_accum}) != batch_size "
                    f"({self.batch_size}): set one of micro_batch or grad_accum"
                )
        if self.micro_batch != "auto" and self.batch_size % self.micro_batch:
            raise ValueError(f"batch_size ({self.batch_size}) must be divisible by micro_batch ({self.micro_batch})")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        return self

    def fixed_micro_batch(self) -> int | None:
        """The micro-batch the spec fixes (micro_batch or batch_size / grad_accum), None for auto."""
        if self.grad_accum is not None:
            return self.batch_size // self.grad_accum
        return None if self.micro_batch == "auto" else self.micro_batch


class TreadSpec(Strict):
    """TREAD token routing (Krause et al. 2025): a random subset of tokens skips the middle blocks."""

    enabled: bool = False
    rate: Annotated[float, Field(ge=0, lt=1)] = 0.5  # fraction of tokens routed past the blocks
    first_block: NonNegInt = 1
    last_block: int | None = None  # inclusive; None = depth - 2 (re-inject before the final block)


class RepaSpec(Strict):
    """REPA (Yu et al. 2024): align a middle block's states to a frozen vision teacher's patch features."""

    enabled: bool = False
    weight: Annotated[float, Field(ge=0)] = 0.5
    block: NonNegInt | None = None  # None = depth // 2
    # dinov2: a real teacher loaded from teacher_path; random_standin: a frozen random conv net,
    # allowed only when chosen explicitly and labelled on the run.
    teacher: Literal["dinov2", STANDIN] = "dinov2"
    teacher_path: str | None = None
    # Linear warm-down of the weight to 0 by this fraction of the steps (arm E: 0.25); None = no decay.
    warmdown_end: Fraction | None = None


class FlowSpec(Strict):
    kind: Literal["standard", "asymflow"] = "standard"
    prediction: Literal["x", "v"] = "x"  # the study predicts x0
    rank: PositiveInt = 8  # AsymFlow: rank of the patch-wise PCA subspace
    logit_normal_mean: float = 0.0
    logit_normal_std: PositiveFloat = 1.0


class PrecisionSpec(Strict):
    mode: Literal["bf16", "fp8", "fp32"] = "bf16"
    # fp8 only. tensorwise / rowwise run on sm89+ GPUs (and on CPU); mxfp8 needs sm100+.
    # rowwise_with_gw_hp: rowwise, with the weight gradient's GEMM in bf16 (torchao's recipe of that name).
    fp8_recipe: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8"] = "tensorwise"
    # fnmatch patterns over module names; only nn.Linear with both dims divisible by 16 convert.
    fp8_modules: list[str] = Field(default_factory=lambda: ["*.attn.qkv", "*.attn.proj", "*.mlp.fc1", "*.mlp.fc2"])
    # torch.compile of the model, see compile_scope. None (default): on where the device is CUDA (1.23x
    # for arm A at seed size, docs/benchmarks.md), off on CPU (compile time dominates tiny runs).
    compile: bool | None = None
    # model: one graph over the whole forward (fusions across blocks, TREAD's routing at static shapes);
    # blocks: regional compile of each block (faster to compile, one graph reused by every block).
    compile_scope: Literal["model", "blocks"] = "model"
    # default: Inductor kernels launched from Python. reduce-overhead: the model's forward and backward
    # replayed as CUDA graphs (they paid at seed size only at tiny batches: B at batch 4 was launch-bound;
    # at the micro-batch auto picks, 32 for B on an H100, the GPU is busy 98% of the step, so graphs could
    # gain at most 2%: docs/benchmarks.md, issue 27); needs one micro-batch per step, since a replay reuses
    # the memory the previous micro-batch's gradients live in (an auto micro-batch below the batch falls
    # back to default, recorded on the run).
    compile_mode: Literal["default", "reduce-overhead"] = "default"
    # fp8 on CUDA, opt-in: keep in FP8 only the linear shapes whose float8 fwd+bwd beats bf16 at the run's
    # token count (speed over the ablation: arm I then may run partly or wholly bf16). Either way a CUDA run
    # times each FP8 shape against bf16 and records it (PrecisionReport.fp8_timings).
    fp8_autotune: bool = False
    fp8_min_speedup: PositiveFloat = 1.02  # bf16 time / fp8 time a shape must reach (above timing noise)
    # Deterministic kernels (torch.use_deterministic_algorithms, Inductor's deterministic mode, cuBLAS's
    # fixed workspace): a rerun, or a stop and resume, is bitwise equal on CUDA too. Off by default: about
    # 28% slower for arm B at seed size on an H100 (docs/benchmarks.md, issue 27).
    deterministic: bool = False


class AdaLNSpec(Strict):
    kind: Literal["per_block", "shared"] = "per_block"
    lora_rank: PositiveInt = 8  # shared: per-block LoRA rank on the shared projection


# Distribution metrics (model/distribution_stats.py): cmmd (CLIP ViT-L/14-336, MMD², Jayasumana et al. 2024),
# dino_mmd (the same MMD² on DINOv2 ViT-B/14), fd_dinov2 (Fréchet distance on DINOv2, Stein et al. 2023), fid
# (Inception; biased ~1/n by a model-dependent amount, so descriptive only: reported, never judged).
DISTRIBUTION_METRICS = ("cmmd", "dino_mmd", "fd_dinov2", "fid")
DESCRIPTIVE_METRICS = frozenset({"fid"})
DistributionMetric = Literal["cmmd", "dino_mmd", "fd_dinov2", "fid"]
# Per-reference-image values an MMD record carries (`<metric>_per_reference`, model/distribution_pass.py): one
# per held-out reference image up to this, group means beyond, so a record stays bounded whatever data.held_out.
MAX_REFERENCE_VALUES = 4096
REFERENCE_SUFFIX = "_per_reference"  # `<mmd>_per_reference`: one value per reference image (or group of them)


class DistributionSpec(Strict):
    """Sample quality as the field reports it, computed on generated samples at checkpoints against held-out
    real images. Sample i is generated from the same prompt and noise for every arm and seed, so the metric is
    paired across arms."""

    metrics: list[DistributionMetric] = Field(default_factory=list, max_length=len(DISTRIBUTION_METRICS))  # []: off
    # Generated samples per pass; the reference is as many held-out images at least. le: each per-sample list
    # crosses the node protocol (protocol.MAX_EVAL_SAMPLES). ge: FD's jackknife needs 2 samples per group.
    # 512 and every 3: at least the 500 samples CMMD's paired interval is checked at (bench/distribution_sim.py), 4
    # measured checkpoints of 10 let the detector judge, and the passes cost 3.8% of a 5000-step seed-size night
    # of A-D at the planner's FLOP prices (bench/distribution_cost.py; 2000 every 2 was 16%).
    samples: Annotated[int, Field(ge=8, le=4096)] = 512
    every: PositiveInt = 3  # each k-th checkpoint (and always the last): a pass is dear
    sampler_steps: Annotated[int, Field(gt=0, le=1000)] = 50  # Euler steps, as eval.sampler_steps
    guidance: Annotated[float, Field(ge=1, le=20)] = 1.0  # classifier-free guidance scale; 1: none (see below)

    @field_validator("metrics")
    @classmethod
    def _no_fid(cls, metrics: list[str]) -> list[str]:  # no pinned Inception extractor (docs/distribution-metrics.md)
        if "fid" in metrics:
            raise ValueError("fid is not offered (no pinned Inception weights; Inception's features are unfair to "
                             "diffusion models, Stein et al. 2023): use fd_dinov2, the Fréchet distance on DINOv2")
        return metrics

    @field_validator("guidance")
    @classmethod
    def _no_guidance(cls, guidance: float) -> float:  # training never drops captions: no unconditional path
        if guidance != 1:
            raise ValueError("classifier-free guidance needs an unconditional model, and arms train with every "
                             "caption (no caption dropout): set eval.distribution.guidance to 1")
        return guidance

    @model_validator(mode="after")
    def _no_repeats(self) -> DistributionSpec:
        repeated = sorted({m for m in self.metrics if self.metrics.count(m) > 1})
        if repeated:
            raise ValueError(f"eval.distribution.metrics names {repeated[0]!r} twice: name each metric once")
        return self


class EvalSpec(Strict):
    num_samples: Annotated[int, Field(gt=0, le=4096)] = 25  # n per metric; le: protocol.MAX_EVAL_SAMPLES
    sampler_steps: PositiveInt = 50  # Euler steps
    seed: Seed = 1234  # per-sample noise is seeded from this and the sample index
    # alexnet: the lpips package's AlexNet; its backbone weights come from lpips_weights (a local file)
    # or torchvision's cache. random_standin: an untrained AlexNet, only when chosen, labelled on metrics.
    lpips_backbone: Literal["alexnet", STANDIN] = "alexnet"
    lpips_weights: str | None = None
    use_ema: bool = True
    distribution: DistributionSpec = DistributionSpec()


class DetectorPolicy(Strict):
    """Collapse-detector policy; see orchestrator/runs/detector.py for how each field is used.

    Defaults are tuned on the published A-D curves: they stop B (best recon LPIPS 0.907 @3000,
    then 0.922, 0.951, ...) at step 4000 and let A, C, D finish (C ends 0.017 above its best).
    """

    # stop: a flagged arm is stopped; warn: flagged and recorded, the arm runs on; off: never judged.
    mode: Literal["stop", "warn", "off"] = "stop"
    # Primary metric, the only one that can stop an arm. "auto": recon_lpips where LPIPS is real,
    # val_flow_loss where a checkpoint's LPIPS came from the random stand-in backbone (it cannot tell
    # two arms apart there); orchestrator/runs/detector.py resolve_policy says how the loss is judged.
    metric: str = "auto"
    metric_mode: Literal["min", "max"] = "min"  # LPIPS and the flow loss: lower is better
    # Secondary metrics and their better direction: they only add warnings, never stop an arm (C's
    # text LPIPS rose 0.038 at the end of a healthy run). text_manip_delta: a larger edit response is better.
    secondary: dict[str, Literal["min", "max"]] = Field(
        default_factory=lambda: {"text_lpips": "min", "text_manip_delta": "max"}
    )
    # k: the metric must have worsened at each of the last k checkpoints; 2 ignores a single noisy
    # checkpoint (n=25 samples) yet catches B at its second worse checkpoint.
    worsening_checkpoints: PositiveInt = 2
    # ... and now be worse than its best by more than this, in metric units: above C's final 0.017
    # rise (not collapse), below B's 0.044 at step 4000.
    margin_abs: Annotated[float, Field(ge=0)] = 0.03
    # ... and by more than this many standard errors of the difference sqrt(se_best^2 + se_now^2).
    margin_se: Annotated[float, Field(ge=0)] = 2.0
    # SE per checkpoint when the metric carries none (no `<metric>_se`): the study's per-sample std
    # 0.030 / sqrt(25). None = judge on margin_abs alone; the reason says which was used.
    assumed_se: Annotated[float, Field(gt=0)] | None = 0.006
    ceiling: float | None = 1.0  # crossing it is collapse at once: LPIPS >= 1 is worse than a trivial baseline
    stall_grace_fraction: Fraction = 0.4  # no stall verdict before this fraction of the steps
    # stalled: the arm's best is worse than the control's best up to the same step by more than this.
    # Generous on purpose: a weaker arm finishing is a result; only a clear failure (H: 0.982) stops.
    stall_margin: Annotated[float, Field(ge=0)] = 0.05
    # Besides metric and secondary: NaN/Inf in any of these means diverged.
    divergence_fields: list[str] = Field(default_factory=lambda: ["train_loss", "grad_norm"])

    @model_validator(mode="after")
    def _primary_not_secondary(self) -> DetectorPolicy:
        # "auto" may judge either of the two
        primary = {"recon_lpips", "val_flow_loss"} if self.metric == "auto" else {self.metric}
        for name in sorted(primary & set(self.secondary)):
            raise ValueError(f"detector.secondary must not repeat the primary metric {name!r} (metric {self.metric!r})")
        return self

    def judged_metric(self, lpips_standin: bool) -> str:
        """The metric "auto" stands for (recon_lpips, or the flow headline where LPIPS is the random stand-in),
        else the metric named: what the detector judges and what the trainer keeps best.pt by."""
        if self.metric != "auto":
            return self.metric
        return HEADLINE if lpips_standin else "recon_lpips"


class ArmSpec(Strict):
    name: str = "A"
    parent: str | None = None
    description: str = ""
    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    schedule: TrainingSchedule = TrainingSchedule()
    tread: TreadSpec = TreadSpec()
    repa: RepaSpec = RepaSpec()
    flow: FlowSpec = FlowSpec()
    precision: PrecisionSpec = PrecisionSpec()
    adaln: AdaLNSpec = AdaLNSpec()
    eval: EvalSpec = EvalSpec()
    detector: DetectorPolicy = DetectorPolicy()
    # Set: the arm runs this command instead of the built-in trainer (the sections above are unused
    # except detector); None: ablate's own NanoDiT.
    command: CommandSpec | None = None
    # GPUs of one node the built-in trainer uses, data-parallel (worker/ranks.py): the global batch
    # (schedule.batch_size) is split evenly over the ranks, so results are those of one GPU at that
    # batch. A command arm asks in command.gpus instead.
    gpus: Annotated[int, Field(gt=0, le=MAX_ARM_GPUS)] = 1

    @model_validator(mode="after")
    def _cross_section(self) -> ArmSpec:
        depth = self.model.dims().depth
        if self.tread.enabled:
            last = self.tread.last_block if self.tread.last_block is not None else depth - 2
            if not 0 <= self.tread.first_block <= last < depth:
                raise ValueError(f"tread blocks {self.tread.first_block}..{last} must lie within 0..{depth - 1}")
        if self.repa.enabled and self.repa.block is not None and self.repa.block >= depth:
            raise ValueError(f"repa.block ({self.repa.block}) must be < model depth ({depth})")
        if self.flow.kind == "asymflow":
            patch = self.model.dims().patch
            if self.flow.rank > 3 * patch * patch:
                raise ValueError(f"flow.rank ({self.flow.rank}) exceeds the patch dimension {3 * patch * patch}")
        if self.command is not None and self.gpus != 1:
            raise ValueError(f"a command arm asks for GPUs in command.gpus, not gpus ({self.gpus})")
        if self.schedule.batch_size % self.gpus:
            raise ValueError(
                f"schedule.batch_size ({self.schedule.batch_size}) must be divisible by gpus ({self.gpus}): "
                "each GPU trains on batch_size / gpus images of every step"
            )
        micro, rank_batch = self.schedule.fixed_micro_batch(), self.rank_batch()
        if micro is not None and rank_batch % micro:
            raise ValueError(
                f"the micro-batch ({micro}) must divide each GPU's share of the batch "
                f"(batch_size {self.schedule.batch_size} / gpus {self.gpus} = {rank_batch})"
            )
        if self.precision.compile_mode == "reduce-overhead" and micro is not None and micro != rank_batch:
            raise ValueError(
                "precision.compile_mode 'reduce-overhead' needs one micro-batch per step "
                f"(got micro-batch {micro} of {rank_batch}): use compile_mode default, "
                "or a batch_size that fits one micro-batch"
            )
        # the metrics are computed on held-out images: fail at submission, not at the first checkpoint
        if self.eval.num_samples > self.data.held_out:
            raise ValueError(
                f"eval.num_samples ({self.eval.num_samples}) exceeds data.held_out ({self.data.held_out}): "
                "raise data.held_out or lower eval.num_samples"
            )
        dist = self.eval.distribution
        if dist.metrics and dist.samples > self.data.held_out:  # the reference set: at least as many real images
            raise ValueError(
                f"eval.distribution.samples ({dist.samples}) exceeds data.held_out ({self.data.held_out}): the "
                "reference set is held-out images, at least as many as the samples; raise data.held_out or lower "
                "eval.distribution.samples"
            )
        judged = self.detector.metric  # a command arm's own metric may share a name: its command measures it
        if self.command is None and judged in DESCRIPTIVE_METRICS:
            raise ValueError(f"detector.metric {judged!r} is descriptive (its small-n bias depends on the model), "
                             "so it cannot judge: name cmmd, dino_mmd or fd_dinov2")  # fmt: skip
        if self.command is None and judged in DISTRIBUTION_METRICS and judged not in dist.metrics:
            raise ValueError(f"detector.metric {judged!r} is not measured: add it to eval.distribution.metrics")
        return self

    def resolution(self) -> int:
        return self.data.resolution or self.model.dims().resolution

    def gpu_count(self) -> int:
        """GPUs of one node the arm holds: command.gpus for a command arm, else gpus."""
        return self.command.gpus if self.command is not None else self.gpus

    def rank_batch(self) -> int:
        """Images of each step that one rank (one GPU) trains on."""
        return self.schedule.batch_size // self.gpus


# -- resources ---------------------------------------------------------------------------------------

# Bytes per parameter held on the GPU while training: fp32 weights, grads, two AdamW moments, EMA.
STATE_BYTES_PER_PARAM = 20
# Activation elements kept per token and block for the backward pass, per unit of hidden width: the
# attention's norm input, q/k/v, output and projection (~6), cross-attention (~4), and the FFN's two
# mlp_ratio-wide tensors; SDPA keeps no (T x T) scores on GPU. An estimate, within ~2x of measured.
ACT_ELEMS_PER_HIDDEN = 10


def estimate_params(spec: ArmSpec) -> int:
    """Rough parameter count without building the model: per block, self- and cross-attention (8 D^2),
    the FFN (2 * mlp_ratio * D^2) and the adaLN modulation (6 D^2, shared in arm H)."""
    d = spec.model.dims()
    per_block = (8 + 2 * spec.model.mlp_ratio) * d.hidden**2
    adaln = 6 * d.hidden**2 * (1 if spec.adaln.kind == "shared" else d.depth)
    return int(d.depth * per_block + adaln + 3 * d.patch**2 * d.hidden * 2)


def estimate_state_bytes(spec: ArmSpec) -> int:
    """Training state on the GPU whatever the batch: weights, grads, optimizer moments, EMA."""
    return estimate_params(spec) * STATE_BYTES_PER_PARAM


def estimate_peak_bytes(spec: ArmSpec) -> int:
    """Estimated peak GPU memory of one arm: training state plus one micro-batch's activations (one image
    where the micro-batch is auto: the least it can pick, so this is what must fit at all)."""
    d = spec.model.dims()
    tokens = (spec.resolution() // d.patch) ** 2 + d.text_tokens + spec.model.identity_tokens
    micro = spec.schedule.fixed_micro_batch() or 1
    act_bytes = 4 if spec.precision.mode == "fp32" else 2
    per_token_block = (ACT_ELEMS_PER_HIDDEN + 2 * spec.model.mlp_ratio) * d.hidden * act_bytes
    return int(estimate_state_bytes(spec) + micro * tokens * d.depth * per_token_block)
