"""The backward kernels: the probabilities recomputed from Q, K and the stored log-sum-exp (chapter 13).

With S = scale * Q K^T, P = exp(S - lse) row by row, O = P V and dO the gradient of the loss with respect to O:

    dV = P^T dO          dP = dO V^T          dS = P * (dP - D),  D = rowsum(dO * O)
    dQ = scale * dS K    dK = scale * dS^T Q

(D = rowsum(P * dP) = rowsum(dO * O): the softmax's Jacobian, proved in the chapter.) Two kernels, so that no two
programs ever add into the same place: ``kv_kernel`` gives each program a tile of keys, which it holds while the query
tiles stream past, summing its dK and dV; ``q_kernel`` gives each a tile of queries, summing its dQ over the key tiles,
as the forward kernel does. Each recomputes a tile of P instead of reading an L x S matrix back. Causal and padded
tiles are skipped as in the forward kernel (for the keys: query tiles wholly before the key tile see none of it).
The price of two kernels: both compute q k^T and dO v^T, seven tile products per pair of tiles where one kernel
doing both loops (Triton's fused-attention tutorial) or one adding into dQ atomically (FlashAttention-2) does five.
"""
import triton
import triton.language as tl

from .forward import key_end, visible


@triton.jit
def _probabilities(q, k, lse, rows, keys, L, n_keys, scale,
                   CAUSAL: tl.constexpr):
    """The tile of P = exp(scale * q k^T - lse), 0 where a query may not see
    a key or either is outside."""
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    seen = (rows[:, None] < L) & visible(rows, keys, n_keys, CAUSAL)
    return tl.where(seen, tl.exp(s - lse[:, None]), 0.0)  # (BM, BN)


@triton.jit
def kv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, LENGTHS, scale, L, S, H,
              sqb, sqh, sql, skb, skh, sks, svb, svh, svs,
              D: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_LENGTHS: tl.constexpr,
              ACC: tl.constexpr):
    j, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    keys = j * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    dims = tl.arange(0, BLOCK_D)
    n_keys = S
    if HAS_LENGTHS:
        n_keys = tl.load(LENGTHS + b)
    inside = (keys[:, None] < n_keys) & (dims[None, :] < D)
    kv = keys[:, None] * sks + dims[None, :]  # K, V, dK, dV: one layout
    k = tl.load(K + b * skb + h * skh + kv, mask=inside, other=0.0)
    v = tl.load(V + b * svb + h * svh + kv, mask=inside, other=0.0)

    begin = 0
    if CAUSAL:  # the first query tile that sees any of these keys
        begin = (j * BLOCK_N // BLOCK_M) * BLOCK_M
    # a tile of padding only: no work, dK = dV = 0
    end = tl.where(j * BLOCK_N < n_keys, L, begin)
    dk = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    dv = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    for start in range(begin, end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        at = b * sqb + h * sqh + rows[:, None] * sql + dims[None, :]
        here = (rows[:, None] < L) & (dims[None, :] < D)
        q = tl.load(Q + at, mask=here, other=0.0)  # Q and dO: one layout
        do = tl.load(DO + at, mask=here, other=0.0)
        lse = tl.load(LSE + bh * L + rows, mask=rows < L, other=0.0)
        delta = tl.load(DELTA + bh * L + rows, mask=rows < L, other=0.0)
        p = _probabilities(q, k, lse, rows, keys, L, n_keys, scale, CAUSAL)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")  # (BM, BN)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision="ieee")
    out = (keys[:, None] < S) & (dims[None, :] < D)
    tl.store(DK + b * skb + h * skh + kv, (dk * scale).to(DK.dtype.element_ty),
             mask=out)
    tl.store(DV + b * svb + h * svh + kv, dv.to(DV.dtype.element_ty), mask=out)


@triton.jit
def q_kernel(Q, K, V, DO, LSE, DELTA, DQ, LENGTHS, scale, L, S, H,
             sqb, sqh, sql, skb, skh, sks, svb, svh, svs,
             D: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, HAS_LENGTHS: tl.constexpr,
             ACC: tl.constexpr):
    i, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    at = b * sqb + h * sqh + rows[:, None] * sql + dims[None, :]
    here = (rows[:, None] < L) & (dims[None, :] < D)
    q = tl.load(Q + at, mask=here, other=0.0)  # Q, dO, dQ: one layout
    do = tl.load(DO + at, mask=here, other=0.0)
    lse = tl.load(LSE + bh * L + rows, mask=rows < L, other=0.0)
    delta = tl.load(DELTA + bh * L + rows, mask=rows < L, other=0.0)
    n_keys = S
    if HAS_LENGTHS:
        n_keys = tl.load(LENGTHS + b)
    end = key_end(i, n_keys, L, BLOCK_M, CAUSAL)  # as in the forward kernel
    dq = tl.zeros((BLOCK_M, BLOCK_D), ACC)
    for start in range(0, end, BLOCK_N):
        keys = start + cols
        inside = (keys[:, None] < n_keys) & (dims[None, :] < D)
        kv = keys[:, None] * sks + dims[None, :]  # K and V: one layout
        k = tl.load(K + b * skb + h * skh + kv, mask=inside, other=0.0)
        v = tl.load(V + b * svb + h * svh + kv, mask=inside, other=0.0)
        p = _probabilities(q, k, lse, rows, keys, L, n_keys, scale, CAUSAL)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])  # (BM, BN)
        dq += tl.dot(ds.to(k.dtype), k, input_precision="ieee")
    tl.store(DQ + at, (dq * scale).to(DQ.dtype.element_ty), mask=here)
