"""The three scoring modules of chapter 1 (attention_course.scores, owned by the lead)."""
import math

import pytest
import torch

from attention_course import (
    AdditiveScore,
    DotProductScore,
    MultiheadAttention,
    SelfAttentionScore,
    causal_mask,
    masked_softmax,
)

MODULES = [AdditiveScore, DotProductScore, SelfAttentionScore]


@pytest.mark.parametrize("cls, shape", [(AdditiveScore, (2, 5)), (DotProductScore, (2, 5)), (SelfAttentionScore, (2, 5, 5))])
def test_score_shapes(cls, shape):
    assert cls(4)(torch.randn(2, 5, 4)).shape == shape


def test_dot_product_score_is_x_dot_query():
    module = DotProductScore(4)
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(module(x), (x * module.query).sum(-1))


def test_additive_score_formula():
    module = AdditiveScore(4)
    x = torch.randn(2, 5, 4)
    hidden = torch.tanh(x @ module.W_k.weight.T + module.query @ module.W_q.weight.T)
    torch.testing.assert_close(module(x), hidden @ module.w.weight[0])


@pytest.mark.parametrize("scaled", [True, False])
def test_self_attention_score_formula(scaled):
    module = SelfAttentionScore(4, scaled=scaled)
    x = torch.randn(2, 5, 4)
    scores = (x @ module.W_q.weight.T) @ (x @ module.W_k.weight.T).transpose(1, 2)
    torch.testing.assert_close(module(x), scores / math.sqrt(4) if scaled else scores)


def test_self_attention_score_gives_the_weights_of_a_one_head_layer():
    """Chapter 1 meets the last chapter: softmax of the scaled scores = the weights of a 1-head layer."""
    layer = MultiheadAttention(4, 1, bias=False, dtype=torch.float64)
    module = SelfAttentionScore(4).double()
    with torch.no_grad():
        module.W_q.weight.copy_(layer.in_proj_weight[:4])
        module.W_k.weight.copy_(layer.in_proj_weight[4:8])
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = causal_mask(5)
    torch.testing.assert_close(masked_softmax(module(x), mask), layer(x, x, x, attn_mask=mask)[1])


@pytest.mark.parametrize("cls", MODULES)
def test_gradients_reach_every_parameter(cls):
    module = cls(4)
    module(torch.randn(2, 3, 4)).sum().backward()
    assert all(p.grad is not None for p in module.parameters())


@pytest.mark.parametrize("cls", MODULES)
def test_scores_reject_bad_input(cls):
    module = cls(4)
    with pytest.raises(ValueError, match=r"x must have 3 dimensions \(B, L, D\).*unsqueeze\(0\)"):
        module(torch.randn(5, 4))
    with pytest.raises(ValueError, match=r"with D=4, got shape \(2, 5, 3\)"):
        module(torch.randn(2, 5, 3))
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor.*x\.float\(\)"):
        module(torch.ones(2, 5, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        module([[1.0]])


@pytest.mark.parametrize("cls", MODULES)
def test_scores_explain_a_dtype_mismatch(cls):
    # a fix the learner can run as printed: the dtype itself, not a name the learner does not have
    with pytest.raises(TypeError, match=r"x is torch.float64 but the module is torch.float32\. Convert it with "
                                        r"x\.to\(torch\.float32\)\.$"):
        cls(4)(torch.randn(2, 5, 4, dtype=torch.float64))
