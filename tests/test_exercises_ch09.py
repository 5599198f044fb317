"""The exercise checkers of chapter 9: each accepts a right answer, names the mistakes of its catalogue, describes the
others by what they did, and runs over sizes that a hard-coded one fails."""
import pytest
import torch
from torch import nn

from attention_course.exercises import ExerciseError, ch09
from attention_course.multihead import MultiheadAttention

# ---------------------------------------------------------------------------------------------------------
# From the course's layer back into BERT


def course_to_bert(mha, block, order=(0, 1, 2), transpose=False, biases=True, dense=True, norm=False):
    W, b = mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3)
    with torch.no_grad():
        for name, i in zip(("query", "key", "value"), order):
            linear = getattr(block.self, name)
            linear.weight.copy_(W[i].T if transpose else W[i])
            if biases:
                linear.bias.copy_(b[i])
        if dense:
            block.output.dense.load_state_dict(mha.out_proj.state_dict())
        if norm:
            block.output.LayerNorm.weight.mul_(2.0)


def views(mha, block):
    """nn.Parameters of the chunks without .clone(): the block's memory is mha's."""
    for name, w, b in zip(("query", "key", "value"), mha.in_proj_weight.detach().chunk(3),
                          mha.in_proj_bias.detach().chunk(3)):
        getattr(block.self, name).weight, getattr(block.self, name).bias = nn.Parameter(w), nn.Parameter(b)
    block.output.dense.weight = nn.Parameter(mha.out_proj.weight.detach())
    block.output.dense.bias = nn.Parameter(mha.out_proj.bias.detach())


def test_course_to_bert_accepts_a_right_answer(capsys):
    ch09.check_course_to_bert(course_to_bert)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("fn, message", [
    (lambda m, b: course_to_bert(m, b, order=(1, 0, 2)), r"weights \(torch.cat, as in_proj_weight\) holds the right "
                                                         r"slices along axis 0 in another order"),
    (lambda m, b: course_to_bert(m, b, transpose=True), "TRANSPOSED"),
    (lambda m, b: course_to_bert(m, b, biases=False), r"biases \(torch.cat, as in_proj_bias\) has NaN"),
    (lambda m, b: course_to_bert(m, b, dense=False), "block.output.dense.weight has NaN"),
    (lambda m, b: course_to_bert(m, b, norm=True), "LayerNorm.weight, which must stay as it was, is 2 times"),
    (lambda m, b: None, "has NaN at 12 of 12 entries"),
    (lambda m, b: setattr(b.self, "query", m), "is a MultiheadAttention after your course_to_bert"),
    (views, "SHARE MEMORY with mha"),
])
def test_course_to_bert_names_or_describes_each_mistake(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch09.check_course_to_bert(fn)


def test_a_parameter_aliased_alone_is_told():
    """out_proj itself in the block, the rest copied: the values are right, the memory is shared."""
    def dense_shared(mha, block):
        course_to_bert(mha, block, dense=False)
        block.output.dense = mha.out_proj
    with pytest.raises(ExerciseError, match=r"share memory with mha .* \['output.dense.weight', 'output.dense.bias'\]"):
        ch09.check_course_to_bert(dense_shared)


def bert_attention_output(block, x, keep, h):
    """BERT's computation up to its output dense (before dropout, residual and LayerNorm): (B, L, D)."""
    B, L, D = x.shape
    heads = lambda t: t.view(B, L, h, D // h).transpose(1, 2)  # noqa: E731  (B, h, L, d)
    q, k, v = (heads(getattr(block.self, name)(x)) for name in ("query", "key", "value"))
    scores = (q @ k.transpose(-2, -1) / (D // h) ** 0.5).masked_fill(keep[:, None, None, :] == 0, float("-inf"))
    return block.output.dense((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D))


@pytest.mark.parametrize("D, h", [(8, 2), (12, 3), (4, 4)])
def test_the_checkers_copy_makes_the_bert_stand_in_compute_what_the_course_layer_computes(D, h):
    torch.manual_seed(0)
    mha, block = MultiheadAttention(D, h, dtype=torch.float64), ch09._bert_attention(D)
    ch09._course_to_bert(mha, block)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    want, _ = mha(x, x, x, key_padding_mask=keep == 0)
    torch.testing.assert_close(bert_attention_output(block, x, keep, h), want, atol=1e-12, rtol=0)


def test_a_stub_is_reported_as_a_stub():
    def stub(*args):
        raise NotImplementedError()
    for check in (ch09.check_course_to_bert, ch09.check_previous_token_scores, ch09.check_max_pool):
        with pytest.raises(ExerciseError, match="still the exercise's stub"):
            check(stub)


# ---------------------------------------------------------------------------------------------------------
# The previous-token head


def previous_scores(weights, keep):
    prev = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, h, L-1): query i on key i - 1
    queries = keep[:, 1:].to(weights.dtype)[:, None, :]  # (B, 1, L-1)
    return (prev * queries).sum((0, 2)) / queries.sum()


def test_previous_token_accepts_a_right_answer(capsys):
    ch09.check_previous_token_scores(previous_scores)
    assert capsys.readouterr().out.startswith("Correct: one score per head")


@pytest.mark.parametrize("switch, message", [
    (dict(offset=1), "NEXT token"),
    (dict(offset=0), "ITSELF"),
    (dict(queries=lambda keep, n: torch.ones_like(keep[:, -n:])), "pad queries too"),
    (dict(count=lambda keep: keep.sum()), "counts query 0"),
])
def test_previous_token_names_each_mistake(switch, message):
    with pytest.raises(ExerciseError, match=message):
        ch09.check_previous_token_scores(lambda w, k: ch09._previous(w, k, **switch))


@pytest.mark.parametrize("fn, message", [
    (lambda w, k: previous_scores(w, k).argmax(), "one number"),
    (lambda w, k: previous_scores(w, k)[None], "an axis of size 1 too many"),
    (lambda w, k: previous_scores(w, k) * 0.5, "0.5 times the right one"),
    (lambda w, k: previous_scores(w, k).view(4), r"shape '\[4\]' is invalid"),  # four heads, hard-coded
])
def test_previous_token_describes_other_mistakes(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch09.check_previous_token_scores(fn)


# ---------------------------------------------------------------------------------------------------------
# Max pooling over real tokens


def max_pool(hidden, keep):
    return hidden.masked_fill(keep[..., None] == 0, float("-inf")).amax(1)


def test_max_pool_accepts_a_right_answer(capsys):
    ch09.check_max_pool(max_pool)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("fn, message", [
    (lambda x, k: x.amax(1), "includes the pads"),
    (lambda x, k: (x * k[..., None]).amax(1), "multiplies by the keep mask"),
    (lambda x, k: x.masked_fill(k[..., None] == 1, float("-inf")).amax(1), "wrong way round"),
    (lambda x, k: max_pool(x, k).T, r"has shape \(4, 2\), expected \(2, 4\): the right one with its axes"),
    (lambda x, k: x.amax(2), r"has shape \(2, 3\), expected \(2, 4\)"),
    (lambda x, k: max_pool(x, k) * 2, "2 times the right one at every entry"),
    (lambda x, k: max_pool(x, k) + 1, "plus the same 1 at the 7 of 8 entries"),  # -1e30 + 1 is -1e30; not float32's rounding
    (lambda x, k: max_pool(x, k).tolist(), "is a list, expected a torch.Tensor"),
    (lambda x, k: max_pool(x[..., :4], k), r"has shape \(3, 4\), expected \(3, 5\)"),  # four features, hard-coded
])
def test_max_pool_names_or_describes_each_mistake(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch09.check_max_pool(fn)
