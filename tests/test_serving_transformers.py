"""attention_course.serving with transformers: the course's scheduler and paged cache driving a swapped Llama give
the tokens of transformers' own continuous batching (generate_batch) and of generate; the course's sink attention
gives gpt-oss's logits."""
import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")
# its models are loaded where a test uses them (transformers.X): not at collection, where every worker would
# load them, whichever runs this file

from attention_course.llama import swap_into_llama  # noqa: E402
from attention_course.serving import (PagedKVCache, Request, Scheduler, continuous_batching_config,  # noqa: E402
                                      paged_implementation, register_sink_attention, serve_llama)


def test_scheduler_on_a_llama_matches_generate_batch():
    transformers.logging.set_verbosity_error()
    torch.manual_seed(1)
    config = transformers.LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).eval()
    prompts, new = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3, 5, 8, 9, 7]], 8
    greedy = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    with torch.no_grad():
        alone = [model.generate(torch.tensor([p]), generation_config=greedy)[0, len(p):].tolist() for p in prompts]
        model.set_attn_implementation(paged_implementation())
        out = model.generate_batch(inputs=prompts, generation_config=greedy, continuous_batching_config=(
            continuous_batching_config(page_size=4, num_blocks=16, max_batch_tokens=16)))
        model.set_attn_implementation("sdpa")
        swap_into_llama(model)
        with pytest.raises(TypeError, match="varlen must be True or False"):
            serve_llama(model, varlen=1)
        ours, scores = {}, []
        for varlen in (False, True):  # one mask over the step's keys; each query its own request's keys
            forward = serve_llama(model, varlen=varlen)
            scheduler = Scheduler(PagedKVCache(12, 4, 2, 8, num_layers=2), max_batch_tokens=6, chunk=3)
            for i, p in enumerate(prompts):
                scheduler.submit(Request(i, p, new, arrival=i))
            ours[varlen] = scheduler.run(forward, lambda s, batch: scores.append(batch.scores) if varlen else None)
    for varlen in (False, True):
        assert [out[f"req_{i}"].generated_tokens for i in range(3)] == alone == [ours[varlen][i] for i in range(3)]
    assert scores and all(0 < needed <= computed for computed, needed in scores)


def test_continuous_batching_config_names_the_page_size_as_the_installed_release_does(monkeypatch):
    """page_size from 5.18, block_size before (Colab's 5.15): read from the class's signature; neither: a TypeError
    that says what it looked for. The installed release's own class takes what the helper gives it."""
    made = continuous_batching_config(page_size=4, num_blocks=16, max_batch_tokens=16)
    assert (getattr(made, "page_size", None) or made.block_size) == 4 and made.num_blocks == 16

    def fake(*names):
        def init(self, **given):
            self.given = given

        init.__signature__ = inspect.Signature(  # what inspect.signature reads of the class
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
            + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in names])
        return type("ContinuousBatchingConfig", (), {"__init__": init})

    monkeypatch.setattr("transformers.ContinuousBatchingConfig", fake("block_size", "num_blocks", "max_batch_tokens"))
    assert continuous_batching_config(4, 16, 8).given == {"block_size": 4, "num_blocks": 16, "max_batch_tokens": 8}
    monkeypatch.setattr("transformers.ContinuousBatchingConfig", fake("page_size", "num_blocks", "max_batch_tokens",
                                                                       "block_size"))
    assert continuous_batching_config(4, 16, 8).given["page_size"] == 4  # both (5.24): the current name
    monkeypatch.setattr("transformers.ContinuousBatchingConfig", fake("slots", "num_blocks", "max_batch_tokens"))
    with pytest.raises(TypeError, match=r"neither page_size \(the name from 5.18\) nor block_size \(before\).*"
                                        r'pip install "transformers>=5.15,<' + transformers.__version__):
        continuous_batching_config(4, 16, 8)


def test_serve_llama_needs_the_course_layers():
    config = transformers.LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, attn_implementation="sdpa")
    with pytest.raises(TypeError, match="swap_into_llama"):
        serve_llama(transformers.LlamaForCausalLM(config))


def tiny_gpt_oss():
    """A random 2-layer gpt-oss (sinks, sliding layers of window 3), eager attention, seeded."""
    torch.manual_seed(2)
    config = transformers.GptOssConfig(vocab_size=48, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                       num_experts_per_tok=1, sliding_window=3, max_position_embeddings=64,
                                       attn_implementation="eager")
    return transformers.GptOssForCausalLM(config).eval()


def test_course_sink_attention_gives_gpt_oss_logits():
    model = tiny_gpt_oss()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
        ids = torch.randint(0, 48, (2, 9))
        reference = model(ids).logits
        model.set_attn_implementation(register_sink_attention())
        torch.testing.assert_close(model(ids).logits, reference, atol=1e-5, rtol=0)


def test_gpt_oss_with_no_sinks_and_left_padding_through_the_course():
    """gpt-oss with every sink at -inf (attention without sinks) and a left-padded batch: the pads' rows are empty
    in the sliding layers. Through the course's sink attention the real tokens' logits are the eager attention's,
    finite (the pads' NaN outputs had reached them as values, 0 * NaN = NaN)."""
    model = tiny_gpt_oss()
    ids = torch.randint(1, 48, (2, 10))
    keep = torch.ones(2, 10, dtype=torch.long)
    keep[1, :5] = 0  # five left pads
    real = keep.bool()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(float("-inf"))
        eager = model(input_ids=ids, attention_mask=keep).logits
        model.set_attn_implementation(register_sink_attention())
        ours = model(input_ids=ids, attention_mask=keep).logits
    assert ours[real].isfinite().all()
    torch.testing.assert_close(ours[real], eager[real], atol=1e-5, rtol=0)
