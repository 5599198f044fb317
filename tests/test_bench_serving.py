"""The benchmark's serving section: the course's Scheduler and serve_llama against transformers' generate_batch on
one workload, tokens compared before anything is timed; skipped with a line where transformers is missing."""
import sys

import pytest

from attention_course import bench


@pytest.mark.slow  # imports transformers and times a benchmark
def test_serving_section_runs_and_prints_the_tokens_line_and_both_rates(capsys):
    pytest.importorskip("transformers")
    import torch

    threads = torch.get_num_threads()
    printed = bench.main(["--section", "serving", "--quick", "--repeats", "1", "--serving-threads", "1"])
    assert printed in capsys.readouterr().out
    assert torch.get_num_threads() == threads  # the section's thread count is restored
    text = " ".join(printed.split())  # the report's lines wrap at 79 characters
    assert "tokens: the same from both for every request (6 of 6, 30 new tokens): ok" in text
    assert "1 CPU thread," in text and "both with 32 pages of 8 slots" in text
    assert bench.SERVING_HEADER in printed
    rows = [line for line in printed.splitlines() if line.startswith(bench.SERVING_NAMES)]
    assert [row[:31].rstrip() for row in rows] == list(bench.SERVING_NAMES)
    for row in rows:  # the whole call's seconds, tokens per second, ratio; the same to the last token
        call, rate, ratio, last, last_rate, last_ratio = (float(x) for x in row[31:].split())
        assert 0 < last <= call and rate > 0 and last_rate >= rate and ratio > 0 and last_ratio > 0
    assert rows[0][31:].split()[2] == rows[0][31:].split()[5] == "1.00"  # generate_batch: the ratios' reference
    path = "the course's path: varlen" if "varlen" in _serve_llama_parameters() else "the course's path: packed"
    assert path in text
    section = printed.split("\n\n1-minute load average")[0]  # main's last line, on the load, is its own
    assert all(len(line) <= 79 for line in section.splitlines())


def _serve_llama_parameters():
    import inspect

    from attention_course.serving import serve_llama

    return inspect.signature(serve_llama).parameters


@pytest.mark.slow  # imports transformers
def test_serving_section_refuses_to_time_different_tokens(monkeypatch):
    pytest.importorskip("transformers")
    from attention_course.serving import Scheduler

    run = Scheduler.run

    def off_by_one(self, forward, **kwargs):  # the course's scheduler, with request 2's fourth token changed
        done = run(self, forward, **kwargs)
        done[2] = done[2][:3] + [done[2][3] + 1] + done[2][4:]
        return done

    monkeypatch.setattr(Scheduler, "run", off_by_one)
    with pytest.raises(AssertionError, match=r"differ from generate_batch's for 1 of 3 requests: request 2 from new "
                                             r"token 3 on \(course \d+, generate_batch \d+\).*nothing was timed"):
        bench.serving_bench(3, 4, 8, 5, hidden=32, intermediate=32, heads=4, kv_heads=2, vocab=32, num_blocks=8,
                            max_batch_tokens=8, repeats=1)


def test_serving_section_without_transformers_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    report, results = bench.serving_bench()
    assert results == {} and report.startswith("serving: skipped, transformers is not installed")


def test_serving_path_follows_serve_llama_s_signature():
    def packed_only(model):
        pass

    def with_varlen(model, varlen=False):
        pass

    assert bench._serving_path(packed_only, None)[0] == {} and "packed" in bench._serving_path(packed_only, None)[1]
    assert bench._serving_path(with_varlen, None)[0] == {"varlen": True}
    assert bench._serving_path(with_varlen, False)[0] == {"varlen": False}
    with pytest.raises(ValueError, match="takes no varlen argument"):
        bench._serving_path(packed_only, True)


def test_serving_workload_is_seeded_and_within_the_lengths():
    prompts = bench.serving_workload(24, 4, 96, 512)
    assert prompts == bench.serving_workload(24, 4, 96, 512) and len(prompts) == 24
    assert all(4 <= len(p) <= 96 and all(0 <= t < 512 for t in p) for p in prompts)
    with pytest.raises(ValueError, match="shortest <= longest"):
        bench.serving_workload(2, 9, 3, 512)


def test_serving_token_check_names_a_short_request_and_the_first_difference():
    bench._check_serving_tokens([[1, 2], [3, 4]], [[1, 2], [3, 4]], 2)  # the same: nothing raised
    with pytest.raises(AssertionError, match=r"for 2 of 2 requests: request 0: 1 new tokens from the course, 2 from "
                                             r"generate_batch \(asked 2\); request 1 from new token 1 on \(course 5, "
                                             r"generate_batch 4\)"):
        bench._check_serving_tokens([[1, 2], [3, 4]], [[1], [3, 5]], 2)


def test_serving_prompt_lengths_take_two_numbers(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--section", "serving", "--serving-prompt-lengths", "4"])
    assert "--serving-prompt-lengths takes two numbers" in capsys.readouterr().err
