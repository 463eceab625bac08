"""NanoDiT: identity at init, shapes for every arm, TREAD routing, parameter counts."""

import pytest
import torch
from torch import nn

from model.nanodit import STUDY_TEXT_DIM, NanoDiT, count_params
from orchestrator.grids.arms import resolve

TEXT_DIM = 24


def tiny(arm: str, **over) -> NanoDiT:
    torch.manual_seed(0)
    return NanoDiT(resolve(arm, {"model": {"size": "tiny"}, **over}), TEXT_DIM)


def inputs(b: int = 2, res: int = 32, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, 3, res, res, generator=g)
    t = torch.rand(b, generator=g)
    text = torch.randn(b, 16, TEXT_DIM, generator=g)
    mask = torch.ones(b, 16, dtype=torch.bool)
    mask[0, 5:] = False  # a padded caption
    return x, t, text, mask


def perturb(model: nn.Module) -> None:
    """Move every parameter off its init, as training would."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.mark.parametrize("arm", ["A", "H"])
def test_blocks_are_identity_and_output_zero_at_init(arm):
    model = tiny(arm)
    x, t, text, mask = inputs()
    seen = []
    for block in model.blocks:
        block.register_forward_hook(lambda mod, args, out: seen.append(torch.equal(args[0], out)))
    out = model(x, t, text, mask, identity=x).out
    assert seen == [True] * len(model.blocks)  # adaLN-zero + zero cross-attn output: each block is identity
    assert torch.count_nonzero(out) == 0  # zero-init output layer
    perturb(model)
    assert model(x, t, text, mask, identity=x).out.abs().sum() > 0  # ...and not by construction


@pytest.mark.parametrize("arm", list("ABCDEFGHI"))
def test_shapes_every_arm(arm):
    model = tiny(arm)
    perturb(model)
    x, t, text, mask = inputs()
    repa_block = model.depth // 2
    res = model(x, t, text, mask, identity=x, repa_block=repa_block)
    assert res.out.shape == x.shape and torch.isfinite(res.out).all()
    n_tokens = (32 // model.patch) ** 2
    if model.tread.enabled:  # training mode: the middle block sees half the tokens
        assert res.hidden.shape == (2, n_tokens // 2, model.hidden) and res.kept.shape == (2, n_tokens // 2)
    else:
        assert res.hidden.shape == (2, n_tokens, model.hidden) and res.kept is None
    res.out.square().mean().backward()
    # text-only generation (no identity) and no mask work too
    assert model(x, t, text).out.shape == x.shape


def test_fully_masked_caption_is_finite():
    model = tiny("A")
    perturb(model)
    x, t, text, _ = inputs()
    mask = torch.zeros(2, 16, dtype=torch.bool)
    assert torch.isfinite(model(x, t, text, mask).out).all()  # the null token is always attended


def test_tread_no_effect_in_eval_and_routes_in_training():
    plain, routed = tiny("A"), tiny("B")
    routed.load_state_dict(plain.state_dict())  # same weights; B only adds routing
    perturb(plain)
    routed.load_state_dict(plain.state_dict())
    x, t, text, mask = inputs()
    plain.eval()
    routed.eval()
    with torch.no_grad():
        assert torch.equal(plain(x, t, text, mask).out, routed(x, t, text, mask).out)
        ev = routed(x, t, text, mask, repa_block=2)
    assert ev.kept is None and ev.hidden.shape[1] == 64
    plain.train()
    routed.train()
    torch.manual_seed(3)
    a = routed(x, t, text, mask, repa_block=2)
    torch.manual_seed(3)
    b = routed(x, t, text, mask, repa_block=2)
    torch.manual_seed(4)
    c = routed(x, t, text, mask, repa_block=2)
    assert torch.equal(a.out, b.out) and torch.equal(a.kept, b.kept)  # global RNG: reproducible on resume
    assert not torch.equal(a.kept, c.kept)  # a fresh permutation per step
    assert a.kept.shape == (2, 32) and all(len(set(row.tolist())) == 32 for row in a.kept)
    assert not torch.allclose(a.out, plain(x, t, text, mask).out)  # routing changes the training forward


def test_tread_routed_tokens_skip_the_blocks():
    model = tiny("B")
    perturb(model)
    model.train()
    x, t, text, mask = inputs()
    entering, leaving = {}, {}
    first, last = model.tread.first_block, model.tread_last
    model.blocks[first].register_forward_pre_hook(lambda m, a: entering.update(x=a[0]))  # returns None
    model.blocks[last].register_forward_hook(lambda m, a, o: leaving.update(x=o))
    torch.manual_seed(0)
    res = model(x, t, text, mask, repa_block=last)
    assert entering["x"].shape[1] == 32 and leaving["x"].shape[1] == 32
    assert torch.equal(res.hidden, leaving["x"])


def test_seed_param_count_and_shared_adaln_saving():
    counts = {}
    for arm in "AGH":
        with torch.device("meta"):
            counts[arm] = count_params(NanoDiT(resolve(arm), STUDY_TEXT_DIM))["params"]
    assert abs(counts["A"] - 239e6) / 239e6 <= 0.02
    assert counts["G"] == counts["A"]  # G changes the target, not the network
    assert 55e6 < counts["A"] - counts["H"] < 63e6  # arm H's shared adaLN + LoRA saves ~59M


def test_tiny_is_a_few_hundred_thousand_params():
    info = count_params(tiny("A"))
    assert 1e5 < info["params"] < 1e6
    assert sum(info["breakdown"].values()) == info["params"]


def test_model_info_cli(capsys):
    import json

    from orchestrator.cli.model_info import model_info

    model_info("H", size="tiny", text_dim=TEXT_DIM)
    info = json.loads(capsys.readouterr().out)
    assert info["params"] == count_params(tiny("H"))["params"]
    assert "blocks.*.adaLN" in info["breakdown"] and "shared_adaLN" in info["breakdown"]
