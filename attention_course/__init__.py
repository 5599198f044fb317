"""Attention by hand: the reference library of attention-course. (``attention_course.llama``, which imports
transformers, is not imported here.)"""
from .decoding import CausalSelfAttention, KVCache, decode_mask, kv_cache_bytes, repeat_kv
from .device import pick_device, seed_everything
from .functional import fused_attention, masked_softmax, scaled_dot_product_attention
from .heads import head_dim, merge_heads, merge_heads_flat, split_heads, split_heads_flat
from .masks import (
    additive_to_ignore,
    allow_to_ignore,
    causal_mask,
    fully_masked_rows,
    ignore_to_additive,
    ignore_to_allow,
    ignore_to_keep,
    keep_to_ignore,
    merge_masks,
    padding_mask,
)
from .multihead import MultiheadAttention
from .parity import ParityReport, assert_close_report, compare, copy_weights
from .plots import plot_attention, plot_mask
from .rope import apply_rope, halves_from_interleaved, rope_cos_sin, rotate_half
from .scores import AdditiveScore, DotProductScore, SelfAttentionScore
from .tiled import tiled_attention

__all__ = [
    "AdditiveScore",
    "CausalSelfAttention",
    "DotProductScore",
    "KVCache",
    "MultiheadAttention",
    "ParityReport",
    "SelfAttentionScore",
    "additive_to_ignore",
    "allow_to_ignore",
    "apply_rope",
    "assert_close_report",
    "causal_mask",
    "compare",
    "copy_weights",
    "decode_mask",
    "fully_masked_rows",
    "fused_attention",
    "halves_from_interleaved",
    "head_dim",
    "ignore_to_additive",
    "ignore_to_allow",
    "ignore_to_keep",
    "keep_to_ignore",
    "kv_cache_bytes",
    "masked_softmax",
    "merge_heads",
    "merge_heads_flat",
    "merge_masks",
    "padding_mask",
    "pick_device",
    "plot_attention",
    "plot_mask",
    "repeat_kv",
    "rope_cos_sin",
    "rotate_half",
    "scaled_dot_product_attention",
    "seed_everything",
    "split_heads",
    "split_heads_flat",
    "tiled_attention",
]
