"""Chapter 9's checkers under mutation: BERT's block from the course's layer, the previous-token score, max pooling."""
import torch
from torch import nn

from attention_course.exercises import ch09
from mutants import Catalogue, Mutant

QKV = ("query", "key", "value")

# ---------------------------------------------------------------------------------------------------------
# From the course's layer back into BERT


def course_to_bert(mha, block, *, order=(0, 1, 2), bias_order=(0, 1, 2), transpose=False, biases=True,
                   dense="copy", norm=None, scale=1.0, rows=None, only=QKV, no_grad=True, dtype=None):
    """The reference with one mistake switched on by a keyword."""
    W, b = mha.in_proj_weight.detach().chunk(3), mha.in_proj_bias.detach().chunk(3)
    D = W[0].shape[0]
    context = torch.no_grad() if no_grad else torch.enable_grad()
    with context:
        for name, i, j in zip(QKV, order, bias_order):
            if name not in only:
                continue
            linear = getattr(block.self, name)
            w = (W[i].T if transpose else W[i]) * scale
            if rows is not None:
                w = w[rows(D, mha.num_heads)]
            if dtype is not None:
                linear.weight = nn.Parameter(w.to(dtype))
            else:
                linear.weight.copy_(w if no_grad else mha.in_proj_weight[i * D:(i + 1) * D])
            if biases:
                linear.bias.copy_(b[j])
        if dense == "copy":
            block.output.dense.load_state_dict(mha.out_proj.state_dict())
        elif dense == "weight":
            block.output.dense.weight.copy_(mha.out_proj.weight)
        elif dense == "transposed":
            block.output.dense.weight.copy_(mha.out_proj.weight.T)
            block.output.dense.bias.copy_(mha.out_proj.bias)
        if norm == "scaled":
            block.output.LayerNorm.weight.mul_(2.0)
        elif norm == "reset":
            block.output.LayerNorm.reset_parameters()


def by_slices(mha, block):
    """Rows i*D:(i+1)*D, loaded with load_state_dict (which copies without autograd)."""
    D = mha.embed_dim
    for i, name in enumerate(QKV):
        getattr(block.self, name).load_state_dict({"weight": mha.in_proj_weight[i * D:(i + 1) * D],
                                                   "bias": mha.in_proj_bias[i * D:(i + 1) * D]})
    block.output.dense.load_state_dict(mha.out_proj.state_dict())


def new_parameters(mha, block):
    """Fresh nn.Parameters holding clones of the blocks, assigned over the old ones."""
    for w, b, name in zip(torch.split(mha.in_proj_weight.detach(), mha.embed_dim),
                          torch.split(mha.in_proj_bias.detach(), mha.embed_dim), QKV):
        linear = getattr(block.self, name)
        linear.weight, linear.bias = nn.Parameter(w.clone()), nn.Parameter(b.clone())
    block.output.dense.weight = nn.Parameter(mha.out_proj.weight.detach().clone())
    block.output.dense.bias = nn.Parameter(mha.out_proj.bias.detach().clone())


