"""REPA: loss values, TREAD-aware gathering, warm-down schedule, teacher loading and refusals.
Nothing here downloads: torch's hub cache is a temporary TORCH_HOME the tests fill themselves."""

import pytest
import torch
from torch import nn

from model.repa import (
    STANDIN_DIM,
    RepaProjector,
    TeacherError,
    build_teacher,
    hub_cache_paths,
    repa_loss,
    repa_weight,
)
from model.spec import RepaSpec


class Identity(nn.Module):
    def forward(self, h):
        return h


def test_loss_is_one_minus_cos():
    h = torch.randn(2, 8, 4)
    assert repa_loss(h, None, h * 3, Identity()).item() == pytest.approx(0.0, abs=1e-6)  # scale-free
    assert repa_loss(h, None, -h, Identity()).item() == pytest.approx(2.0, abs=1e-6)
    orth = torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[0.0, 1.0]]])
    assert repa_loss(orth[0], None, orth[1], Identity()).item() == pytest.approx(1.0)


def test_loss_gathers_the_kept_tokens():
    teacher = torch.randn(2, 8, 4)
    kept = torch.tensor([[5, 1, 6], [0, 7, 2]])
    hidden = torch.stack([teacher[b, kept[b]] for b in range(2)])  # (2, 3, 4): states of the kept tokens
    assert repa_loss(hidden, kept, teacher, Identity()).item() == pytest.approx(0.0, abs=1e-6)
    assert repa_loss(hidden, kept.flip(1), teacher, Identity()).item() > 0.1


def test_projector_is_bias_free_and_trains():
    proj = RepaProjector(16, 8)
    assert proj.proj.bias is None
    loss = repa_loss(torch.randn(2, 4, 16), None, torch.randn(2, 4, 8), proj)
    loss.backward()
    assert proj.proj.weight.grad.abs().sum() > 0


def test_weight_schedule():
    constant = RepaSpec(enabled=True, weight=0.5)
    assert repa_weight(constant, 0, 5000) == repa_weight(constant, 4999, 5000) == 0.5
    down = RepaSpec(enabled=True, weight=0.5, warmdown_end=0.25)  # arm E: to 0 by step 1250 of 5000
    assert repa_weight(down, 0, 5000) == 0.5
    assert repa_weight(down, 625, 5000) == pytest.approx(0.25)
    assert repa_weight(down, 1250, 5000) == 0.0
    assert repa_weight(down, 4000, 5000) == 0.0
    assert repa_weight(RepaSpec(enabled=False, weight=0.5), 0, 5000) == 0.0


# Stands in for the official repository's hubconf.py in torch's hub cache (operator-level, never from a
# spec): a DINOv2-shaped ViT-B/14 whose pretrained weights load the way the real ones do, through
# torch.hub's weights cache.
FAKE_HUBCONF = """
import torch
from torch import nn

dependencies = ["torch"]


class PatchNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 768))
        self.patch = nn.Conv2d(3, 768, 14, stride=14)

    def forward_features(self, x):
        return {"x_norm_patchtokens": self.patch(x).flatten(2).transpose(1, 2)}


def dinov2_vitb14(pretrained=True, **kwargs):
    model = PatchNet()
    if pretrained:
        url = "https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_pretrain.pth"
        model.load_state_dict(torch.hub.load_state_dict_from_url(url, map_location="cpu"))
    return model
"""


@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    return tmp_path / "torch_home"


def _cache_repo() -> None:
    repo_dir, _ = hub_cache_paths()
    repo_dir.mkdir(parents=True)
    (repo_dir / "hubconf.py").write_text(FAKE_HUBCONF)


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"cls_token": torch.randn(1, 1, 768, generator=g), "patch.weight": torch.randn(768, 3, 14, 14, generator=g),
            "patch.bias": torch.randn(768, generator=g)}


def test_dinov2_offline_and_not_cached_names_the_fix(torch_home, monkeypatch):
    monkeypatch.setenv("ABLATE_OFFLINE", "1")
    repo_dir, weights = hub_cache_paths()
    assert (repo_dir, weights) == (torch_home / "hub/facebookresearch_dinov2_main",
                                   torch_home / "hub/checkpoints/dinov2_vitb14_pretrain.pth")
    with pytest.raises(TeacherError) as err:
        build_teacher(RepaSpec(enabled=True), "cpu")
    msg = str(err.value)
    assert "ABLATE_OFFLINE forbids downloading" in msg and str(repo_dir) in msg and str(weights) in msg
    assert "repa.teacher_path" in msg and "random_standin" in msg
    with pytest.raises(TeacherError, match="does not exist"):
        build_teacher(RepaSpec(enabled=True, teacher_path="/nonexistent/dinov2.pt"), "cpu")


