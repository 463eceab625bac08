"""NanoDiT: the pixel-space Diffusion Transformer every arm trains.

Written in the style of facebookresearch/DiT `models.py` (Peebles & Xie 2023): a few plain modules,
each mechanism spelled out in `forward` with shape comments, all initialisation in one method.

- Pixel-space patchify (no VAE): a p x p x 3 patch is one token; fixed 2-D sin-cos positions.
- LayerNorm without affine; bias-free QKV, attention output and FFN projections.
- Self-attention and cross-attention through `F.scaled_dot_product_attention`. Cross-attention
  reads the conditioning tokens: one learned null token (so a fully masked caption never yields a
  NaN row), the projected text tokens and, for reconstruction, `identity_tokens` tokens of the
  reference image (patch-embedded, average-pooled to a small grid).
- adaLN-zero (DiT): per block a linear map from c = t_emb + pooled conditioning to 6 modulation
  vectors (shift/scale/gate for attention and FFN). Zero-initialised, so every block starts as the
  identity; the cross-attention output projection is zero-initialised for the same reason.
- Arm H (`adaln.kind == "shared"`): one adaLN projection shared by all blocks plus a per-block
  rank-r LoRA on it (~59M fewer parameters at seed size).
- TREAD (Krause et al. 2025): in training, a random `rate` of the tokens skip blocks
  first..last and are re-injected at their positions before the final blocks. No effect in eval.

Seed size (768/18/12/p16 at 1024 px, text_dim 768 = T5-base width) has 238.6M parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.flow import patchify, unpatchify
from model.spec import ArmSpec

# The study's text states came from a T5-class encoder; 768 (T5-base width) is what
# `ablate model-info` assumes. The real trainer passes its text encoder's width.
STUDY_TEXT_DIM = 768


@dataclass
class DiTOutput:
    out: Tensor  # (B, 3, H, W) raw network prediction (x0, v or u_A: the network does not care)
    hidden: Tensor | None = None  # (B, N', D) states after block `repa_block`, when asked for
    kept: Tensor | None = None  # (B, N') long token indices of `hidden` when TREAD routed them


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    # x (B, N, D); shift, scale (B, D)
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def sincos_2d(dim: int, h: int, w: int) -> Tensor:
    """Fixed 2-D sin-cos position table (h*w, dim), as in DiT / MAE."""
    assert dim % 4 == 0, "hidden must be divisible by 4 for 2-D sin-cos positions"
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    out = [f(c.reshape(-1, 1) * omega) for c in (ys, xs) for f in (torch.sin, torch.cos)]
    return torch.cat(out, dim=1).float()  # (h*w, dim)


def pool_grid(k: int) -> tuple[int, int]:
    """The most square (a, b) grid with a*b = k (16 -> 4x4)."""
    a = max(d for d in range(1, math.isqrt(k) + 1) if k % d == 0)
    return a, k // a


class TimestepEmbedder(nn.Module):
    """t in [0, 1] -> (B, D): sinusoid of 1000*t (DiT's frequency scale), then a 2-layer MLP."""

    def __init__(self, hidden: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = 1000 * t.float()[:, None] * freqs[None]  # (B, half)
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))  # (B, D)


class Attention(nn.Module):
    """Multi-head attention; self-attention when `kv` is None, else cross-attention to `kv`."""

    def __init__(self, hidden: int, heads: int, cross: bool = False):
        super().__init__()
        self.heads = heads
        if cross:
            self.q = nn.Linear(hidden, hidden, bias=False)
            self.kv = nn.Linear(hidden, 2 * hidden, bias=False)
        else:
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor, kv: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        B, N, D = x.shape
        H = self.heads
        if kv is None:
            q, k, v = self.qkv(x).view(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, hd)
        else:
            q = self.q(x).view(B, N, H, D // H).transpose(1, 2)  # (B, H, N, hd)
            k, v = self.kv(kv).view(B, kv.shape[1], 2, H, D // H).permute(2, 0, 3, 1, 4)  # 2 x (B, H, L, hd)
        # mask (B, L) True = attend -> broadcast over heads and queries
        attn_mask = None if mask is None else mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, H, N, hd)
        return self.proj(y.transpose(1, 2).reshape(B, N, D))


class MLP(nn.Module):
    def __init__(self, hidden: int, mlp_ratio: float):
        super().__init__()
        inner = int(hidden * mlp_ratio)
        self.fc1 = nn.Linear(hidden, inner, bias=False)
        self.fc2 = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class LoRA(nn.Module):
    """Per-block rank-r correction of arm H's shared adaLN projection (Hu et al. 2021)."""

    def __init__(self, hidden: int, out: int, rank: int):
        super().__init__()
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, out, bias=False)

    def forward(self, c: Tensor) -> Tensor:
        return self.up(self.down(c))


