"""Call a learner's function in a process of its own, and take back plain data only.

The learner's code runs in a *learner process* (:meth:`Learner.fork`); the process that checks it keeps a
:class:`Remote` for each of the learner's functions, a callable that forwards the call. The way there is trusted
(the arguments are pickled); the way back is not: the learner process writes its answer with ``torch.save`` and
this process reads it with ``torch.load(weights_only=True)``, then checks every value by its exact type. Plain data
is a ``torch.Tensor`` (the class itself, strided, on the CPU), ``int``, ``float``, ``complex``, ``bool``, ``str``,
``bytes``, ``None``, ``torch.dtype``, and tuples, lists and dicts (with ``str`` or ``int`` keys) of these. Anything
else is described in words where it was made and comes back as :class:`Refused` (a tensor subclass, an object
whose comparisons lie, a generator, a lazy object, ...). An exception of the learner's code comes back as its
type's name, its arguments and its text, and is raised here again: as the same type when it is a built-in or torch
exception, else as a :class:`LearnerError` of the same name. A layer (``nn.Module``) passed as an argument and
filled in by the learner's function (weights copied into it) gets the learner process's values back, parameter by
parameter, as plain tensors. A layer the learner's function returns (a factory's, a class's) stays in the learner
process and comes back as a :class:`Layer`, a :class:`Remote` of its own: the checker never holds the learner's
objects, it applies the package's functions to them there.

So whatever the learner's code does in its process (patch the checker's module, rebind ``torch.equal``, walk up
the stack with ``sys._getframe`` to the caller's locals, undo its patches afterwards), the comparison runs here,
where none of its code ever ran. The learner process lives across calls (one per learner and chapter, not one per
call); a call that runs over its time, a process that dies, or code that goes over the memory given to it
(``RLIMIT_AS``, and its resident memory watched from here) raises :class:`Stopped` here, and the process is gone:
the next :meth:`Learner.fork` starts a fresh one.

Grading (instructor/check_server.py) forks one learner process per submission and chapter and hands the chapter's
checkers :class:`Remote` functions; in a learner's own notebook the checkers get the function itself, as always.
:meth:`Remote.apply` runs a function of the package on the learner's function in its process and brings back its
plain-data result, the same way. Chapter 11's checkers, which run the learner's function in worker processes, use
it: the learner process ships the function to the workers, launches them and collects what they send back; only
that, as plain data (their exceptions as :func:`exception_data`, rebuilt here with :func:`rebuilt`), reaches the
checker, which judges it where no learner code ran. Chapters 6 and 7's checkers, which build the learner's layer,
load weights into it and run backward through it, use it too: ``probe_layer`` (attention_course/probe.py)
does all of that in the learner process, on the class (or on the :class:`Layer` a factory returned), and sends back
outputs, weights, gradients, parameter names and exceptions; the checker builds torch's layer and compares here.
Chapter 13's checkers, whose answers are Triton functions a course kernel calls, use it too: the kernel runs in the
learner process on the learner's functions and sends back its output tensors. One mechanism for every checker.
"""
from __future__ import annotations

import importlib
import io
import os
import pickle
import resource
import select
import signal
import struct
import sys
import time
import types

import torch

LIMIT = 64 * 2**20  # bytes of one answer from the learner process
POLL = 0.05  # seconds between two looks at the learner process's memory
PLAIN = (int, float, complex, bool, str, bytes, type(None))
DATA = ("plain torch.Tensor values, Python numbers, strings, bools, None, and tuples, lists and dicts of these")


class Refused(BaseException):
    """What the learner's function returned is not plain data. A BaseException: a checker's ``except Exception``
    must not turn it into a message about the learner's code raising."""


class Stopped(BaseException):
    """The learner process was stopped (time, memory) or ended during a call; it is gone."""


class LearnerError(Exception):
    """An exception of the learner's code whose type is neither built in nor torch's (its name is kept)."""


