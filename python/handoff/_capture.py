"""CUDA graph captures with JAX work inside: each capture's own PJRT client.

A replay of a captured graph writes again the memory XLA gave its JAX work during the
capture: the outputs, and the scratch XLA handed back to its allocator as soon as the
work was enqueued. On JAX's own client the arrays JAX makes after the capture can land
in that memory, and a replay then overwrites them. So a tensor that crosses to JAX
inside a capture (``handoff.to_jax``, ``handoff.torch_function``) lands on a device of a
client of handoff's own, leased to that capture for the graph's life: the JAX work on
it runs on that client, and nothing outside the graph allocates from it. The lease is
kept with the graph (a CUDA user object) and ends when the graph and its executable
graphs are destroyed; the client then serves a later capture.

A client is a second client of the CUDA plugin JAX loaded (``xla_bridge``'s
``make_pjrt_c_api_client``), with its own streams and a BFC allocator that grows on
demand (no preallocation). Making one takes about 0.2 s and 12.6 MB of device memory
(H100, H200); each JAX function compiles once more for it. Clients live as long as the
process (handoff keeps their streams), reused, at most :func:`capture_clients`' limit
per device at once.

Off unless switched on (``handoff.capture_clients(enabled=True)``): on an H100, 4 of 17
runs of ``torch.cuda.make_graphed_callables`` on a module with a JAX layer ended in a
segmentation fault inside the capture, right after the JAX work on a new client
(BENCHMARKS.md, 2026-12-07 15:12), and 1 of 10 more (22:15), in PJRT while a JAX result
was handed to PyTorch, as if it had no device memory behind it. Its cause is not found yet.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["capture_clients"]

#: Whether crossings inside a capture go to capture clients (``False``, the default:
#: JAX's own device; see the module's docs).
ENABLED = False

_lock = threading.RLock()  # a lease may be dropped on the thread holding it
_limit = 8
_memory_fraction: Optional[float] = None
#: Idle clients per device ordinal, and every client made per ordinal (kept for the
#: process's life: handoff holds the streams of their devices).
_free: Dict[int, List[Any]] = {}
_made: Dict[int, List[Any]] = {}
#: The client each live capture holds, by (device ordinal, capture id).
_leased: Dict[Tuple[int, int], Any] = {}


def capture_clients(enabled: Optional[bool] = None, limit: Optional[int] = None,
                    memory_fraction: Optional[float] = None) -> Dict[str, Any]:
    """PJRT clients of CUDA graph captures' own: with ``enabled=True``, a tensor handed to
    JAX inside a capture (``handoff.to_jax``, ``handoff.torch_function``) lands on a
    client the capture holds alone for the graph's life, one per live graph with JAX
    work per device, so no JAX array made later can sit in the memory a replay writes.
    Off by default (``handoff._capture``'s docs say why). ``limit``: at most this many
    per device at once (default 8); a capture past it raises ``HandoffError`` naming the
    limit. ``memory_fraction``: the share of device memory each client's allocator may
    grow to (default: the plugin's own); applies to clients made from now on.

    Returns ``{"enabled", "limit", "memory_fraction", "made", "leased", "memory"}``: the
    clients made and leased per device ordinal, and each made client's allocator
    statistics (``bytes_in_use``, ``pool_bytes``, ``peak_bytes_in_use``, as JAX reports
    them)::

        import handoff
        handoff.capture_clients(enabled=True, limit=4)
        print(handoff.capture_clients()["memory"])
    """
    global ENABLED, _limit, _memory_fraction
    if enabled is not None:
        if not isinstance(enabled, bool):
            raise ValueError(f"handoff.capture_clients: enabled must be a bool, got {enabled!r}")
        ENABLED = enabled
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"handoff.capture_clients: limit must be a positive int, got {limit!r}")
        _limit = limit
    if memory_fraction is not None:
        if not isinstance(memory_fraction, (int, float)) or not 0 < memory_fraction <= 1:
            raise ValueError(
                f"handoff.capture_clients: memory_fraction must be in (0, 1], got {memory_fraction!r}"
            )
        _memory_fraction = float(memory_fraction)
    with _lock:
        made = {o: len(cs) for o, cs in _made.items()}
        leased: Dict[int, int] = {}
        for o, _ in _leased:
            leased[o] = leased.get(o, 0) + 1
        clients = [(o, c) for o, cs in _made.items() for c in cs]
    memory = [{"ordinal": o, **_memory(c, o)} for o, c in clients]
    return {"enabled": ENABLED, "limit": _limit, "memory_fraction": _memory_fraction, "made": made,
            "leased": leased, "memory": memory}


def lease(ordinal: int, capture: int) -> Tuple[Any, Any]:
    """The JAX device of device ``ordinal`` on the client the capture ``capture`` (its
    CUDA id) holds, and, the first time for that capture, the token to keep with its
    graph (dropped when the graph is gone, it gives the client back); ``None`` for the
    token after that. ``(None, None)`` when capture clients are off (:data:`ENABLED`, the
    default).
    Called by handoff's crossings inside a capture."""
    if not ENABLED:
        return None, None
    key = (ordinal, capture)
    with _lock:
        client = _leased.get(key)
        if client is not None:
            return _device(client, ordinal), None
        free = _free.setdefault(ordinal, [])
        if free:
            client = free.pop()
        else:
            made = _made.setdefault(ordinal, [])
            if len(made) >= _limit:
                from ._handoff import HandoffError

                raise HandoffError(
                    f"handoff: {len(made)} CUDA graphs with JAX work on cuda:{ordinal} are alive, "
                    f"each holding a PJRT client of its own (limit {_limit}): destroy graphs no "
                    "longer replayed, or raise the limit with handoff.capture_clients(limit=...)"
                )
            client = _make_client(ordinal)
            made.append(client)
        _leased[key] = client
    return _device(client, ordinal), _Lease(key)


class _Lease:
    """Kept with a graph: when the graph is gone, its client goes back to the idle ones."""

    __slots__ = ("key",)

    def __init__(self, key: Tuple[int, int]) -> None:
        self.key = key

    def __del__(self) -> None:
        with _lock:
            client = _leased.pop(self.key, None)
            if client is not None:
                _free.setdefault(self.key[0], []).append(client)


def _make_client(ordinal: int) -> Any:
    """A new client of the CUDA plugin JAX loaded (see the module's docs)."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    xla_bridge.get_backend("cuda")  # the plugin is initialized with JAX's own client
    options = dict(xla_client.generate_pjrt_gpu_plugin_options())
    options.update(allocator="bfc", preallocate=False)
    if _memory_fraction is not None:
        options["memory_fraction"] = _memory_fraction
    return xla_bridge.make_pjrt_c_api_client("cuda", options)


def _device(client: Any, ordinal: int) -> Any:
    for d in client.local_devices():
        if d.local_hardware_id == ordinal:
            return d
    raise RuntimeError(f"handoff: the capture client has no device with local hardware id {ordinal}")


def _memory(client: Any, ordinal: int) -> Dict[str, Any]:
    try:
        stats = _device(client, ordinal).memory_stats() or {}
    except Exception:  # noqa: BLE001 - a report, never an error
        stats = {}
    return {k: stats[k] for k in ("bytes_in_use", "pool_bytes", "peak_bytes_in_use") if k in stats}
