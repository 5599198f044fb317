"""Chapter 2's checkers under mutation (a seed: to be completed)."""
import torch

from attention_course.exercises import ch02
from mutants import Catalogue, Mutant


def softmax(scores, dim=-1, *, shift="row", dim_used=None):
    dim = dim if dim_used is None else dim_used
    if shift == "row":
        scores = scores - scores.max(dim, keepdim=True).values
    e = scores.exp()
    return e / e.sum(dim, keepdim=True)


CATALOGUES = [
    Catalogue(
        ch02.check_softmax,
        correct={"shifted by the row maximum": softmax, "torch.softmax": lambda s, dim=-1: torch.softmax(s, dim)},
        mutants=[
            Mutant("no shift", lambda s, dim=-1: softmax(s, dim, shift=None), r"subtract each row's maximum"),
            Mutant("softmax over the columns", lambda s, dim=-1: softmax(s, dim_used=0), r"column"),
        ],
    ),
]
