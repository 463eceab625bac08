"""Optimizer split, lr schedule, EMA warm-up."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from model.optim import EMA, BatchedMuon, build_optimizers, ema_decay, hidden_weight_names, lr_at, set_lr
from model.spec import ArmSpec, EMASpec, TrainingSchedule


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.fc1 = nn.Linear(d, 4 * d)  # has a bias: the bias goes to AdamW
        self.ada = nn.Linear(d, 6 * d)
        self.gain = nn.Parameter(torch.ones(d))


class Toy(nn.Module):
    """Named like NanoDiT: embeddings and output outside `blocks`, hidden linears inside."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.patch_embed = nn.Linear(48, d)
        self.t_embed = nn.Sequential(nn.Linear(16, d), nn.SiLU(), nn.Linear(d, d))
        self.pos = nn.Parameter(torch.zeros(1, 4, d))
        self.blocks = nn.ModuleList([Block(d) for _ in range(2)])
        self.final = nn.Linear(d, 48)


def _spec(name: str) -> ArmSpec:
    return ArmSpec.model_validate({"optimizer": {"name": name}, "schedule": {"lr": 1e-3}})


def test_muon_gets_exactly_the_hidden_weights() -> None:
    model = Toy()
    text = nn.Embedding(10, 8)
    opts = build_optimizers(model, _spec("muon"), extra=text.named_parameters())
    assert [type(o) for o in opts] == [BatchedMuon, torch.optim.AdamW]
    names = {id(p): n for n, p in model.named_parameters()}
    muon_names = {names[id(p)] for g in opts[0].param_groups for p in g["params"]}
    expected = {f"blocks.{i}.{m}.weight" for i in range(2) for m in ("qkv", "fc1", "ada")}
    assert muon_names == expected == set(hidden_weight_names(model))
    adam = [p for g in opts[1].param_groups for p in g["params"]]
    # Everything else, the text embedding included, is in AdamW; nothing is in both or missing.
    all_ids = {id(p) for p in model.parameters()} | {id(text.weight)}
    muon_ids = {id(p) for g in opts[0].param_groups for p in g["params"]}
    assert {id(p) for p in adam} | muon_ids == all_ids
    assert len(adam) + len(expected) == len(all_ids)
    m = opts[0].defaults
    assert (m["momentum"], m["nesterov"], m["ns_steps"], m["adjust_lr_fn"]) == (0.95, True, 5, "match_rms_adamw")


