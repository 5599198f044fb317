"""attention_course/boundary.py: what a learner process sends back is plain data or refused by name; its exceptions
come back as their own type; a layer it fills comes back filled; a call that runs over its time, its memory, or ends
its process is stopped, and only that process is gone. The learner processes here are forks of the test process
(milliseconds each); what runs in them is tested through them, and once more in this process (``_respond``), where
line coverage follows."""
import collections
import os
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import boundary
from attention_course.boundary import Learner, LearnerError, Refused, Remote, Stopped
from attention_course.exercises import ExerciseError

# A layer filled in place, a call that never returns, one that allocates without end (the check server's learners
# have them too: tests/test_verdict.py)
MISBEHAVING = '''
def fill(layer):
    with torch.no_grad():
        layer.weight.fill_(3.0)
def forever():
    while True:
        pass
def hog():
    kept = []
    while True:
        kept.append(torch.ones(2**24))
'''
CODE = '''
import os, signal
class Sub(torch.Tensor):
    pass
def double(x, times=2):
    return times * x
def sub():
    return torch.ones(2).as_subclass(Sub)
def key():
    raise KeyError("k")
''' + MISBEHAVING + '''def big():
    return torch.zeros(2**18)
pair = (1, 2)
def leave(code):
    os._exit(code)
def killed():
    os.kill(os.getpid(), signal.SIGKILL)
'''


class Guard:
    """The shape of the check server's guard: entered around each call, ``used`` the forbidden names called."""

    def __init__(self, log):
        self.log, self.used = log, []

    def enter(self):
        self.log.append("enter")

    def exit(self):
        self.log.append("exit")
        self.used.append("torch.softmax")


@pytest.fixture
def learner():
    process = Learner.fork({"torch": torch}, 256 * 2**20)
    process.deadline = time.monotonic() + 60
    assert process.run(CODE, "<learner>") is None
    yield process
    process.close()


# ---------------------------------------------------------------- plain data: what passes, what is refused by name
class Liar:
    __class__ = property(lambda self: torch.Tensor)  # isinstance() is fooled; type() is not

    def __eq__(self, other):
        return True


def generator():
    yield torch.ones(2)


class Call:
    def __call__(self):
        return 1


REFUSED = [
    (torch.ones(2).as_subclass(type("Sub", (torch.Tensor,), {})), "Sub, a subclass of torch.Tensor"),
    (type("Pair", (tuple,), {})((1, 2)), "Pair, a subclass of tuple"),
    (type("Row", (list,), {})([1]), "Row, a subclass of list"),
    (type("Table", (dict,), {})(a=1), "Table, a subclass of dict"),
    (type("Count", (int,), {})(3), "Count, a subclass of int"),
    (type("Real", (float,), {})(0.5), "Real, a subclass of float"),
    (type("Text", (str,), {})("a"), "Text, a subclass of str"),
    (generator(), "a generator (the function yields: return the value instead)"),
    (lambda: 1, "a function, something to call (a lazy value?), not its result"),
    (Call(), "something to call (a lazy value?)"),
    (Liar(), "Liar: grading takes"),
    ({1, 2}, "a set: grading takes"),
    (torch.ones(2, 2).to_sparse(), "a tensor of layout torch.sparse_coo"),
    ({("a", 1): 1}, "a dict whose keys are not all str or int"),
    (b"", "empty bytes (b''), which the strict reader cannot carry"),
]


@pytest.mark.parametrize("value, words", REFUSED, ids=[words.split(",")[0] for _, words in REFUSED])
def test_what_is_not_plain_data_is_refused_and_named(value, words):
    with pytest.raises(Refused, match="^f returned ") as caught:
        boundary.plain([value], "f returned")
    assert words in str(caught.value) and boundary.DATA in str(caught.value)


def test_a_container_that_holds_itself_is_refused_and_one_held_twice_is_not():
    loop = [1]
    loop.append(loop)
    with pytest.raises(Refused, match="a container that holds itself"):
        boundary.plain(loop, "f returned")
    twice = (1, 2)
    assert boundary.plain([twice, {"a": twice}], "f returned") == [twice, {"a": twice}]