def test_dinov2_from_torch_hubs_cache_loads_offline(torch_home, monkeypatch):
    """The cache-hit path without a teacher_path: the repository and the pretrained weights where
    torch.hub keeps them load with no network."""
    monkeypatch.setenv("ABLATE_OFFLINE", "1")
    _cache_repo()
    _, weights = hub_cache_paths()
    weights.parent.mkdir(parents=True)
    state = _state(0)
    torch.save(state, weights)
    teacher = build_teacher(RepaSpec(enabled=True), "cpu")
    assert teacher.label == "dinov2" and teacher.dim == 768
    assert torch.equal(teacher.net.patch.weight, state["patch.weight"])  # the cached weights, not a fresh init
    assert teacher.features(torch.zeros(1, 3, 32, 32), (4, 4)).shape == (1, 16, 768)


def test_a_weights_file_takes_its_architecture_from_the_cached_repository(torch_home, monkeypatch, tmp_path):
    """repa.teacher_path: a plain state dict; its architecture from the official repository's cached copy."""
    monkeypatch.setenv("ABLATE_OFFLINE", "1")
    _cache_repo()
    state = _state(1)
    path = tmp_path / "my_dinov2.pth"
    torch.save(state, path)
    teacher = build_teacher(RepaSpec(enabled=True, teacher_path=str(path)), "cpu")
    assert teacher.label == "dinov2" and torch.equal(teacher.net.patch.weight, state["patch.weight"])


@pytest.mark.usefixtures("online_but_refused")
def test_dinov2_failed_download_names_the_fix(torch_home):
    """Online, torch.hub's download of the repository goes through a proxy that refuses connections."""
    with pytest.raises(TeacherError) as err:
        build_teacher(RepaSpec(enabled=True), "cpu")
    msg = str(err.value)
    assert "could not be loaded through torch.hub from facebookresearch/dinov2" in msg
    assert "URLError" in msg and "random_standin" in msg


def test_not_a_weights_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "teacher.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(TeacherError, match="not a loadable weights file"):
        build_teacher(RepaSpec(enabled=True, teacher_path=str(bad)), "cpu")


def test_a_hub_directory_is_refused_and_its_code_never_runs(tmp_path):
    # torch.hub.load(source="local") imports hubconf.py: any token holder could run code on the workers.
    marker = tmp_path / "ran"
    hub = tmp_path / "dinov2"
    hub.mkdir()
    (hub / "hubconf.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\ndef dinov2_vits14(**kw): pass\n")
    torch.save({"cls_token": torch.zeros(1, 1, 384)}, hub / "dinov2_vits14_pretrain.pth")
    with pytest.raises(TeacherError, match="must be a weights file"):
        build_teacher(RepaSpec(enabled=True, teacher_path=str(hub)), "cpu")
    assert not marker.exists()


def test_torchscript_is_refused(tmp_path):
    path = tmp_path / "dinov2_tiny.pt"
    torch.jit.save(torch.jit.script(nn.Conv2d(3, 24, 14, stride=14)), str(path))
    with pytest.raises(TeacherError, match="not a loadable weights file"):
        build_teacher(RepaSpec(enabled=True, teacher_path=str(path)), "cpu")


def test_a_state_dict_that_is_not_dinov2_names_the_width(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"cls_token": torch.zeros(1, 1, 24), "w": torch.zeros(3)}, path)
    with pytest.raises(TeacherError, match="not a DINOv2 state dict.*width 24"):
        build_teacher(RepaSpec(enabled=True, teacher_path=str(path)), "cpu")


def test_random_standin_is_labelled_deterministic_and_leaves_rng_alone():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = build_teacher(RepaSpec(enabled=True, teacher="random_standin"), "cpu")
    assert torch.equal(before, torch.get_rng_state())
    b = build_teacher(RepaSpec(enabled=True, teacher="random_standin"), "cpu")
    assert a.label == "random_standin" and a.dim == STANDIN_DIM
    imgs = torch.rand(2, 3, 32, 32) * 2 - 1
    fa = a.features(imgs, (8, 8))
    assert fa.shape == (2, 64, STANDIN_DIM) and torch.equal(fa, b.features(imgs, (8, 8)))
    assert not any(p.requires_grad for p in a.net.parameters())
