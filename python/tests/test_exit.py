"""Interpreter exit: a hand-off whose consumer lets go while the interpreter
is finalizing (a module global, dropped when the modules are torn down, after every
``atexit`` hook ran) gives its producer's deleter exactly once, on the main thread,
with the GIL; a release still pending on a stream that never completes is leaked on
purpose (counted, one line on stderr), its deleter never called; nothing crashes.

Each case runs in a subprocess; the producer's deleter writes one line to stdout with
``os.write`` (bound as default arguments: during finalization, module globals may be
gone already)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from seams import hooks, needs_hooks

TESTS = os.path.dirname(os.path.abspath(__file__))

# A producer whose deleter says where it ran, with nothing but what it bound itself
# (during finalization, module globals may be gone already).
PRODUCER = textwrap.dedent(
    """
    import os, threading

    class Counted(Producer):
        def __init__(self, action):
            super().__init__()
            self.action = action

        def _on_delete(self, ptr, _write=os.write, _ident=threading.get_ident, _h=handoff):
            where = "main" if _ident() == MAIN else "other"
            _write(1, ("deleter ran on " + where + "\\n").encode())
            if self.action == "flush":
                _h.flush()
                _write(1, b"flush inside the deleter returned\\n")
    """
)

SCRIPT = textwrap.dedent(
    """
    import ctypes, faulthandler, os, sys, threading
    faulthandler.dump_traceback_later(60, exit=True)
    sys.path.insert(0, {tests!r})
    import numpy as np
    import handoff
    from handoff import _handoff
    from dlpack_ctypes import Producer

    # The producer's class lives outside __main__: the producer is kept alive until the
    # process ends (below), and with it its class's globals, which must not be
    # __main__'s (they hold `late`, which must die while the modules are torn down).
    ns = {{"Producer": Producer, "handoff": handoff, "MAIN": threading.get_ident()}}
    exec({producer!r}, ns)
    p = ns["Counted"]({action!r})
    # Alive (its deleter callable) until the process ends, as a real producer's
    # manager_ctx keeps its owner: dlpack_ctypes keeps producers whose tensor is out in
    # a module global, which is cleared at exit before the consumer's array dies.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(p))
    path = {path!r}
    if path == "host":
        o = handoff.ordered(p)
    else:
        o = _handoff._mock_ordered(p, 1000)
    late = np.from_dlpack(o)  # kept until the interpreter tears __main__ down
    if path == "advanced":
        o._mock_advance(1000)  # the consumer's work is done; its release is not
    assert handoff.stats()["pending"] == 0
    print("end of script", flush=True)
    """
)


def run_at_exit(path: str, action: str = "count") -> subprocess.CompletedProcess:
    script = SCRIPT.format(tests=TESTS, producer=PRODUCER, path=path, action=action)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", ["host", needs_hooks("advanced")])
@pytest.mark.parametrize("action", ["count", "flush"])
def test_a_release_during_finalization_calls_the_deleter_once(path, action):
    """The consumer's array is a module global: it dies after ``atexit``, while the
    modules are torn down (``Py_IsInitialized()`` is 0 then, so PyO3 no longer attaches).
    The producer's deleter still runs there, once, on the main thread (the finalizing
    one, which holds the GIL); a deleter that calls ``handoff.flush()`` there returns."""
    r = run_at_exit(path, action)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "end of script" in r.stdout, out
    assert r.stdout.count("deleter ran on") == 1, out
    assert "deleter ran on main" in r.stdout, out
    if action == "flush":
        assert "flush inside the deleter returned" in r.stdout, out
    assert "not called" not in r.stderr, out
    assert "handoff:" not in r.stderr, out


@hooks
def test_a_release_pending_on_a_stream_that_never_completes_is_leaked_at_exit():
    """The consumer's queued work never completes (the simulated clock is never moved):
    at exit the release waits ``EXIT_DRAIN_TIMEOUT`` (5 s), then leaks the producer's
    tensor on purpose (a kernel may still read it), says so in one line, and its
    deleter is never called. The process exits normally."""
    r = run_at_exit("pending")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "end of script" in r.stdout, out
    assert "deleter ran" not in r.stdout, out
    assert r.stderr.count("leaked on purpose") == 1, out
