"""The extension's test seams, which only a wheel built with the cargo feature
``test-hooks`` has (``maturin build --features pyo3/extension-module,test-hooks``; the
wheel users install has none):

- ``handoff._handoff._set_route("public" | "auto")``: forces a crossing route in this
  process (users force the public one with ``HANDOFF_ROUTE=public``, at import);
- ``handoff._handoff._mock_ordered(obj, busy_us)`` and ``Ordered._mock_advance(us)``: a
  wrapper whose consumer stream is the runtime's simulated one.

A test (or a parameter) that needs one is marked ``hooks`` (``@hooks``, or
``needs_hooks(value)`` in a parametrization); ``conftest.py`` skips it, saying why, where
the wheel has no seams. ``cargo xtask test`` runs pytest on the wheel users get, then
``pytest -m hooks`` on the wheel with the seams.
"""

import pytest

from handoff import _handoff

#: The module functions a ``test-hooks`` build adds.
FUNCTIONS = ("_set_route", "_mock_ordered")
#: The ``Ordered`` methods it adds.
METHODS = ("_mock_advance",)
#: The ``_``-prefixed functions of every build: the package's own internals
#: (``handoff/__init__.py``'s ``atexit`` hook, ``handoff.torch_function``'s crossings,
#: ``handoff.jax_function``'s counted copies and host syncs).
INTERNAL = ("_shutdown", "_to_jax_many", "_to_torch_many", "_count_copy", "_host_sync")

#: Whether this wheel has the seams.
HOOKS = hasattr(_handoff, FUNCTIONS[0])

#: Marks a test that needs a seam.
hooks = pytest.mark.hooks


def needs_hooks(value, id=None):
    """A parameter value whose test needs a seam."""
    return pytest.param(value, marks=hooks, id=id)


#: The crossings' routes, for a parametrization: the process's own route (native here)
#: on any wheel; the public one, forced with ``_set_route``, on a wheel with the seams.
ROUTES = ["auto", needs_hooks("public")]


def set_route(route):
    """``_set_route(route)``: "public" needs the seams; "auto", the process's route, is a
    no-op on a wheel without them (nothing there can have changed it)."""
    if HOOKS:
        _handoff._set_route(route)
    elif route != "auto":
        pytest.skip(f"route {route!r} is forced with _handoff._set_route, a test seam this wheel lacks")
