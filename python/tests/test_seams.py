"""The ``_``-prefixed names of ``handoff._handoff``: the package's own internals in every
build, and the test seams only in a ``test-hooks`` build, all or none (``seams.py``)."""

from handoff import _handoff
from seams import FUNCTIONS, HOOKS, INTERNAL, METHODS


def private(names):
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_the_private_names_are_the_packages_own_and_this_builds_seams():
    assert private(dir(_handoff)) == set(INTERNAL) | (set(FUNCTIONS) if HOOKS else set())
    assert private(vars(_handoff.Ordered)) == (set(METHODS) if HOOKS else set())


def test_the_type_stub_parses_and_declares_every_name_of_every_build():
    import ast
    import os

    import handoff

    path = os.path.join(os.path.dirname(handoff.__file__), "_handoff.pyi")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)  # a misplaced line is a SyntaxError
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    declared |= {t.id for n in tree.body if isinstance(n, (ast.AnnAssign, ast.Assign))
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    module = {n for n in dir(_handoff) if not n.startswith("__")} - set(FUNCTIONS)
    assert module <= declared, f"not in _handoff.pyi: {sorted(module - declared)}"
