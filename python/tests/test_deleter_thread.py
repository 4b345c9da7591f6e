"""The benchmark-only switches of issue 32 (``bench/python_host_cost.py``):
``_set_deleters_on_main_thread`` (where a producer's deleter runs) and
``_pending_call_counts`` (the pending calls that run them on the main thread). The
default, the main thread, is tested in ``test_release.py``."""

import gc
import threading
import time

import numpy as np
import pytest

import handoff
from dlpack_ctypes import Producer
from handoff import _handoff


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)  # releases the GIL: the reaper may need it
    return predicate()


def release_on_the_reaper(p):
    """A hand-off of ``p`` released by the reaper's thread (simulated consumer work)."""
    o = _handoff._mock_ordered(p, 1000)
    b = np.from_dlpack(o)
    del b
    gc.collect()
    o._mock_advance(2000)
    assert wait_for(lambda: p.deleted == 1)
    assert wait_for(lambda: handoff.stats()["pending"] == 0)


def test_pending_calls_are_counted():
    calls, jobs, ns = _handoff._pending_call_counts()
    p = Producer()
    release_on_the_reaper(p)
    assert p.deleter_threads == [threading.main_thread().ident]
    calls2, jobs2, ns2 = _handoff._pending_call_counts()
    assert calls2 >= calls + 1
    assert jobs2 >= jobs + 1
    assert ns2 > ns


@pytest.mark.parametrize("gil", [True, False])
def test_deleters_on_the_releasing_thread(gil):
    p = Producer()
    _handoff._set_deleters_on_main_thread(False, gil=gil)
    try:
        release_on_the_reaper(p)
    finally:
        _handoff._set_deleters_on_main_thread(True)
    assert len(p.deleter_threads) == 1
    assert p.deleter_threads[0] != threading.main_thread().ident, "the reaper's thread"
    # Set back: the main thread again.
    q = Producer()
    release_on_the_reaper(q)
    assert q.deleter_threads == [threading.main_thread().ident]
