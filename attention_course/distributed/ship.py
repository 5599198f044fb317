"""Sending a function to worker processes *by value*, for checkers that run a learner's code in them.

A worker is a fresh Python process: it imports what it runs by module and name, and a function defined in a
notebook cell (module ``__main__``) has neither. So the function goes by value: :func:`pack` turns it into plain,
picklable data -- its code object (marshal, the format of the .pyc files of this very interpreter, which the workers
run), its defaults and closure, and the globals its code names: modules by name, library functions by reference,
the learner's other functions by value in turn, other values pickled -- and :func:`unpack` rebuilds it in the
worker. This needs no source text: it works in a fresh kernel, JupyterLab, Colab, for a lambda, and for code that was
exec'd (grading). A global that cannot be sent is left undefined there; :func:`absent_names` says which, so that a
checker can explain the ``NameError``.

In the worker, :func:`forbid` makes the functions an exercise forbids raise :class:`Forbidden` under every name,
:func:`install_pretence` and :func:`pretend` let ``dist.get_rank()`` / ``dist.get_world_size()`` answer a simulated
rank, :func:`call` runs the function and returns what it gave as plain data (:func:`plain`: tensors as detached CPU
copies) or the exception it raised (:func:`sendable_error`), and :func:`changed` names the arguments it changed in
place. Back in the caller, :func:`describe` says in words what a plain value is.

Used by :mod:`.trial`, which runs chapter 11's exercises in workers started by :func:`~.processes.launch`. The
functions marked ``# pragma: no cover (worker)`` run only in worker processes, where the tests' line coverage does
not follow; tests/test_trial.py and tests/test_exercises_ch11.py run every one of them.
"""
from __future__ import annotations

import builtins
import importlib
import inspect
import marshal
import pickle
import sys
import types

import torch


LIBRARIES = {"torch", "attention_course", "numpy", "einops", "transformers", "functorch"}
PICKLE_LIMIT = 16 * 2**20  # bytes: a global larger than this (a model, a data set) is not sent


def _library(module: str | None) -> bool:
    top = (module or "").split(".")[0]
    return top != "__main__" and (top in LIBRARIES or top in sys.stdlib_module_names)


def _reference(obj) -> tuple[str, str] | None:
    """(module, qualified name) when a worker can import ``obj`` by them: a library's function or class."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not _library(module) or "<" in qualname:
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return (module, qualname) if found is obj else None


def _names_used(code: types.CodeType) -> set[str]:
    """The global names a code object (and the functions, lambdas and comprehensions inside it) may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


class _Parcel:
    """The learner's function, and what it needs, as plain picklable data (see :func:`unpack`)."""

    def __init__(self):
        self.functions: list[dict | None] = []
        self.spaces: list[dict] = []  # one per globals dict of the parent (a notebook's functions share one)
        self._function_index: dict[int, int] = {}
        self._space_index: dict[int, int] = {}

    def value(self, obj) -> tuple:
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        if isinstance(obj, types.FunctionType) and _reference(obj) is None:
            return ("function", self.function(obj))
        ref = _reference(obj)
        if ref is not None:
            return ("ref", *ref)
        try:
            data = pickle.dumps(obj)
        except Exception:  # noqa: BLE001 - not sendable; the worker leaves the name undefined and says why
            return ("absent", type(obj).__name__)
        return ("pickle", data) if len(data) <= PICKLE_LIMIT else ("absent", f"{type(obj).__name__} too large")

    def function(self, fn: types.FunctionType) -> int:
        if id(fn) in self._function_index:
            return self._function_index[id(fn)]
        index = len(self.functions)
        self._function_index[id(fn)] = index
        self.functions.append(None)
        space = self._space_index.setdefault(id(fn.__globals__), len(self.spaces))
        if space == len(self.spaces):
            self.spaces.append({})
        table = self.spaces[space]
        for name in sorted(_names_used(fn.__code__)):
            if name in table or name not in fn.__globals__ or name.startswith("__"):
                continue
            table[name] = ("absent", "")  # while its value is packed (a function that names itself)
            table[name] = self.value(fn.__globals__[name])
        closure = []
        for cell in fn.__closure__ or ():
            try:
                closure.append(self.value(cell.cell_contents))
            except ValueError:  # an empty cell
                closure.append(("empty",))
        self.functions[index] = {
            "code": marshal.dumps(fn.__code__), "name": fn.__name__, "qualname": fn.__qualname__, "space": space,
            "defaults": [self.value(d) for d in fn.__defaults__ or ()],
            "kwdefaults": {k: self.value(d) for k, d in (fn.__kwdefaults__ or {}).items()},
            "closure": closure,
        }
        return index


def pack(fn) -> dict:
    """The learner's function as data a worker can rebuild (:func:`unpack`)."""
    fn = inspect.unwrap(fn)  # a wrapper made with functools.wraps: the function itself
    parcel = _Parcel()
    return {"python": tuple(sys.version_info[:2]), "root": parcel.value(fn), "functions": parcel.functions,
            "spaces": parcel.spaces}


class Forbidden(Exception):
    """Raised in a worker by a function the exercise forbids."""


