"""``handoff.jax_function`` and ``handoff.jax_module``: PyTorch code inside ``jax.jit``,
``jax.grad`` and ``jax.vmap``.

The other direction of ``handoff.torch_function``. A :class:`JaxFunction` flattens its
arguments (JAX's pytrees), finds the :class:`~handoff._jax_callback.Signature` of the
call (the structure, shapes and dtypes of the arguments and JAX's configuration) and
calls its ``jax.custom_vjp`` function, whose forward and backward are
``jax.experimental.buffer_callback`` calls running PyTorch (``handoff._jax_callback``).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _imports, _jax_config

__all__ = ["JaxFunction", "jax_function", "jax_module"]

_VMAP_METHODS = ("torch", "sequential", None)
_HOST_SYNCS = ("error", "warn", "allow")


def jax_function(
    fn: Optional[Callable[..., Any]] = None,
    out_shapes: Any = None,
    *,
    out: bool = False,
    random: Optional[bool] = None,
    vmap_method: Optional[str] = "torch",
    host_syncs: str = "error",
    cache_size: int = 64,
) -> Any:
    """Turns the PyTorch function ``fn`` into a function of JAX arrays that ``jax.jit``
    compiles into the program, ``jax.grad`` differentiates (through PyTorch's autograd)
    and ``jax.vmap`` batches (through ``torch.func.vmap``)::

        import handoff, jax, jax.numpy as jnp, torch

        def gelu_proj(x, w):                          # PyTorch
            return torch.nn.functional.gelu(x @ w)

        layer = handoff.jax_function(gelu_proj)       # out_shapes from PyTorch's fake tensors
        loss = lambda x, w: jnp.mean(layer(x, w) ** 2)
        g = jax.jit(jax.grad(loss, argnums=1))(jnp.ones((8, 4)), jnp.ones((4, 3)))

    Also a decorator: ``@handoff.jax_function`` or ``@handoff.jax_function(out_shapes=...)``.
    For a ``torch.nn.Module``, :func:`jax_module` gives ``(fn, params)``.

    **Arguments and results.** Positional arguments are pytrees of JAX arrays (Python
    and NumPy numbers become arrays; torch tensors are refused: ``handoff.to_jax`` them
    first). ``fn`` receives torch tensors in the same structure, viewing XLA's buffers
    (no copy) on the arrays' device, and returns a pytree of tensors on that device.
    ``out_shapes``, as ``jax.pure_callback``'s ``result_shape_dtypes``: a pytree of
    ``jax.ShapeDtypeStruct`` (anything with ``shape`` and ``dtype``), or a function of
    the arguments' ``ShapeDtypeStruct`` returning one; ``None`` (the default) runs
    ``fn`` once per new signature under PyTorch's ``FakeTensorMode`` (no kernel runs) to
    find them. Where ``out_shapes`` is given that fake run checks it too, when it can
    run. A result of another structure, shape, dtype or device raises ``TypeError`` or
    ``ValueError`` naming the output, expected and got, at trace time where the fake
    run sees it. ``buffer_callback`` gives the callback XLA's output buffers to fill, so
    each result is copied into its buffer (one stream-ordered copy per output, counted
    in ``handoff.stats()["copies"]``). ``out=True`` says ``fn`` accepts ``out=`` (the
    output pytree of tensors, viewing XLA's buffers; a tensor where ``out_shapes`` is
    one): the forward then writes there, no copy; ``fn`` returns ``None`` or those
    tensors. It must also run without ``out=``: the backward and ``jax.vmap`` call it
    so. Without x64 mode a float64 output is refused (``TypeError``) and an int64 one
    is cast to int32 by the copy, as JAX reads 64-bit integers. Complex arrays are
    refused. ``fn`` must not modify its inputs in place: that is refused (``ValueError``
    naming the argument; at trace time where the fake run sees it, else after the call,
    whose buffer JAX may then have read changed), and must not keep the tensors it gets
    past the call.

    **Streams.** On CUDA, PyTorch runs on XLA's stream
    (``torch.cuda.ExternalStream(ctx.stream)`` as the current stream): ordered after
    the program's earlier work and before its later work, with no event and no host
    wait. PyTorch's temporaries are freed in that stream's order by its caching
    allocator. ``host_syncs="error"`` (the default) runs ``fn`` under
    ``torch.cuda.set_sync_debug_mode("error")``: an operation that would block the host
    (``.item()``, ``.cpu()``, ``torch.nonzero``, ...) raises, with a message saying so;
    ``"warn"`` lets PyTorch warn; ``"allow"`` does neither. (The mode is
    process-wide: while ``fn`` runs, other threads' PyTorch work is checked too.)

    **Gradients** (``jax.custom_vjp``). The backward runs ``fn`` again under
    ``torch.func.vjp``, with respect to the floating-point inputs JAX differentiates
    only, and takes the VJP of the floating-point outputs whose cotangent is not a
    symbolic zero. Integer and bool inputs get ``float0`` cotangents, and inputs JAX
    does not differentiate zeros, as JAX's convention is. Nothing but the inputs is
    kept between the passes: the forward again costs one more forward per backward,
    and no memory. ``random``: whether ``fn`` draws random numbers (dropout); ``None``
    (default) reads it from the fake run (an operator tagged
    ``nondeterministic_seeded``; assumed when the fake run fails). A random ``fn``
    passes its device's generator state to the backward as a small residual, and the
    backward re-runs with it (the same dropout mask), then puts the generator back, as
    ``torch.utils.checkpoint`` does. On CUDA the backward reads that state from the
    GPU: a host sync, refused under ``host_syncs="error"``. ``jax.jvp`` and
    ``jax.linearize`` raise JAX's ``TypeError`` ("can't apply forward-mode autodiff
    (jvp) to a custom_vjp function"), and a second derivative JAX's ``ValueError``
    ("Buffer callbacks do not support JVP"). Under ``jax.jit(jax.grad(...))`` XLA drops a
    forward whose outputs only the loss's value needs: a step that returns the
    gradients alone runs a non-random ``fn`` forward once (in the backward).

    **jax.vmap.** ``vmap_method="torch"`` (default): the callback receives the batched
    buffers (``buffer_callback``'s ``"expand_dims"``) and runs ``fn`` under
    ``torch.func.vmap`` (``randomness="different"``), nested vmaps too;
    ``"sequential"``: JAX's loop, one call per example; ``None``: ``jax.vmap`` raises
    JAX's ``NotImplementedError``.

    **Limits.** ``buffer_callback`` lowers for one platform at a time (no
    multi-platform lowering) and a program holding it cannot be serialized by
    ``jax.export`` (a Python callback). It is not captured into XLA's command buffers
    (``command_buffer_compatible=False``): XLA launches it between them. XLA treats it
    as pure: a call whose results are unused may be dropped. Exceptions inside the
    callback reach the caller as ``jax.errors.JaxRuntimeError`` ("INTERNAL: Error when
    calling buffer callback", with the traceback and handoff's message);
    ``.last_error`` keeps the last one. Each signature is traced once; at most
    ``cache_size`` are kept (least recently used dropped, with a warning once).

    Returns a :class:`JaxFunction`.
    """
    options = dict(out=out, random=random, vmap_method=vmap_method, host_syncs=host_syncs,
                   cache_size=cache_size)
    if fn is None:
        return lambda g: JaxFunction(g, out_shapes, **options)
    return JaxFunction(fn, out_shapes, **options)


class JaxFunction:
    """What :func:`jax_function` returns: call it with JAX arrays (see there), inside
    ``jax.jit`` or not.

    ``fn``: the PyTorch function. ``traces``: how many signatures were traced.
    ``last_error``: the exception the last failed callback raised (``None``), as
    JAX reports it only as text. Example::

        layer = handoff.jax_function(torch.tanh, lambda x: x)   # out_shapes: like x
        y = jax.jit(layer)(jnp.ones(3))
    """

    def __init__(self, fn: Callable[..., Any], out_shapes: Any = None, *, out: bool = False,
                 random: Optional[bool] = None, vmap_method: Optional[str] = "torch",
                 host_syncs: str = "error", cache_size: int = 64, _device: Any = None) -> None:
        _imports.need("jax", "handoff.jax_function")
        if not callable(fn):
            raise TypeError(f"handoff.jax_function: fn must be callable, got {type(fn).__name__} {fn!r:.60}")
        if vmap_method not in _VMAP_METHODS:
            raise ValueError(
                'handoff.jax_function: vmap_method must be "torch", "sequential" or None, '
                f"got {vmap_method!r}")
        if host_syncs not in _HOST_SYNCS:
            raise ValueError(
                f'handoff.jax_function: host_syncs must be "error", "warn" or "allow", got {host_syncs!r}')
        if random not in (None, True, False):
            raise ValueError(f"handoff.jax_function: random must be None, True or False, got {random!r}")
        if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 1:
            raise ValueError(f"handoff.jax_function: cache_size must be a positive int, got {cache_size!r}")
        self.fn, self.out_shapes, self.out, self.random = fn, out_shapes, bool(out), random
        self.vmap_method, self.host_syncs, self.cache_size = vmap_method, host_syncs, cache_size
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn
        self._name = f"handoff.jax_function({self.__name__})"
        self._device = _device
        self._signatures: "OrderedDict[Any, Any]" = OrderedDict()
        self._lock = threading.Lock()
        self._warned = False
        self.traces = 0
        self.last_error: Optional[BaseException] = None

    def __repr__(self) -> str:
        return f"handoff.jax_function({self.fn!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import jax

        if kwargs:
            raise TypeError(
                f"{self._name}: keyword arguments are not supported ({sorted(kwargs)}): pass arrays "
                "positionally, and bind constants with functools.partial")
        leaves, tree = jax.tree_util.tree_flatten(args)
        leaves = [self._array(tree, k, x) for k, x in enumerate(leaves)]
        key = (tree, tuple((tuple(x.shape), x.dtype) for x in leaves), _jax_config.current())
        sig = self._signatures.get(key)
        if sig is None:
            sig = self._trace(key, tree, leaves)
        else:
            try:
                self._signatures.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile
                pass
        return jax.tree_util.tree_unflatten(sig.out_tree, sig.call(*leaves))

    def _array(self, tree: Any, k: int, x: Any) -> Any:
        import jax

        if isinstance(x, jax.Array):
            return x
        if type(x).__module__.startswith("torch"):
            where = _argument(_paths(tree)[k])
            raise TypeError(
                f"{self._name}: {where} is a {type(x).__name__}: pass JAX arrays (handoff.to_jax(t))")
        try:
            return jax.numpy.asarray(x)
        except TypeError as e:
            where = _argument(_paths(tree)[k])
            raise TypeError(
                f"{self._name}: {where} is a {type(x).__name__} ({x!r:.60}), not an array: {e}") from None

    def _trace(self, key: Any, tree: Any, leaves: Any) -> Any:
        from ._jax_callback import Signature

        with self._lock:
            sig = self._signatures.get(key)
            if sig is not None:
                return sig
            sig = Signature(self, tree, [_aval(x) for x in leaves], self._device or _fake_device(leaves))
            self.traces += 1
            self._signatures[key] = sig
            if len(self._signatures) <= self.cache_size:
                return sig
            self._signatures.popitem(last=False)
            warn, self._warned = not self._warned, True
        if warn:
            warnings.warn(f"{self._name} keeps retracing: more than cache_size={self.cache_size} signatures "
                          "(shapes, dtypes, JAX configuration); the least recently used are dropped",
                          UserWarning, stacklevel=3)
        return sig


def jax_module(module: Any, out_shapes: Any = None, **options: Any) -> Tuple[JaxFunction, Dict[str, Any]]:
    """A ``torch.nn.Module`` as ``(fn, params)`` for JAX: ``params`` is a dict from
    each parameter's name (``module.named_parameters()``) to a JAX array viewing it
    (``handoff.to_jax(p.detach())``, no copy), and ``fn(params, *args)`` calls
    ``torch.func.functional_call(module, params, args)`` through :func:`jax_function`
    (``out_shapes`` and ``options`` as there), so ``jax.grad`` reaches the weights::

        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
        fn, params = handoff.jax_module(model)
        loss = lambda p, x: jnp.mean(fn(p, x) ** 2)
        grads = jax.jit(jax.grad(loss))(params, jnp.ones((16, 4)))   # a dict like params

    ``params`` are views of the module's tensors: an update JAX makes (an optax step)
    gives new arrays and leaves the module as it was; a change PyTorch makes in place
    to a parameter is seen by the arrays. **Buffers** (BatchNorm's running statistics)
    are constants: the module's buffer tensors at this call, read by every call. A
    forward that changes a buffer in place (BatchNorm in training mode updates its
    statistics) is refused with a ``ValueError`` naming the buffer, at trace time
    where the fake run sees it: call ``module.eval()`` first, or use
    ``track_running_stats=False``. Dropout follows the module's mode (``jax_function``'s
    ``random``). float64 parameters need JAX's x64 mode.
    """
    th = torch()
    if not isinstance(module, th.nn.Module):
        raise TypeError(f"handoff.jax_module: module must be a torch.nn.Module, got {type(module).__name__}")
    from ._handoff import to_jax

    params = {}
    for name, p in module.named_parameters():
        if p.dtype == th.float64 and not _jax_config.x64():
            raise TypeError(
                f"handoff.jax_module: parameter {name!r} is torch.float64 but JAX's x64 mode is off "
                "(JAX would compute in float32): jax.config.update('jax_enable_x64', True)")
        params[name] = to_jax(p.detach())
    call = _ModuleCall(module)
    tensors = list(module.parameters()) + list(call.buffers.values())
    device = tensors[0].device if tensors else None
    return JaxFunction(call, out_shapes, _device=device, **options), params


class _ModuleCall:
    """``fn(params, *args)`` of :func:`jax_module`: the module's forward with ``params``
    for its parameters and its buffers as constants; a buffer changed in place is
    refused."""

    def __init__(self, module: Any) -> None:
        th = torch()
        self.module = module
        self.buffers = dict(module.named_buffers())
        self.__name__ = type(module).__name__
        self.ready = None
        if any(b.is_cuda for b in self.buffers.values()):
            self.ready = th.cuda.Event()  # the buffers' last writes, for XLA's stream to wait on
            self.ready.record()

    def __call__(self, params: Dict[str, Any], *args: Any) -> Any:
        th = torch()
        from torch._subclasses.fake_tensor import FakeTensor

        fake = next((t for t in params.values() if isinstance(t, FakeTensor)), None)
        if fake is not None:
            buffers = {k: fake.fake_mode.from_tensor(b) for k, b in self.buffers.items()}
        else:
            buffers = self.buffers
            if self.ready is not None:
                th.cuda.current_stream().wait_event(self.ready)
        versions = {k: b._version for k, b in buffers.items()}
        result = th.func.functional_call(self.module, (params, buffers), args)
        for k, b in buffers.items():
            if b._version != versions[k]:
                raise ours(ValueError(
                    f"handoff.jax_module({self.__name__}): the forward modified buffer {k!r} in place "
                    "(BatchNorm in training mode updates its running statistics): buffers are "
                    "constants here; call module.eval(), or use track_running_stats=False"))
        return result


def _aval(x: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)


def _fake_device(leaves: Any) -> Any:
    """The torch device the arrays are on (concrete ones), else JAX's default device's."""
    import jax

    device = None
    for x in leaves:
        try:
            device = next(iter(x.devices()))
            break
        except Exception:  # noqa: BLE001 - a tracer has no devices
            continue
    if device is None:
        device = jax.config.jax_default_device or jax.devices()[0]
        if isinstance(device, str):
            device = jax.devices(device)[0]
    if device.platform in ("gpu", "cuda", "rocm"):
        return torch().device("cuda", device.local_hardware_id)
    return torch().device("cpu")


_TORCH = None


def torch() -> Any:
    """The ``torch`` module, imported at first use (``import handoff`` imports neither
    framework)."""
    global _TORCH
    if _TORCH is None:
        _TORCH = _imports.need("torch", "handoff.jax_function")
    return _TORCH


def ours(e: BaseException) -> BaseException:
    """Marks ``e`` as one of handoff's own errors (re-raised as it is, never wrapped)."""
    e._handoff = True  # type: ignore[attr-defined]
    return e


# ---- dtypes and names ----------------------------------------------------------------


def _torch_dtype(sig: Any, where: str, dtype: Any) -> Any:
    """PyTorch's dtype for a JAX/NumPy (or PyTorch) dtype; complex ones are refused."""
    import numpy as np

    t = torch()
    if isinstance(dtype, t.dtype):
        found = dtype
    else:
        try:
            found = getattr(t, np.dtype(dtype).name, None)
        except TypeError:
            found = None
    if not isinstance(found, t.dtype):
        raise ours(TypeError(f"{sig.name}: {where} has dtype {dtype!r}, which PyTorch has no dtype for"))
    if found.is_complex:
        raise ours(TypeError(
            f"{sig.name}: {where} is {found}: complex arrays are not supported (PyTorch and JAX use "
            "different conventions for complex gradients)"))
    return found


def _jax_dtype(dtype: Any) -> Any:
    import jax.numpy as jnp

    return jnp.dtype(str(dtype).removeprefix("torch."))


class _Spec:
    """A result's shape and PyTorch dtype (a pytree leaf, as ``jax.ShapeDtypeStruct``)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = shape, dtype


def _struct(sig: Any, r: Any) -> _Spec:
    if not isinstance(r, torch().Tensor):
        raise ours(TypeError(
            f"{sig.name}: the function returned a {type(r).__name__} ({r!r:.60}), not a torch.Tensor"))
    return _Spec(tuple(r.shape), r.dtype)


def _paths(tree: Any) -> List[Tuple[Any, ...]]:
    import jax

    return [p for p, _ in jax.tree_util.tree_flatten_with_path(tree.unflatten([0] * tree.num_leaves))[0]]


def _argument(path: Tuple[Any, ...]) -> str:
    import jax

    return f"argument {path[0].idx}{jax.tree_util.keystr(path[1:])}"


def _output(path: Tuple[Any, ...]) -> str:
    import jax

    return f"output {jax.tree_util.keystr(path)}" if path else "the output"
