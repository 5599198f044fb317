"""The exercise checkers of chapter 9: each accepts a right answer and names each typical wrong answer."""
import pytest
import torch

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


def test_course_to_bert_accepts_a_right_answer(capsys):
    ch09.check_course_to_bert(course_to_bert)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("fn, message", [
    (lambda m, b: course_to_bert(m, b, order=(1, 0, 2)), "query.weight holds the key block"),
    (lambda m, b: course_to_bert(m, b, transpose=True), "TRANSPOSED"),
    (lambda m, b: course_to_bert(m, b, biases=False), "query.bias is UNCHANGED"),
    (lambda m, b: course_to_bert(m, b, dense=False), "block.output.dense.weight is not mha.out_proj"),
    (lambda m, b: course_to_bert(m, b, norm=True), "changed block.output.LayerNorm"),
    (lambda m, b: None, "copy did not happen"),
    (lambda m, b: setattr(b.self, "query", m), "keep it an nn.Linear"),
])
def test_course_to_bert_names_each_mistake(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch09.check_course_to_bert(fn)


def test_the_bert_stand_in_computes_what_the_course_layer_computes():
    """The checker's reference: BERT's q/k/v Linears + output dense = MultiheadAttention with stacked weights."""
    torch.manual_seed(0)
    block = ch09._bert_attention(8)
    mha = MultiheadAttention(8, 2, dtype=torch.float64)
    s = block.self
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([s.query.weight, s.key.weight, s.value.weight]))
        mha.in_proj_bias.copy_(torch.cat([s.query.bias, s.key.bias, s.value.bias]))
        mha.out_proj.load_state_dict(block.output.dense.state_dict())
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    want, _ = mha(x, x, x, key_padding_mask=keep == 0)
    torch.testing.assert_close(ch09._bert_attention_output(block, x, keep, 2), want, atol=1e-12, rtol=0)


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
    out = capsys.readouterr().out
    assert out.startswith("Correct") and "head 2" in out


def test_the_planted_heads_are_what_they_claim():
    weights, keep = ch09._planted_weights()
    scores = ch09._previous_token_scores(weights, keep)
    assert int(scores.argmax()) == 2 and scores[2] > 0.9
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


@pytest.mark.parametrize("variant, message", [
    (dict(offset=1), "NEXT token"),
    (dict(offset=0), "ITSELF"),
    (dict(queries="all"), "pad queries too"),
    (dict(first_query=True), "counts query 0"),
    (dict(reduce="sum"), "adds the weights up"),
])
def test_previous_token_names_each_mistake(variant, message):
    fn = lambda w, k: ch09._previous_token_scores(w, k, **variant)  # noqa: E731
    with pytest.raises(ExerciseError, match=message):
        ch09.check_previous_token_scores(fn)


@pytest.mark.parametrize("fn, message", [
    (lambda w, k: previous_scores(w, k).argmax(), "one number"),
    (lambda w, k: previous_scores(w, k)[None], "shape \\(1, 4\\)"),
    (lambda w, k: previous_scores(w, k) * 0.5, "expected \\["),
])
def test_previous_token_other_mistakes(fn, message):
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
    (lambda x, k: (x * k[..., None]).amax(1), "multiplied by the keep mask"),
    (lambda x, k: x.masked_fill(k[..., None] == 1, float("-inf")).amax(1), "wrong way round"),
    (lambda x, k: max_pool(x, k).T, "shape \\(5, 3\\)"),
    (lambda x, k: x.amax(2), "wrong axis"),
    (lambda x, k: max_pool(x, k) + 1, "largest value over the tokens"),
    (lambda x, k: max_pool(x, k).tolist(), "must return a torch.Tensor"),
])
def test_max_pool_names_each_mistake(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch09.check_max_pool(fn)
