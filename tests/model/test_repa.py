"""REPA: loss values, TREAD-aware gathering, warm-down schedule, teacher loading and refusals."""

import pytest
import torch
from torch import nn

from model.repa import STANDIN_DIM, RepaProjector, TeacherError, build_teacher, repa_loss, repa_weight
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


def test_dinov2_without_path_names_the_fix():
    with pytest.raises(TeacherError, match=r"repa.teacher_path.*random_standin"):
        build_teacher(RepaSpec(enabled=True), "cpu")
    with pytest.raises(TeacherError, match="does not exist"):
        build_teacher(RepaSpec(enabled=True, teacher_path="/nonexistent/dinov2.pt"), "cpu")


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
