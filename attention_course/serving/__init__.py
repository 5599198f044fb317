"""Attention that serves many requests at once (chapter 12), one idea per module:

* ``packing``: sequences laid end to end with ``cu_seqlens`` and the block-diagonal causal mask;
* ``paged``: ``PagedKVCache``, a pool of fixed-size blocks and a block table per request, prefix sharing with
  reference counts and copy on write; ``gather_blocks``;
* ``scheduler``: ``Scheduler``, continuous batching (admit and retire at every step, prefill chunks beside decode
  tokens; blocks reserved for a request's whole length, or taken on demand with preemption: ``choose_victims``);
* ``prefix``: ``block_keys``, full blocks keyed by a hash chain; ``PrefixCachingKVCache``, shared prefixes found
  without ``fork`` and evicted least recently used; ``PrefixScheduler``, the scheduler on it;
* ``attention``: ``paged_self_attention``, the course's causal layer on a step's packed tokens and the paged cache
  (``varlen=True``: each query scores its own request's keys only); ``serve_llama`` for a swapped transformers Llama;
* ``model``: ``TinyDecoder`` and ``generate_static``, a small model to serve and its static-batching baseline;
* ``sinks``: sink logits, merging partial softmaxes, StreamingLLM's cache, gpt-oss's attention through the course.
"""
from .attention import (continuous_batching_config, paged_implementation, paged_self_attention, serve_llama,
                        step_keys, step_mask)
from .model import TinyDecoder, generate_static
from .packing import (block_diagonal_mask, check_cu_seqlens, cu_seqlens, pack, packed_attention, packed_positions,
                      padding_waste, sequence_ids, unpack)
from .paged import (PagedKVCache, PoolExhausted, check_block_table, gather_blocks, paged_slots,
                    preallocated_slots)
from .prefix import PrefixCachingKVCache, PrefixScheduler, block_hash, block_keys
from .scheduler import Request, Scheduler, StepBatch, choose_victims
from .sinks import (StreamingKVCache, course_sink_attention, merge_partials, partial_attention,
                    register_sink_attention, sink_attention, streaming_mask)

__all__ = [
    "PagedKVCache", "PoolExhausted", "PrefixCachingKVCache", "PrefixScheduler", "Request", "Scheduler", "StepBatch",
    "StreamingKVCache", "TinyDecoder", "block_diagonal_mask", "block_hash", "block_keys", "check_block_table",
    "check_cu_seqlens", "choose_victims", "continuous_batching_config", "course_sink_attention", "cu_seqlens",
    "gather_blocks", "generate_static", "merge_partials", "pack", "packed_attention", "packed_positions",
    "padding_waste", "paged_implementation", "paged_self_attention", "paged_slots", "partial_attention",
    "preallocated_slots", "register_sink_attention", "sequence_ids", "serve_llama", "sink_attention", "step_keys",
    "step_mask", "streaming_mask", "unpack"
]
