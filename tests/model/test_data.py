"""Datasets: determinism, pixel ranges, splits, edits, and imagefolder's error messages."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from model.data import (
    COLOURS,
    EDIT_KINDS,
    SHAPES,
    DatasetError,
    ImageFolderDataset,
    NoEditsError,
    ShapesDataset,
    build_dataset,
    render_shapes,
    shape_attrs,
    to_lpips,
    to_unit,
)
from model.spec import ArmSpec


def spec(**data: object) -> ArmSpec:
    return ArmSpec.model_validate({"model": {"size": "tiny"}, "data": data, "eval": {"num_samples": 1}})


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- shapes


def test_shapes_batches_are_deterministic_given_the_generator() -> None:
    ds = build_dataset(spec(num_images=128, held_out=8))
    a, ca = ds.train_batch(16, gen(3))
    b, cb = build_dataset(spec(num_images=128, held_out=8)).train_batch(16, gen(3))
    c, _ = ds.train_batch(16, gen(4))
    assert torch.equal(a, b) and ca == cb
    assert not torch.equal(a, c)
    assert a.shape == (16, 3, 32, 32) and a.dtype == torch.float32


def test_generator_state_continues_the_stream() -> None:
    """A trainer that saves and restores its generator resumes the same batch sequence."""
    ds = build_dataset(spec())
    g = gen(0)
    ds.train_batch(8, g)
    state = g.get_state()
    nxt, _ = ds.train_batch(8, g)
    g2 = torch.Generator()
    g2.set_state(state)
    assert torch.equal(ds.train_batch(8, g2)[0], nxt)


def test_data_seed_changes_the_images() -> None:
    a, _ = build_dataset(spec(seed=0)).held_out(8)
    b, _ = build_dataset(spec(seed=1)).held_out(8)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("pixel_range", ["unit", "symmetric"])
def test_pixel_range_and_helpers(pixel_range: str) -> None:
    ds = build_dataset(spec(pixel_range=pixel_range))
    x, _ = ds.train_batch(32, gen(0))
    lo, hi = (0.0, 1.0) if pixel_range == "unit" else (-1.0, 1.0)
    assert x.min() >= lo and x.max() <= hi
    assert x.min() < lo + 0.2 and x.max() > hi - 0.2  # the range is used, not squeezed
    unit = ds.to_unit(x)
    assert unit.min() >= 0 and unit.max() <= 1
    torch.testing.assert_close(ds.to_lpips(x), unit * 2 - 1)
    torch.testing.assert_close(ds.from_unit(unit), x)
    torch.testing.assert_close(to_unit(x, pixel_range), unit)
    torch.testing.assert_close(to_lpips(x, pixel_range), unit * 2 - 1)


def test_unit_and_symmetric_are_the_same_images() -> None:
    u, _ = build_dataset(spec(pixel_range="unit")).held_out(4)
    s, _ = build_dataset(spec(pixel_range="symmetric")).held_out(4)
    torch.testing.assert_close(s, u * 2 - 1)


def test_captions_describe_the_image() -> None:
    """Centre pixel of a square is its colour, a corner is the background; the caption names both."""
    for i in range(200):
        a = shape_attrs(0, i)
        if a.shape == "square" and a.position == "center":
            break
    else:
        pytest.fail("no centred square in 200 items")
    img = render_shapes([a], 64)[0]
    torch.testing.assert_close(img[:, 32, 32], torch.tensor(COLOURS[a.colour]))
    torch.testing.assert_close(img[:, 0, 0], torch.tensor(COLOURS[a.background]))
    assert f"{a.colour} square in the center" in a.caption() and f"{a.background} background" in a.caption()


@pytest.mark.parametrize("resolution", [32, 1024])
def test_any_resolution_with_antialiased_edges(resolution: int) -> None:
    a = shape_attrs(0, 1)
    img = render_shapes([a], resolution)[0]
    assert img.shape == (3, resolution, resolution)
    fg, bg = torch.tensor(COLOURS[a.colour]).view(3, 1, 1), torch.tensor(COLOURS[a.background]).view(3, 1, 1)
    # every pixel is a blend bg + alpha (fg - bg); some are partial (the soft edge)
    channel = int((fg - bg).abs().argmax())
    alpha = (img[channel] - bg[channel]) / (fg[channel] - bg[channel])
    torch.testing.assert_close(img, bg + alpha.clamp(0, 1) * (fg - bg), atol=1e-5, rtol=0)
    partial = ((alpha > 0.05) & (alpha < 0.95)).sum().item()
    inside = (alpha >= 0.95).sum().item()
    assert partial > 0 and inside > partial  # an edge one pixel wide around a solid interior


def test_tiled_rendering_equals_per_pixel_rendering() -> None:
    """The tile shortcut (1-Lipschitz distances) changes no pixel, for every shape, at high resolution."""
    items = [shape_attrs(0, i) for i in range(40)]
    assert {a.shape for a in items} == set(SHAPES) and {a.size for a in items} == {"small", "large"}
    assert torch.equal(render_shapes(items, 512), render_shapes(items, 512, tile=10**6))


def test_same_item_at_two_resolutions_agrees() -> None:
    a = shape_attrs(0, 5)
    small = render_shapes([a], 32)
    big = torch.nn.functional.avg_pool2d(render_shapes([a], 256), 8)
    assert (small - big).abs().mean() < 0.02


def test_held_out_is_fixed_and_disjoint_from_training() -> None:
    ds = build_dataset(spec(num_images=64, held_out=8))
    assert isinstance(ds, ShapesDataset)
    h1, c1 = ds.held_out(8)
    h2, c2 = ds.held_out(8)
    assert torch.equal(h1, h2) and c1 == c2
    held = {shape_attrs(0, 64 + i) for i in range(8)}
    train = {shape_attrs(0, i) for i in range(64)}
    assert not held & train  # different items (the jitter makes each item unique)
    assert [ds.attrs("held", i).caption() for i in range(8)] == c1
    with pytest.raises(DatasetError, match="data.held_out"):
        ds.held_out(9)


def test_spec_rejects_more_eval_samples_than_held_out_images() -> None:
    with pytest.raises(ValueError, match=r"eval.num_samples \(25\) exceeds data.held_out \(8\)"):
        ArmSpec.model_validate({"data": {"held_out": 8}})


def test_sample_images_deterministic_per_seed() -> None:
    ds = build_dataset(spec(num_images=64))
    assert torch.equal(ds.sample_images(16, 7), ds.sample_images(16, 7))
    assert not torch.equal(ds.sample_images(16, 7), ds.sample_images(16, 8))
    assert ds.sample_images(100, 1).shape == (100, 3, 32, 32)  # more than num_images: with replacement


def test_edits_change_exactly_one_attribute_and_the_image() -> None:
    ds = build_dataset(spec(held_out=8))
    assert isinstance(ds, ShapesDataset)
    examples = ds.edit_examples(20)
    assert [k for _, _, k in examples[:5]] == list(EDIT_KINDS)
    field = {"colour": "colour", "shape": "shape", "background": "background", "size": "size", "position": "position"}
    for a, e, kind in examples:
        changed = [f for f in field.values() if getattr(a, f) != getattr(e, f)]
        assert changed == [field[kind]]
        assert e.colour != e.background
        assert (a.dx, a.dy, a.scale, a.angle) == (e.dx, e.dy, e.scale, e.angle)
        before, after = render_shapes([a, e], 32)
        assert (before - after).abs().max() > 0.3
    pairs = ds.edit_pairs(20)
    assert pairs == [(a.caption(), e.caption()) for a, e, _ in examples]
    assert pairs == ds.edit_pairs(20)
    for cap, edited in pairs:
        assert cap != edited
        # a one-attribute edit leaves the rest of the sentence alone: one contiguous changed span
        ops = difflib.SequenceMatcher(a=cap.split(), b=edited.split()).get_opcodes()
        assert len([op for op in ops if op[0] != "equal"]) == 1


def test_captions_use_only_the_vocabulary() -> None:
    ds = build_dataset(spec())
    vocab = set(ds.caption_words())
    _, caps = ds.train_batch(64, gen(0))
    for cap in caps + [e for _, e in ds.edit_pairs(10)]:
        assert set(cap.split()) <= vocab


# ---------------------------------------------------------------- digits


def test_digits() -> None:
    from sklearn.datasets import load_digits

    ds = build_dataset(spec(dataset="digits", held_out=16, pixel_range="symmetric"))
    x, caps = ds.train_batch(8, gen(0))
    assert x.shape == (8, 3, 32, 32) and x.min() >= -1 and x.max() <= 1
    assert all(c.startswith("the digit ") and c[-1].isdigit() for c in caps)
    assert torch.equal(x[:, 0], x[:, 1])  # grey
    held, held_caps = ds.held_out(16)
    # caption matches the digit: the held images are the sklearn images with those labels
    d = load_digits()
    small = torch.nn.functional.avg_pool2d(ds.to_unit(held)[:, :1], 4)  # back to 8x8
    for img, cap in zip(small, held_caps, strict=True):
        label = int(cap[-1])
        nearest = ((torch.from_numpy(d.images).float() / 16 - img).pow(2).sum((1, 2))).argmin()
        assert d.target[nearest] == label
    assert ds.num_train + ds.num_held == 1797
    assert not set(ds._held.tolist()) & set(ds._train.tolist())
    for a, b in ds.edit_pairs(10):
        assert a.startswith("the digit ") and b.startswith("the digit ") and a != b


# ---------------------------------------------------------------- imagefolder


def make_folder(root: Path, n: int = 6, embeddings: bool = False) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lines, captions = [], []
    colours = ["red", "green", "blue", "yellow", "purple", "orange"]
    for i in range(n):
        w, h = (40 + 8 * i, 30) if i % 2 else (30, 50)
        arr = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(root / f"img{i}.png")
        cap = f"a photo of a {colours[i % len(colours)]} thing number {i}"
        captions.append(cap)
        lines.append({"file": f"img{i}.png", "caption": cap})
    (root / "captions.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    if embeddings:
        torch.save({c: torch.randn(3 + i, 8) for i, c in enumerate(captions)}, root / "embeddings.pt")
    return captions


def test_imagefolder_loads_resizes_and_splits(tmp_path: Path) -> None:
    captions = make_folder(tmp_path / "ds")
    s = spec(dataset="imagefolder", path=str(tmp_path / "ds"), held_out=2, resolution=24)
    ds = build_dataset(s)
    assert ds.resolution == 24 and ds.num_train == 4 and ds.num_held == 2
    x, caps = ds.train_batch(10, gen(0))
    assert x.shape == (10, 3, 24, 24) and set(caps) <= set(captions)
    held, held_caps = ds.held_out(2)
    again, again_caps = build_dataset(s).held_out(2)
    assert torch.equal(held, again) and held_caps == again_caps
    train_caps = {ds._render("train", [i])[1][0] for i in range(ds.num_train)}
    assert not train_caps & set(held_caps) and len(train_caps | set(held_caps)) == 6
    # the centre crop of img0 (30x50 -> 24x40, crop rows 8..32) matches a direct PIL resize
    img0 = Image.open(tmp_path / "ds/img0.png").convert("RGB").resize((24, 40), Image.Resampling.BICUBIC)
    expected = torch.from_numpy(np.asarray(img0)[8:32].copy()).permute(2, 0, 1).float() / 255
    rows = ds._held + ds._train
    pos = rows.index(0)
    got = ds.held_out(2)[0][pos] if pos < 2 else ds._render("train", [pos - 2])[0][0]
    torch.testing.assert_close(got, expected)


def test_imagefolder_missing_image_names_the_file(tmp_path: Path) -> None:
    make_folder(tmp_path)
    (tmp_path / "img3.png").unlink()
    with pytest.raises(DatasetError, match=r"img3\.png.*does not exist.*line 4"):
        build_dataset(spec(dataset="imagefolder", path=str(tmp_path), held_out=1))


def test_imagefolder_corrupt_image_names_the_file(tmp_path: Path) -> None:
    make_folder(tmp_path)
    (tmp_path / "img2.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    with pytest.raises(DatasetError, match=r"img2\.png is corrupt"):
        build_dataset(spec(dataset="imagefolder", path=str(tmp_path), held_out=1))


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", "line 7: not valid JSON"),
        ('{"file": "img0.png"}', "line 7: expected"),
        ('{"file": "img0.png", "caption": "x", "captoin": "y"}', r"line 7: unknown key\(s\) \['captoin'\]"),
    ],
)
def test_imagefolder_bad_captions_line(tmp_path: Path, line: str, match: str) -> None:
    make_folder(tmp_path)
    with (tmp_path / "captions.jsonl").open("a") as f:
        f.write(line + "\n")
    with pytest.raises(DatasetError, match=match):
        build_dataset(spec(dataset="imagefolder", path=str(tmp_path), held_out=1))


def test_imagefolder_missing_captions_and_too_few_images(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not a directory"):
        build_dataset(spec(dataset="imagefolder", path=str(tmp_path / "nope")))
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(DatasetError, match=r"captions\.jsonl is missing"):
        build_dataset(spec(dataset="imagefolder", path=str(tmp_path / "empty")))
    make_folder(tmp_path / "few", n=3)
    with pytest.raises(DatasetError, match=r"data.held_out \(64\) must be smaller than the number of images \(3\)"):
        build_dataset(spec(dataset="imagefolder", path=str(tmp_path / "few")))


def test_imagefolder_edits_from_field_then_colour_swap(tmp_path: Path) -> None:
    make_folder(tmp_path, n=4)
    lines = [json.loads(x) for x in (tmp_path / "captions.jsonl").read_text().splitlines()]
    lines[0]["edit"] = "a photo of a red thing number 99"
    (tmp_path / "captions.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    ds = build_dataset(spec(dataset="imagefolder", path=str(tmp_path), held_out=1))
    pairs = ds.edit_pairs(8)
    assert len(pairs) == 8 and ("a photo of a red thing number 0", "a photo of a red thing number 99") in pairs
    for cap, edited in pairs:
        if not edited.endswith("99"):  # colour swap: exactly the colour word changes
            diff = [(a, b) for a, b in zip(cap.split(), edited.split(), strict=True) if a != b]
            assert len(diff) == 1 and diff[0][0] in COLOURS and diff[0][1] in COLOURS
    assert set(" ".join(e for _, e in pairs).split()) <= set(ds.caption_words())


def test_imagefolder_without_possible_edits_says_so(tmp_path: Path) -> None:
    make_folder(tmp_path, n=3)
    lines = [{"file": f"img{i}.png", "caption": f"a thing number {i}"} for i in range(3)]
    (tmp_path / "captions.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    ds = build_dataset(spec(dataset="imagefolder", path=str(tmp_path), held_out=1))
    assert not ds.supports_edits
    with pytest.raises(NoEditsError, match='add an "edit" field'):
        ds.edit_pairs(4)


def test_imagefolder_embeddings(tmp_path: Path) -> None:
    captions = make_folder(tmp_path / "pt", embeddings=True)
    ds = build_dataset(spec(dataset="imagefolder", path=str(tmp_path / "pt"), held_out=1, text_encoder="precomputed"))
    assert ds.text_embeddings is not None and ds.text_embeddings[captions[2]].shape == (5, 8)
    make_folder(tmp_path / "npy")
    np.save(tmp_path / "npy/embeddings.npy", np.ones((6, 4, 16), dtype=np.float32))
    ds = build_dataset(spec(dataset="imagefolder", path=str(tmp_path / "npy"), held_out=1))
    assert ds.text_embeddings is not None and ds.text_embeddings[captions[0]].shape == (4, 16)
    np.save(tmp_path / "npy/embeddings.npy", np.ones((5, 4, 16), dtype=np.float32))
    with pytest.raises(DatasetError, match="first dimension 5 != 6 lines"):
        build_dataset(spec(dataset="imagefolder", path=str(tmp_path / "npy"), held_out=1))
    make_folder(tmp_path / "none")
    with pytest.raises(DatasetError, match="'precomputed' needs .*embeddings.pt"):
        build_dataset(spec(dataset="imagefolder", path=str(tmp_path / "none"), held_out=1, text_encoder="precomputed"))


def test_imagefolder_over_its_cache_cap_decodes_per_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import model.data.folder as data_mod

    make_folder(tmp_path, 12)
    decoded: list[str] = []
    real = data_mod.load_image

    def counting(path: Path, resolution: int, where: str = "") -> torch.Tensor:  # a spy: the real decoder, counted
        decoded.append(path.name)
        return real(path, resolution, where)

    monkeypatch.setattr(data_mod, "load_image", counting)
    ds = ImageFolderDataset(tmp_path, 16, "unit", seed=0, held_out=2, cache_bytes=0)
    assert decoded == [] and ds._cache is None  # nothing decoded up front: 40 of 40 were before
    images, _ = ds.train_batch(3, gen(0))
    assert images.shape == (3, 3, 16, 16) and len(decoded) == 3
    cached = ImageFolderDataset(tmp_path, 16, "unit", seed=0, held_out=2)  # 1 GiB default: all kept
    assert cached._cache is not None and cached._cache.shape[0] == 12


def test_imagefolder_over_its_cap_still_refuses_a_non_image(tmp_path: Path) -> None:
    make_folder(tmp_path, 4)
    (tmp_path / "img1.png").write_bytes(b"not an image")
    with pytest.raises(DatasetError, match="img1.png"):
        ImageFolderDataset(tmp_path, 16, "unit", seed=0, held_out=1, cache_bytes=0)