def heads_reversed(D, h):
    return torch.arange(D).view(h, D // h).flip(0).reshape(-1)  # head blocks h - 1, ..., 1, 0


def heads_interleaved(D, h):
    return torch.arange(D).view(h, D // h).T.reshape(-1)  # view(d, h) read as view(h, d)


def no_bias(mha, block):
    course_to_bert(mha, block)
    block.self.key = nn.Linear(mha.embed_dim, mha.embed_dim, bias=False, dtype=torch.float64)
    with torch.no_grad():
        block.self.key.weight.copy_(mha.in_proj_weight.chunk(3)[1])


def whole_in_proj(mha, block):
    with torch.no_grad():
        block.self.query.weight.copy_(mha.in_proj_weight)


def assign_tensor(mha, block):
    block.self.query.weight = mha.in_proj_weight.detach().chunk(3)[0].clone()


def views_as_parameters(mha, block):
    """New nn.Parameters of the chunks, without .clone(): the block's parameters are mha's memory."""
    for w, b, name in zip(mha.in_proj_weight.detach().chunk(3), mha.in_proj_bias.detach().chunk(3), QKV):
        getattr(block.self, name).weight, getattr(block.self, name).bias = nn.Parameter(w), nn.Parameter(b)
    block.output.dense.weight = nn.Parameter(mha.out_proj.weight.detach())
    block.output.dense.bias = nn.Parameter(mha.out_proj.bias.detach())


def dense_module_shared(mha, block):
    """out_proj itself put in the block: one module in two models."""
    course_to_bert(mha, block, dense=None)
    block.output.dense = mha.out_proj


BLOCK_ORDER = r"value weights \(torch\.cat, as in_proj_weight\) holds the right slices along axis 0 in another order"
COURSE_TO_BERT = Catalogue(
    ch09.check_course_to_bert,
    correct={"chunk and copy_": course_to_bert, "slices and load_state_dict": by_slices,
             "new nn.Parameters": new_parameters},
    mutants=[
        Mutant("query and key swapped", lambda m, b: course_to_bert(m, b, order=(1, 0, 2)),
               (BLOCK_ORDER, r"\[2, 3, 0, 1, 4, 5\]"), family="block order"),
        Mutant("key and value swapped", lambda m, b: course_to_bert(m, b, order=(0, 2, 1)),
               (BLOCK_ORDER, r"\[0, 1, 4, 5, 2, 3\]"), family="block order"),
        Mutant("query and value swapped", lambda m, b: course_to_bert(m, b, order=(2, 1, 0)),
               (BLOCK_ORDER, r"\[4, 5, 2, 3, 0, 1\]"), family="block order"),
        Mutant("blocks rotated", lambda m, b: course_to_bert(m, b, order=(2, 0, 1)),
               (BLOCK_ORDER, r"\[4, 5, 0, 1, 2, 3\]"),
               family="block order"),
        Mutant("weights transposed", lambda m, b: course_to_bert(m, b, transpose=True),
               (r"copies each block TRANSPOSED", r"\(out, in\)")),
        Mutant("transposed and swapped", lambda m, b: course_to_bert(m, b, transpose=True, order=(1, 0, 2)),
               (r"value weights \(torch\.cat, as in_proj_weight\) holds the right values, arranged differently",)),
        Mutant("scale 1/sqrt(d) folded into the weights",
               lambda m, b: course_to_bert(m, b, scale=(m.embed_dim // m.num_heads) ** -0.5),
               (r"value weights .* is 0\.7071 times the right one at every entry \(1/√2\)",), family="scaled"),
        Mutant("scale 1/sqrt(D) folded into the weights", lambda m, b: course_to_bert(m, b, scale=m.embed_dim ** -0.5),
               (r"value weights .* is 0\.7071 times the right one at every entry \(1/√2\)",), family="scaled"),
        Mutant("heads in reverse order", lambda m, b: course_to_bert(m, b, rows=heads_reversed),
               (BLOCK_ORDER, r"\[3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8\]"), family="block order"),
        Mutant("rows interleaved across heads", lambda m, b: course_to_bert(m, b, rows=heads_interleaved),
               (BLOCK_ORDER, r"\[0, 3, 1, 4, 2, 5, 6, 9,"), family="block order"),
        Mutant("biases not copied", lambda m, b: course_to_bert(m, b, biases=False),
               (r"value biases \(torch\.cat, as in_proj_bias\) has NaN at 6 of 6",), family="copy missing"),
        Mutant("biases in the wrong order", lambda m, b: course_to_bert(m, b, bias_order=(1, 0, 2)),
               (r"value biases \(torch\.cat, as in_proj_bias\) holds the right slices along axis 0 in another order",)),
        Mutant("a Linear without bias", no_bias, (r"block\.self\.key is a Linear with no bias", r"with its bias")),
        Mutant("nothing copied", lambda m, b: None,
               (r"value weights \(torch\.cat, as in_proj_weight\) has NaN at 12 of 12",),
               family="copy missing"),
        Mutant("only the query copied", lambda m, b: course_to_bert(m, b, only=("query",)),
               (r"has NaN at 8 of 12 entries .*whole rows \[2, 3, 4, 5\]",), family="copy missing"),
        Mutant("copy without no_grad", lambda m, b: course_to_bert(m, b, no_grad=False),
               (r"in place", r"torch\.no_grad")),
        Mutant("a tensor assigned to a parameter", assign_tensor,
               (r"cannot assign", r"torch\.nn\.Parameter or None expected")),
        Mutant("the whole in_proj_weight copied", whole_in_proj, (r"\(3D, D\)", r"chunk\(3\)")),
        Mutant("weights in float32", lambda m, b: course_to_bert(m, b, dtype=torch.float32),
               (r"float32", r"dtype")),
        Mutant("out_proj not copied", lambda m, b: course_to_bert(m, b, dense=None),
               (r"block\.output\.dense\.weight has NaN",), family="out_proj"),
        Mutant("out_proj's bias not copied", lambda m, b: course_to_bert(m, b, dense="weight"),
               (r"block\.output\.dense\.bias has NaN",), family="out_proj"),
        Mutant("out_proj transposed", lambda m, b: course_to_bert(m, b, dense="transposed"),
               (r"block\.output\.dense\.weight is the transpose",), family="out_proj"),
        Mutant("LayerNorm changed", lambda m, b: course_to_bert(m, b, norm="scaled"),
               (r"LayerNorm\.weight, which must stay as it was",), family="LayerNorm"),
        Mutant("LayerNorm reset", lambda m, b: course_to_bert(m, b, norm="reset"),
               (r"resets block\.output\.LayerNorm",), family="LayerNorm"),
        Mutant("the layer put in place of the Linear", lambda m, b: setattr(b.self, "query", m),
               (r"block\.self\.query is a MultiheadAttention", r"keep BERT's nn\.Linear")),
        Mutant("new nn.Parameters of the chunks, not cloned", views_as_parameters, (r"SHARE MEMORY", r"clone"),
               family="shared"),
        Mutant("out_proj itself put in the block", dense_module_shared,
               (r"share memory with mha .* has \['output\.dense\.weight', 'output\.dense\.bias'\] too many",),
               family="shared"),
    ],
)

# ---------------------------------------------------------------------------------------------------------
# The previous-token head


def diagonal_scores(weights, keep, *, offset=-1, dims=(-2, -1), queries="real", reduce="mean", count="real",
                    dtype=None):
    """diagonal(offset) of the (L, S) weights, averaged over the chosen queries; one mistake by keyword."""
    previous = weights.diagonal(offset=offset, dim1=dims[0], dim2=dims[1])  # (B, h, L - |offset|)
    n = previous.shape[-1]
    mask = {"real": keep[:, -n:], "all": torch.ones_like(keep[:, -n:]), "pads": 1 - keep[:, -n:],
            "keys": keep[:, :n]}[queries].to(weights.dtype)[:, None, :]  # (B, 1, n)
    if dtype is not None:
        previous, mask = previous.to(dtype), mask.to(dtype)
    total = (previous * mask).sum((0, 2))  # (h,)
    if reduce == "sum":
        return total
    if reduce == "sentences":
        return ((previous * mask).sum(2) / mask.sum(2)).mean(0)
    if count == "all":
        return total / (keep.shape[0] * n)
    if count == "with query 0":
        return total / keep.sum()
    return total / mask.sum()


def indexed_scores(weights, keep):
    """Index the key i - 1 of every query with arange, select the real queries with a bool mask."""
    B, h, L, S = weights.shape
    i = torch.arange(1, L)
    previous = weights[:, :, i, i - 1].transpose(1, 2)  # (B, L-1, h)
    return previous[keep[:, 1:].bool()].mean(0)  # (N, h) -> (h,)


def loop_scores(weights, keep):
    """Plain loops over sentences and real queries."""
    total, count = torch.zeros(weights.shape[1], dtype=weights.dtype), 0
    for b in range(weights.shape[0]):
        for i in range(1, weights.shape[2]):
            if keep[b, i]:
                total = total + weights[b, :, i, i - 1]
                count += 1
    return total / count


def right_padded_loop(weights, keep):
    """Loops over queries 1 .. n - 1: right padding assumed."""
    total, count = torch.zeros(weights.shape[1], dtype=weights.dtype), 0
    for b in range(weights.shape[0]):
        for i in range(1, int(keep[b].sum())):
            total, count = total + weights[b, :, i, i - 1], count + 1
    return total / count


def in_place_scores(weights, keep):
    weights.mul_(keep[:, None, :, None])  # zero the pad queries, in the caller's tensor
    return diagonal_scores(weights, keep)


PREVIOUS_TOKEN = Catalogue(
    ch09.check_previous_token_scores,
    correct={"diagonal and a float mask": diagonal_scores, "arange index and a bool mask": indexed_scores,
             "loops": loop_scores,
             "diagonal of the transposed axes": lambda w, k: diagonal_scores(w, k, offset=1, dims=(-1, -2))},
    mutants=[
        Mutant("next token", lambda w, k: diagonal_scores(w, k, offset=1), (r"NEXT token", r"key i - 1"),
               family="next token"),
        Mutant("next token (transposed weights)", lambda w, k: diagonal_scores(w.transpose(-2, -1), k),
               (r"NEXT token",), family="next token"),
        Mutant("the main diagonal", lambda w, k: diagonal_scores(w, k, offset=0), (r"ITSELF", r"offset 0")),
        Mutant("two tokens back", lambda w, k: diagonal_scores(w, k, offset=-2), (r"TWO places back",)),
        Mutant("pad queries counted", lambda w, k: diagonal_scores(w, k, queries="all"), (r"pad queries too",),
               family="pad queries"),
        Mutant("whole diagonal mean", lambda w, k: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, 2)),
               (r"pad queries too",), family="pad queries"),
        Mutant("mask inverted", lambda w, k: diagonal_scores(w, k, queries="pads"),
               (r"ONLY the pad queries", r"keep == 1")),
        Mutant("mask shifted by one", lambda w, k: diagonal_scores(w, k, queries="keys"),
               (r"shifted by one", r"keep\[:, 1:\]")),
        Mutant("query 0 counted", lambda w, k: diagonal_scores(w, k, count="with query 0"), (r"query 0",)),
        Mutant("sum, not mean", lambda w, k: diagonal_scores(w, k, reduce="sum"),
               (r"not divided by their number",)),
        Mutant("loop over the first keep.sum() positions", right_padded_loop, (r"pads on the LEFT",)),
        Mutant("mean of sentence means", lambda w, k: diagonal_scores(w, k, reduce="sentences"),
               (r"each sentence first",)),
        Mutant("divided by all queries", lambda w, k: diagonal_scores(w, k, count="all"),
               (r"divides by every query i >= 1, pads included",)),
        Mutant("averaged over the heads", lambda w, k: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, 1)),
               (r"has shape \(5,\), expected \(4,\)",), family="axes"),
        Mutant("averaged over heads and queries",
               lambda w, k: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean((1, 2)),
               (r"has shape \(3,\), expected \(4,\)",), family="axes"),
        Mutant("batch axis left", lambda w, k: (w.diagonal(offset=-1, dim1=-2, dim2=-1)
                                                * k[:, None, 1:]).sum(2) / k[:, None, 1:].sum(2),
               (r"the expected axes and more",), family="axes"),
        Mutant("argmax returned", lambda w, k: diagonal_scores(w, k).argmax(), (r"one number",)),
        Mutant("computed in float32", lambda w, k: diagonal_scores(w, k, dtype=torch.float32),
               (r"float32", r"dtype")),
        Mutant("weights changed in place", in_place_scores, (r"in place",)),
        Mutant("diagonal() of the first two axes", lambda w, k: w.diagonal(offset=-1).mean((0, 1)),
               (r"has shape \(2,\), expected \(4,\)",)),
        Mutant("keep without the heads axis", lambda w, k: (w.diagonal(offset=-1, dim1=-2, dim2=-1) * k[:, 1:]).sum(
            (0, 2)) / k[:, 1:].sum(), (r"matched from the RIGHT", r"missing axes as size 1")),
        Mutant("scores halved", lambda w, k: diagonal_scores(w, k) / 2, (r"result is 0\.5 times the right one",)),
    ],
)

