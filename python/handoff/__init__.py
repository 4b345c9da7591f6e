"""handoff: stream-ordered, zero-copy DLPack hand-offs between PyTorch, JAX and any
DLPack framework.

::

    import handoff
    y = torch.from_dlpack(handoff.ordered(jax_out))   # any consumer that speaks __dlpack__
    x = jax.dlpack.from_dlpack(handoff.ordered(t))
    handoff.stats()                                     # host syncs, waits, deferred releases
    layer = handoff.torch_function(jax_fn)              # a JAX function PyTorch trains through

``handoff.ordered(obj)`` wraps anything with ``__dlpack__`` (or only
``__cuda_array_interface__``). A consumer's ``from_dlpack`` gets the producer's tensor
without a copy, made ready on the consumer's stream by the producer (the DLPack stream
protocol: a GPU wait, never a host sync), and the producer's memory is given back only
after the work the consumer queued on its stream before letting go has run: an event
recorded on the consumer's stream and a background reaper, never a host wait. Plain
``from_dlpack`` gives the memory back when the consumer's Python object dies, while its
kernels may still be queued: the next allocation of the producer can overwrite it.

The protocol is the Rust runtime's (``handoff-runtime``): the same validation of every
DLPack field (``InvalidTensorError``; the producer's deleter is called exactly once on
every path), the same stream-ordered release, the same counters (``stats()``).

Stream values a consumer may pass to ``__dlpack__(stream=...)``: ``None`` or ``1`` the
legacy default stream, ``2`` the per-thread default stream of the calling thread, ``-1``
no synchronization (the release then waits for the legacy default stream, which covers
every blocking stream), or a ``CUstream`` handle; ``0`` and other negative values raise
``ValueError``. Host tensors are released at once when the consumer lets go.

The producer's deleter (which gives its memory back) runs on the main thread, between
two bytecodes, with the GIL, as if a Python consumer had let go there: JAX's deleter
must not run beside JAX's own ``__dlpack__``, which releases the GIL. A program whose
main thread blocks for long while other threads hand off (a ``join``) gets that memory
back when the main thread runs Python again, or at ``handoff.flush()``.
"""

from __future__ import annotations

import atexit as _atexit
from typing import Any as _Any

from ._handoff import (
    DLPACK_VERSION,
    HandoffError,
    InvalidTensorError,
    Ordered,
    _shutdown,
    cuda_available,
    flush,
    ordered,
    stats,
)
from ._torch_function import TorchFunction, torch_function

__all__ = [
    "DLPACK_VERSION",
    "HandoffError",
    "InvalidTensorError",
    "Ordered",
    "TorchFunction",
    "cuda_available",
    "flush",
    "ordered",
    "stats",
    "to_jax",
    "to_torch",
    "torch_function",
]

__version__ = "0.1.0"

# Runs while the interpreter is still whole: every queued release is done (the GIL is
# released while waiting) and the producers' deleters they made due are run on this,
# the main, thread; hand-offs released later, during finalization, behind a device
# stream are released on the finalizing thread after a wait for the consumer's stream.
_atexit.register(_shutdown)


def to_torch(x: _Any, *, writable: bool = False) -> _Any:
    """``torch.from_dlpack(handoff.ordered(x))``: a PyTorch tensor viewing ``x``'s memory
    (no copy), ready on PyTorch's current stream, whose release waits for the work
    PyTorch queued on that stream. PyTorch is imported on first use."""
    import torch

    return torch.from_dlpack(ordered(x, writable=writable))


def to_jax(x: _Any) -> _Any:
    """``jax.dlpack.from_dlpack(handoff.ordered(x))``: a JAX array viewing ``x``'s memory
    (no copy where JAX can view it), ready on the stream JAX reads external data on,
    whose release waits for the work queued there. JAX is imported on first use."""
    import jax.dlpack

    return jax.dlpack.from_dlpack(ordered(x))
