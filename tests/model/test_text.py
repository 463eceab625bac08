"""Text encoders: the built-in tokenizer + learned embedding, offline MiniLM, precomputed embeddings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from model.data import build_dataset, tokenize
from model.spec import ArmSpec
from model.text import LearnedTextEncoder, MiniLMTextEncoder, TextEncoderError, build_text_encoder


def spec(**data: object) -> ArmSpec:
    return ArmSpec.model_validate({"model": {"size": "tiny"}, "data": data, "eval": {"num_samples": 1}})


@pytest.fixture(scope="module")
def minilm() -> MiniLMTextEncoder:
    s = spec(text_encoder="minilm")
    enc = build_text_encoder(s, build_dataset(s))
    assert isinstance(enc, MiniLMTextEncoder)
    return enc


# ---------------------------------------------------------------- learned


def test_learned_shapes_mask_and_unknown_words() -> None:
    s = spec()
    enc = build_text_encoder(s, build_dataset(s))
    assert isinstance(enc, LearnedTextEncoder)
    assert enc.dim == 64 and enc.max_tokens == 16  # tiny: hidden 64, text_tokens 16
    long = " ".join(["red"] * 40)
    states, mask = enc(["a red circle", "a zebra circle", "", long])
    assert states.shape == (4, 16, 64) and mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [3, 3, 1, 16]  # empty caption: one <empty> token; long: truncated
    ids, _ = enc.token_ids(["a zebra circle", "A RED, circle!"])
    assert ids[0, 1].item() == 1  # unknown word
    assert ids[1, :3].tolist() == [enc.index["a"], enc.index["red"], enc.index["circle"]]
    assert (states[~mask] == 0).all()
    assert tokenize("A red-circle, 2x! Café_au") == ["a", "red", "circle", "2x", "café", "au"]


def test_learned_is_trainable_and_deterministic() -> None:
    s = spec()
    a = build_text_encoder(s, build_dataset(s))
    torch.manual_seed(0)
    b = build_text_encoder(s, build_dataset(s))
    assert a.trainable and a.vocab == b.vocab  # vocabulary is a function of the dataset only
    states, mask = a(["a red circle on a blue background"])
    states.sum().backward()
    assert a.tokens.weight.grad is not None and a.position.grad is not None
    assert a.tokens.weight.grad[a.index["red"]].abs().sum() > 0
    assert a.tokens.weight.grad[a.index["square"]].abs().sum() == 0
    # different captions, different states
    x, _ = a(["a red circle", "a green circle"])
    assert not torch.allclose(x[0], x[1])


def test_learned_state_dict_carries_the_vocabulary(tmp_path: Path) -> None:
    s = spec()
    enc = build_text_encoder(s, build_dataset(s))
    with torch.no_grad():
        enc.position.add_(1.0)
    other = build_text_encoder(s, build_dataset(s))
    other.load_state_dict(enc.state_dict())
    torch.testing.assert_close(other(["a red circle"])[0], enc(["a red circle"])[0])
    d = spec(dataset="digits")
    digits = build_text_encoder(d, build_dataset(d))
    digits_state = {k: v for k, v in enc.state_dict().items() if k == "_extra_state"}
    digits_state.update({k: v for k, v in digits.state_dict().items() if k != "_extra_state"})
    with pytest.raises(TextEncoderError, match="vocabulary"):
        digits.load_state_dict(digits_state)


# ---------------------------------------------------------------- minilm


def test_minilm_token_states_differ_per_caption(minilm: MiniLMTextEncoder) -> None:
    assert minilm.dim == 384 and not minilm.trainable
    assert list(minilm.state_dict()) == []  # the frozen transformer is not checkpointed
    caps = ["a red circle on a blue background", "a green circle on a blue background", "the digit 7"]
    states, mask = minilm(caps + caps[:1])
    assert states.shape == (4, 16, 384)
    assert mask[:, 0].all() and mask[2].sum() < mask[0].sum()  # [CLS] ... [SEP], shorter caption
    assert (states[~mask] == 0).all()
    assert not torch.allclose(states[0], states[1], atol=1e-3)
    assert torch.equal(states[0], states[3])  # cached, identical
    assert set(minilm._cache) == set(caps)
    # token states, not a pooled vector: positions differ from each other
    n = int(mask[0].sum())
    assert states[0, :n].std(0).mean() > 0.05


def test_minilm_truncates_to_text_tokens(minilm: MiniLMTextEncoder) -> None:
    _, mask = minilm([" ".join(["red"] * 50)])
    assert mask.sum().item() == 16


def test_minilm_works_offline(tmp_path: Path) -> None:
    """A fresh process with an empty HF cache and an unreachable hub still loads and encodes."""
    code = textwrap.dedent(
        """
        import json, torch
        from model.spec import ArmSpec
        from model.data import build_dataset
        from model.text import build_text_encoder
        s = ArmSpec.model_validate({"model": {"size": "tiny"}, "data": {"text_encoder": "minilm"}})
        enc = build_text_encoder(s, build_dataset(s))
        x, m = enc(["a red circle", "a blue square"])
        print(json.dumps({"shape": list(x.shape), "diff": float((x[0] - x[1]).abs().max())}))
        """
    )
    env = dict(os.environ)
    env.update(
        HF_HOME=str(tmp_path / "hf"),
        HF_ENDPOINT="http://127.0.0.1:9",
        HF_HUB_OFFLINE="0",  # the encoder must force offline mode itself
        TRANSFORMERS_OFFLINE="0",
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["shape"] == [2, 16, 384] and result["diff"] > 0.01
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("*.safetensors"))


# ---------------------------------------------------------------- precomputed


def test_precomputed_embeddings(tmp_path: Path) -> None:
    from PIL import Image

    caps = [f"a red thing {i}" for i in range(4)]
    table = {c: torch.randn(3 + 10 * i, 12) for i, c in enumerate(caps)}
    table["a green thing 0"] = torch.randn(2, 12)
    for i in range(4):
        Image.new("RGB", (20, 20), (i * 40, 0, 0)).save(tmp_path / f"{i}.png")
    lines = [{"file": f"{i}.png", "caption": c} for i, c in enumerate(caps)]
    lines[0]["edit"] = "a green thing 0"
    (tmp_path / "captions.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    torch.save(table, tmp_path / "embeddings.pt")
    s = spec(dataset="imagefolder", path=str(tmp_path), held_out=1, text_encoder="precomputed")
    ds = build_dataset(s)
    enc = build_text_encoder(s, ds)
    assert enc.dim == 12 and not enc.trainable
    states, mask = enc([caps[0], caps[2]])
    assert mask.sum(1).tolist() == [3, 16]  # 23 stored tokens truncated to text_tokens
    torch.testing.assert_close(states[0, :3], table[caps[0]])
    torch.testing.assert_close(states[1], table[caps[2]][:16])
    # with precomputed embeddings only edits that have an embedding qualify (not colour swaps)
    assert ds.edit_pairs(3) == [(caps[0], "a green thing 0")] * 3
    with pytest.raises(TextEncoderError, match="no precomputed embedding for caption 'a blue thing'"):
        enc(["a blue thing"])


def test_precomputed_without_embeddings_is_an_error() -> None:
    s = spec(text_encoder="precomputed")
    with pytest.raises(TextEncoderError, match="shapes has none.*learned or minilm"):
        build_text_encoder(s, build_dataset(s))
