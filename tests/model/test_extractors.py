"""model/extractors: the distribution metrics' feature extractors. Nothing here downloads: real weights are played
by tiny files made here, pinned through real registry entries; the architectures are transformers' own."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from model.extractors import (
    EXTRACTOR_FOR_METRIC,
    EXTRACTORS,
    FINAL_EXTRACTOR_FOR_METRIC,
    ExtractorEntry,
    ExtractorWeightsError,
    PinnedFile,
    UnknownExtractor,
    WeightsHashError,
    load_extractor,
)
from model.extractors.networks import build
from model.spec import DISTRIBUTION_METRICS


def _images(n: int = 4, h: int = 40, w: int = 48, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_metric_but_fid_has_a_pinned_extractor_for_training_and_for_the_final_pass():
    judged = [m for m in DISTRIBUTION_METRICS if m != "fid"]
    for table in (EXTRACTOR_FOR_METRIC, FINAL_EXTRACTOR_FOR_METRIC):
        assert sorted(table) == sorted(judged)
        assert set(table.values()) <= set(EXTRACTORS)
    for entry in EXTRACTORS.values():
        assert len(entry.revision) == 40 and int(entry.revision, 16) >= 0  # a commit, never a branch
        assert all(len(f.sha256) == 64 and int(f.sha256, 16) >= 0 and f.size > 0 for f in entry.files)
    assert EXTRACTORS[EXTRACTOR_FOR_METRIC["cmmd"]].resolution == 336
    assert all(e.dim == e.width for e in EXTRACTORS.values() if e.family == "dinov2")  # the CLS token's width


@pytest.mark.parametrize("name", list(EXTRACTORS))
def test_the_small_stand_in_keeps_the_contract_and_says_what_it_is(name: str):
    ex = load_extractor(name, stand_in="small")
    feats = ex(_images(5))
    assert feats.shape == (5, ex.dim) and feats.dtype == torch.float32
    assert ex.stand_in and "stand-in" in ex.label and name in ex.label
    assert torch.isfinite(feats).all() and feats.std(dim=0).mean() > 0  # the images are told apart
    assert ex(_images(0)).shape == (0, ex.dim)


def test_a_stand_in_is_the_same_network_in_every_construction_and_leaves_the_callers_rng_alone():
    """Arms and seeds are compared on the same random network, or a stand-in metric would not be paired."""
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = load_extractor("dinov2-vit-b-14", stand_in="small")(_images())
    assert torch.equal(torch.random.get_rng_state(), before)
    b = load_extractor("dinov2-vit-b-14", stand_in="small")(_images())
    assert torch.equal(a, b)
    other = load_extractor("dinov2-vit-l-14", stand_in="small")(_images())
    assert not torch.allclose(a, other)  # each name its own network


def test_clip_features_are_unit_vectors_and_dinov2_features_are_not_normalised():
    clip = load_extractor("clip-vit-l-14-336", stand_in="small")(_images())
    dino = load_extractor("dinov2-vit-b-14", stand_in="small")(_images())
    torch.testing.assert_close(clip.norm(dim=1), torch.ones(4))
    assert not torch.allclose(dino.norm(dim=1), torch.ones(4), atol=1e-3)


def test_preprocessing_centre_crops_to_the_resolution_and_normalises_with_the_networks_mean_and_std():
    ex = load_extractor("clip-vit-l-14-336", stand_in="small")
    mean = torch.tensor(ex.entry.mean).view(1, 3, 1, 1)
    flat = (mean * 2 - 1).expand(2, 3, 30, 70)  # every pixel at the network's mean, a wide image
    x = ex.preprocess(flat)
    assert x.shape == (2, 3, ex.resolution, ex.resolution)
    torch.testing.assert_close(x, torch.zeros_like(x), atol=1e-5, rtol=0)
    wide = torch.full((1, 3, 20, 60), -1.0)
    wide[..., 20:40] = 1.0  # white in the middle third, black on both sides
    assert ex.preprocess(wide)[..., ex.resolution // 2].max() > 1  # the crop keeps the centre


def test_no_weights_is_a_labelled_stand_in_with_auto_and_an_error_saying_how_to_provide_them_strictly(
        tmp_path: Path):
    auto = load_extractor("dinov2-vit-b-14", weights_dir=tmp_path, stand_in="auto")
    assert auto.stand_in and auto.kind == "small" and "stand-in" in auto.label
    assert str(tmp_path / "dinov2-vit-b-14") in auto.reason
    with pytest.raises(ExtractorWeightsError) as err:
        load_extractor("dinov2-vit-b-14", weights_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message and "model.safetensors" in message and "ABLATE_WEIGHTS_DIR" in message
    assert EXTRACTORS["dinov2-vit-b-14"].files[0].sha256 in message and "ablate weights fetch" in message
    with pytest.raises(UnknownExtractor, match="known are clip-vit-l-14-336"):
        load_extractor("dinov2-vit-g-14", stand_in="small")


def _tiny_entry(name: str, family: str, files: tuple[PinnedFile, ...] = ()) -> ExtractorEntry:
    """A real registry entry for a tiny network of the family."""
    base = EXTRACTORS["clip-vit-l-14-336" if family == "clip" else "dinov2-vit-b-14"]
    dim = 16 if family == "clip" else 32  # CLIP's projection is its own width; DINOv2's CLS token is the width
    return replace(base, name=name, repo=f"test/{name}", width=32, depth=1, heads=2, dim=dim, resolution=28,
                   files=files)


def _pinned(path: Path) -> PinnedFile:
    return PinnedFile(path.name, _sha(path), path.stat().st_size)


# transformers 5's DINOv2 attention names -> those of the files on the hub (from_pretrained maps them back)
_DINOV2_PUBLISHED = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
                     "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense"}


def _published(key: str) -> str:
    for ours, theirs in _DINOV2_PUBLISHED.items():
        key = key.replace(ours, theirs)
    return key


def _tiny_weights(tmp_path: Path, family: str,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[ExtractorEntry, torch.nn.Module]:
    """A tiny network of the family saved under tmp_path/weights/<name>/, its entry registered."""
    from safetensors.torch import save_file

    name = f"tiny-{family}"
    folder = tmp_path / "weights" / name
    folder.mkdir(parents=True)
    trained = build(_tiny_entry("other-seed", family))  # other random weights than the stand-in's
    state = {_published(k): v.contiguous() for k, v in trained.model.state_dict().items()}
    if family == "clip":  # a whole-CLIP checkpoint: the text tower's tensors are read and dropped
        path = folder / "pytorch_model.bin"
        torch.save({**state, "text_model.embeddings.token_embedding.weight": torch.zeros(4, 8),
                    "logit_scale": torch.tensor(2.0)}, path)
    else:  # in the layout of facebook/dinov2-*'s model.safetensors
        path = folder / "model.safetensors"
        save_file(state, str(path))
        assert any(".attention.attention.query." in k for k in state)
    entry = _tiny_entry(name, family, (_pinned(path),))
    monkeypatch.setitem(EXTRACTORS, name, entry)
    return entry, trained


@pytest.mark.parametrize("family", ["clip", "dinov2"])
def test_pinned_weights_are_loaded_into_the_transformers_architecture(tmp_path: Path, family: str,
                                                                      monkeypatch: pytest.MonkeyPatch):
    entry, trained = _tiny_weights(tmp_path, family, monkeypatch)
    ex = load_extractor(entry.name, weights_dir=tmp_path / "weights")
    assert not ex.stand_in and ex.label == entry.name and ex.kind == "weights"
    images = _images(3)
    with torch.no_grad():
        expected = trained(ex.preprocess(images))
    if family == "clip":
        expected = expected / expected.norm(dim=1, keepdim=True)
    assert expected.shape == (3, ex.dim)
    torch.testing.assert_close(ex(images), expected)
    stand_in = load_extractor(entry.name, stand_in="architecture")
    assert stand_in.dim == ex.dim and not torch.allclose(stand_in(images), ex(images))


def test_a_file_whose_hash_differs_is_refused_naming_it_and_both_hashes_even_with_auto(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch):
    good = tmp_path / "good.bin"
    good.write_bytes(b"the pinned bytes")
    entry = replace(EXTRACTORS["dinov2-vit-b-14"], name="tampered",
                    files=(PinnedFile("model.safetensors", _sha(good), good.stat().st_size),))
    monkeypatch.setitem(EXTRACTORS, "tampered", entry)
    staged = tmp_path / "weights" / "tampered" / "model.safetensors"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"the pinned byteZ")  # the same size: only the hash tells
    found = _sha(staged)
    for stand_in in (None, "auto"):  # a wrong file is never a reason to fall back to a stand-in
        with pytest.raises(WeightsHashError) as err:
            load_extractor("tampered", weights_dir=tmp_path / "weights", stand_in=stand_in)
        assert str(staged) in str(err.value) and entry.files[0].sha256 in str(err.value) and found in str(err.value)


def test_a_node_copies_its_weights_from_the_store_and_hashes_them_first(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    from model.extractors.pinned_files import stage_in_store, store_state

    entry, _ = _tiny_weights(tmp_path, "dinov2", monkeypatch)
    store = f"file://{tmp_path / 'store'}"
    assert store_state(entry, store) == "no"
    stage_in_store(entry, tmp_path / "weights", store)
    assert store_state(entry, store) == "staged"
    node = tmp_path / "node-weights"
    ex = load_extractor(entry.name, weights_dir=node, store_url=store)
    assert not ex.stand_in and (node / entry.name / entry.files[0].filename).is_file()

    # a store that a node can write is no authority: a replaced file is refused and not kept
    stored = tmp_path / "store" / "weights" / entry.name / entry.files[0].filename
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF
    stored.write_bytes(bytes(data))
    assert store_state(entry, store) == "corrupt"
    fresh = tmp_path / "fresh-node"
    with pytest.raises(ExtractorWeightsError, match=entry.files[0].sha256):
        load_extractor(entry.name, weights_dir=fresh, store_url=store)
    assert not (fresh / entry.name / entry.files[0].filename).exists()
    # ... and, where a stand-in is allowed, absent: before, it failed every node's pass (WeightsHashError)
    ex = load_extractor(entry.name, weights_dir=fresh, store_url=store, stand_in="auto")
    assert ex.stand_in and ex.kind == "small" and ex.reason is not None
    assert "corrupt" in ex.reason and entry.files[0].sha256 in ex.reason
    assert not (fresh / entry.name / entry.files[0].filename).exists()


def test_fid_is_refused_at_submit_naming_the_field_and_the_metric_to_use_instead():
    from pydantic import ValidationError

    from model.spec import ArmSpec

    with pytest.raises(ValidationError) as err:
        ArmSpec.model_validate({"data": {"held_out": 64},
                                "eval": {"distribution": {"metrics": ["cmmd", "fid"], "samples": 32}}})
    (error,) = err.value.errors()
    assert error["loc"] == ("eval", "distribution", "metrics") and "fd_dinov2" in error["msg"]


def test_an_unreadable_store_is_missing_weights_so_auto_runs_the_labelled_stand_in(tmp_path: Path):
    ex = load_extractor("dinov2-vit-b-14", weights_dir=tmp_path, store_url="nosuchprotocol://bucket/x",
                        stand_in="auto")
    assert ex.stand_in and "could not be read" in ex.reason
    with pytest.raises(ExtractorWeightsError, match="nosuchprotocol://bucket/x could not be read"):
        load_extractor("dinov2-vit-b-14", weights_dir=tmp_path, store_url="nosuchprotocol://bucket/x")


def test_a_verified_file_that_lacks_a_tensor_of_the_network_is_refused_not_left_random(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from safetensors.torch import load_file, save_file

    from model.extractors import ExtractorLoadError

    entry, _ = _tiny_weights(tmp_path, "dinov2", monkeypatch)
    path = tmp_path / "weights" / entry.name / "model.safetensors"
    state = load_file(str(path))
    del state["layernorm.weight"]
    save_file(state, str(path))
    monkeypatch.setitem(EXTRACTORS, entry.name, replace(entry, files=(_pinned(path),)))
    with pytest.raises(ExtractorLoadError, match="1 tensors missing"):
        load_extractor(entry.name, weights_dir=tmp_path / "weights")