class DiTBlock(nn.Module):
    """adaLN-zero modulated self-attention, unmodulated cross-attention, modulated FFN."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: float, adaln_rank: int | None):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.cross = Attention(hidden, heads, cross=True)
        self.norm3 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(hidden, mlp_ratio)
        # per_block: own projection c -> 6D; shared (arm H): a LoRA added to the shared projection.
        if adaln_rank is None:
            self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))
        else:
            self.adaLN = nn.Sequential(nn.SiLU(), LoRA(hidden, 6 * hidden, adaln_rank))

    def forward(self, x: Tensor, c: Tensor, cond: Tensor, cond_mask: Tensor | None, shared: Tensor | None) -> Tensor:
        # x (B, N, D) image tokens; c (B, D); cond (B, L, D); shared (B, 6D) or None
        mod = self.adaLN(c) if shared is None else shared + self.adaLN(c)  # (B, 6D)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.chunk(6, dim=-1)
        x = x + gate_a.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_a, scale_a))
        x = x + self.cross(self.norm2(x), kv=cond, mask=cond_mask)
        x = x + gate_m.unsqueeze(1) * self.mlp(modulate(self.norm3(x), shift_m, scale_m))
        return x  # (B, N, D)


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, patch: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))
        self.linear = nn.Linear(hidden, patch * patch * 3)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm(x), shift, scale))  # (B, N, p*p*3)


class NanoDiT(nn.Module):
    def __init__(self, spec: ArmSpec, text_dim: int):
        super().__init__()
        d = spec.model.dims()
        self.hidden, self.depth, self.heads, self.patch = d.hidden, d.depth, d.heads, d.patch
        self.identity_tokens = spec.model.identity_tokens
        self.tread = spec.tread
        self.tread_last = spec.tread.last_block if spec.tread.last_block is not None else d.depth - 2
        D, p = d.hidden, d.patch

        self.x_embed = nn.Linear(3 * p * p, D)  # pixel patch -> token
        self.t_embed = TimestepEmbedder(D)
        self.text_proj = nn.Linear(text_dim, D)
        self.null_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pool_proj = nn.Linear(D, D)  # pooled conditioning -> added to the timestep embedding
        if self.identity_tokens:
            self.id_embed = nn.Linear(3 * p * p, D)  # the reference image's own patch embedding
            self.id_pos = nn.Parameter(torch.zeros(1, self.identity_tokens, D))
        shared = spec.adaln.kind == "shared"
        self.shared_adaLN = nn.Sequential(nn.SiLU(), nn.Linear(D, 6 * D)) if shared else None
        rank = spec.adaln.lora_rank if shared else None
        self.blocks = nn.ModuleList(DiTBlock(D, d.heads, spec.model.mlp_ratio, rank) for _ in range(d.depth))
        self.final = FinalLayer(D, p)
        grid = spec.resolution() // p  # data.resolution when set, else the size's native one
        self.register_buffer("pos", sincos_2d(D, grid, grid)[None], persistent=False)  # (1, N, D)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        # Transformer linears: Xavier-uniform, biases zero (DiT).
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        # Patch embeddings initialised like a conv over the flattened patch (DiT's x_embedder).
        for emb in [self.x_embed] + ([self.id_embed] if self.identity_tokens else []):
            nn.init.xavier_uniform_(emb.weight.view(emb.weight.shape[0], -1))
        nn.init.normal_(self.t_embed.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embed.mlp[2].weight, std=0.02)
        nn.init.normal_(self.null_token, std=0.02)
        if self.identity_tokens:
            nn.init.normal_(self.id_pos, std=0.02)
        # adaLN-zero: zero the modulation (shared projection too) so each block starts as identity.
        # For LoRA only `up` is zeroed: `down` stays random so the LoRA receives gradient.
        for block in self.blocks:
            ada = block.adaLN[-1]
            if isinstance(ada, LoRA):
                nn.init.zeros_(ada.up.weight)
            else:
                nn.init.zeros_(ada.weight)
                nn.init.zeros_(ada.bias)
            # The cross-attention has no gate; its zero output projection keeps the block an identity.
            nn.init.zeros_(block.cross.proj.weight)
        if self.shared_adaLN is not None:
            nn.init.zeros_(self.shared_adaLN[-1].weight)
            nn.init.zeros_(self.shared_adaLN[-1].bias)
        # Zero the output layer: the network predicts 0 at init.
        for lin in (self.final.adaLN[-1], self.final.linear):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def patchify(self, img: Tensor) -> Tensor:
        return patchify(img, self.patch)  # (B, N, 3*p*p), the layout AsymFlow's projection uses too

    def unpatchify(self, x: Tensor, H: int, W: int) -> Tensor:
        return unpatchify(x, self.patch, 3, H, W)  # (B, 3, H, W)

    def positions(self, h: int, w: int, device: torch.device) -> Tensor:
        if self.pos.shape[1] == h * w and h == w:
            return self.pos
        return sincos_2d(self.hidden, h, w)[None].to(device)  # a resolution other than the spec's

    def identity_embed(self, ref: Tensor) -> Tensor:
        """Reference image (B, 3, H, W) -> (B, K, D) tokens, average-pooled on the patch grid."""
        B, _, H, W = ref.shape
        tok = self.id_embed(self.patchify(ref))  # (B, N, D)
        grid = tok.transpose(1, 2).reshape(B, self.hidden, H // self.patch, W // self.patch)
        a, b = pool_grid(self.identity_tokens)
        h, w = grid.shape[2:]
        if h % a == 0 and w % b == 0:  # an even split: a mean over blocks, whose CUDA backward is deterministic
            pooled = grid.reshape(B, self.hidden, a, h // a, b, w // b).mean(dim=(3, 5))  # (B, D, a, b)
        else:  # adaptive_avg_pool2d's CUDA backward has no deterministic kernel (precision.deterministic raises)
            pooled = F.adaptive_avg_pool2d(grid, (a, b))
        return pooled.flatten(2).transpose(1, 2) + self.id_pos  # (B, K, D)

    def forward(
        self,
        x_t: Tensor,
        t: Tensor,
        text: Tensor,
        text_mask: Tensor | None = None,
        identity: Tensor | None = None,
        repa_block: int | None = None,
    ) -> DiTOutput:
        """x_t (B,3,H,W); t (B,) in [0,1]; text (B,L,text_dim); text_mask (B,L) bool, True = real token;
        identity (B,3,H,W) reference image or None; repa_block: return the states after that block."""
        B, _, H, W = x_t.shape
        h, w = H // self.patch, W // self.patch
        x = self.x_embed(self.patchify(x_t)) + self.positions(h, w, x_t.device)  # (B, N, D)

        # Conditioning tokens: [null | text | identity], with a mask only where padding exists.
        parts = [self.null_token.expand(B, -1, -1), self.text_proj(text)]  # (B, 1, D), (B, L, D)
        ones = torch.ones(B, 1 + text.shape[1], dtype=torch.bool, device=x.device)
        masks = [ones[:, :1], text_mask if text_mask is not None else ones[:, 1:]]
        if identity is not None and self.identity_tokens:
            parts.append(self.identity_embed(identity))  # (B, K, D)
            masks.append(torch.ones(B, self.identity_tokens, dtype=torch.bool, device=x.device))
        cond = torch.cat(parts, dim=1).to(x.dtype)  # (B, 1+L(+K), D)
        mask = torch.cat(masks, dim=1)  # (B, 1+L(+K))
        pooled = (cond * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # (B, D) masked mean
        cond_mask = None if text_mask is None else mask  # unmasked SDPA takes the fast kernels
        c = self.t_embed(t) + self.pool_proj(pooled)  # (B, D)
        shared = self.shared_adaLN(c) if self.shared_adaLN is not None else None  # (B, 6D)

        # TREAD: route a random subset of tokens past blocks first..last (training only).
        route = self.training and self.tread.enabled and self.tread.rate > 0
        keep = None
        hidden, kept = None, None
        for i, block in enumerate(self.blocks):
            if route and i == self.tread.first_block:
                n_keep = max(1, round(x.shape[1] * (1 - self.tread.rate)))
                # A fresh random permutation per sample per step, from torch's global RNG.
                keep = torch.rand(B, x.shape[1], device=x.device).argsort(dim=1)[:, :n_keep]  # (B, N')
                x_full = x
                x = torch.gather(x, 1, keep[..., None].expand(-1, -1, self.hidden))  # (B, N', D)
            x = block(x, c, cond, cond_mask, shared)
            if i == repa_block:
                hidden, kept = x, keep
            if keep is not None and i == self.tread_last:
                # Re-inject the routed tokens at their positions before the final blocks.
                x = x_full.scatter(1, keep[..., None].expand(-1, -1, self.hidden), x)  # (B, N, D)
                keep = None
        out = self.final(x, c)  # (B, N, p*p*3)
        return DiTOutput(out=self.unpatchify(out, H, W), hidden=hidden, kept=kept)


def count_params(model: nn.Module) -> dict:
    """Parameter counts: total, trainable, and one entry per top-level module (blocks split by part)."""
    total = sum(p.numel() for p in model.parameters())
    breakdown: dict[str, int] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        # blocks.3.attn.qkv.weight -> blocks.*.attn ; x_embed.weight -> x_embed
        key = f"blocks.*.{parts[2]}" if parts[0] == "blocks" else parts[0]
        breakdown[key] = breakdown.get(key, 0) + p.numel()
    return {
        "params": total,
        "params_millions": round(total / 1e6, 2),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "breakdown": dict(sorted(breakdown.items(), key=lambda kv: -kv[1])),
    }
