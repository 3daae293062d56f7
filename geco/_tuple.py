"""``class X(NamedTuple)`` as :class:`typing.NamedTuple` has it, without :mod:`typing`.

Importing :mod:`typing` costs a hook about 2 ms of its start on a small node,
and hooks need nothing else from it at run time. The class made here is what
``typing.NamedTuple`` makes: a :func:`collections.namedtuple` with the
annotated fields (in order), their defaults (which must come last), and the
class body's docstring, methods and properties. Type checkers see
``typing.NamedTuple`` itself.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    from collections import namedtuple

    # made by namedtuple: a class body may not replace them (as typing says)
    _OWN = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                      "_field_defaults", "_make", "_replace", "_asdict", "_source"})
    _SKIP = frozenset({"__module__", "__annotations__"})

    class _NamedTupleMeta(type):
        def __new__(mcls, name, bases, ns):
            if not bases:  # NamedTuple itself
                return super().__new__(mcls, name, bases, ns)
            if bases != (NamedTuple,):
                raise TypeError(f"{name}: a NamedTuple class has NamedTuple as its only base")
            fields = list(ns.get("__annotations__", {}))
            defaulted = [f in ns for f in fields]
            if defaulted != sorted(defaulted):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            cls = namedtuple(name, fields, defaults=[ns[f] for f in fields if f in ns],
                             module=ns["__module__"])
            for key, value in ns.items():
                if key in _OWN:
                    raise AttributeError(f"cannot overwrite NamedTuple attribute {key}")
                if key not in _SKIP and key not in cls._fields:
                    setattr(cls, key, value)
            cls.__annotations__ = dict(ns.get("__annotations__", {}))
            return cls

    NamedTuple = _NamedTupleMeta("NamedTuple", (), {"__module__": __name__})
