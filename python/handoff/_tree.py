"""Pytrees at the PyTorch boundary: tuples, lists, dicts and namedtuples of leaves.

A structure is described by nested tuples of constants (``LEAF``, or the container's
kind, its keys and its children's descriptions), so that ``torch.compile`` traces
:func:`flatten` and :func:`unflatten` like any Python code, and a description can be
passed to a function whose result Dynamo keeps as a constant. JAX's own pytrees stay on
the JAX side; this module imports neither framework.
"""

from __future__ import annotations

from typing import Any, Iterator, List

#: The description of a leaf.
LEAF = "*"


def flatten(obj: Any, leaves: List[Any]) -> Any:
    """Appends ``obj``'s leaves to ``leaves`` in order and returns its description.
    Anything that is not a tuple, list, dict or ``None`` is a leaf."""
    if isinstance(obj, tuple):
        kids = tuple(flatten(x, leaves) for x in obj)
        if hasattr(obj, "_fields"):
            return ("namedtuple", type(obj), kids)
        return ("tuple", kids)
    if isinstance(obj, list):
        return ("list", tuple(flatten(x, leaves) for x in obj))
    if isinstance(obj, dict):
        keys = tuple(obj.keys())
        return ("dict", keys, tuple(flatten(obj[k], leaves) for k in keys))
    if obj is None:
        return ("none",)
    leaves.append(obj)
    return LEAF


def unflatten(leaves: Iterator[Any], desc: Any) -> Any:
    """The structure ``desc`` (from :func:`flatten`) with its leaves taken from
    ``leaves`` in order."""
    if desc == LEAF:
        return next(leaves)
    kind = desc[0]
    if kind == "tuple":
        return tuple(unflatten(leaves, d) for d in desc[1])
    if kind == "list":
        return [unflatten(leaves, d) for d in desc[1]]
    if kind == "dict":
        return {k: unflatten(leaves, d) for k, d in zip(desc[1], desc[2])}
    if kind == "namedtuple":
        return desc[1](*(unflatten(leaves, d) for d in desc[2]))
    return None


def paths(desc: Any, prefix: str = "") -> List[str]:
    """Each leaf's path in ``desc``, in order, as Python indexing: ``[0]['w1']``."""
    if desc == LEAF:
        return [prefix]
    kind = desc[0]
    if kind == "dict":
        return [p for k, d in zip(desc[1], desc[2]) for p in paths(d, f"{prefix}[{k!r}]")]
    if kind in ("tuple", "list", "namedtuple"):
        kids = desc[-1]
        return [p for i, d in enumerate(kids) for p in paths(d, f"{prefix}[{i}]")]
    return []
