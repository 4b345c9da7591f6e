"""The stream-ordered release through the runtime's reaper, on the runtime's simulated
device (``_mock_ordered``, a test seam: the consumer's stream is a simulated one with
consumer work queued on it; those tests are marked ``hooks``), and the thread rules: the reaper releases, the producer's deleter runs on
the main thread (JAX's races JAX's own ``__dlpack__`` anywhere else), and nothing
deadlocks."""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

import handoff
from dlpack_ctypes import Producer
from handoff import _handoff
from seams import hooks


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)  # releases the GIL: the reaper may need it
    return predicate()


@hooks
def test_release_waits_for_the_consumers_queued_work():
    a = np.arange(8, dtype=np.float32)
    p = Producer(a)
    o = _handoff._mock_ordered(p, 1000)
    before = handoff.stats()
    b = np.from_dlpack(o)
    np.testing.assert_array_equal(a, b)
    del b  # the consumer lets go while 1 ms of its work is queued
    gc.collect()
    time.sleep(0.05)
    assert p.deleted == 0, "not before the consumer's work is done"
    assert handoff.stats()["pending"] >= 1
    o._mock_advance(2000)  # the simulated work completes
    assert wait_for(lambda: p.deleted == 1), "the reaper thread released it"
    after = handoff.stats()
    assert after["releases_deferred"] == before["releases_deferred"] + 1
    assert after["events_recorded"] >= before["events_recorded"] + 1
    assert after["host_syncs"] == before["host_syncs"], "nobody waited"
    time.sleep(0.05)
    assert p.deleted == 1, "exactly once"


@hooks
def test_the_producers_deleter_runs_on_the_main_thread():
    p = Producer()
    o = _handoff._mock_ordered(p, 1000)
    b = np.from_dlpack(o)
    del b
    gc.collect()
    o._mock_advance(2000)  # the reaper thread takes the release...
    assert wait_for(lambda: handoff.stats()["pending"] == 0)
    # ...and the deleter runs here, between two bytecodes of this (the main) thread.
    assert wait_for(lambda: p.deleted == 1)
    assert p.deleter_threads == [threading.main_thread().ident]


def test_a_release_on_another_thread_is_deleted_on_the_main_thread():
    p = Producer()
    views = [np.from_dlpack(handoff.ordered(p))]  # a host tensor: released at once
    t = threading.Thread(target=views.pop)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert wait_for(lambda: p.deleted == 1)
    assert p.deleter_threads == [threading.main_thread().ident], "not the releasing thread"


@hooks
def test_flush_waits_on_the_host_and_counts_it():
    p = Producer()
    o = _handoff._mock_ordered(p, 5000)
    b = np.from_dlpack(o)
    del b
    gc.collect()
    before = handoff.stats()
    handoff.flush()
    assert p.deleted == 1
    assert handoff.stats()["host_syncs"] >= before["host_syncs"] + 1
    assert handoff.stats()["pending"] == 0


@hooks
def test_unconsumed_capsule_on_a_simulated_stream():
    p = Producer()
    cap = _handoff._mock_ordered(p, 100).__dlpack__(max_version=(1, 0))
    del cap
    gc.collect()
    handoff.flush()
    assert p.deleted == 1


@hooks
def test_many_releases_from_many_threads_each_exactly_once():
    producers = [Producer(np.full(16, i, dtype=np.float32)) for i in range(200)]
    wrappers = [_handoff._mock_ordered(p, 10 * (i % 7)) for i, p in enumerate(producers)]
    views = [np.from_dlpack(w) for w in wrappers]
    assert [v[0] for v in views] == list(range(200))
    chunks = [views[i::4] for i in range(4)]
    del views

    def drop(chunk):
        while chunk:
            chunk.pop()

    threads = [threading.Thread(target=drop, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    for w in wrappers[::2]:
        w._mock_advance(1000)
    handoff.flush()
    assert [p.deleted for p in producers] == [1] * len(producers)


GIL_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    import handoff
    from handoff import _handoff

    a = np.arange(1 << 16, dtype=np.float32)
    o = _handoff._mock_ordered(a, 1000)
    refs = sys.getrefcount(a)
    views = [np.from_dlpack(o)]  # NumPy's capsule, released behind simulated work
    assert sys.getrefcount(a) > refs

    # The consumer is dropped on another thread: the hand-off goes back to this one,
    # where the reaper's thread queues its release once it waited there too long.
    t = threading.Thread(target=views.pop)
    t.start(); t.join()
    end = time.perf_counter() + 5
    while handoff.stats()["pending"] < 1 and time.perf_counter() < end:
        time.sleep(0.001)
    assert handoff.stats()["pending"] >= 1

    # The work completes: the reaper thread takes the release and calls NumPy's
    # deleter, which waits for the GIL. This thread keeps the GIL meanwhile (no switch
    # for 30 s), then flushes: flush must let go of the GIL while it waits.
    sys.setswitchinterval(30)
    o._mock_advance(2000)
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:
        pass
    handoff.flush()
    sys.setswitchinterval(0.005)
    assert sys.getrefcount(a) == refs, "NumPy's deleter ran"
    print("no deadlock")
    """
)


@hooks
def test_flush_does_not_deadlock_with_a_numpy_deleter_on_the_reaper_thread():
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", GIL_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no deadlock" in r.stdout


EXIT_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import handoff
    from handoff import _handoff

    a = np.arange(16, dtype=np.float32)
    done = _handoff._mock_ordered(a, 1000)
    keep = [np.from_dlpack(done) for _ in range(2)]
    del keep  # two releases queued behind work that completes
    done._mock_advance(2000)
    stuck = _handoff._mock_ordered(a, 3_600_000_000)  # an hour of simulated work, never advanced
    keep = [np.from_dlpack(stuck) for _ in range(3)]
    del keep  # three releases queued behind work that never completes
    late = np.from_dlpack(stuck)  # released during finalization
    print("exiting")
    """
)


@hooks
def test_interpreter_exit_with_pending_releases_does_not_hang():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "exiting" in r.stdout
    # The atexit drain waits at most 5 s, then leaks what never completed, saying so.
    assert "3 release(s)" in r.stderr and "leaked on purpose" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 60
