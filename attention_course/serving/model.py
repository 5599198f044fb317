"""A tiny decoder built on the course's :class:`~attention_course.decoding.CausalSelfAttention`, runnable three ways:

* :meth:`TinyDecoder.generate_alone`: one request, greedy, with chapter 10's ``KVCache`` per layer (the reference);
* :func:`generate_static`: a static batch: requests left-padded to the longest prompt, started together, stepped
  until the one with most tokens to generate has finished;
* :meth:`TinyDecoder.step`: one continuous-batching step on packed tokens, reading a paged cache
  (``forward`` for :class:`~attention_course.serving.Scheduler`).

The three share every weight; only the arrangement of the keys differs.
"""
from __future__ import annotations

import torch
from torch import nn

from ..decoding import CausalSelfAttention, KVCache
from .attention import paged_self_attention


class TinyDecoder(nn.Module):
    """Token embedding, ``layers`` blocks of x + attention(norm(x)), x + mlp(norm(x)), a final norm and the
    vocabulary map. Positions enter through RoPE in the attention layers only."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, kv_heads: int = 2, layers: int = 2,
                 window: int | None = None, dtype=torch.float64, device=None):
        super().__init__()
        f = {"dtype": dtype, "device": device}
        self.embed = nn.Embedding(vocab, dim, **f)
        self.norms1 = nn.ModuleList(nn.LayerNorm(dim, **f) for _ in range(layers))
        self.attn = nn.ModuleList(CausalSelfAttention(dim, heads, kv_heads, window=window, **f) for _ in range(layers))
        self.norms2 = nn.ModuleList(nn.LayerNorm(dim, **f) for _ in range(layers))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim, **f), nn.GELU(), nn.Linear(2 * dim, dim, **f))
                                  for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim, **f), nn.Linear(dim, vocab, **f)

    def _blocks(self, x, attend):
        for i, (n1, n2, mlp) in enumerate(zip(self.norms1, self.norms2, self.mlps)):
            x = x + attend(i, n1(x))
            x = x + mlp(n2(x))
        return self.head(self.norm(x))

    def forward(self, tokens, positions=None, caches=None, key_padding_mask=None):
        """tokens (B, L) -> logits (B, L, V), the course's layers as they are (caches: a KVCache per layer)."""
        caches = caches or [None] * len(self.attn)
        return self._blocks(self.embed(tokens),
                            lambda i, x: self.attn[i](x, positions, caches[i], key_padding_mask))

    def step(self, batch, cache, varlen: bool = False):
        """One continuous-batching step: the packed tokens (N,) of ``batch`` -> logits (N, V); ``varlen``: each query
        scores its own request's keys only (see :func:`~attention_course.serving.attention.paged_self_attention`)."""
        device = self.head.weight.device
        return self._blocks(self.embed(batch.tokens.to(device)),
                            lambda i, x: paged_self_attention(self.attn[i], x, batch, cache, i, varlen))

    @torch.no_grad()
    def generate_alone(self, prompt, max_new_tokens: int) -> list:
        """Greedy tokens of one request: prefill, then one token per step, a KVCache per layer."""
        device = self.head.weight.device
        caches = [KVCache() for _ in self.attn]
        logits = self(torch.tensor([prompt], device=device), caches=caches)[0, -1]  # (V,)
        out = [int(logits.argmax())]
        while len(out) < max_new_tokens:
            logits = self(torch.tensor([[out[-1]]], device=device), caches=caches)[0, -1]
            out.append(int(logits.argmax()))
        return out


@torch.no_grad()
def generate_static(model: TinyDecoder, prompts, max_new_tokens, batch_size: int) -> tuple[list, int]:
    """Greedy tokens of every request, in static batches of ``batch_size`` (arrival order): each batch left-padded,
    prefilled together and stepped max(max_new_tokens) times. Returns (tokens per request, forward passes)."""
    device = model.head.weight.device
    results, passes = [], 0
    for start in range(0, len(prompts), batch_size):
        group, news = prompts[start:start + batch_size], max_new_tokens[start:start + batch_size]
        P = max(len(p) for p in group)
        ids = torch.tensor([[0] * (P - len(p)) + list(p) for p in group], device=device)  # (B, P), left-padded
        pad = torch.tensor([[True] * (P - len(p)) + [False] * len(p) for p in group], device=device)  # (B, P)
        positions = (~pad).long().cumsum(-1) - 1  # (B, P): real tokens at 0 .. len - 1
        caches = [KVCache() for _ in model.attn]
        logits = model(ids, positions.clamp(min=0), caches, pad)[:, -1]  # (B, V)
        passes += 1
        out = [[int(t)] for t in logits.argmax(-1)]
        for _ in range(max(news) - 1):  # every row steps until the longest is done
            new = torch.tensor([[o[-1]] for o in out], device=device)  # (B, 1)
            positions = positions[:, -1:] + 1
            pad = torch.cat([pad, torch.zeros_like(new, dtype=torch.bool)], 1)
            logits = model(new, positions, caches, pad)[:, -1]
            passes += 1
            for o, t in zip(out, logits.argmax(-1)):
                o.append(int(t))
        results += [o[:n] for o, n in zip(out, news)]
    return results, passes