def test_tensors_come_back_detached_and_torch_containers_as_tuples():
    weight = torch.nn.Parameter(torch.ones(2, dtype=torch.complex64))
    got = boundary.plain({"w": weight, "conj": weight.conj(), "size": torch.Size([2, 3]),
                          "max": torch.ones(2, 3).max(dim=1), "dtype": torch.float64}, "f returned")
    assert type(got["w"]) is torch.Tensor and not got["w"].requires_grad
    assert not got["conj"].is_conj() and torch.equal(got["conj"], weight.detach().conj())
    assert got["size"] == (2, 3) and type(got["size"]) is tuple
    assert type(got["max"]) is tuple and len(got["max"]) == 2 and got["dtype"] is torch.float64


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**62, 2**62), st.floats(allow_nan=False),
                    st.text(max_size=5), st.binary(min_size=1, max_size=5),
                    st.lists(st.floats(-1e3, 1e3), max_size=4).map(lambda xs: torch.tensor(xs, dtype=torch.float64)))
data = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 9)), inner, max_size=3)), max_leaves=8)


def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is torch.Tensor:
        return a.dtype == b.dtype and torch.equal(a, b)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=30, deadline=None)
@given(data)
def test_plain_data_crosses_the_boundary_as_itself(value):
    """For all plain data: plain() there, torch.save, torch.load(weights_only=True) and the strict check here give
    back an equal value of the same types."""
    message = boundary.decode(boundary.encode({"kind": "ok", "value": boundary.plain(value, "f returned")}))
    assert same(message["value"], value)


@pytest.mark.parametrize("value, words", [
    ({1, 2}, "sent a set"), (collections.OrderedDict(a=1), "sent a OrderedDict"),
    (torch.nn.Parameter(torch.ones(1)), "sent a Parameter"), ({(1,): 1}, "sent a dict"),
    (torch.ones(2, 2).to_sparse(), "a tensor of layout torch.sparse_coo on cpu"),
    (torch.ones(1, device="meta"), "on meta"), ([1, [2, {3}]], "sent a set")])
def test_the_strict_check_takes_exact_types_only(value, words):
    with pytest.raises(Refused, match=words):
        boundary.strict(value)


def test_the_strict_reader_refuses_objects_and_messages_it_does_not_know():
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo ran in the checker",))
    with pytest.raises(Refused, match="the strict reader refused it"):
        boundary.decode(boundary.encode({"kind": "ok", "value": Evil()}))
    for message in ([1], {"value": 1}, {"kind": 1}):
        with pytest.raises(Refused, match="not one the learner process sends"):
            boundary.decode(boundary.encode(message))


# ---------------------------------------------------------------- exceptions: their own type, or a LearnerError
class Own(Exception):
    pass


@pytest.mark.parametrize("error, kind", [
    (KeyError("k"), KeyError), (ValueError("bad", 3), ValueError), (torch.OutOfMemoryError("full"),
                                                                     torch.OutOfMemoryError),
    (ExerciseError("your mask is inverted"), ExerciseError),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), UnicodeDecodeError)])
def test_an_exception_comes_back_as_its_own_type(error, kind):
    back = boundary.rebuilt(boundary.decode(boundary.encode(boundary.exception_data(error))))
    assert type(back) is kind and str(back) == str(error)


def test_any_other_exception_comes_back_as_a_learner_error_of_its_name():
    back = boundary.rebuilt(boundary.exception_data(Own("mine")))
    assert isinstance(back, LearnerError) and type(back).__name__ == "Own" and str(back) == "mine"
    odd = boundary.exception_data(ValueError(object()))  # arguments that are not data: the text alone
    assert odd["args"] == [odd["text"]]
    weird = {"kind": "raised", "module": "m", "type": "no-name", "args": [], "text": "t"}
    assert type(boundary.rebuilt(weird)).__name__ == "LearnerError"
    wants = {"kind": "raised", "module": "builtins", "type": "UnicodeDecodeError", "args": ["x"], "text": "x"}
    assert type(boundary.rebuilt(wants)).__name__ == "UnicodeDecodeError" and isinstance(boundary.rebuilt(wants),
                                                                                         LearnerError)
    other = {"kind": "raised", "module": "builtins", "type": "KeyError", "args": ["k"], "text": "what it said"}
    assert type(boundary.rebuilt(other)) is KeyError and str(boundary.rebuilt(other)) == "'what it said'"
    assert boundary._memory_error(RuntimeError("CUDA out of memory")) and not boundary._memory_error(KeyError())


