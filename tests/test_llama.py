"""swap_into_llama: the course's layer inside transformers' LlamaForCausalLM gives the model's own logits and tokens.

The models are small and random (built from a LlamaConfig with GQA, nothing downloaded), so the file runs in seconds.
The reference is transformers' own model with attn_implementation="sdpa".
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
# its models are loaded where a test uses them (transformers.X): not at collection, where every worker would
# load them, whichever runs this file

from attention_course.decoding import CausalSelfAttention  # noqa: E402
from attention_course.llama import (LlamaCourseAttention, UnknownLlamaArgument, _key_padding,  # noqa: E402
                                    cache_keyword, swap_into_llama)
from attention_course.rope import rope_cos_sin  # noqa: E402

NEW_TOKENS = 50
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def config(**changes):
    settings = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=128, rope_theta=500.0, pad_token_id=0,
                    bos_token_id=None, eos_token_id=None, initializer_range=1.0, attn_implementation="sdpa")
    return transformers.LlamaConfig(**{**settings, **changes})


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["float32", "float64"])
def models(request):
    """(transformers' model, a deep copy with the course's layers swapped in), in eval mode, in the dtype."""
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(config()).to(request.param).eval()
    return ref, swap_into_llama(copy.deepcopy(ref))


@pytest.fixture(scope="module")
def prompts():
    """A left-padded batch of 3 prompts of 7, 4 and 2 tokens, as batched generation pads them."""
    gen = torch.Generator().manual_seed(1)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, :3] = mask[2, :5] = 0
    ids = torch.randint(1, 64, (3, 7), generator=gen).masked_fill(mask == 0, 0)
    return ids, mask


def positions_of(mask):
    """Positions as generate numbers a left-padded batch: 0, 1, ... on real tokens, 0 on pads."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def greedy(model, ids, mask, use_cache):
    """A greedy loop written out: with the cache, prefill then one token per step; without, the whole sequence
    every step."""
    cache = transformers.DynamicCache(config=model.config) if use_cache else None
    inputs = ids
    for _ in range(NEW_TOKENS):
        positions = positions_of(mask)[:, -inputs.shape[1]:]
        with torch.no_grad():
            logits = model(inputs, attention_mask=mask, position_ids=positions, **{cache_keyword(model): cache},
                           use_cache=use_cache).logits
        new = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        ids, mask = torch.cat((ids, new), 1), torch.cat((mask, torch.ones_like(new)), 1)
        inputs = new if use_cache else ids
    return ids


def test_cos_sin_equal_transformers_bit_for_bit_in_float32():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    positions = torch.arange(300)[None]  # (1, L)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config())(torch.zeros(1, dtype=torch.float64), positions)
    cos, sin = rope_cos_sin(positions, 8, base=500.0)  # float32 angles, as transformers computes them
    assert torch.equal(cos.double(), hf_cos) and torch.equal(sin.double(), hf_sin)


def test_same_logits_on_a_left_padded_batch(models, prompts):
    ref, ours = models
    ids, mask = prompts
    real = mask.bool()  # the logits at pads are nobody's business
    tol = TOL[ref.dtype]
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask, position_ids=positions_of(mask)).logits
        got = ours(ids, attention_mask=mask, position_ids=positions_of(mask)).logits
        torch.testing.assert_close(got[real], expected[real], atol=tol, rtol=0)
        plain = ref(ids, attention_mask=mask).logits  # positions 0..6 for every row: what a plain forward uses
        torch.testing.assert_close(ours(ids, attention_mask=mask).logits[real], plain[real], atol=tol, rtol=0)
        # no padding, no attention mask: transformers' SDPA passes no mask at all, the layer's causal mask does it
        torch.testing.assert_close(ours(ids[:1]).logits, ref(ids[:1]).logits, atol=tol, rtol=0)
        # The eager attention passes its mask as additive floats: the course's layer reads that form too.
        eager, ours_eager = copy.deepcopy(ref), copy.deepcopy(ours)
        eager.config._attn_implementation = ours_eager.config._attn_implementation = "eager"
        torch.testing.assert_close(ours_eager(ids, attention_mask=mask).logits[real], plain[real], atol=tol, rtol=0)
        # transformers' own eager attention agrees in float32. Not in float64 (transformers 5.23): its softmax runs
        # in float32, where float64's most negative number is -inf, so a pad's row is all -inf, its softmax NaN,
        # and 0 * NaN carries that to every token of the padded sentences. The course's layer gives such rows zeros.
        if ref.dtype == torch.float32:
            torch.testing.assert_close(eager(ids, attention_mask=mask).logits[real], plain[real], atol=1e-4, rtol=0)