# ---------------------------------------------------------------- in the learner process: plain data or a description
def describe(value) -> str:
    """What a value is, in words, from its type alone (``type()`` cannot be faked by a ``__class__`` property)."""
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    a = "an" if name[:1].lower() in "aeiou" else "a"
    if issubclass(kind, torch.Tensor):
        return f"{a} {name}, a subclass of torch.Tensor"
    for base in (tuple, list, dict, int, float, str):
        if issubclass(kind, base) and kind is not base:
            return f"{a} {name}, a subclass of {base.__name__}"
    if issubclass(kind, types.GeneratorType):
        return "a generator (the function yields: return the value instead)"
    if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)) or (
            callable(value) and not isinstance(value, type)):
        return f"{a} {name}, something to call (a lazy value?), not its result"
    return f"{a} {name}"


def plain(value, where: str, seen=None):
    """``value`` as plain data (a Parameter or a tensor that needs grad: its detached values; ``torch.Size`` and
    ``torch.return_types``: tuples), or :class:`Refused` saying what it is."""
    seen = set() if seen is None else seen
    kind = type(value)
    if kind is bytes and not value:  # torch.save writes b"" as a call of bytes(), which weights_only refuses
        raise Refused(f"{where} empty bytes (b''), which the strict reader cannot carry: {DATA} only")
    if kind in PLAIN or kind is torch.dtype:
        return value
    if kind in (torch.Tensor, torch.nn.Parameter):
        if value.layout is not torch.strided or value.is_quantized:
            raise Refused(f"{where} a tensor of layout {value.layout}: {DATA} only")
        return value.detach().cpu().clone().resolve_conj().resolve_neg()
    if id(value) in seen:  # the containers around this one: a cycle (the same value twice is fine)
        raise Refused(f"{where} a container that holds itself")
    seen.add(id(value))
    try:
        if kind in (tuple, list, torch.Size) or kind.__module__ == "torch.return_types":
            items = [plain(item, where, seen) for item in value]
            return items if kind is list else tuple(items)
        if kind is dict:
            if not all(type(key) in (str, int) for key in value):
                raise Refused(f"{where} a dict whose keys are not all str or int: {DATA} only")
            return {key: plain(item, where, seen) for key, item in value.items()}
    finally:
        seen.discard(id(value))
    raise Refused(f"{where} {describe(value)}: grading takes {DATA} only")


def strict(value, where: str = "the learner process sent"):
    """Raise :class:`Refused` unless ``value`` (read with weights_only) is plain data, checked by exact type."""
    kind = type(value)
    if kind in PLAIN or kind is torch.dtype:
        return
    if kind is torch.Tensor:
        if value.layout is not torch.strided or value.device.type != "cpu" or value.is_quantized:
            raise Refused(f"{where} a tensor of layout {value.layout} on {value.device}: {DATA} only")
        return
    if kind in (tuple, list):
        for item in value:
            strict(item, where)
        return
    if kind is dict and all(type(key) in (str, int) for key in value):
        for item in value.values():
            strict(item, where)
        return
    raise Refused(f"{where} a {kind.__qualname__}: {DATA} only")