# ---------------------------------------------------------------- the learner process's answers, computed here
def respond(request, namespace, guard=None, used=None):
    used = [] if used is None else used
    return boundary.decode(boundary._respond(request, namespace, {"torch": torch}, guard, used))


def test_each_request_is_answered_in_plain_data():
    namespace = {"torch": torch}
    assert respond({"op": "exec", "code": CODE, "filename": "<c>"}, namespace)["value"] is None
    assert respond({"op": "exec", "code": "1 / 0", "filename": "<c>"}, namespace)["type"] == "ZeroDivisionError"
    assert {"double", "sub", "os"} <= set(respond({"op": "names"}, namespace)["value"])
    log = []
    answer = respond({"op": "call", "name": "double", "args": (torch.ones(2),), "kwargs": {"times": 3},
                      "context": "ex"}, namespace, guard=lambda context: Guard(log))
    assert torch.equal(answer["value"], torch.full((2,), 3.0)) and answer["used"] == ["torch.softmax"]
    assert log == ["enter", "exit"] and answer["states"] == [None]
    layer = torch.nn.Linear(2, 2)
    states = respond({"op": "call", "name": "fill", "args": (layer,), "kwargs": {}, "context": None},
                     namespace)["states"]
    assert torch.equal(states[0]["weight"], torch.full((2, 2), 3.0))
    assert respond({"op": "call", "name": "sub", "args": (), "kwargs": {}, "context": None},
                   namespace)["kind"] == "refused"
    apply = {"op": "apply", "function": "attention_course.boundary:describe", "name": "double", "args": ()}
    assert respond(apply, namespace)["value"] == "a function, something to call (a lazy value?), not its result"
    assert respond(dict(apply, function="attention_course.boundary:plain", name="pair", args=("w",)),
                   namespace)["value"] == (1, 2)
    assert respond(dict(apply, function="os:system", args=("true",)), namespace)["text"] == (
        "apply takes a function of attention_course, not os")
    refused = respond(dict(apply, function="attention_course.boundary:Remote", args=("x",)), namespace)
    assert refused["kind"] == "refused"
    assert refused["what"].startswith("attention_course.boundary:Remote returned an attention_course.boundary.Remote, "
                                      "something to call")
    assert respond({"op": "call", "name": "m", "args": (), "kwargs": {}, "context": None},
                   {"m": lambda: (_ for _ in ()).throw(MemoryError())})["kind"] == "memory"


def test_an_answer_torch_cannot_write_is_refused(monkeypatch):
    real = boundary.encode
    calls = []

    def failing(message):
        calls.append(message)
        if len(calls) == 1:
            raise OSError("disk full")
        return real(message)
    monkeypatch.setattr(boundary, "encode", failing)
    answer = boundary.decode(boundary._respond({"op": "names"}, {}, {}, None, []))
    assert answer == {"kind": "refused", "what": "an answer that could not be written (OSError)", "used": []}


def test_a_filled_layer_gets_the_values_and_shapes_it_was_given():
    layer = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    boundary._fill(layer, {"0.weight": torch.full((3, 2), 2.0), "0.bias": torch.zeros(4),
                           "1.running_mean": torch.ones(5), "nothing": torch.ones(1), 3: torch.ones(1),
                           "1.weight": [1.0]})
    assert torch.equal(layer[0].weight.detach(), torch.full((3, 2), 2.0))
    assert isinstance(layer[0].bias, torch.nn.Parameter) and layer[0].bias.shape == (4,)
    assert layer[0].bias.requires_grad and torch.equal(layer[1].running_mean, torch.ones(5))


