"""Optimizers, the learning-rate schedule and the EMA of the weights.

AdamW everywhere (arm A), or Muon (Jordan et al. 2024, `torch.optim.Muon`) on the 2-D hidden
weights, i.e. the weights of the linear layers inside the transformer blocks, with AdamW on
everything else: embeddings, norms, biases, the output layer, the text embedding and the REPA
projector. Muon's own docs say it is "only for hidden weight layers"; input/output layers and
gains belong to AdamW.

Muon is `BatchedMuon`: `torch.optim.Muon`'s update (same state, same hyper-parameters) with the
Newton-Schulz iteration batched over all weights of one shape: at seed size 144 matrices fall into 8
shape groups, so a step is 8 chains of batched matmuls instead of 144 chains of small ones, which
kept `torch.optim.Muon` host-bound (docs/benchmarks.md). NVIDIA's Emerging-Optimizers has a Muon
but is not on PyPI (install from source only), so it is not used.

On CUDA, AdamW is the fused kernel and `OptimizerStep` can run the optimizer steps compiled
(PyTorch's "compiling the optimizer" recipe). On CPU everything stays eager with a float lr.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from model.spec import ArmSpec, EMASpec, TrainingSchedule

# Module-name prefix under which the transformer blocks live (NanoDiT.blocks).
BLOCKS_PREFIX = "blocks."


def hidden_weight_names(model: nn.Module) -> list[str]:
    """Names of the 2-D weights of the nn.Linear layers inside the blocks: Muon's parameters."""
    names = []
    for mod_name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and mod_name.startswith(BLOCKS_PREFIX) and mod.weight.requires_grad:
            names.append(f"{mod_name}.weight")
    return names


def newton_schulz_batched(g: Tensor, steps: int, coefficients: tuple[float, float, float], eps: float) -> Tensor:
    """`torch.optim.Muon`'s quintic Newton-Schulz on a stack (n, rows, cols) of same-shape matrices, in bf16.

    Each matrix is normalised by its own Frobenius norm and iterated as in `torch.optim._muon`
    (wide orientation: the Gram matrix is the small side).
    """
    a, b, c = coefficients
    x = g.bfloat16()
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT  # (n, r, r), r the small side
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, update, x, beta=a)
    return x.mT if tall else x


class BatchedMuon(torch.optim.Muon):
    """`torch.optim.Muon` with one batched Newton-Schulz per group of same-shape weights.

    Same constructor, parameter groups and state ("momentum_buffer" per parameter) as
    `torch.optim.Muon`, so checkpoints load either way; the update matches it to bf16 rounding
    (tests/model/test_optim.py). Momentum, weight decay and the parameter update are foreach ops.
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            if not params:
                continue
            lr, mom = group["lr"], group["momentum"]
            torch._foreach_lerp_(bufs, grads, 1 - mom)
            updates = torch._foreach_lerp(grads, bufs, mom) if group["nesterov"] else bufs
            if group["weight_decay"]:
                decay = 1 - lr * group["weight_decay"]
                torch._foreach_mul_(params, decay)
            by_shape: dict[tuple[int, ...], list[int]] = {}
            for i, p in enumerate(params):
                by_shape.setdefault(tuple(p.shape), []).append(i)
            for shape, idx in by_shape.items():
                ortho = newton_schulz_batched(
                    torch.stack([updates[i] for i in idx]), group["ns_steps"], group["ns_coefficients"], group["eps"]
                )
                scale = -_adjust_lr_ratio(group["adjust_lr_fn"], shape) * lr
                dst = [params[i] for i in idx]
                if isinstance(scale, Tensor):  # compiled step: lr is a 0-d tensor; fp32 as Muon's alpha
                    torch._foreach_add_(dst, torch._foreach_mul(list(ortho.float().unbind(0)), scale))
                else:
                    torch._foreach_add_(dst, list(ortho.unbind(0)), alpha=scale)
        return loss


def _adjust_lr_ratio(adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    """`torch.optim.Muon`'s per-shape lr factor (its `_adjust_lr` over lr = 1)."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


