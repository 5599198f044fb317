"""Chapter 5's checkers under mutation: splitting (B, L, D) into heads (B, h, L, d) and merging them back."""
import torch

from attention_course.exercises import ch05
from mutants import Catalogue, Mutant

# ---------------------------------------------------------------------------------------------------------
# check_split_heads: fn(x, num_heads) -> (B, h, L, d)


def split(x, h):
    B, L, D = x.shape
    return x.reshape(B, L, h, D // h).transpose(1, 2)  # (B, h, L, d)


def split_by_chunks(x, h):
    """Another style: the feature axis cut into h chunks, stacked as a new axis 1."""
    return torch.stack(x.chunk(h, dim=-1), dim=1)


def split_by_view(x, h):
    """Another style: view and permute, then a contiguous copy."""
    return x.view(*x.shape[:2], h, -1).permute(0, 2, 1, 3).contiguous()


def split_unflatten(x, h):
    """Another style: unflatten and movedim."""
    return x.unflatten(-1, (h, -1)).movedim(2, 1)


SPLIT = Catalogue(
    ch05.check_split_heads,
    correct={"reshape and transpose": split, "chunk and stack": split_by_chunks, "view, permute, contiguous":
             split_by_view, "unflatten and movedim": split_unflatten},
    mutants=[
        Mutant("reshape to (B, h, L, d) without transpose", lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1),
               r"without transposing", family="no transpose"),
        Mutant("view to (B, h, L, d) without transpose", lambda x, h: x.view(x.shape[0], h, x.shape[1], -1),
               r"without transposing", family="no transpose"),
        Mutant("strided heads (B, L, d, h)", lambda x, h: x.reshape(*x.shape[:2], -1, h).permute(0, 3, 1, 2),
               r"every h-th feature"),
        Mutant("no transpose: (B, L, h, d)", lambda x, h: x.reshape(*x.shape[:2], h, -1),
               r"heads are still after the tokens"),
        Mutant("flattened to (B*h, L, d)", lambda x, h: split(x, h).flatten(0, 1), r"flat \(B\*h, L, d\)"),
        Mutant("heads in reverse order", lambda x, h: split(x, h).flip(1), r"along axis 1 in another order.*reversed"),
        Mutant("head-major (h, B, L, d)", lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=0),
               r"\(h, B, L, d\)"),
        Mutant("each head transposed (B, h, d, L)", lambda x, h: split(x, h).transpose(-2, -1),
               r"\(B, h, d, L\)"),
        Mutant("tokens reversed", lambda x, h: split(x, h).flip(2), r"along axis 2 in another order.*reversed"),
        Mutant("values changed", lambda x, h: split(x, h) + 0.5, r"plus the same 0\.5 at every entry"),
        Mutant("sizes hard-coded", lambda x, h: x.reshape(2, 4, 2, 4).transpose(1, 2), r"x\.shape"),
        Mutant("d = D / h, a float", lambda x, h: x.reshape(*x.shape[:2], h, x.shape[2] / h).transpose(1, 2),
               r"D // h"),
        Mutant("a feature dropped", lambda x, h: split(x, h)[..., 1:], r"has shape \(2, 4, 2, 1\), expected \(2, 4, 2, 2\)"),
        Mutant("returned in float32", lambda x, h: split(x, h).float(), (r"float32", r"dtype")),
        Mutant("a list of heads returned", lambda x, h: list(split(x, h).unbind(1)), r"torch\.Tensor"),
    ],
)

# ---------------------------------------------------------------------------------------------------------
# check_merge_heads: fn(x) with x (B, h, L, d) -> (B, L, D)


def merge(x):
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


def merge_by_cat(x):
    """Another style: the heads concatenated along the features."""
    return torch.cat(x.unbind(1), dim=-1)


def merge_by_view(x):
    """Another style: permute, contiguous, view."""
    return x.permute(0, 2, 1, 3).contiguous().view(x.shape[0], x.shape[2], -1)


def merge_flatten(x):
    """Another style: movedim and flatten."""
    return x.movedim(1, 2).flatten(-2)


MERGE = Catalogue(
    ch05.check_merge_heads,
    correct={"transpose and reshape": merge, "torch.cat of the heads": merge_by_cat,
             "permute, contiguous, view": merge_by_view, "movedim and flatten": merge_flatten},
    mutants=[
        Mutant("reshape without transpose", lambda x: x.reshape(x.shape[0], x.shape[2], -1),
               r"without transposing"),
        Mutant(".view on the transposed tensor", lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1),
               r"call \.contiguous\(\) before \.view"),
        Mutant("features interleaved (B, L, d, h)", lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1),
               r"interleaved"),
        Mutant("transposed, not merged", lambda x: x.transpose(1, 2), r"transpose is done"),
        Mutant("flat (B*h, L, d) returned", lambda x: x.flatten(0, 1), r"flat split layout"),
        Mutant("heads joined along the tokens", lambda x: torch.cat(x.unbind(1), dim=1), r"along the tokens"),
        Mutant("heads averaged", lambda x: x.mean(1), r"concatenated", family="reduced"),
        Mutant("heads summed", lambda x: x.sum(1), r"concatenated", family="reduced"),
        Mutant("heads in reverse order", lambda x: merge(x.flip(1)), r"heads in REVERSE order"),
        Mutant("tokens reversed", lambda x: merge(x).flip(1), r"along axis 1 in another order.*reversed"),
        Mutant("sizes hard-coded", lambda x: x.transpose(1, 2).reshape(2, 4, 8), r"axis 1 should be 2, not 4"),
        Mutant("returned in float32", lambda x: merge(x).float(), (r"float32", r"dtype")),
        Mutant("values changed", lambda x: merge(x) + 0.5, r"plus the same 0\.5 at every entry"),
    ],
)

CATALOGUES = [SPLIT, MERGE]
