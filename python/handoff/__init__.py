"""handoff: stream-ordered, zero-copy DLPack hand-offs between PyTorch, JAX and any
DLPack framework.

::

    import handoff
    y = torch.from_dlpack(handoff.ordered(jax_out))   # any consumer that speaks __dlpack__
    x = jax.dlpack.from_dlpack(handoff.ordered(t))
    x = handoff.to_jax(t)                               # the same, by the fastest route
    y = handoff.to_torch(jax_out)
    handoff.stats()                                     # host syncs, waits, deferred releases
    layer = handoff.torch_function(jax_fn)              # a JAX function PyTorch trains through
    fn = handoff.jax_function(torch_fn)                 # a PyTorch function inside jax.jit/grad/vmap
    fn, params = handoff.jax_module(module)             # a torch.nn.Module for JAX, weights as arrays

``handoff.to_jax(x)`` and ``handoff.to_torch(x)`` cross between PyTorch and JAX by the
fastest route the installed frameworks offer, with the same guarantees: a torch tensor
goes through PyTorch's DLPack C exchange API and jaxlib's own buffer functions (no
Python ``__dlpack__`` or ``from_dlpack`` runs), anything else through
``handoff.ordered`` and the framework's ``from_dlpack``. ``handoff.routes()`` says which
route each direction takes and why; ``HANDOFF_ROUTE=public`` forces the public one.

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
import sys as _sys

from ._handoff import (
    DLPACK_VERSION,
    CaptureWarning,
    HandoffError,
    InvalidTensorError,
    Ordered,
    _shutdown,
    cuda_available,
    flush,
    ordered,
    prune_graph,
    routes,
    stats,
    to_jax,
    to_torch,
)
from ._capture import capture_clients
from ._jax_function import JaxFunction, jax_function, jax_module
from ._torch_function import TorchFunction, torch_function

if "torch" in _sys.modules:
    # PyTorch is in use: handoff's operators (handoff::call, handoff::call_bwd) are
    # registered now, so that a program saved by torch.export loads.
    from . import _torch_ops  # noqa: F401

__all__ = [
    "CaptureWarning",
    "DLPACK_VERSION",
    "HandoffError",
    "InvalidTensorError",
    "JaxFunction",
    "Ordered",
    "TorchFunction",
    "capture_clients",
    "cuda_available",
    "flush",
    "jax_function",
    "jax_module",
    "ordered",
    "prune_graph",
    "routes",
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
