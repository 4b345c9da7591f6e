"""JAX's configuration (x64 mode, default matmul precision, ...) as its jit cache keys
on it, and running code under a configuration read elsewhere.

JAX's configuration contexts are thread-local; PyTorch runs the backward of CUDA tensors
on its own autograd thread, so a configuration read at the forward is set again around
the work done for it later.
"""

from __future__ import annotations

import contextlib
from typing import Any, List

_CONFIG = None


def current() -> Any:
    """JAX's configuration in force on this thread, as JAX keys its jit cache on it."""
    return _config()[0]()


def configured(context: Any):
    """A context manager that runs its body under the configuration ``context`` (from
    :func:`current`): each option in it that differs on this thread is set for the body
    and restored after. Nothing is done where they agree."""
    trace_context, states = _config()
    if trace_context() == context:
        return contextlib.nullcontext()
    return _Configured([(s, v) for s, v in zip(states, context) if s is not None and s.value != v])


class _Configured:
    """Sets JAX configuration states on this thread, as their own context managers do
    (``swap_local`` and the thread-local hook), for the body of a ``with``."""

    def __init__(self, settings):
        self.settings = settings
        self.previous: List[Any] = []

    def __enter__(self):
        for state, value in self.settings:
            self.previous.append(state.swap_local(value))
            hook = state._update_thread_local_hook
            if hook is not None:
                hook(value)

    def __exit__(self, *exc):
        from jax._src import config as jc

        for (state, _), prev in zip(reversed(self.settings), reversed(self.previous)):
            state.set_local(prev)
            hook = state._update_thread_local_hook
            if hook is not None:
                hook(None if prev is jc.config_ext.unset else prev)
        self.previous.clear()
        return False


def _config():
    """``(trace_context, states)``: JAX's function that reads the configuration its jit
    cache is keyed on, and for each of its entries the configuration state that can set
    it on a thread (``None`` for the entries that are not plain options, such as the
    mesh context)."""
    global _CONFIG
    if _CONFIG is None:
        from jax._src import config as jc

        try:
            names = jc.trace_context_names()
        except NotImplementedError:  # jaxlib before extension 455: nothing can be set
            names = []
        _CONFIG = (jc.trace_context, [jc.config_states.get(n) for n in names])
    return _CONFIG


def x64() -> bool:
    """Whether JAX's x64 mode is on on this thread."""
    import jax
    import numpy as np

    return jax.dtypes.canonicalize_dtype(np.float64) == np.float64
