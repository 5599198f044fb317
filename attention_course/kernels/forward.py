"""The forward kernel: one program holds a tile of queries and streams the key/value tiles past it (chapter 13).

Three small functions are its pieces, the chapter's exercises: ``key_end`` (where the loop over keys ends),
``visible`` (which keys of a tile each query may see) and ``online_step`` (a tile folded into the running state).

Program (i, bh) owns queries i*BLOCK_M .. i*BLOCK_M + BLOCK_M - 1 of batch b = bh // H, head bh % H. It loads its
query tile once, then for each tile of BLOCK_N keys computes the scores, folds them into the running row maximum m,
normaliser l and weighted sum acc (chapter 8's online softmax), and finally writes O = acc / l and each row's
log-sum-exp m + log l, which the backward kernels use to recompute the probabilities. Only q, acc, m, l and one tile
of scores live on the chip; K and V are read once per query tile and nothing of size L x S is ever written.

Causal (key j visible to query i when j <= i): the loop stops after the tile that holds the diagonal of the program's
last query (the last of the tile, or of the sequence), so the tiles above it are never loaded: every tile a program
loads holds at least one key one of its queries may see. Inside the tiles loaded, keys past the diagonal are masked.
Key padding: keys from LENGTHS[b] on are masked, and the loop stops at the tile that holds the last key. A row that
sees no key at all (length 0) writes O = 0 and log-sum-exp 0 (the package's convention for an empty row).
"""
import triton
import triton.language as tl


@triton.jit
def key_end(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """Where query tile i's loop over keys ends: keys from there on are never
    loaded (exercise 13.2)."""
    end = n_keys
    if CAUSAL:  # no key after the program's last query
        end = tl.minimum(end, tl.minimum((i + 1) * BLOCK_M, L))
    return end


@triton.jit
def visible(rows, keys, n_keys, CAUSAL: tl.constexpr):
    """Which keys of a tile each query may see (exercise 13.2)."""
    seen = keys[None, :] < n_keys  # (1, BLOCK_N)
    if CAUSAL:
        seen = seen & (keys[None, :] <= rows[:, None])  # (BLOCK_M, BLOCK_N)
    return seen


@triton.jit
def online_step(m, l, acc, s, v):  # noqa: E741
    """A tile of scores s folded into the running (m, l, acc) of its queries,
    chapter 8's online softmax (exercise 13.1)."""
    m_new = tl.maximum(m, tl.max(s, 1))
    # a row with no key yet subtracts 0: exp(-inf - 0) = 0, not NaN
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - shift[:, None])  # this tile's unnormalised weights
    alpha = tl.exp(m - shift)  # rescales what was summed before
    l = l * alpha + tl.sum(p, 1)  # noqa: E741
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v,
                                        input_precision="ieee")
    return m_new, l, acc


@triton.jit
def forward_kernel(Q, K, V, O, LSE, LENGTHS, scale, L, S, H,
                   sqb, sqh, sql, skb, skh, sks, svb, svh, svs, sob, soh, sol,
                   D: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, HAS_LENGTHS: tl.constexpr,
                   ACC: tl.constexpr):
    i, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions in a tile
    dims = tl.arange(0, BLOCK_D)  # (BLOCK_D,) features, D padded
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sql + dims[None, :],
                mask=(rows[:, None] < L) & (dims[None, :] < D),
                other=0.0)  # (BLOCK_M, BLOCK_D)

    n_keys = S
    if HAS_LENGTHS:
        n_keys = tl.load(LENGTHS + b)
    end = key_end(i, n_keys, L, BLOCK_M, CAUSAL)  # keys from `end` on: unread

    m = tl.full((BLOCK_M,), float("-inf"), ACC)  # running row maximum
    l = tl.zeros((BLOCK_M,), ACC)  # running normaliser  # noqa: E741
    acc = tl.zeros((BLOCK_M, BLOCK_D), ACC)  # running weighted sum
    for start in range(0, end, BLOCK_N):
        keys = start + cols  # (BLOCK_N,)
        inside = (keys[:, None] < n_keys) & (dims[None, :] < D)
        at = keys[:, None] * sks + dims[None, :]  # K and V: one layout
        k = tl.load(K + b * skb + h * skh + at, mask=inside, other=0.0)
        v = tl.load(V + b * svb + h * svh + at, mask=inside, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(visible(rows, keys, n_keys, CAUSAL), s, float("-inf"))
        m, l, acc = online_step(m, l, acc, s, v)  # noqa: E741

    seen = l > 0
    out = acc / tl.where(seen, l, 1.0)[:, None]  # an empty row: acc = 0
    lse = tl.where(seen, m + tl.log(tl.where(seen, l, 1.0)), 0.0)
    tl.store(O + b * sob + h * soh + rows[:, None] * sol + dims[None, :],
             out.to(O.dtype.element_ty),
             mask=(rows[:, None] < L) & (dims[None, :] < D))
    tl.store(LSE + bh * L + rows, lse, mask=rows < L)
