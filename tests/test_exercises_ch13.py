"""Chapter 13's checkers: the learner's @triton.jit pieces run in the checkers' kernels (Triton's interpreter here).
The torch copies of the kernels that run the catalogue agree with exact attention and its gradients; right answers
in two styles pass; the catalogue's mistakes are named (every mutant of tests/mutants/ch13.py is run by
tests/test_mutation.py); a wrong answer outside the catalogue is described, not named; the stub and a function
without @triton.jit are told so."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="chapter 13's checkers need Triton (pip install -e '.[kernels]', Linux)")
from attention_course.exercises import ExerciseError, ch13  # noqa: E402
from attention_course.kernels import causal_tile_counts  # noqa: E402
from mutants import ch13 as answers  # noqa: E402

pytestmark = pytest.mark.slow  # Triton's interpreter: seconds a file, left to `make test`

tl = ch13.triton.language


def test_the_torch_copy_of_the_forward_kernel_is_attention():
    for case in ch13.STEP.cases:
        q, k, v, allowed, bm, bn = case.args
        o, lse = ch13.STEP.reference(*case.args)
        want_o, want_lse = ch13._exact(q, k, v, allowed)
        torch.testing.assert_close(o, want_o, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(lse, want_lse, atol=1e-12, rtol=1e-12)


def test_the_torch_copy_counts_the_tiles_the_package_kernel_loads():
    case = ch13.MASK.cases[[c.name for c in ch13.MASK.cases].index("causal, L = S, L = 48, S = 48, tiles 16 x 16")]
    assert int(ch13.MASK.reference(*case.args)[2].sum()) == causal_tile_counts(48, 16)[0] == 6


def test_the_torch_copy_of_the_backward_kernel_is_autograd():
    for case in ch13.BACKWARD.cases:
        q, k, v, do, allowed, bm, bn = case.args
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(ch13._exact(*leaves, allowed)[0], leaves, do)
        for got, right in zip(ch13.BACKWARD.reference(*case.args), want):
            torch.testing.assert_close(got, right, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("checker, answer", [
    *[(ch13.check_online_step, (step,)) for step in (answers.step_stand_in, answers.step_exp2_where)],
    *[(ch13.check_tile_mask, pair) for pair in ((answers.end_package, answers.visible_package),
                                                (answers.end_returns, answers.visible_difference))],
    *[(ch13.check_backward_step, pair) for pair in ((answers.prob_package, answers.grad_package),
                                                    (answers.prob_exp2, answers.grad_expanded))],
    (ch13.check_online_step, (ch13._online_step,)), (ch13.check_tile_mask, (ch13._key_end, ch13._visible)),
], ids=["step, stand-in", "step, exp2", "mask, package's", "mask, returns", "backward, package's",
        "backward, exp2", "step, the kernel's own", "mask, the kernel's own"])
def test_a_right_answer_passes_in_each_style(checker, answer, capsys):
    checker(*answer)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("checker, answer, words", [
    (ch13.check_online_step, (answers.acc_unscaled,), "adds this tile's p @ v to acc WITHOUT RESCALING acc"),
    (ch13.check_online_step, (answers.unguarded,), "exp(-inf - -inf) = NaN"),
    (ch13.check_tile_mask, (answers.end_past_diagonal, answers.visible_package), "load ONE TILE TOO MANY"),
    (ch13.check_tile_mask, (answers.end_package, answers.visible_strict), "hide the diagonal"),
    (ch13.check_backward_step, (answers.prob_lse_columns, answers.grad_package), "ALONG THE KEYS"),
    (ch13.check_backward_step, (answers.prob_package, answers.grad_tile_delta), "sees one tile of them"),
], ids=["acc not rescaled", "no guard", "a tile too many", "diagonal hidden", "lse[None, :]", "D from the tile"])
def test_a_catalogue_mistake_is_named(checker, answer, words):
    with pytest.raises(ExerciseError) as info:
        checker(*answer)
    assert words in str(info.value)


def _says(exercise) -> list[str]:
    return [m.says for m in exercise.mistakes]


@pytest.mark.parametrize("checker, answer, exercise, words", [
    (ch13.check_online_step, (answers.half_weights,), ch13.STEP, "your online_step's O is 0.5 times the right one"),
    (ch13.check_tile_mask, (answers.end_package, answers.visible_transposed), ch13.MASK, "differs at"),
    (ch13.check_backward_step, (answers.prob_package, answers.grad_misparenthesised), ch13.BACKWARD,
     "your probabilities and score_grad's dq differs at"),
], ids=["p halved", "mask transposed", "P * dP - D"])
def test_a_wrong_answer_outside_the_catalogue_is_described_not_named(checker, answer, exercise, words):
    with pytest.raises(ExerciseError) as info:
        checker(*answer)
    message = str(info.value)
    assert words in message and not any(says in message for says in _says(exercise)), message


def test_the_stub_and_a_function_without_the_decorator():
    with pytest.raises(ExerciseError, match="still the exercise's stub"):
        ch13.check_online_step(answers.step_stub)
    with pytest.raises(ExerciseError, match="still the exercise's stub"):
        ch13.check_backward_step(answers.prob_package, answers.grad_stub)
    with pytest.raises(ExerciseError, match=r"your visible is a plain Python function.*@triton\.jit"):
        ch13.check_tile_mask(answers.end_package, answers.visible_package.fn)


def test_a_learner_error_inside_the_kernel_is_its_own_last_line_with_a_hint():
    with pytest.raises(ExerciseError) as info:
        ch13.check_online_step(answers.alpha_unbroadcast)
    message = str(info.value)
    assert "raised ValueError: Cannot make_shape_compatible" in message and "x[:, None]" in message
    assert "InterpreterError" not in message and "Traceback" not in message


@ch13.jit
def step_in_float32(m, l, acc, s, v):  # noqa: E741 - right in the chapter's float32 kernel, a dtype named
    m_new = tl.maximum(m, tl.max(s, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - shift[:, None])
    alpha = tl.exp(m - shift)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p.to(tl.float32), v)


def test_a_dtype_named_in_the_answer_is_told_that_the_tiles_are_float64():
    with pytest.raises(ExerciseError, match=r"Got fp32 and fp64\. Likeliest cause here: the checker's tiles are "
                                            r"float64.*x\.to\(v\.dtype\)"):
        ch13.check_online_step(step_in_float32)


STALE = '''import os
os.environ.pop("TRITON_INTERPRET", None)
import triton
import triton.language as tl


@triton.jit
def online_step(m, l, acc, s, v):
    return m, l, acc


from attention_course.exercises import ExerciseError, ch13

try:
    ch13.check_online_step(online_step)
except ExerciseError as err:
    print(err)
'''


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, Triton is compiled: never imported again")
def test_a_function_made_by_a_triton_imported_before_the_interpreter_is_told_what_to_run_again(tmp_path):
    """Without a GPU the course imports Triton again, interpreted; a function jitted before that is not callable
    by the kernel, and the fix is to import Triton again and define the function again, not to add @triton.jit."""
    script = tmp_path / "stale.py"
    script.write_text(STALE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "imported BEFORE the course set up Triton's interpreter" in out, out
    assert "Put @triton.jit" not in out


WITHOUT_TRITON = '''import sys
sys.modules["triton"] = None  # import triton fails, as on macOS
from attention_course.exercises import ch13

print(len(ch13.EXERCISES))
try:
    ch13.check_online_step(None)
except ModuleNotFoundError as err:
    print(err)
'''


def test_without_triton_the_catalogue_stands_and_a_check_says_what_to_install(tmp_path):
    """The catalogue runs in torch alone (tests/test_catalogues.py needs no Triton); a check needs it."""
    script = tmp_path / "without.py"
    script.write_text(WITHOUT_TRITON)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.splitlines()[0] == "3", out.stderr
    assert "chapter 13 needs Triton" in out.stdout


def test_the_compiler_s_error_is_its_last_line_and_the_stub_is_the_stub():
    """On a GPU Triton compiles the learner's function: its errors show the source, then the error; the stub's raise
    is refused by the compiler. (The interpreter's are tested above.)"""
    import ast

    from triton.compiler.errors import CompilationError

    source = "def online_step(m, l, acc, s, v):\n    return m, acc\n"
    node = ast.parse(source).body[0].body[0]
    err = ch13._cause(CompilationError(source, node, "ValueError('not enough values to unpack (expected 3, got 2)')"))
    assert type(err) is RuntimeError and str(err) == "ValueError('not enough values to unpack (expected 3, got 2)')"
    source = "def online_step(m, l, acc, s, v):\n    raise NotImplementedError()\n"
    node = ast.parse(source).body[0].body[0]
    assert type(ch13._cause(CompilationError(source, node, "unsupported AST node type: Raise"))) is NotImplementedError


def _solution(label: str) -> str:
    """The notebook's solution cell of exercise ``label`` (its BEGIN/END SOLUTION marks are comments)."""
    import json

    cells = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "13_kernels.ipynb").read_text())["cells"]
    return next("".join(c["source"]) for c in cells
                if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("grade_id") == label)