# ---------------------------------------------------------------------------------------------------------
# Max pooling over real tokens


def max_pool(hidden, keep, *, fill=float("-inf"), pads=lambda k: k == 0, add=False, how="masked_fill"):
    """The reference: pads filled with -inf, then the maximum over the tokens; one mistake by keyword."""
    mask = pads(keep)[..., None]  # (B, L, 1)
    if add:
        return (hidden + fill * mask).amax(1)
    return hidden.masked_fill(mask, fill).amax(1)


def where_pool(hidden, keep):
    """torch.where with the dtype's lowest number, and max(dim).values."""
    low = torch.tensor(torch.finfo(hidden.dtype).min, dtype=hidden.dtype)
    return torch.where(keep.bool()[..., None], hidden, low).max(dim=1).values


def loop_pool(hidden, keep):
    """Each sentence cut to its real tokens."""
    return torch.stack([h[k.bool()].amax(0) for h, k in zip(hidden, keep)])


def sliced_pool(hidden, keep, extra=0):
    return torch.stack([h[:int(k.sum()) + extra].amax(0) for h, k in zip(hidden, keep)])


def in_place_pool(hidden, keep):
    return hidden.masked_fill_(keep[..., None] == 0, float("-inf")).amax(1)


MAX_POOL = Catalogue(
    ch09.check_max_pool,
    correct={"masked_fill -inf": max_pool, "torch.where, finfo.min": where_pool, "per-sentence loop": loop_pool},
    mutants=[
        Mutant("slices [:length], right padding assumed", sliced_pool, (r"padded on the left.*pads on the LEFT those are not the real tokens",)),
        Mutant("no mask", lambda x, k: x.amax(1), (r"includes the pads",)),
        Mutant("multiplied by the keep mask", lambda x, k: (x * k[..., None]).amax(1),
               (r"multiplies by the keep mask",), family="zero"),
        Mutant("filled with 0", lambda x, k: max_pool(x, k, fill=0.0), (r"fills the pads with 0",), family="zero"),
        Mutant("filled with -1e4", lambda x, k: max_pool(x, k, fill=-1e4), (r"FINITE value, -1e4\b",),
               family="finite fill"),
        Mutant("filled with -1e9", lambda x, k: max_pool(x, k, fill=-1e9), (r"FINITE value, -1e9\b",),
               family="finite fill"),
        Mutant("added -1e4 at the pads", lambda x, k: max_pool(x, k, fill=-1e4, add=True),
               (r"ADDS a finite penalty to the pads, -1e4\b",), family="penalty"),
        Mutant("added -1e9 at the pads", lambda x, k: max_pool(x, k, fill=-1e9, add=True),
               (r"ADDS a finite penalty to the pads, -1e9\b",), family="penalty"),
        Mutant("mask inverted", lambda x, k: max_pool(x, k, pads=lambda k: k == 1), (r"wrong way round",)),
        Mutant("int mask as bool", lambda x, k: max_pool(x, k, pads=lambda k: k), (r"INTEGER mask", r"keep == 0"),
               family="int mask"),
        Mutant("~ on the int mask", lambda x, k: max_pool(x, k, pads=lambda k: ~k), (r"INTEGER mask", r"~"),
               family="int mask"),
        Mutant("mask on the wrong axis", lambda x, k: x.masked_fill(k[:, None] == 0, float("-inf")).amax(1),
               (r"keep\[\.\.\., None\] is \(B, L, 1\)",)),
        Mutant("mean, not max", lambda x, k: (x * k[..., None]).sum(1) / k.sum(1, keepdim=True),
               (r"MEAN",)),
        Mutant("last real token left out", lambda x, k: sliced_pool(x, k, -1), (r"LAST real token",)),
        Mutant("first pad taken in", lambda x, k: sliced_pool(x, k, 1), (r"FIRST PAD",)),
        Mutant("max over the features", lambda x, k: x.amax(2),
               (r"has shape \(2, 3\), expected \(2, 4\)",), family="axis"),
        Mutant("max over the batch", lambda x, k: x.masked_fill(k[..., None] == 0, float("-inf")).amax(0),
               (r"has shape \(3, 4\), expected \(2, 4\)",), family="axis"),
        Mutant("result transposed", lambda x, k: max_pool(x, k).T, (r"axes in another order \(a transpose",)),
        Mutant("max(dim) pair returned", lambda x, k: x.masked_fill(k[..., None] == 0, float("-inf")).max(1),
               (r"\.values",)),
        Mutant("indices returned", lambda x, k: x.masked_fill(k[..., None] == 0, float("-inf")).argmax(1),
               (r"integers where values are expected", r"argmax")),
        Mutant("computed in float32", lambda x, k: max_pool(x.float(), k), (r"is float32, expected float64",)),
        Mutant("hidden changed in place", in_place_pool, (r"in place",)),
        Mutant("the token at n = keep[b].sum() taken", lambda x, k: torch.stack(
            [x[b, :int(k[b].sum()) + 1].amax(0) if k[b].sum() < k.shape[1] else x[b, int(k[b].sum())].amax(0)
             for b in range(len(x))]), (r"out of bounds", r"runs one too far")),
        Mutant("a list returned", lambda x, k: max_pool(x, k).tolist(), (r"is a list, expected a torch\.Tensor",)),
        Mutant("filled with -1e30", lambda x, k: max_pool(x, k, fill=-1e30), (r"differs at .* got -1e\+30",)),
    ],
)

CATALOGUES = [COURSE_TO_BERT, PREVIOUS_TOKEN, MAX_POOL]