def test_greedy_generation_is_identical_with_and_without_the_cache(models, prompts):
    ref, ours = models
    ids, mask = prompts
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    expected = ref.generate(ids, **kwargs)  # transformers' own attention, its own loop
    assert expected.shape == (3, 7 + NEW_TOKENS)
    assert all(len(set(row[7:].tolist())) > 5 for row in expected)  # real text-like output, not one token repeated
    assert torch.equal(ours.generate(ids, use_cache=True, **kwargs), expected)
    assert torch.equal(ours.generate(ids, use_cache=False, **kwargs), expected)
    assert torch.equal(greedy(ours, ids, mask, use_cache=True), expected)
    assert torch.equal(greedy(ours, ids, mask, use_cache=False), expected)


def test_the_course_layer_is_what_runs(models, prompts):
    ref, ours = models
    ids, mask = prompts
    layers = [layer.self_attn for layer in ours.model.layers]
    assert all(type(a) is LlamaCourseAttention and isinstance(a, CausalSelfAttention) for a in layers)
    assert [a.layer_idx for a in layers] == [0, 1] and (layers[0].num_heads, layers[0].num_kv_heads) == (4, 2)
    assert ours.state_dict().keys() == ref.state_dict().keys()  # the same weights under the same names
    calls = []
    hooks = [a.register_forward_hook(lambda m, args, out: calls.append(m.layer_idx)) for a in layers]
    with torch.no_grad():
        before = ours(ids, attention_mask=mask).logits
    for hook in hooks:
        hook.remove()
    assert calls == [0, 1]
    broken = copy.deepcopy(ours)
    with torch.no_grad():
        broken.model.layers[1].self_attn.k_proj.weight.mul_(2.0)  # its weights, not transformers', are read
        assert (broken(ids, attention_mask=mask).logits - before).abs().max() > 1e-3
        broken = copy.deepcopy(ours)
        broken.model.layers[0].self_attn.rope_base = 10000.0  # its RoPE, not transformers' cos and sin
        assert (broken(ids, attention_mask=mask).logits - before).abs().max() > 1e-3
    assert swap_into_llama(ours) is ours and ours.model.layers[0].self_attn is layers[0]  # a second swap: no-op


def test_cache_filled_outside_the_course_layer_is_refused(models, prompts):
    ref, ours = models
    ids, mask = prompts
    cache = transformers.DynamicCache(config=ref.config)
    with torch.no_grad():
        ref(ids, attention_mask=mask, **{cache_keyword(ref): cache}, use_cache=True)  # transformers' layers fill it
        with pytest.raises(RuntimeError, match="filled or changed outside it.*Start from a new cache"):
            ours(ids[:, -1:], attention_mask=torch.cat((mask, mask[:, -1:]), 1), **{cache_keyword(ours): cache})


@pytest.mark.parametrize("changes, match", [
    (dict(attn_implementation="flex_attention"), "attn_implementation='sdpa' or 'eager'"),
    (dict(rope_scaling=dict(rope_type="linear", factor=2.0)), "rope_type is 'linear'"),
    (dict(head_dim=16), "head_dim=16 times num_attention_heads=4 is not hidden_size=32"),
    (dict(attention_dropout=0.1), "attention_dropout=0.1"),
])
def test_models_the_layer_cannot_hold_are_refused(changes, match):
    model = transformers.LlamaForCausalLM(config(num_hidden_layers=1, **changes))
    with pytest.raises(ValueError, match=match):
        swap_into_llama(model)


def test_other_models_and_masks_are_refused():
    with pytest.raises(TypeError, match="expects a transformers LlamaForCausalLM or LlamaModel, got Linear"):
        swap_into_llama(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="4-D attention masks"):
        _key_padding(torch.ones(2, 5), 2)
    allow = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    allow[..., :2] = False
    assert _key_padding(allow, 2).tolist() == [[True, True, False, False, False]] * 2
    additive = torch.zeros(1, 1, 3, 5).masked_fill(~allow, torch.finfo(torch.float32).min)
    assert torch.equal(_key_padding(additive, 2), _key_padding(allow, 2))
    base = transformers.LlamaForCausalLM(config(num_hidden_layers=1)).model  # a LlamaModel without the head works too
    assert type(swap_into_llama(base).layers[0].self_attn) is LlamaCourseAttention