def encode(message: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    return buffer.getvalue()


def decode(data: bytes) -> dict:
    """A message of the learner process: torch.load with weights_only, then every value checked by exact type."""
    try:
        message = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as error:  # noqa: BLE001  (whatever it holds that the strict reader refuses)
        raise Refused(f"the answer is not plain data (the strict reader refused it: "
                      f"{' '.join(str(error).split())[:300]})") from None
    strict(message)
    if type(message) is not dict or type(message.get("kind")) is not str:
        raise Refused("the answer is not one the learner process sends")
    return message


def exception_data(error: BaseException) -> dict:
    kind = type(error)
    try:
        args = plain(list(error.args), "")
    except Refused:
        args = [str(error)]
    return {"kind": "raised", "module": kind.__module__, "type": kind.__qualname__, "args": args,
            "text": str(error)[:4000]}


def rebuilt(message: dict) -> BaseException:
    """The learner's exception, here: the same built-in, torch or package type (a checker's ExerciseError from a
    launch in the learner process, say), else a LearnerError of the same name."""
    module, name, args, text = message["module"], message["type"], message["args"], message["text"]
    if type(module) is str and type(name) is str and (module == "builtins" or
                                                      module.split(".")[0] in ("torch", "attention_course")):
        found = sys.modules.get(module)
        for part in name.split("."):
            found = getattr(found, part, None)
        if isinstance(found, type) and issubclass(found, Exception):
            try:
                error = found(*args) if type(args) is list else found(str(text))
                if str(error) == text:
                    return error
                return found(str(text))
            except Exception:  # noqa: BLE001  (a type that wants other arguments)
                pass
    short = str(name).rsplit(".", 1)[-1]
    return type(short if short.isidentifier() else "LearnerError", (LearnerError,), {})(str(text))


def _memory_error(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or "can't allocate memory" in str(error) or "out of memory" in str(error)


def _serve(inbox: int, outbox: int, namespace: dict, guard) -> None:  # pragma: no cover (learner process)
    """The learner process's loop: a request in, its answer out, until the checking process closes the channel.
    (Coverage does not follow a fork; tests/test_boundary.py runs every line of it.)"""
    before = dict(namespace)
    used: list[str] = []
    while True:
        request = _read(inbox, None, limit=float("inf"))
        if request is None:
            os._exit(0)
        data = _respond(pickle.loads(request), namespace, before, guard, used)
        os.write(outbox, struct.pack("<Q", len(data)))
        view = memoryview(data)
        while view:
            view = view[os.write(outbox, view[:1 << 20]):]


def _respond(request: dict, namespace: dict, before: dict, guard, used: list) -> bytes:
    """The answer to one request, written with torch.save (in the learner process)."""
    op = request["op"]
    try:
        if op == "exec":
            exec(compile(request["code"], request["filename"], "exec"), namespace)
            answer = {"kind": "ok", "value": None}
        elif op == "names":
            answer = {"kind": "ok", "value": sorted(name for name, value in namespace.items()
                                                     if type(name) is str and not name.startswith("__")
                                                     and (name not in before or before[name] is not value))}
        elif op == "apply":  # a function of the package applied to the learner's function (and arguments)
            module, _, attr = request["function"].partition(":")
            if module.split(".")[0] != "attention_course":
                raise ValueError(f"apply takes a function of attention_course, not {module}")
            found = getattr(importlib.import_module(module), attr)(namespace[request["name"]], *request["args"])
            try:
                answer = {"kind": "ok", "value": plain(found, f"{request['function']} returned")}
            except Refused as refusal:
                answer = {"kind": "refused", "what": str(refusal)}
        else:  # call
            answer = _call(namespace, request, guard, used)
    except BaseException as error:  # noqa: BLE001  (the learner's code may raise anything)
        answer = {"kind": "memory"} if _memory_error(error) else exception_data(error)
    answer["used"] = list(used)
    used.clear()
    try:
        return encode(answer)
    except BaseException as error:  # noqa: BLE001
        return encode({"kind": "refused", "what": f"an answer that could not be written ({type(error).__name__})",
                       "used": []})


def _call(namespace: dict, request: dict, guard, used: list) -> dict:
    context = guard(request["context"]) if guard is not None else None
    if context is not None:
        context.enter()
    try:
        result = namespace[request["name"]](*request["args"], **request["kwargs"])
    finally:
        if context is not None:
            context.exit()
            used.extend(context.used)
            context.used.clear()
    if isinstance(result, torch.nn.Module):  # a layer: kept here, for the package's functions (Remote.apply)
        name = f"__layer_{sum(1 for key in namespace if str(key).startswith('__layer_'))}__"
        namespace[name] = result
        return {"kind": "layer", "name": name}
    try:
        value = plain(result, f"{request['name']} returned")
    except Refused as refusal:
        return {"kind": "refused", "what": str(refusal)}
    states = []
    for arg in request["args"]:  # a layer the function filled in: its values go back
        states.append({name: tensor.detach().cpu().clone() for name, tensor in arg.state_dict().items()
                       if type(tensor) in (torch.Tensor, torch.nn.Parameter)}
                      if isinstance(arg, torch.nn.Module) else None)
    return {"kind": "ok", "value": value, "states": states}


def _read(fd: int, deadline: float | None, watch=None, limit: float | None = None) -> bytes | None:
    """A length-prefixed message from ``fd``; None at its end. ``watch()`` is called while waiting."""
    head = _exactly(fd, 8, deadline, watch)
    if head is None:
        return None
    size = struct.unpack("<Q", head)[0]
    if size > (LIMIT if limit is None else limit):
        raise Refused(f"an answer of {size / 2**20:.0f} MiB, over the {LIMIT / 2**20:.0f} MiB grading reads")
    return _exactly(fd, size, deadline, watch)


def _exactly(fd: int, size: int, deadline, watch) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(left, POLL))
            if watch is not None:
                watch()
            if not ready:
                continue
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _statm(pid: int, field: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[field]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


# ---------------------------------------------------------------- in the checking process
class Learner:
    """A learner process: a fork of this one, running the learner's code. Calls come back as plain data."""

    def __init__(self, pid: int, inbox: int, outbox: int, memory: int):
        self.pid, self.inbox, self.outbox, self.memory = pid, inbox, outbox, memory
        self.deadline = float("inf")  # set by the caller: when the current exercise's time is up
        self.used: list[str] = []  # forbidden functions the learner's code called (from the guard)
        self.alive, self.busy = True, False  # busy: a request is waiting for its answer
        self.base = _statm(pid, 1)

    @classmethod
    def fork(cls, namespace: dict, memory: int, guard=None, prepare=None) -> "Learner":
        """Fork a learner process that shares ``namespace`` as it is now. ``memory``: bytes it may allocate
        (address space over what it has at the fork, and resident memory over this process's); ``guard(context)``:
        an object entered around each call (``enter``, ``exit``, ``used``), or None; ``prepare()``: run first in the
        child (close what it must not hold)."""
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the learner process: coverage does not follow a fork)
            try:
                os.close(to_child)
                os.close(from_child)
                os.setsid()
                torch.set_num_threads(1)  # the parent's OpenMP threads are not in the fork: a parallel op would hang
                if prepare is not None:
                    prepare()
                mapped = _statm(os.getpid(), 0)
                if mapped:
                    resource.setrlimit(resource.RLIMIT_AS, (mapped + memory, mapped + memory))
                _serve(from_parent, to_parent, namespace, guard)
            finally:
                os._exit(0)
        os.close(from_parent)
        os.close(to_parent)
        return cls(pid, to_child, from_child, memory)

    def request(self, **request) -> dict:
        if not self.alive:
            raise Stopped("the process running your code was stopped earlier")
        self.busy = True
        try:
            data = pickle.dumps(request)
            os.write(self.inbox, struct.pack("<Q", len(data)))
            view = memoryview(data)
            while view:
                view = view[os.write(self.inbox, view[:1 << 20]):]
            answer = _read(self.outbox, self.deadline, self.watch)
            self.busy = False
        except TimeoutError:
            self.kill()
            raise Stopped("timed out: your code ran over the time a check may take") from None
        except (BrokenPipeError, OSError):
            answer = None
        except Refused:
            self.kill()
            raise
        if answer is None:
            raise Stopped(f"the process running your code ended ({self.ended()}) before it answered")
        message = decode(answer)
        used = message.pop("used", [])
        self.used.extend(name for name in used if type(name) is str and name not in self.used)
        if message["kind"] == "memory":
            self.kill()
            raise Stopped(self.over_memory(""))
        return message

    def watch(self) -> None:
        if _statm(self.pid, 1) - self.base > self.memory:
            self.kill()
            raise Stopped(self.over_memory(" resident"))

    def over_memory(self, kind: str) -> str:
        return (f"your code went over the memory grading gives it ({self.memory / 2**20:.0f} MiB{kind}) and was "
                f"stopped there: keep fewer or smaller tensors (a loop that keeps every step's result? a size "
                f"computed wrong?)")

    def run(self, code: str, filename: str) -> BaseException | None:
        """Execute ``code`` in the learner's namespace: None, or the exception it raised (rebuilt here)."""
        message = self.request(op="exec", code=code, filename=filename)
        return rebuilt(message) if message["kind"] == "raised" else None

    def names(self) -> list[str]:
        """The names the learner's code defined or rebound since the fork."""
        value = self.request(op="names")["value"]
        return [name for name in value if type(name) is str] if type(value) is list else []

    def apply(self, function: str, name: str, *args):
        """``function(learner's name, *args)`` (``function``: ``"attention_course.module:name"``) run in the learner
        process: its plain-data result. Chapter 11's checkers so launch their worker processes from there."""
        return self.answer(self.request(op="apply", function=function, name=name, args=args), ())

    def call(self, name: str, args: tuple, kwargs: dict, context=None):
        message = self.request(op="call", name=name, args=args, kwargs=kwargs, context=context)
        if message["kind"] == "layer" and type(message.get("name")) is str and message["name"].startswith("__layer_"):
            return Layer(self, message["name"], context)
        return self.answer(message, args)

    def answer(self, message: dict, args: tuple):
        kind = message["kind"]
        if kind == "raised":
            raise rebuilt(message)
        if kind == "refused":
            raise Refused(str(message.get("what", "something that is not plain data")))
        if kind != "ok":
            raise Refused("an answer the learner process does not send")
        states = message.get("states") or []
        for arg, state in zip(args, states if type(states) is list else []):
            if isinstance(arg, torch.nn.Module) and type(state) is dict:
                _fill(arg, state)
        return message["value"]

    def ended(self) -> str:
        """How the learner process ended, read without reaping it (WNOWAIT): its pid, and so its process group's id,
        stay reserved until :meth:`kill` has ended the group and reaped it, so no other process is ever signalled."""
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "it is gone"
        self.kill()
        if info is None:
            return "its answer channel closed"
        if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            return f"signal {info.si_status}"
        return f"exit status {info.si_status}"

    def kill(self) -> None:
        if not self.alive:
            return
        self.alive = False
        for fd in (self.inbox, self.outbox):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass

    close = kill


def _fill(module: torch.nn.Module, state: dict) -> None:
    """Put the learner process's values of a layer's tensors into the layer here (same names; a new shape replaces
    the tensor, keeping whether it is a parameter and whether it needs grad)."""
    own = dict(module.state_dict(keep_vars=True))
    for name, value in state.items():
        if type(name) is not str or type(value) is not torch.Tensor or name not in own:
            continue
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        old = own[name]
        with torch.no_grad():
            if old.shape == value.shape and old.dtype == value.dtype:
                old.copy_(value)
            elif isinstance(old, torch.nn.Parameter):
                setattr(owner, leaf, torch.nn.Parameter(value, requires_grad=old.requires_grad))
            else:
                setattr(owner, leaf, value)


class Remote:
    """The learner's function ``name``, called in its learner process: what comes back is plain data."""

    def __init__(self, learner: Learner, name: str, context=None):
        self.learner, self.name, self.context = learner, name, context
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self.learner.call(self.name, args, kwargs, self.context)

    def apply(self, function: str, *args):
        """``function`` of the package applied to this function (and ``args``) in its learner process (see
        Learner.apply)."""
        return self.learner.apply(function, self.name, *args)

    def __repr__(self) -> str:
        return f"<{self.name}, run in a process of its own>"


class Layer(Remote):
    """A layer (``nn.Module``) the learner's function returned, kept in its learner process: the checker applies the
    package's functions to it there (:meth:`Remote.apply`), and calling it calls the layer there."""

    def __repr__(self) -> str:
        return f"<a layer kept in the process that runs your code ({self.name})>"


__all__ = ["DATA", "Layer", "Learner", "LearnerError", "Refused", "Remote", "Stopped", "decode", "describe", "encode",
           "exception_data", "plain", "rebuilt", "strict"]