# ---------------------------------------------------------------- through a learner process
def test_a_call_runs_in_the_learner_process_and_comes_back_as_data(learner):
    double = Remote(learner, "double")
    assert torch.equal(double(torch.ones(2), times=5), torch.full((2,), 5.0))
    assert repr(double) == "<double, run in a process of its own>" and double.__name__ == "double"
    assert "leave" in learner.names() and "torch" not in learner.names()
    assert Remote(learner, "pair").apply("attention_course.boundary:plain", "w") == (1, 2)
    with pytest.raises(Refused, match="returned a Sub, a subclass of torch.Tensor"):
        Remote(learner, "sub")()
    with pytest.raises(KeyError, match="'k'"):
        Remote(learner, "key")()
    assert isinstance(learner.run("raise ValueError('no')", "<cell>"), ValueError)
    layer = torch.nn.Linear(2, 2)
    Remote(learner, "fill")(layer)
    assert torch.equal(layer.weight.detach(), torch.full((2, 2), 3.0))
    assert learner.alive and os.getpid() != learner.pid


def test_a_learner_process_runs_its_preparation_and_its_guard():
    log, namespace = [], {"torch": torch}
    process = Learner.fork(namespace, 256 * 2**20, guard=lambda context: Guard(log),
                           prepare=lambda: namespace.update(prepared=True))
    try:
        process.deadline = time.monotonic() + 60
        assert process.run("assert prepared\ndef soft(x):\n    return torch.softmax(x, -1)\n", "<cell>") is None
        Remote(process, "soft", context="ex")(torch.zeros(2))
        assert process.used == ["torch.softmax"] and log == [] and "prepared" not in namespace  # there, not here
    finally:
        process.close()


@pytest.mark.parametrize("name, args, words", [
    ("forever", (), "^timed out: your code ran over the time a check may take$"),
    ("hog", (), r"^your code went over the memory grading gives it \(256 MiB( resident)?\) and was stopped there: "
                r"keep fewer or smaller tensors"),
    ("leave", (3,), r"ended \((exit status 3|its answer channel closed)\) before it answered"),
    ("killed", (), r"ended \((signal 9|its answer channel closed)\) before it answered")])
def test_a_stopped_call_ends_its_process_and_says_why(learner, name, args, words):
    learner.deadline = time.monotonic() + (0.5 if name == "forever" else 60)
    with pytest.raises(Stopped, match=words):
        learner.call(name, args, {})
    assert not learner.alive
    with pytest.raises(Stopped, match="stopped earlier"):
        Remote(learner, "double")(1)
    assert learner.ended() == "it is gone"


# How a process ended, and the memory watch, each on its own path: the stopped calls above race the process's exit
# (either wording passes there), so each path is also taken here, where nothing races.
def test_a_process_still_running_when_asked_is_stopped_and_its_channel_named(learner):
    assert learner.ended() == "its answer channel closed" and not learner.alive
    assert learner.ended() == "it is gone"  # reaped by then


def test_a_process_that_ended_is_named_by_its_signal_and_killed_again_quietly(learner):
    os.kill(learner.pid, 9)
    os.waitid(os.P_PID, learner.pid, os.WEXITED | os.WNOWAIT)  # until it has ended, left unreaped
    assert learner.ended() == "signal 9" and not learner.alive  # its group and its status were gone when killed


def test_the_resident_memory_watch_stops_the_process(learner):
    learner.memory, learner.base = 0, -1  # every resident page is over
    with pytest.raises(Stopped, match=r"went over the memory grading gives it \(0 MiB resident\)"):
        learner.watch()
    assert not learner.alive


def test_an_answer_over_the_limit_is_refused_unread(learner, monkeypatch):
    monkeypatch.setattr(boundary, "LIMIT", 2**20)
    with pytest.raises(Refused, match="an answer of 1 MiB, over the 1 MiB grading reads"):
        learner.call("big", (), {})
    assert not learner.alive


def test_a_process_that_is_gone_reads_as_no_memory():
    assert boundary._statm(2**22 + 1, 1) == 0


def test_a_layer_the_learner_returns_stays_in_its_process_and_is_probed_there(learner):
    """A factory's layer comes back as a boundary.Layer: the package's functions run on it in the learner process."""
    assert learner.run("def make(n):\n    return torch.nn.Linear(n, n)\n", "<make>") is None
    layer = Remote(learner, "make")(2)
    assert isinstance(layer, boundary.Layer) and "make" in learner.names()
    assert layer.apply("attention_course.boundary:describe").startswith("a torch.nn.modules.linear.Linear")
    assert Remote(learner, "make")(3).name != layer.name  # each layer kept under a name of its own
