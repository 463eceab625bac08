"""A plain DiT of NanoDiT's shapes: the reference arm A is measured against (issue 13, item 3).

Nothing but what a DiT training step needs at these shapes, written as plainly as DiT's `models.py`:
patch embedding, adaLN-zero blocks (self-attention, cross-attention to `cond_len` tokens, GELU MLP),
final layer. Same linears, same attention shapes, same token counts as NanoDiT at the given size, so
the difference between the two is what NanoDiT adds (conditioning assembly, identity tokens, masks,
TREAD bookkeeping), not model shape. Used by `bench/dit_throughput.py --stages night`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class RefBlock(nn.Module):
    def __init__(self, d: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * d, bias=False)
        self.cproj = nn.Linear(d, d, bias=False)
        self.fc1 = nn.Linear(d, int(d * mlp_ratio), bias=False)
        self.fc2 = nn.Linear(int(d * mlp_ratio), d, bias=False)
        self.ada = nn.Linear(d, 6 * d)

    def forward(self, x: Tensor, c: Tensor, cond: Tensor) -> Tensor:
        B, N, D = x.shape
        H = self.heads
        sa, ca, ga, sm, cm, gm = self.ada(F.silu(c)).chunk(6, dim=-1)
        h = _modulate(F.layer_norm(x, (D,), eps=1e-6), sa, ca)
        q, k, v = self.qkv(h).view(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)
        x = x + ga.unsqueeze(1) * self.proj(a)
        h = F.layer_norm(x, (D,), eps=1e-6)
        q = self.q(h).view(B, N, H, D // H).transpose(1, 2)
        k, v = self.kv(cond).view(B, cond.shape[1], 2, H, D // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)
        x = x + self.cproj(a)
        h = _modulate(F.layer_norm(x, (D,), eps=1e-6), sm, cm)
        return x + gm.unsqueeze(1) * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class RefDiT(nn.Module):
    def __init__(self, d: int, depth: int, heads: int, patch: int, tokens: int, text_dim: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.d, self.patch = d, patch
        self.x_embed = nn.Linear(3 * patch * patch, d)
        self.pos = nn.Parameter(torch.randn(1, tokens, d) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        self.text_proj = nn.Linear(text_dim, d)
        self.blocks = nn.ModuleList(RefBlock(d, heads, mlp_ratio) for _ in range(depth))
        self.final_ada = nn.Linear(d, 2 * d)
        self.final = nn.Linear(d, 3 * patch * patch)

    def forward(self, patches: Tensor, t: Tensor, text: Tensor) -> Tensor:
        # patches (B, N, 3p^2); t (B,); text (B, L, text_dim)
        half = 128
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = 1000 * t[:, None] * freqs[None]
        c = self.t_mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))
        cond = self.text_proj(text)
        c = c + cond.mean(1)
        x = self.x_embed(patches) + self.pos
        for block in self.blocks:
            x = block(x, c, cond)
        shift, scale = self.final_ada(F.silu(c)).chunk(2, dim=-1)
        return self.final(_modulate(F.layer_norm(x, (self.d,), eps=1e-6), shift, scale))
