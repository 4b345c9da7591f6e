"""The ``_``-prefixed names of ``handoff._handoff``: the package's own internals in every
build, and the test seams only in a ``test-hooks`` build, all or none (``seams.py``)."""

from handoff import _handoff
from seams import FUNCTIONS, HOOKS, INTERNAL, METHODS


def private(names):
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_the_private_names_are_the_packages_own_and_this_builds_seams():
    assert private(dir(_handoff)) == set(INTERNAL) | (set(FUNCTIONS) if HOOKS else set())
    assert private(vars(_handoff.Ordered)) == (set(METHODS) if HOOKS else set())