def _message(checker, answer) -> str:
    """What ``checker(*answer)`` says: the verdict it prints, or the ExerciseError it raises."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            checker(*answer)
        except ExerciseError as err:
            return f"ExerciseError: {err}"
    return out.getvalue()


FORKED = pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the kernel runs on CUDA, which a forked "
                            "learner process cannot use once this process has (grade with CUDA_VISIBLE_DEVICES='')")


@FORKED
@pytest.mark.parametrize("checker, label, change, names, words", [
    (ch13.check_tile_mask, "ex-ch13-mask", ("", ""), ("key_end", "visible"), "Correct"),
    (ch13.check_tile_mask, "ex-ch13-mask", ("(i + 1) * BLOCK_M", "(i + 2) * BLOCK_M"), ("key_end", "visible"),
     "load ONE TILE TOO MANY"),
    (ch13.check_backward_step, "ex-ch13-backward", ("tl.sum(do * o, 1)", "tl.sum(p * dp, 1)"),
     ("probabilities", "score_grad"), "sees one tile of them"),
    (ch13.check_online_step, "ex-ch13-step", ("    ### BEGIN SOLUTION\n", "    raise NotImplementedError()\n"),
     ("online_step",), "still the exercise's stub"),
    (ch13.check_online_step, "ex-ch13-step", ("acc * alpha[:, None]", "acc * alpha"), ("online_step",),
     "raised ValueError: Cannot make_shape_compatible"),
], ids=["mask, right", "mask, a tile too many", "backward, D from the tile", "step, the stub", "step, an error"])
def test_grading_s_remote_functions_get_the_local_verdict(checker, label, change, names, words):
    """In grading the checker holds boundary.Remote functions: the kernel runs in the learner's process on its
    functions (the second one found by name beside the first) and only tensors come back, judged here as a local
    answer's: the same verdict, word for word."""
    from attention_course import boundary

    cell = _solution(label).replace(*change)
    assert cell != _solution(label) or not change[0]
    local = {"__name__": "__main__", "triton": ch13.triton, "tl": tl}
    exec(compile(cell, "<cell>", "exec"), local)
    learner = boundary.Learner.fork({"__name__": "__main__", "triton": ch13.triton, "tl": tl}, 2**30)
    try:
        assert learner.run(cell, f"<{label}>") is None
        remote = _message(checker, [boundary.Remote(learner, name) for name in names])
    finally:
        learner.close()
    assert words in remote and remote == _message(checker, [local[name] for name in names]), remote


@FORKED
def test_a_second_function_not_beside_the_first_is_told_so():
    """The learner's process finds visible in key_end's globals: a key_end taken from elsewhere (the checker's
    module, whose globals have no visible) is told where to define it."""
    from attention_course import boundary

    learner = boundary.Learner.fork({"__name__": "__main__", "triton": ch13.triton, "tl": tl}, 2**30)
    try:
        cell = _solution("ex-ch13-mask") + "\nfrom attention_course.exercises import ch13\nkey_end = ch13._key_end\n"
        assert learner.run(cell, "<cell>") is None
        message = _message(ch13.check_tile_mask, [boundary.Remote(learner, n) for n in ("key_end", "visible")])
    finally:
        learner.close()
    assert "your visible is not beside your key_end" in message, message


def test_a_learner_process_that_cannot_use_the_gpu_says_so(monkeypatch):
    """With a GPU, the check server's fork cannot use CUDA once the server has: the verdict says so and how to grade,
    rather than report CUDA's error as the learner's."""
    monkeypatch.setattr(ch13, "interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    with pytest.raises(ExerciseError, match="CUDA_VISIBLE_DEVICES=''"):
        ch13.in_learner(answers.step_stand_in, "_step_kernel", [], *ch13.STEP.cases[0].args)
