"""The llama the engine trains ("type": "llama"), written in PyTorch for bench/gpu_vs_torch.py --model llama.

Pre-RMSNorm blocks; grouped-query causal attention (kv heads repeated to the query heads, as Hugging Face's eager
Llama does); rotary embeddings with the half-split pairing (Su et al. 2021, RoFormer; Hugging Face's
rotate_half); a SwiGLU MLP (Shazeer 2020) of width F; final RMSNorm; an untied LM head; no biases. Init N(0, 0.02)
(throughput does not depend on it). Attention is PyTorch's fused scaled_dot_product_attention where it exists (PyTorch >= 2.0), else the
materialised masked softmax. The loss is
computed in fp32.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    def __init__(self, C, H, KV, F_):
        super().__init__()
        self.H, self.KV, self.hs = H, KV, C // H
        self.input_layernorm = RMSNorm(C)
        self.q_proj = nn.Linear(C, C, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hs, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hs, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)
        self.post_attention_layernorm = RMSNorm(C)
        self.gate_proj = nn.Linear(C, F_, bias=False)
        self.up_proj = nn.Linear(C, F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.H, self.hs).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.KV, self.hs).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.KV, self.hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.H // self.KV, dim=1)
        v = v.repeat_interleave(self.H // self.KV, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # Debian's PyTorch 1.13: the materialised masked softmax
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hs))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, c))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, V, T, C, L, H, KV, F_, theta):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(C, H, KV, F_) for _ in range(L))
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        hs = C // H
        inv = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed_tokens(idx)
        for blk in self.layers:
            x = blk(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))

    def matmul_weights(self):
        """N of the MFU formula: the parameters that take part in a matrix product, i.e. all but the input
        embedding table (the untied head's are counted; PaLM, appendix B)."""
        return sum(p.numel() for p in self.parameters()) - self.embed_tokens.weight.numel()
