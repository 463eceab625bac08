"""LPIPS: the labelled random stand-in, the AlexNet trunk from a local file or torch's hub cache, and the
missing-weights errors (offline, and a download that fails). Nothing here downloads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model import perceptual
from model.perceptual import LPIPSWeightsError, import_torchvision, load_lpips
from model.spec import EvalSpec

STANDIN = EvalSpec(lpips_backbone="random_standin")


@pytest.fixture(autouse=True)
def no_weights_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty torchvision cache and no ABLATE_LPIPS_WEIGHTS, whatever this machine has."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.delenv("ABLATE_LPIPS_WEIGHTS", raising=False)


@pytest.fixture(scope="module")
def alexnet_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A freshly initialised torchvision alexnet state dict saved to a file (stands in for the ImageNet one)."""
    tv = import_torchvision()
    torch.manual_seed(123)
    state = tv.models.alexnet(weights=None).state_dict()
    path = tmp_path_factory.mktemp("weights") / "alexnet.pth"
    torch.save(state, path)
    return path, state


def images(seed: int, n: int = 4, side: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    smooth = torch.nn.functional.interpolate(torch.rand(n, 3, side // 8, side // 8, generator=g), size=side)
    return smooth * 2 - 1


def test_torchvision_imports_with_nms() -> None:
    tv = import_torchvision()
    assert hasattr(tv.models, "alexnet")
    assert hasattr(torch.ops.torchvision, "nms")


def test_standin_is_labelled_and_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_rng_state()
    a = load_lpips(STANDIN)
    monkeypatch.setattr(perceptual, "_standin_net", None)  # build it again from scratch, not from the cache
    b = load_lpips(STANDIN)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG stream is untouched
    assert a.label == b.label == "random_standin"
    for (k, va), (_, vb) in zip(a.net.state_dict().items(), b.net.state_dict().items(), strict=True):
        assert torch.equal(va, vb), k
    x, y = images(0), images(1)
    assert torch.equal(a(x, y), b(x, y))
    assert not any(p.requires_grad for p in a.net.parameters())


def test_distance_zero_on_identical_and_grows_with_noise() -> None:
    metric = load_lpips(STANDIN)
    x = images(0, n=8)
    d0 = metric(x, x)
    assert d0.shape == (8,) and torch.equal(d0, torch.zeros(8))
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(x.shape, generator=g)
    dists = [metric(x, (x + s * noise).clamp(-1, 1)).mean().item() for s in (0.05, 0.2, 0.6)]
    assert 0 < dists[0] < dists[1] < dists[2]


def test_small_images_are_upsampled_not_rejected() -> None:
    metric = load_lpips(STANDIN)
    x = images(0, side=16)
    assert metric(x, images(1, side=16)).shape == (4,)
    with pytest.raises(ValueError, match="same shape"):
        metric(x, images(1, side=32))


def test_real_weights_load_from_a_local_file(alexnet_file: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, state = alexnet_file
    metric = load_lpips(EvalSpec(lpips_weights=str(path)))
    assert metric.label == "alexnet" and metric.source == str(path)
    trunk = metric.net.net
    for slice_no, idx in ((1, 0), (2, 3), (3, 6), (4, 8), (5, 10)):
        conv = getattr(trunk, f"slice{slice_no}")._modules[str(idx)]
        assert torch.equal(conv.weight, state[f"features.{idx}.weight"])
        assert torch.equal(conv.bias, state[f"features.{idx}.bias"])
    # the package's v0.1 linear layers are loaded (not random): the stand-in shares them
    standin = load_lpips(STANDIN)
    assert torch.equal(metric.net.lin0.model[1].weight, standin.net.lin0.model[1].weight)
    x = images(0)
    assert torch.equal(metric(x, x), torch.zeros(4))
    assert not torch.equal(metric(x, images(1)), standin(x, images(1)))


def test_weights_argument_env_and_cache(
    alexnet_file: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = alexnet_file
    assert load_lpips(EvalSpec(), weights=path).source == str(path)
    monkeypatch.setenv("ABLATE_LPIPS_WEIGHTS", str(path))
    assert load_lpips(EvalSpec()).source == str(path)
    monkeypatch.delenv("ABLATE_LPIPS_WEIGHTS")
    cache = tmp_path / "torch_home/hub/checkpoints"
    cache.mkdir(parents=True)
    cached = cache / "alexnet-owt-7be5be79.pth"
    cached.symlink_to(path)
    assert load_lpips(EvalSpec()).source == str(cached)


def test_a_state_dict_in_torchvisions_cache_path_is_used_offline(
    alexnet_file: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache-hit path: the file where torchvision's weights API would have downloaded it is loaded
    as the trunk, with ABLATE_OFFLINE on (nothing needs the network)."""
    _, state = alexnet_file
    monkeypatch.setenv("ABLATE_OFFLINE", "1")
    cached = tmp_path / "torch_home/hub/checkpoints/alexnet-owt-7be5be79.pth"
    assert perceptual.torchvision_cache_path() == cached
    cached.parent.mkdir(parents=True)
    torch.save(state, cached)
    metric = load_lpips(EvalSpec())
    assert (metric.label, metric.source) == ("alexnet", str(cached))
    assert torch.equal(metric.net.net.slice1[0].weight, state["features.0.weight"])


def test_missing_weights_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_OFFLINE", "1")
    with pytest.raises(LPIPSWeightsError) as err:
        load_lpips(EvalSpec())
    msg = str(err.value)
    assert "ABLATE_OFFLINE forbids downloading" in msg and str(perceptual.torchvision_cache_path()) in msg
    assert "eval.lpips_weights" in msg and "eval.lpips_backbone: random_standin" in msg
    assert "ABLATE_LPIPS_WEIGHTS" in msg
    assert not perceptual.torchvision_cache_path().exists()


@pytest.mark.usefixtures("online_but_refused")
def test_a_failed_download_is_the_same_clear_error() -> None:
    """Online, torchvision's download goes through a proxy that refuses connections (a port just
    closed): the error names the URL and how to provide the file; nothing is left in the cache."""
    with pytest.raises(LPIPSWeightsError) as err:
        load_lpips(EvalSpec())
    msg = str(err.value)
    assert "could not be downloaded from https://download.pytorch.org/models/alexnet-owt-7be5be79.pth" in msg
    assert "URLError" in msg and "eval.lpips_backbone: random_standin" in msg
    assert not perceptual.torchvision_cache_path().exists()


def test_missing_weights_is_a_clear_error() -> None:
    with pytest.raises(LPIPSWeightsError, match=r"nope\.pth \(from eval.lpips_weights\) does not exist"):
        load_lpips(EvalSpec(lpips_weights="/nonexistent/nope.pth"))


def test_wrong_weights_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, bad)
    with pytest.raises(LPIPSWeightsError, match="not a torchvision alexnet state dict"):
        load_lpips(EvalSpec(lpips_weights=str(bad)))
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(LPIPSWeightsError, match="could not be loaded"):
        load_lpips(EvalSpec(lpips_weights=str(garbage)))
