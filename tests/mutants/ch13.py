"""Chapter 13's checkers under mutation: the learner's @triton.jit pieces of FlashAttention's kernels, each mutant a
learner's wrong piece written as a learner would, run in the checker's kernel (in Triton's interpreter on a CPU)."""
from __future__ import annotations  # (tl.constexpr read by Triton, not by Python: none without Triton)

from attention_course.exercises import ch13  # (first: it sets TRITON_INTERPRET=1 where no GPU is, before Triton)
from attention_course.exercises.ch13 import jit, triton
from mutants import Catalogue, Mutant

tl = triton.language if triton is not None else None  # without Triton (not Linux): no catalogue, below


def check_tile_mask(pair):
    ch13.check_tile_mask(*pair)


def check_backward_step(pair):
    ch13.check_backward_step(*pair)


# 1. online_step: two right styles, then the mutants.

@jit
def step_stand_in(m, l, acc, s, v):  # noqa: E741
    m_new = tl.maximum(m, tl.max(s, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp(-inf - 0) = 0, not NaN
    alpha = tl.exp(m - shift)
    p = tl.exp(s - shift[:, None])
    l = alpha * l + tl.sum(p, axis=1)  # noqa: E741
    acc = acc * alpha[:, None]
    acc += tl.dot(p, v)
    return m_new, l, acc


@jit
def step_exp2_where(m, l, acc, s, v):  # noqa: E741
    """exp2 of scores in base 2, each exponential guarded by a where."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    p = tl.where(s == float("-inf"), 0.0, tl.exp2((s - m_new[:, None]) * 1.4426950408889634))
    alpha = tl.where(m == float("-inf"), 0.0, tl.exp2((m - m_new) * 1.4426950408889634))
    return m_new, l * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")


@jit
def weights(m, s):
    """(m_new, p, alpha), right: the mutants below that share them go wrong after."""
    m_new = tl.maximum(m, tl.max(s, 1))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, tl.exp(s - safe[:, None]), tl.exp(m - safe)


@jit
def acc_unscaled(m, l, acc, s, v):  # noqa: E741
    m_new, p, alpha = weights(m, s)
    return m_new, l * alpha + tl.sum(p, 1), acc + tl.dot(p, v)


@jit
def l_unscaled(m, l, acc, s, v):  # noqa: E741
    m_new, p, alpha = weights(m, s)
    l += tl.sum(p, 1)  # noqa: E741
    return m_new, l, acc * alpha[:, None] + tl.dot(p, v)


@jit
def tile_max_only(m, l, acc, s, v):  # noqa: E741
    m_new = tl.max(s, 1)
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - safe[:, None])
    alpha = tl.exp(m - safe)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


@jit
def one_max_per_tile(m, l, acc, s, v):  # noqa: E741
    m_new = tl.maximum(m, tl.max(s))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - shift[:, None])
    correction = tl.exp(m - shift)
    return m_new, l * correction + tl.sum(p, 1), acc * correction[:, None] + tl.dot(p, v)


@jit
def m_without_inf(m, l, acc, s, v):  # noqa: E741
    """-inf replaced by 0 in m_new itself, to keep NaN away, and returned so."""
    top = tl.maximum(m, tl.max(s, 1))
    m_new = tl.where(top > float("-inf"), top, 0.0)
    alpha = tl.exp(m - m_new)
    l = l * alpha + tl.sum(tl.exp(s - m_new[:, None]), 1)  # noqa: E741
    return m_new, l, acc * alpha[:, None] + tl.dot(tl.exp(s - m_new[:, None]), v)


@jit
def exp_backwards(m, l, acc, s, v):  # noqa: E741
    m_new = tl.maximum(m, tl.max(s, 1))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - safe[:, None])
    alpha = tl.exp(safe - m)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


@jit
def exp_backwards_guarded(m, l, acc, s, v):  # noqa: E741
    m_new = tl.maximum(m, tl.max(s, 1))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - safe[:, None])
    alpha = tl.where(m == float("-inf"), 0.0, tl.exp(m_new - m))
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


@jit
def unguarded(m, l, acc, s, v):  # noqa: E741
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


@jit
def p_old_max(m, l, acc, s, v):  # noqa: E741
    m_new = tl.maximum(m, tl.max(s, 1))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m[:, None])
    alpha = tl.exp(m - safe)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


@jit
def p_old_max_zero(m, l, acc, s, v):  # noqa: E741
    """p against the old maximum, with 0 standing in for it while it is -inf."""
    m_new = tl.maximum(m, tl.max(s, 1))
    old = tl.where(m == float("-inf"), 0.0, m)
    alpha = tl.exp(m - tl.where(m_new == float("-inf"), 0.0, m_new))
    p = tl.exp(s - old[:, None])
    return m_new, alpha * l + tl.sum(p, 1), alpha[:, None] * acc + tl.dot(p, v)


@jit
def no_pv(m, l, acc, s, v):  # noqa: E741
    m_new, p, alpha = weights(m, s)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None]


@jit
def pv_twice(m, l, acc, s, v):  # noqa: E741
    m_new, p, alpha = weights(m, s)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    acc += tl.dot(p, v)
    return m_new, l * alpha + tl.sum(p, 1), acc


@jit
def normalised_inside(m, l, acc, s, v):  # noqa: E741
    m_new, p, alpha = weights(m, s)
    l = l * alpha + tl.sum(p, 1)  # noqa: E741
    return m_new, l, (acc * alpha[:, None] + tl.dot(p, v)) / l[:, None]


@jit
def normalised_inside_guarded(m, l, acc, s, v):  # noqa: E741
    m_new, p, alpha = weights(m, s)
    l_new = l * alpha + tl.sum(p, 1)
    return m_new, l_new, (acc * alpha[:, None] + tl.dot(p, v)) / tl.where(l_new > 0, l_new, 1.0)[:, None]


@jit
def old_m_returned(m, l, acc, s, v):  # noqa: E741
    m_new, p, alpha = weights(m, s)
    return m, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


@jit
def alpha_unbroadcast(m, l, acc, s, v):  # noqa: E741
    """alpha (BM,) against acc (BM, D) without [:, None]: lined up from the right, along the features."""
    m_new, p, alpha = weights(m, s)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha + tl.dot(p, v)


@jit
def half_weights(m, l, acc, s, v):  # noqa: E741
    """Outside the catalogue: p halved in acc only."""
    m_new, p, alpha = weights(m, s)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p * 0.5, v)


@jit
def step_stub(m, l, acc, s, v):  # noqa: E741
    raise NotImplementedError()


def step_plain(m, l, acc, s, v):  # noqa: E741 - the decorator forgotten
    return m, l, acc


# 2. key_end and visible.

@jit
def end_package(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    end = n_keys
    if CAUSAL:
        end = tl.minimum(end, tl.minimum((i + 1) * BLOCK_M, L))
    return end


@jit
def end_returns(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    if CAUSAL:
        return tl.minimum(tl.minimum(n_keys, L), i * BLOCK_M + BLOCK_M)
    return n_keys


@jit
def visible_package(rows, keys, n_keys, CAUSAL: tl.constexpr):
    seen = (keys[None, :] < n_keys) & (rows[:, None] > -1)
    if CAUSAL:
        seen = seen & (keys[None, :] <= rows[:, None])
    return seen


@jit
def visible_difference(rows, keys, n_keys, CAUSAL: tl.constexpr):
    """A (1, BN) mask where not causal: broadcast by the kernel."""
    ok = keys[None, :] < n_keys
    if CAUSAL:
        ok = ok & (rows[:, None] - keys[None, :] >= 0)
    return ok


@jit
def end_before_diagonal(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    end = n_keys
    if CAUSAL:
        end = tl.minimum(end, tl.minimum(i * BLOCK_M, L))
    return end


@jit
def end_past_diagonal(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    end = n_keys
    if CAUSAL:
        end = tl.minimum(end, tl.minimum((i + 2) * BLOCK_M, L))
    return end


@jit
def end_all_keys(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    return n_keys


@jit
def end_causal_always(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    return tl.minimum(n_keys, tl.minimum((i + 1) * BLOCK_M, L))


@jit
def end_without_lengths(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    if CAUSAL:
        return tl.minimum((i + 1) * BLOCK_M, L)
    return n_keys


@jit
def end_without_L(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    end = n_keys
    if CAUSAL:
        end = tl.minimum(end, (i + 1) * BLOCK_M)
    return end


@jit
def end_one_key_short(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    end = n_keys - 1
    if CAUSAL:
        end = tl.minimum(end, tl.minimum((i + 1) * BLOCK_M, L))
    return end


@jit
def visible_through_n_keys(rows, keys, n_keys, CAUSAL: tl.constexpr):
    seen = (keys[None, :] <= n_keys) & (rows[:, None] >= 0)
    if CAUSAL:
        seen = seen & (keys[None, :] <= rows[:, None])
    return seen


@jit
def visible_no_padding(rows, keys, n_keys, CAUSAL: tl.constexpr):
    seen = rows[:, None] >= keys[None, :] - 1000000
    if CAUSAL:
        seen = keys[None, :] <= rows[:, None]
    return seen


@jit
def visible_strict(rows, keys, n_keys, CAUSAL: tl.constexpr):
    seen = (keys[None, :] < n_keys) & (rows[:, None] >= 0)
    if CAUSAL:
        seen = seen & (keys[None, :] < rows[:, None])
    return seen


@jit
def visible_backwards(rows, keys, n_keys, CAUSAL: tl.constexpr):
    seen = (keys[None, :] < n_keys) & (rows[:, None] >= 0)
    if CAUSAL:
        seen = seen & (keys[None, :] >= rows[:, None])
    return seen


@jit
def visible_padding_only(rows, keys, n_keys, CAUSAL: tl.constexpr):
    return (keys[None, :] < n_keys) & (rows[:, None] >= 0)


@jit
def visible_causal_only(rows, keys, n_keys, CAUSAL: tl.constexpr):
    if CAUSAL:
        return keys[None, :] <= rows[:, None]
    return (keys[None, :] < n_keys) & (rows[:, None] >= 0)


@jit
def visible_transposed(rows, keys, n_keys, CAUSAL: tl.constexpr):
    """Outside the catalogue: the tile built (keys, rows), read as (rows, keys)."""
    seen = (keys[:, None] < n_keys) & (rows[None, :] >= 0)
    if CAUSAL:
        seen = seen & (keys[:, None] <= rows[None, :])
    return seen


@jit
def end_stub(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    raise NotImplementedError()


# 3. probabilities and score_grad.

@jit
def prob_package(s, lse):
    return tl.exp(s - lse[:, None])


@jit
def grad_package(p, dp, do, o):
    delta = tl.sum(do * o, axis=1)
    return p * (dp - delta[:, None])


@jit
def prob_exp2(s, lse):
    return tl.exp2(s * 1.4426950408889634 - lse[:, None] * 1.4426950408889634)


@jit
def grad_expanded(p, dp, do, o):
    return p * dp - p * tl.sum(o * do, 1)[:, None]


@jit
def prob_lse_columns(s, lse):
    return tl.exp(s - lse[None, :])


@jit
def prob_tile_max(s, lse):
    return tl.exp(s - tl.max(s, 1)[:, None])


@jit
def prob_no_lse(s, lse):
    return tl.exp(s)


@jit
def prob_plus_lse(s, lse):
    return tl.exp(s + lse[:, None])


@jit
def grad_no_delta(p, dp, do, o):
    return p * dp


@jit
def grad_tile_delta(p, dp, do, o):
    delta = tl.sum(p * dp, 1)
    return p * (dp - delta[:, None])


@jit
def grad_do_delta(p, dp, do, o):
    return p * (dp - tl.sum(do, 1)[:, None])


@jit
def grad_one_delta(p, dp, do, o):
    return p * (dp - tl.sum(do * o))


@jit
def grad_flipped(p, dp, do, o):
    return p * (tl.sum(do * o, 1)[:, None] - dp)


@jit
def grad_no_p(p, dp, do, o):
    return dp - tl.sum(do * o, 1)[:, None]


@jit
def grad_misparenthesised(p, dp, do, o):
    """Outside the catalogue: P * dP - D, the parentheses lost."""
    return p * dp - tl.sum(do * o, 1)[:, None]


@jit
def grad_stub(p, dp, do, o):
    raise NotImplementedError()


NOT_JIT = r"not a Triton function.*@triton\.jit"
CATALOGUES = [] if triton is None else [
    Catalogue(ch13.check_online_step, {"stand-in for -inf, += (the package's)": step_stand_in,
                                       "exp2 and where-guards": step_exp2_where}, [
        Mutant("acc not rescaled", acc_unscaled, r"without rescaling acc"),
        Mutant("l not rescaled", l_unscaled, r"without rescaling l\b"),
        Mutant("m_new = the tile's maximum alone", tile_max_only, r"forgetting the maximum of the tiles before"),
        Mutant("tl.max(s) without an axis", one_max_per_tile, r"maximum over the WHOLE TILE"),
        Mutant("0 for -inf in m_new, returned", m_without_inf, r"returns the stand-in 0 as m"),
        Mutant("exp(m_new - m)", exp_backwards, r"wrong way round", "wrong way"),
        Mutant("exp(m_new - m), 0 where m is -inf", exp_backwards_guarded, r"wrong way round", "wrong way"),
        Mutant("no stand-in for a row with no key yet", unguarded, (r"rows that have seen no key yet",
                                                                    r"exp\(-inf - -inf\) = NaN")),
        Mutant("p against the old maximum", p_old_max, r"against the OLD maximum", "old maximum"),
        Mutant("p against the old maximum, 0 for -inf", p_old_max_zero, r"against the OLD maximum", "old maximum"),
        Mutant("p @ v never added", no_pv, r"never adds this tile's p @ v"),
        Mutant("p @ v added twice", pv_twice, r"TWICE"),
        Mutant("acc divided by l in the loop", normalised_inside, r"divides acc by l INSIDE the loop", "inside"),
        Mutant("acc divided by l in the loop, 0 for 0", normalised_inside_guarded, r"divides acc by l INSIDE the loop",
               "inside"),
        Mutant("the old m returned", old_m_returned, r"returns the old m"),
        Mutant("alpha without [:, None]", alpha_unbroadcast, (r"Cannot make_shape_compatible", r"\[:, None\]")),
        Mutant("p halved in acc (outside the catalogue)", half_weights, r"O is 0\.5 times the right one"),
        Mutant("the stub", step_stub, r"stub"),
        Mutant("no @triton.jit", step_plain, NOT_JIT),
    ]),
    Catalogue(check_tile_mask, {"the package's": (end_package, visible_package),
                                "returns, a (1, BN) mask": (end_returns, visible_difference)}, [
        Mutant("end at i * BLOCK_M", (end_before_diagonal, visible_package), r"ONE TILE EARLY"),
        Mutant("end at (i + 2) * BLOCK_M", (end_past_diagonal, visible_package), r"ONE TILE TOO MANY"),
        Mutant("no causal skip", (end_all_keys, visible_package), r"load EVERY key tile"),
        Mutant("the causal end when not causal", (end_causal_always, visible_package),
               r"even when CAUSAL is off"),
        Mutant("end without n_keys", (end_without_lengths, visible_difference), r"without tl\.minimum with n_keys"),
        Mutant("keys past n_keys visible", (end_package, visible_no_padding), r"last tile's mask forgotten"),
        Mutant("end without L", (end_without_L, visible_package), r"without L"),
        Mutant("end at n_keys - 1", (end_one_key_short, visible_package), r"ONE KEY SHORT"),
        Mutant("keys <= n_keys", (end_package, visible_through_n_keys), r"let key n_keys be seen"),
        Mutant("keys < rows", (end_returns, visible_strict), r"hide the diagonal"),
        Mutant("keys >= rows", (end_package, visible_backwards), r"WRONG WAY ROUND"),
        Mutant("CAUSAL ignored by the mask", (end_package, visible_padding_only), r"ignoring CAUSAL"),
        Mutant("the padding mask dropped when causal", (end_returns, visible_causal_only),
               r"drop the padding mask when CAUSAL"),
        Mutant("the mask built (keys, rows) (outside the catalogue)", (end_package, visible_transposed),
               r"differs at \d+ of \d+ entries"),
        Mutant("the stub", (end_stub, visible_package), r"stub"),
        Mutant("no @triton.jit on visible", (end_package, visible_package.fn), NOT_JIT),
    ]),
    Catalogue(check_backward_step, {"the package's": (prob_package, grad_package),
                                    "exp2, P * dP - P * D": (prob_exp2, grad_expanded)}, [
        Mutant("lse[None, :]", (prob_lse_columns, grad_package), r"ALONG THE KEYS"),
        Mutant("the tile's maximum for lse", (prob_tile_max, grad_package), r"TILE's own maximum"),
        Mutant("exp(s)", (prob_no_lse, grad_package), r"WITHOUT THE LOG-SUM-EXP"),
        Mutant("exp(s + lse)", (prob_plus_lse, grad_package), r"ADD the log-sum-exp"),
        Mutant("dS = P * dP", (prob_package, grad_no_delta), r"leaving out D"),
        Mutant("D from the tile", (prob_package, grad_tile_delta), (r"THIS TILE only", r"whole row")),
        Mutant("D = rowsum(dO)", (prob_exp2, grad_do_delta), r"D = rowsum\(dO\), without O"),
        Mutant("tl.sum(do * o) without an axis", (prob_package, grad_one_delta), r"WITHOUT AN AXIS"),
        Mutant("the sign flipped", (prob_package, grad_flipped), r"SIGN FLIPPED"),
        Mutant("dS = dP - D", (prob_package, grad_no_p), r"leave P out"),
        Mutant("P * dP - D (outside the catalogue)", (prob_package, grad_misparenthesised), r"differs at"),
        Mutant("the stub", (prob_package, grad_stub), r"stub"),
    ]),
]