def forbid(dotted: list[str], rule: str) -> None:
    """In a worker: make each forbidden function raise, under every name (module attribute, and its code, so that
    an alias imported before still reaches the stub)."""
    for name in dotted:
        module_name, attr = name.rsplit(".", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, attr, None)
        if original is None:
            continue

        def stub(*args, _name=name, **kwargs):
            raise Forbidden(f"{_name} may not be used in this exercise: it says \u201c{rule}\u201d")
        if isinstance(original, types.FunctionType) and not original.__code__.co_freevars:
            key = f"__forbidden_{attr}__"
            original.__globals__[key] = stub
            scope: dict = {}
            exec(f"def {attr}(*args, **kwargs):\n    return {key}(*args, **kwargs)\n", scope)
            original.__code__ = scope[attr].__code__
        setattr(module, attr, stub)


# What the learner's code sees as dist.get_rank() and dist.get_world_size() while the checker simulates a rank of
# another world size (None: the real process group's).
PRETEND: dict[str, int | None] = {"rank": None, "world_size": None}


def _pretending(real):  # pragma: no cover (worker)
    def answer(*args, **kwargs):
        key = "rank" if real.__name__ == "get_rank" else "world_size"
        return PRETEND[key] if PRETEND[key] is not None else real(*args, **kwargs)
    answer.__name__ = real.__name__
    return answer


def install_pretence() -> None:  # pragma: no cover (worker)
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in ("get_rank", "get_world_size"):
        answer = _pretending(getattr(c10d, name))
        setattr(dist, name, answer)
        setattr(c10d, name, answer)


def unpack(parcel: dict):
    """In a worker: the learner's function rebuilt from :func:`pack`'s data."""
    if parcel["python"] != tuple(sys.version_info[:2]):
        raise RuntimeError(f"the workers run Python {sys.version_info[:2]}, the notebook {parcel['python']}")
    spaces = [{"__builtins__": builtins, "__name__": "__main__"} for _ in parcel["spaces"]]
    functions = []
    for entry in parcel["functions"]:
        code = marshal.loads(entry["code"])
        closure = tuple(types.CellType() for _ in code.co_freevars) or None
        fn = types.FunctionType(code, spaces[entry["space"]], entry["name"], None, closure)
        fn.__qualname__ = entry["qualname"]
        functions.append(fn)

    def value(packed):
        kind = packed[0]
        if kind == "module":
            return importlib.import_module(packed[1])
        if kind == "function":
            return functions[packed[1]]
        if kind == "ref":
            found = importlib.import_module(packed[1])
            for part in packed[2].split("."):
                found = getattr(found, part)
            return found
        if kind == "pickle":
            return pickle.loads(packed[1])
        raise LookupError(packed[1])

    for space, table in zip(spaces, parcel["spaces"]):
        for name, packed in table.items():
            try:
                space[name] = value(packed)
            except Exception:  # noqa: BLE001 - left undefined: a NameError if the code reaches it, explained then
                pass
    for fn, entry in zip(functions, parcel["functions"]):
        fn.__defaults__ = tuple(value(d) for d in entry["defaults"]) or None
        fn.__kwdefaults__ = {k: value(d) for k, d in entry["kwdefaults"].items()} or None
        for cell, packed in zip(fn.__closure__ or (), entry["closure"]):
            if packed[0] != "empty":
                cell.cell_contents = value(packed)
    return value(parcel["root"])


def absent_names(parcel: dict) -> dict[str, str]:
    """The globals the learner's code names that could not be sent (name -> what they are)."""
    return {name: packed[1] for table in parcel["spaces"] for name, packed in table.items() if packed[0] == "absent"
            and packed[1]}



class Foreign(Exception):
    """An exception of the learner's code that could not be sent back as itself: its type's name and text."""


def sendable_error(err: BaseException) -> BaseException:  # pragma: no cover (worker)
    try:
        back = pickle.loads(pickle.dumps(err))
        if type(back) is type(err) and str(back) == str(err):
            return back
    except Exception:  # noqa: BLE001
        pass
    return type(type(err).__name__, (Foreign,), {})(str(err))


def plain(value):  # pragma: no cover (worker)
    """The learner's return value as plain data: tensors as plain detached CPU copies, tuples and lists item by item;
    anything else as a description ("other", type name)."""
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            return ("subclass", type(value).__qualname__)
        return ("tensor", value.detach().cpu().clone())
    if isinstance(value, (tuple, list)):
        return ("sequence", type(value).__name__, [plain(item) for item in value])
    if value is None:
        return ("none",)
    return ("other", type(value).__name__)


def call(fn, *args):  # pragma: no cover (worker)
    """("ok", plain result) or ("raised", exception) of one call of the learner's function, in a worker."""
    try:
        return ("ok", plain(fn(*args)))
    except Exception as err:  # noqa: BLE001 - the learner's code may raise anything; it is named, not hidden
        return ("raised", sendable_error(err))


def cloned(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def changed(before, after, names) -> list[str]:
    """The names of the tensor arguments a call changed in place."""
    return [name for name, a, b in zip(names, before, after)
            if isinstance(a, torch.Tensor) and not (a.shape == b.shape and torch.equal(a, b))]



def valid_tensor(packed) -> bool:
    return packed[0] == "tensor"


def describe(packed) -> str:
    """What a plain-data value from a worker is, in words."""
    kind = packed[0]
    if kind == "tensor":
        return f"a tensor of shape {tuple(packed[1].shape)}"
    if kind == "sequence":
        return f"a {packed[1]} of {len(packed[2])}"
    if kind == "none":
        return "None"
    if kind == "subclass":
        return f"a {packed[1]} (a subclass of torch.Tensor: return the plain tensor)"
    return f"a {packed[1]}"


def pretend(rank, world_size):
    PRETEND["rank"], PRETEND["world_size"] = rank, world_size
