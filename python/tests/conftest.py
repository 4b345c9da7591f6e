"""The ``hooks`` marker: tests that need the extension's test seams (see ``seams.py``)
are skipped, with the reason, on a wheel without them (the one users install).

``HANDOFF_TEST_HOOKS=absent`` or ``present`` (``cargo xtask test`` sets it for each of
its two runs) says which wheel the run is meant for: a run on the other one stops
before any test, so that neither run passes on the wrong wheel."""

import os

import pytest

import handoff
from seams import FUNCTIONS, HOOKS, METHODS

SKIP_REASON = (
    "a test seam (cargo feature test-hooks): not in this wheel, as not in the one users "
    "install; cargo xtask test runs this on the hooks wheel"
)


def pytest_configure(config):
    config.addinivalue_line("markers", "hooks: needs the extension's test seams (the cargo feature test-hooks)")
    expected = os.environ.get("HANDOFF_TEST_HOOKS")
    if expected not in (None, "", "absent", "present"):
        raise pytest.UsageError(f'HANDOFF_TEST_HOOKS={expected!r}: expected "absent" or "present"')
    if expected and (expected == "present") != HOOKS:
        raise pytest.UsageError(
            f"HANDOFF_TEST_HOOKS={expected}, but the installed handoff ({handoff.__file__}) "
            f"{'has' if HOOKS else 'lacks'} the test seams {', '.join(FUNCTIONS + METHODS)}"
        )


def pytest_report_header(config):
    which = "with the test seams (test-hooks)" if HOOKS else "without test seams (as shipped)"
    return f"handoff: {os.path.dirname(handoff.__file__)}, {which}"


def pytest_collection_modifyitems(config, items):
    if HOOKS:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("hooks") is not None:
            item.add_marker(skip)
