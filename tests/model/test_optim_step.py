"""OptimizerStep: eager on CPU (bit-identical to stepping each optimizer), tensor lr, compile fallback."""

from __future__ import annotations

import torch
from torch import nn

from model.optim import OptimizerStep, build_optimizers, set_lr
from model.spec import ArmSpec


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)) for _ in range(2)])
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.out(x)


def _setup(seed: int = 0) -> tuple[Net, list[torch.optim.Optimizer]]:
    torch.manual_seed(seed)
    net = Net()
    spec = ArmSpec.model_validate({"optimizer": {"name": "muon"}, "schedule": {"lr": 1e-2}})
    return net, build_optimizers(net, spec)


def _train(net: Net, step_fn, opts: list[torch.optim.Optimizer], steps: int = 3) -> None:
    gen = torch.Generator().manual_seed(1)
    for i in range(steps):
        loss = net(torch.randn(4, 6, generator=gen)).square().mean()
        loss.backward()
        set_lr(opts, 1e-2 / (i + 1))
        step_fn()
        for o in opts:
            o.zero_grad(set_to_none=True)


def test_cpu_step_is_eager_and_bit_identical() -> None:
    net_a, opts_a = _setup()
    net_b, opts_b = _setup()
    assert not any(g.get("fused") for o in opts_a for g in o.param_groups)  # fused only on CUDA
    step = OptimizerStep(opts_b, compile=True, device=torch.device("cpu"))
    assert not step.compiled
    _train(net_a, lambda: [o.step() for o in opts_a], opts_a)
    _train(net_b, step, opts_b)
    for pa, pb in zip(net_a.parameters(), net_b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert all(isinstance(g["lr"], float) for o in opts_b for g in o.param_groups)


def test_set_lr_fills_a_tensor_lr_in_place() -> None:
    _, opts = _setup()
    lr = torch.tensor(0.5)
    opts[0].param_groups[0]["lr"] = lr
    set_lr(opts, 0.25)
    assert opts[0].param_groups[0]["lr"] is lr and lr.item() == 0.25
    assert opts[1].param_groups[0]["lr"] == 0.25


def test_compile_failure_falls_back_to_eager_and_is_recorded() -> None:
    net, opts = _setup()
    ref_net, ref_opts = _setup()
    seen: list[str] = []
    step = OptimizerStep(opts, compile=False, device=torch.device("cpu"), on_fallback=seen.append)

    def broken() -> None:
        raise RuntimeError("no compiler")

    # What __init__ sets up on CUDA, with a compile that fails; the device stays CPU for the lr tensors.
    step._fn, step._targets, step.compiled_ids = broken, [opts[0]], [id(opts[0])]
    _train(net, step, opts)
    _train(ref_net, lambda: [o.step() for o in ref_opts], ref_opts)
    assert not step.compiled
    assert seen == [step.fallback] and "RuntimeError: no compiler" in seen[0]
    assert isinstance(opts[0].param_groups[0]["lr"], float)  # back to a float after the fallback
    for p, q in zip(net.parameters(), ref_net.parameters(), strict=True):
        torch.testing.assert_close(p, q)  # every step applied exactly once