def test_the_cache_is_read_under_either_name_and_written(models, prompts):
    """transformers 5.24 renamed the layer's argument past_key_values to cache: the adapter reads both, and the
    cache it is handed is the one it fills (a cache that is silently dropped leaves it empty)."""
    _, ours = models
    ids, mask = prompts
    layer = ours.model.layers[0].self_attn
    x = torch.randn(3, 7, ours.config.hidden_size, dtype=layer.q_proj.weight.dtype,
                    generator=torch.Generator().manual_seed(2))
    positions = positions_of(mask)
    outputs = []
    for name in ("cache", "past_key_values"):
        cache = transformers.DynamicCache(config=ours.config)
        with torch.no_grad():
            out, weights = layer(x, position_ids=positions, **{name: cache})
        assert weights is None and cache.get_seq_length(layer.layer_idx) == 7, name
        outputs.append(out)
    assert torch.equal(*outputs)
    with pytest.raises(TypeError, match="two caches"):
        layer(x, position_ids=positions, cache=transformers.DynamicCache(config=ours.config),
              past_key_values=transformers.DynamicCache(config=ours.config))


@pytest.mark.parametrize("name, value", [("kv_cache", "a cache object"), ("cu_seq_lens_q", torch.tensor([0, 7])),
                                         ("segment_mask", torch.ones(3, 7)), ("output_attentions", True)])
def test_an_argument_the_adapter_does_not_know_is_refused_not_dropped(models, name, value):
    _, ours = models
    layer = ours.model.layers[0].self_attn
    x = torch.zeros(1, 2, ours.config.hidden_size, dtype=layer.q_proj.weight.dtype)
    with pytest.raises(UnknownLlamaArgument, match=rf"given {name}=\w+ by transformers {transformers.__version__}"):
        layer(x, **{name: value})
    layer(x, use_cache=False, cache_position=torch.arange(2), output_attentions=False, segment_mask=None)  # nothing


def test_the_models_cache_keyword_is_the_one_its_forward_reads(models):
    import inspect

    ref, _ = models
    parameters = inspect.signature(type(ref).forward).parameters
    assert cache_keyword(ref) in parameters
    assert cache_keyword(ref) == ("cache" if "cache" in parameters else "past_key_values")


def test_the_course_core_through_transformers_attention_interface(prompts):
    """transformers' stable extension point: the course's core (repeat_kv, scores, masked softmax, weighted sum)
    registered as an attention function gives the model's logits and greedy tokens, with and without the cache."""
    from attention_course.llama import register_course_attention

    name = register_course_attention()
    ids, mask = prompts
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        ref = transformers.LlamaForCausalLM(config()).to(dtype).eval()
        ours = copy.deepcopy(ref)
        ours.set_attn_implementation(name)
        assert ours.config._attn_implementation == "course"
        with torch.no_grad():
            theirs, mine = (m(ids, attention_mask=mask, position_ids=positions_of(mask)).logits[mask.bool()]
                            for m in (ref, ours))
        # float32: the course's core scales q before the product and SDPA does not: rounding apart, up to ~1e-4 on
        # these logits (initializer_range=1.0 makes them large)
        torch.testing.assert_close(mine, theirs, atol={torch.float32: 1e-3, torch.float64: 1e-12}[dtype], rtol=0)
        if dtype == torch.float64:  # the tokens (float32's rounding apart, near-ties could differ)
            for use_cache in (True, False):
                assert torch.equal(greedy(ours, ids, mask, use_cache), greedy(ref, ids, mask, use_cache))


def test_the_course_core_is_causal_without_padding_too():
    """Without padding transformers' SDPA mask is None (SDPA then runs with is_causal): the course's core, which
    reads no is_causal, gets the full boolean mask instead, and stays causal."""
    from attention_course.llama import register_course_attention

    name = register_course_attention()
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(config()).double().eval()
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(name)
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, atol=1e-12, rtol=0)