def _adamw_groups(named: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Weight decay on matrices and embeddings, none on 1-D tensors (biases, norm gains), as nanoGPT."""
    decay, no_decay = [], []
    for _, p in named:
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizers(
    model: nn.Module, spec: ArmSpec, extra: Iterable[tuple[str, nn.Parameter]] = ()
) -> list[torch.optim.Optimizer]:
    """The optimizers for `model` (the DiT) plus `extra` named parameters (text embedding, REPA projector).

    optimizer.name "adamw": one AdamW. "muon": [BatchedMuon over hidden_weight_names(model), AdamW over the rest].
    The lr is set per step by `set_lr`; the initial value here is the peak lr.
    """
    opt = spec.optimizer
    lr = spec.schedule.lr
    named = list(model.named_parameters()) + list(extra)
    if opt.name == "adamw":
        hidden: list[nn.Parameter] = []
        rest = named
    else:
        names = set(hidden_weight_names(model))
        if not names:
            raise ValueError("optimizer.name 'muon' found no 2-D hidden weights (nn.Linear under 'blocks.')")
        hidden = [p for n, p in model.named_parameters() if n in names]
        hidden_ids = {id(p) for p in hidden}
        rest = [(n, p) for n, p in named if id(p) not in hidden_ids]
    optimizers: list[torch.optim.Optimizer] = []
    if hidden:
        m = opt.muon
        optimizers.append(
            BatchedMuon(
                hidden,
                lr=lr,
                weight_decay=opt.weight_decay,
                momentum=m.momentum,
                nesterov=m.nesterov,
                ns_steps=m.ns_steps,
                adjust_lr_fn=m.adjust_lr_fn,
            )
        )
    groups = _adamw_groups(rest, opt.weight_decay)
    if groups:
        # Fused (one kernel for all tensors) needs every parameter on CUDA; elsewhere the default.
        on_cuda = all(p.is_cuda for g in groups for p in g["params"])
        fused = {"fused": True} if on_cuda else {}
        optimizers.append(torch.optim.AdamW(groups, lr=lr, betas=tuple(opt.betas), eps=opt.eps, **fused))
    return optimizers


def lr_at(step: int, schedule: TrainingSchedule) -> float:
    """Learning rate for optimizer step `step` (0-based).

    Linear warm-up from lr/warmup to lr over `warmup_steps`, then cosine from lr to min_lr at the
    last step (or constant lr). Past `lr_explode_after` the lr is multiplied by `lr_explode_factor`
    (a real lr spike that makes a run break: the collapse detector's tests and the demo's broken arm).
    """
    s = schedule
    if step < s.warmup_steps:
        lr = s.lr * (step + 1) / s.warmup_steps
    elif s.lr_schedule == "constant":
        lr = s.lr
    else:
        span = max(1, s.steps - 1 - s.warmup_steps)
        progress = min(1.0, (step - s.warmup_steps) / span)
        lr = s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * progress))
    if s.lr_explode_after is not None and step >= s.lr_explode_after:
        lr *= s.lr_explode_factor
    return lr


def set_lr(optimizers: Iterable[torch.optim.Optimizer], lr: float) -> None:
    """Set every group's lr; a tensor lr (compiled step) is filled in place so nothing recompiles."""
    for o in optimizers:
        for g in o.param_groups:
            if isinstance(g["lr"], torch.Tensor):
                g["lr"].fill_(lr)
            else:
                g["lr"] = lr


def _lr_as(optimizers: Iterable[torch.optim.Optimizer], tensor_on: torch.device | None) -> None:
    """Make each group's lr a 0-d float32 tensor on `tensor_on` (None: a Python float).

    A float lr is a constant to torch.compile (a new value recompiles); a tensor is an input.
    Checkpoints may hold either, so this runs before every step (a few groups: microseconds).
    """
    for o in optimizers:
        for g in o.param_groups:
            lr = g["lr"]
            if tensor_on is None:
                if isinstance(lr, torch.Tensor):
                    g["lr"] = lr.item()
            elif not isinstance(lr, torch.Tensor) or lr.device != tensor_on or lr.dim() != 0:
                g["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=tensor_on)


class OptimizerStep:
    """`step()` of every optimizer: eager, or (compile=True on CUDA) one `torch.compile`d function.

    Which optimizers are compiled: those that are not fused (Muon; AdamW where not fused). The fused
    AdamW is already one multi-tensor kernel and runs eagerly. The first call runs eagerly too: it
    creates the optimizer state, so the compiled function is traced once, on the second call.
    If compiling fails, the step falls back to eager and `fallback` says why (the trainer records
    it in the run's fallbacks through `on_fallback`). CPU: always eager, lr stays a float.
    """

    def __init__(
        self,
        optimizers: list[torch.optim.Optimizer],
        compile: bool,
        device: torch.device,
        on_fallback: Callable[[str], None] | None = None,
        mode: str | None = None,
        options: dict | None = None,
    ) -> None:
        self.optimizers = optimizers
        self.device = device
        self.on_fallback = on_fallback
        self.fallback: str | None = None
        self.compiled_ids: list[int] = []
        self._calls = 0
        self._fn: Callable[[], None] | None = None
        if compile and device.type == "cuda":
            targets = [o for o in optimizers if not any(g.get("fused") for g in o.param_groups)]
            if targets:
                self.compiled_ids = [id(o) for o in targets]
                self._targets = targets

                def _step() -> None:
                    for o in targets:
                        o.step()

                self._fn = torch.compile(_step, mode=mode, options=options)

    @property
    def compiled(self) -> bool:
        """Whether the compiled path is (still) in use."""
        return self._fn is not None

    def _eager(self) -> None:
        for o in self.optimizers:
            o.step()

    def __call__(self) -> None:
        if self._fn is None:
            self._eager()
            return
        _lr_as(self._targets, self.device)
        self._calls += 1
        if self._calls == 1:
            self._eager()  # creates the state (momentum buffers) outside the trace
            return
        rest = [o for o in self.optimizers if id(o) not in self.compiled_ids]
        if self._calls == 2:
            try:
                self._fn()
            except Exception as exc:  # noqa: BLE001 - any compile error: record it, go on eagerly
                self._fn = None
                _lr_as(self._targets, None)  # eager Muon with a tensor lr would sync per parameter
                self.fallback = f"compiled optimizer step failed ({type(exc).__name__}: {exc}): eager optimizer step"
                if self.on_fallback is not None:
                    self.on_fallback(self.fallback)
                self._eager()
                return
        else:
            self._fn()
        for o in rest:
            o.step()


def ema_decay(step: int, ema: EMASpec) -> float:
    """EMA decay after optimizer step `step`: min(decay, (1+s)/(10+s)) during warm-up, then `decay`.

    The warm-up keeps the average from being dominated by the random initial weights.
    """
    if step < ema.warmup_steps:
        return min(ema.decay, (1 + step) / (10 + step))
    return ema.decay


class EMA:
    """An exponential moving average of a module's floating-point parameters (buffers are copied).

    `module` is a frozen deep copy used for evaluation; the average is kept in float32.
    """

    def __init__(self, model: nn.Module, spec: EMASpec) -> None:
        self.spec = spec
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        for p in self.module.parameters():
            p.data = p.data.float()

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> float:
        """Blend the live weights in after optimizer step `step`; returns the decay used.

        Parameters are matched by name, so `model` may since have been converted (FP8) or compiled.
        """
        d = ema_decay(step, self.spec)
        live = dict(model.named_parameters())
        mine = dict(self.module.named_parameters())
        if live.keys() != mine.keys():
            raise ValueError("EMA and model parameter names differ; the EMA must copy this model")
        names = list(mine)
        torch._foreach_lerp_([mine[n] for n in names], [live[n].detach().float() for n in names], 1.0 - d)
        live_buffers = dict(model.named_buffers())
        for name, buf in self.module.named_buffers():
            buf.copy_(live_buffers[name])
        return d

    def state_dict(self) -> dict:
        return self.module.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state)