def test_adamw_only_and_decay_groups() -> None:
    model = Toy()
    (opt,) = build_optimizers(model, _spec("adamw"))
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["betas"] == (0.9, 0.95)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.03 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_both_optimizers_step() -> None:
    model = Toy()
    opts = build_optimizers(model, _spec("muon"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.final(model.blocks[0].fc1(model.patch_embed(torch.randn(3, 48)))[:, :8]).pow(2).mean().backward()
    for o in opts:
        o.step()
    after = dict(model.named_parameters())
    assert not torch.equal(before["blocks.0.fc1.weight"], after["blocks.0.fc1.weight"])
    assert not torch.equal(before["final.weight"], after["final.weight"])
    set_lr(opts, 0.123)
    assert all(g["lr"] == 0.123 for o in opts for g in o.param_groups)


def test_lr_schedule_values() -> None:
    s = TrainingSchedule(steps=110, lr=1e-3, min_lr=1e-5, warmup_steps=10)
    assert lr_at(0, s) == pytest.approx(1e-4)
    assert lr_at(4, s) == pytest.approx(5e-4)
    assert lr_at(9, s) == pytest.approx(1e-3)
    assert lr_at(10, s) == pytest.approx(1e-3)  # cosine starts at the peak
    mid = 10 + (110 - 1 - 10) / 2
    assert lr_at(int(mid), s) == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * 49 / 99)))
    assert lr_at(109, s) == pytest.approx(1e-5)  # min_lr at the last step
    lrs = [lr_at(i, s) for i in range(10, 110)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    const = TrainingSchedule(steps=100, lr=1e-3, min_lr=0, warmup_steps=0, lr_schedule="constant")
    assert lr_at(0, const) == lr_at(99, const) == 1e-3


def test_lr_explode_hook() -> None:
    s = TrainingSchedule(steps=100, lr=1e-3, min_lr=1e-3, warmup_steps=0, lr_explode_after=50, lr_explode_factor=30.0)
    assert lr_at(49, s) == pytest.approx(1e-3)
    assert lr_at(50, s) == pytest.approx(3e-2)


def test_ema_warmup_and_update() -> None:
    spec = EMASpec(decay=0.999, warmup_steps=100)
    assert ema_decay(0, spec) == pytest.approx(0.1)
    assert ema_decay(10, spec) == pytest.approx(11 / 20)
    assert ema_decay(99, spec) == pytest.approx(100 / 109)
    assert ema_decay(100, spec) == 0.999
    assert ema_decay(10, EMASpec(decay=0.5, warmup_steps=100)) == 0.5  # never above decay

    model = nn.Linear(2, 2, bias=False)
    nn.init.zeros_(model.weight)
    ema = EMA(model, spec)
    with torch.no_grad():
        model.weight.fill_(1.0)
    d = ema.update(model, step=0)  # decay 0.1: EMA moves 90% of the way
    assert d == pytest.approx(0.1)
    assert torch.allclose(ema.module.weight, torch.full((2, 2), 0.9))
    ema.update(model, step=1000)  # decay 0.999
    assert torch.allclose(ema.module.weight, torch.full((2, 2), 0.9 + 0.1 * 0.001))
    assert not ema.module.weight.requires_grad
    state = ema.state_dict()
    other = EMA(nn.Linear(2, 2, bias=False), spec)
    other.load_state_dict(state)
    assert torch.equal(other.module.weight, ema.module.weight)


def test_muon_split_on_nanodit() -> None:
    from model.nanodit import NanoDiT

    spec = ArmSpec.model_validate({"model": {"size": "tiny"}, "optimizer": {"name": "muon"}})
    model = NanoDiT(spec, text_dim=16)
    muon, adamw = build_optimizers(model, spec)
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = sorted(names[id(p)] for g in muon.param_groups for p in g["params"])
    in_adamw = sorted(names[id(p)] for g in adamw.param_groups for p in g["params"])
    assert all(n.startswith("blocks.") and n.endswith(".weight") for n in in_muon)
    assert all(model.get_parameter(n).dim() == 2 for n in in_muon)
    assert {"blocks.0.attn.qkv.weight", "blocks.0.mlp.fc2.weight", "blocks.3.cross.kv.weight"} <= set(in_muon)
    # Embeddings, output layer, biases and everything outside the blocks stay on AdamW.
    assert {"x_embed.weight", "final.linear.weight", "null_token", "blocks.0.adaLN.1.bias"} <= set(in_adamw)
    assert not any(n.startswith("blocks.") and n.endswith(".weight") and model.get_parameter(n).dim() == 2
                   for n in in_adamw)
    assert len(in_muon) + len(in_adamw) == len(names)


@pytest.mark.parametrize(
    ("adjust", "tensor_lr"), [("match_rms_adamw", False), ("original", False), ("match_rms_adamw", True)]
)
def test_batched_muon_matches_torch_muon(adjust: str, tensor_lr: bool) -> None:
    """Same gradients, three steps: BatchedMuon's weights and momentum match torch.optim.Muon's to bf16 rounding.

    tensor_lr: the compiled step's 0-d tensor lr takes the other update path.
    """
    g = torch.Generator().manual_seed(0)
    shapes = [(24, 8), (24, 8), (8, 24), (16, 16), (8, 24), (16, 16), (24, 8)]  # tall, wide, square
    ours = [nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    ref = [nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    kw = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.9, "nesterov": True, "adjust_lr_fn": adjust}
    opt = BatchedMuon(ours, **{**kw, "lr": torch.tensor(0.02) if tensor_lr else 0.02})
    ref_opt = torch.optim.Muon(ref, **kw)
    for _ in range(3):
        for a, b in zip(ours, ref, strict=True):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        ref_opt.step()
    for a, b, s in zip(ours, ref, start, strict=True):
        delta_ours, delta_ref = a.detach() - s, b.detach() - s  # compare the updates, not the (large) weights
        rel = (delta_ours - delta_ref).norm() / delta_ref.norm()
        assert rel < 4e-3, rel  # bf16 Newton-Schulz: per-element rounding ~2^-8 on a small update
        assert torch.equal(opt.state[a]["momentum_buffer"], ref_opt.state[b]["momentum_buffer"])
    assert opt.state_dict()["state"].keys() == ref_opt.state_dict()["state"].keys()


def test_batched_muon_update_is_orthogonalised() -> None:
    """The update itself, not only the weights: (param change) / lr has singular values near 1."""
    p = nn.Parameter(torch.zeros(16, 48))
    p.grad = torch.randn(16, 48, generator=torch.Generator().manual_seed(3))
    BatchedMuon([p], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False, adjust_lr_fn="original").step()
    s = torch.linalg.svdvals(p.detach())
    assert 0.5 < s.min() and s.max() < 1.5  # Muon's quintic iteration lands in roughly (0.7, 1.2)
