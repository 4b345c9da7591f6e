"""Type hints for handoff's native module (built from Rust with pyo3)."""

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

DLPACK_VERSION: Tuple[int, int]
"""The DLPack version of the versioned capsules handoff makes."""

class HandoffError(RuntimeError):
    """A hand-off could not be made: CUDA unavailable, a driver error, streams that
    cannot be ordered."""

class InvalidTensorError(BufferError):
    """The producer's DLPack tensor failed validation (the message names the field and
    the value). The producer's deleter has been called exactly once."""

class CaptureWarning(RuntimeWarning):
    """JAX work was captured into a CUDA graph: JAX arrays made after the capture and
    still alive at one of its replays can be overwritten by it (XLA reuses a captured
    execution's scratch memory). Given once per process."""

class Ordered:
    """What ``ordered(obj)`` returns: speaks ``__dlpack__``/``__dlpack_device__`` for
    ``obj``, releasing ``obj``'s tensor in stream order."""

    @property
    def obj(self) -> Any:
        """The wrapped object."""
    @property
    def writable(self) -> bool:
        """Whether the consumer's import is writable (``ordered(obj, writable=True)``)."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """The producer's DLPack device, ``(device_type, device_id)``."""
    def __dlpack__(
        self,
        stream: Optional[int] = None,
        *,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """The producer's tensor in a DLPack capsule whose deleter releases it only
        after the work queued on ``stream`` before the release has run. ``stream``:
        ``None``/``1`` legacy default stream, ``2`` per-thread default stream, ``-1``
        no synchronization, else a ``CUstream`` handle; ``0`` and other negative values
        raise ``ValueError``."""
    # A test seam: only in a wheel built with the cargo feature ``test-hooks``.
    def _mock_advance(self, micros: int) -> None: ...

def ordered(obj: Any, *, writable: bool = False) -> Ordered:
    """Wraps ``obj`` (anything with ``__dlpack__`` and ``__dlpack_device__``, or with
    only ``__cuda_array_interface__``) so that a consumer's ``from_dlpack`` releases its
    memory only after the consumer's queued work is done. ``writable=True`` refuses
    read-only tensors (and tensors whose strides overlap)."""

def stats() -> Dict[str, int]:
    """The runtime's counters: ``exports``, ``imports``, ``host_syncs``,
    ``events_created``, ``events_recorded``, ``waits_enqueued``, ``waits_elided``,
    ``copies``, ``bytes_copied``, ``releases_immediate``, ``releases_deferred``,
    ``releases_leaked``, ``pending``, ``released``."""

def flush() -> None:
    """Blocks (without the GIL) until every release queued so far has happened."""

def cuda_available() -> bool:
    """Whether the CUDA driver can be used."""

def prune_graph(graph: Any) -> int: ...

def to_jax(x: Any) -> Any:
    """``jax.dlpack.from_dlpack(handoff.ordered(x))`` by the fastest route: a JAX array
    viewing ``x``'s memory, ready on JAX's stream through a GPU wait, released in
    stream order. A torch tensor crosses natively (``routes()``)."""

def to_torch(x: Any, *, writable: bool = False) -> Any:
    """``torch.from_dlpack(handoff.ordered(x, writable=writable))`` by the fastest
    route: a torch tensor viewing ``x``'s memory, ready on PyTorch's current stream
    through a GPU wait, released in stream order. A JAX array crosses natively."""

def routes() -> Dict[str, Any]:
    """The route each crossing takes (``"torch_to_jax"``, ``"jax_to_torch"``:
    ``"native"`` or ``"public"``) and why (``"reasons"``). Imports PyTorch and JAX."""

# The package's own internals (every build): the atexit hook, torch_function's crossings,
# jax_function's counted copies and host syncs.
def _shutdown() -> None: ...
def _to_jax_many(tensors: Iterable[Any]) -> List[Any]: ...
def _to_torch_many(arrays: Iterable[Any], keep: Any = None) -> List[Any]: ...
def _count_copy(bytes: int) -> None: ...
def _host_sync(f: Callable[[], Any]) -> Any: ...

# Test seams: only in a wheel built with the cargo feature ``test-hooks`` (not the one
# users install; ``HANDOFF_ROUTE=public`` forces the public route there).
def _set_route(route: str) -> None: ...
def _mock_ordered(obj: Any, busy_us: int, *, writable: bool = False) -> Ordered: ...
