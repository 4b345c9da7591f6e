"""``handoff.torch_function``: a JAX function PyTorch can train through.

The forward runs ``jax.jit`` of the function on the PyTorch tensors (handed to JAX as
``handoff.to_jax`` does, all of one call at once: no copy, ready on JAX's stream
through a GPU wait, given back in stream order), and returns PyTorch tensors viewing
JAX's outputs (handed back the same way). When gradients are needed it runs a jitted ``jax.vjp`` instead, whose residuals
stay JAX arrays on the autograd graph; the backward runs the jitted VJP on the
cotangents. Both are compiled once per input signature.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import OrderedDict
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
    overload,
)

from ._handoff import _to_jax_many, _to_torch_many

__all__ = ["TorchFunction", "torch_function"]


@overload
def torch_function(
    f: Callable[..., Any],
    *,
    static_argnums: Union[int, Iterable[int]] = (),
    cache_size: int = 64,
) -> "TorchFunction": ...


@overload
def torch_function(
    f: None = None,
    *,
    static_argnums: Union[int, Iterable[int]] = (),
    cache_size: int = 64,
) -> Callable[[Callable[..., Any]], "TorchFunction"]: ...


def torch_function(
    f: Optional[Callable[..., Any]] = None,
    *,
    static_argnums: Union[int, Iterable[int]] = (),
    cache_size: int = 64,
) -> Any:
    """Turns the JAX function ``f`` into a function of PyTorch tensors that autograd
    differentiates (a ``torch.autograd.Function`` underneath), to call like a module's
    forward::

        import functools, handoff, jax, jax.numpy as jnp, torch

        def ln_gelu_matmul(h, gamma, w):            # JAX
            mu = h.mean(-1, keepdims=True)
            var = ((h - mu) ** 2).mean(-1, keepdims=True)
            return jax.nn.gelu((h - mu) * jax.lax.rsqrt(var + 1e-5) * gamma) @ w

        layer = handoff.torch_function(ln_gelu_matmul)
        y = layer(h, gamma, w)                      # torch tensors in, torch tensor out
        y.square().mean().backward()                # gamma.grad, w.grad (and h's)

    Also a decorator (``@handoff.torch_function``, or
    ``@functools.partial(handoff.torch_function, static_argnums=(1,))``).

    **Arguments.** Every positional argument not in ``static_argnums`` is a
    ``torch.Tensor`` or a pytree of them (tuples, lists, dicts: JAX's
    ``jax.tree_util``), all on one device. ``f`` receives JAX arrays in the same
    structure, on the matching JAX device: CPU tensors give JAX CPU arrays, ``cuda:N``
    tensors JAX GPU arrays of device N, and ``f`` runs there. Arguments in
    ``static_argnums`` and every keyword argument are static: passed to ``f`` as they
    are (hashable: Python numbers, strings, tuples, ``None``), part of the compilation
    key; ``functools.partial`` binds constants too. Complex tensors are refused
    (``TypeError``: PyTorch and JAX differ in complex gradient conventions), as are
    non-tensor leaves of dynamic arguments (``TypeError`` naming the argument).
    ``float64`` tensors need JAX's x64 mode (``jax.config.update("jax_enable_x64",
    True)`` or ``with jax.enable_x64(True):``), else ``TypeError``: JAX would silently
    compute in float32. Without x64 mode JAX reads ``int64`` tensors as ``int32`` (a
    copy), as it does any 64-bit integer input.

    **Gradients.** Floating-point inputs that require grad get gradients from
    ``jax.vjp``; the VJP is taken with respect to those inputs only, so nothing is
    computed for the others. Inputs that do not require grad get ``None``, and so do
    integer and bool inputs (indices, masks): they are non-differentiable, as in
    PyTorch, where they cannot require grad. An input that no output used in the loss
    reaches gets ``None`` too, as in PyTorch (so an optimizer with momentum or weight
    decay leaves it alone); which inputs an output reaches is read from the function's
    structure (its jaxpr), never from values. Integer and bool outputs are marked
    non-differentiable. Any pytree of arrays may be returned; the result has the same
    structure, with PyTorch tensors for leaves. Double backward is not supported (a
    backward with ``create_graph=True`` through it raises ``RuntimeError``). An input
    modified in place between forward and backward raises PyTorch's usual error, as
    for its own saved tensors.

    **Compilation.** The signature is the structure, shapes, dtypes and device of the
    tensors, which of them need a gradient, the static arguments, and JAX's
    configuration at the call (what JAX keys its own jit cache on: x64 mode, default
    matmul precision, default device, ...). The backward runs under the forward's
    configuration, on whichever thread PyTorch runs it (its own autograd thread for CUDA
    tensors; JAX's configuration contexts are thread-local). ``f`` is traced
    once per new signature (twice if it is called both with and without gradients:
    the forward alone keeps no residuals); the backward is compiled once per signature
    too, from the VJP, without tracing ``f`` again. The object's ``traces`` counts the
    traces of ``f``. Under ``torch.no_grad()``, or when no input
    requires grad, only the plain ``jax.jit(f)`` runs. At most ``cache_size`` (64)
    signatures are kept, the least recently used dropped first; the first time one is
    dropped a warning says the function keeps retracing (a shape that changes every
    call).

    **Memory and streams.** Every hand-off, both ways and both passes, crosses as
    ``handoff.to_jax`` / ``handoff.to_torch`` do (the fastest route, ``handoff.routes()``;
    the tensors of one call in one native call): tensors are made ready on the consumer's stream by a GPU wait
    (no host sync), and memory read by queued kernels is given back only after they
    ran. The VJP residuals are JAX arrays owned by the autograd graph: dropped with it,
    they go back to JAX's allocator, in JAX's stream order. Outputs are PyTorch tensors
    viewing JAX's output buffers (no copy); an output that is one of the inputs (``f``
    returning an argument unchanged) is cloned so that it does not alias the input.

    Returns a :class:`TorchFunction`.
    """
    if f is None:
        return lambda g: TorchFunction(g, static_argnums=static_argnums, cache_size=cache_size)
    return TorchFunction(f, static_argnums=static_argnums, cache_size=cache_size)


class TorchFunction:
    """What :func:`torch_function` returns: call it with PyTorch tensors (see there).

    ``traces``: how many times the wrapped function was traced (a new signature, the
    first call with or without gradients, or, once per signature, reading which inputs
    each output reaches when a backward gets an output without a cotangent).
    ``signatures``: how many signatures are compiled (at most ``cache_size``). ``fun``:
    the wrapped JAX function."""

    def __init__(
        self,
        f: Callable[..., Any],
        *,
        static_argnums: Union[int, Iterable[int]] = (),
        cache_size: int = 64,
    ) -> None:
        if not callable(f):
            raise TypeError(
                f"handoff.torch_function: f must be callable, got {type(f).__name__} {f!r}"
            )
        nums = tuple(static_argnums) if not isinstance(static_argnums, int) else (static_argnums,)
        for n in nums:
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(
                    f"handoff.torch_function: static_argnums must hold non-negative ints, got {n!r}"
                )
        if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 1:
            raise ValueError(f"handoff.torch_function: cache_size must be a positive int, got {cache_size!r}")
        self.fun = f
        self.static_argnums = frozenset(nums)
        self.cache_size = cache_size
        self._traces = 0
        self._traces_lock = threading.Lock()
        self._cache: "OrderedDict[Any, _Entry]" = OrderedDict()
        self._lock = threading.Lock()
        self._warned = False
        self.__name__ = getattr(f, "__name__", type(self).__name__)
        self.__doc__ = getattr(f, "__doc__", None)
        self.__wrapped__ = f

    @property
    def traces(self) -> int:
        return self._traces

    @property
    def signatures(self) -> int:
        return len(self._cache)

    def __repr__(self) -> str:
        return f"handoff.torch_function({self.fun!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        torch, jax = _frameworks()
        tree = jax.tree_util
        static: List[Tuple[int, Any]] = []
        dynamic: List[Any] = []
        positions: List[int] = []
        for i, a in enumerate(args):
            if i in self.static_argnums:
                static.append((i, a))
            else:
                dynamic.append(a)
                positions.append(i)
        for n in self.static_argnums:
            if n >= len(args):
                raise TypeError(
                    f"handoff.torch_function({self.__name__}): static_argnums has {n}, but "
                    f"only {len(args)} positional arguments were given"
                )
        leaves, treedef = tree.tree_flatten(dynamic)
        if not leaves:
            raise TypeError(
                f"handoff.torch_function({self.__name__}): no tensor argument (every argument "
                "is static): at least one torch.Tensor must be passed to choose the device"
            )
        grad_on = torch.is_grad_enabled()
        device = None
        sig = []
        diff = []
        name = f"handoff.torch_function({self.__name__})"

        def arg(k: int) -> str:
            return _where(dynamic, positions, k, tree)

        for k, t in enumerate(leaves):
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"{name}: {arg(k)} is a {type(t).__name__} ({t!r:.60}), not a "
                    "torch.Tensor: pass tensors, or make the argument static "
                    "(static_argnums, a keyword argument, or functools.partial)"
                )
            if device is None:
                device = t.device
                if device.type not in ("cpu", "cuda"):
                    raise ValueError(
                        f"{name}: {arg(k)} is on {device}; only CPU and CUDA tensors can be "
                        "handed to JAX"
                    )
            elif t.device != device:
                raise ValueError(
                    f"{name}: {arg(k)} is on {t.device} but {arg(0)} is on {device}: all "
                    "tensor arguments must be on one device"
                )
            if t.is_complex():
                raise TypeError(
                    f"{name}: {arg(k)} is {t.dtype}: complex tensors are not supported "
                    "(PyTorch and JAX use different conventions for complex gradients)"
                )
            if t.dtype == torch.float64 and not _x64(jax):
                raise TypeError(
                    f"{name}: {arg(k)} is torch.float64 but JAX's x64 mode is off (JAX would "
                    "compute in float32): jax.config.update('jax_enable_x64', True), or "
                    "call inside `with jax.enable_x64(True):`"
                )
            d = grad_on and t.requires_grad and t.is_floating_point()
            diff.append(d)
            sig.append((tuple(t.shape), t.dtype, d))
        try:
            key = (treedef, tuple(sig), device, tuple(static), tuple(sorted(kwargs.items())),
                   _trace_context())
            hash(key)
        except TypeError as e:
            self._refuse_arrays(static, kwargs)  # the clearer error, where it applies
            raise TypeError(
                f"handoff.torch_function({self.__name__}): static arguments must be hashable "
                f"(static positions {sorted(self.static_argnums)} and keyword arguments): {e}"
            ) from None
        entry = self._cache.get(key)
        if entry is None:
            entry = self._new_entry(key, treedef, len(args), static, kwargs, diff)
        else:
            try:
                self._cache.move_to_end(key)  # the most recently used (atomic under the GIL)
            except KeyError:  # dropped by another thread meanwhile
                pass
        if any(diff):
            outs = _function_class()(entry, *leaves)
        else:
            outs = entry.forward(leaves)
        return tree.tree_unflatten(entry.out_treedef, outs)

    def _new_entry(self, key, treedef, nargs, static, kwargs, diff) -> "_Entry":
        # A tensor in a static argument is hashed by identity: each call is a new key,
        # so checking new keys is enough.
        self._refuse_arrays(static, kwargs)
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                return entry
            entry = _Entry(self, treedef, nargs, static, kwargs, diff, key[-1])
            self._cache[key] = entry
            if len(self._cache) <= self.cache_size:
                return entry
            self._cache.popitem(last=False)
            warn = not self._warned
            self._warned = True
        if warn:
            warnings.warn(
                f"handoff.torch_function({self.__name__}) keeps retracing: more than "
                f"cache_size={self.cache_size} signatures (shapes, dtypes, static arguments, "
                "JAX configuration); the least recently used are dropped and compiled again "
                "when they come back",
                UserWarning,
                stacklevel=3,
            )
        return entry

    def _refuse_arrays(self, static, kwargs) -> None:
        """A static argument holding a tensor or an array is refused (it would be hashed
        by identity, retrace on every call and be baked into the program as a constant)."""
        torch, jax = _frameworks()
        import numpy as np

        named = [(f"argument {i}", v) for i, v in static]
        named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
        for where, value in named:
            for leaf in jax.tree_util.tree_leaves(value):
                if isinstance(leaf, (torch.Tensor, np.ndarray, jax.Array)):
                    raise TypeError(
                        f"handoff.torch_function({self.__name__}): {where} is a static "
                        f"argument holding a {type(leaf).__name__} (an array): static "
                        "arguments are compiled into the program as constants and compared "
                        "by identity; pass it as a positional argument that is not in "
                        "static_argnums"
                    )

    def _count_trace(self) -> None:
        with self._traces_lock:
            self._traces += 1


class _Entry:
    """The compiled functions of one signature."""

    def __init__(self, owner, treedef, nargs, static, kwargs, diff, context) -> None:
        torch, jax = _frameworks()
        self.owner = owner
        self.context = context  # JAX's configuration at the forward (its trace context)
        self.diff = tuple(diff)
        self.diff_idx = tuple(i for i, d in enumerate(diff) if d)
        self.nondiff_idx = tuple(i for i, d in enumerate(diff) if not d)
        self.out_treedef = None
        self.out_float: Tuple[bool, ...] = ()
        self.out_meta: Tuple[Tuple[Tuple[int, ...], Any], ...] = ()
        # Per pattern of missing cotangents: the jitted VJP and the unreached inputs.
        self._bwds: Dict[Tuple[bool, ...], Tuple[Any, Tuple[int, ...]]] = {}
        self._reach: Optional[List[frozenset]] = None
        self._in_avals: Optional[List[Any]] = None
        f = owner.fun
        tree = jax.tree_util
        static = dict(static)
        kwargs = dict(kwargs)

        def call(leaves):
            owner._count_trace()
            dyn = iter(tree.tree_unflatten(treedef, list(leaves)))
            args = [static[i] if i in static else next(dyn) for i in range(nargs)]
            return f(*args, **kwargs)

        def fwd_plain(*leaves):
            return call(leaves)

        diff_idx, nondiff_idx = self.diff_idx, self.nondiff_idx
        n = len(diff)

        def fwd_vjp(diff_leaves, nondiff_leaves):
            def g(*d):
                leaves = [None] * n
                for i, x in zip(diff_idx, d):
                    leaves[i] = x
                for i, x in zip(nondiff_idx, nondiff_leaves):
                    leaves[i] = x
                return call(leaves)

            return jax.vjp(g, *diff_leaves)

        self._call = call
        self._fwd_plain = jax.jit(fwd_plain)
        self._fwd_vjp = jax.jit(fwd_vjp)

    def _outputs(self, out, inputs, keep=None):
        """JAX outputs to PyTorch tensors; records the output structure once. Inside a
        CUDA graph capture, ``keep`` (the VJP's residuals) is kept with the graph, as the
        outputs are: a captured backward reads them at every replay."""
        torch, jax = _frameworks()
        leaves, treedef = jax.tree_util.tree_flatten(out)
        if self.out_treedef is None:
            self.out_treedef = treedef
            self.out_meta = tuple((tuple(y.shape), y.dtype) for y in leaves)
            self.out_float = tuple(_is_float(jax, y.dtype) for y in leaves)
        outs = _to_torch_many(leaves, keep)
        ptrs = None
        for i, t in enumerate(outs):
            if t.numel():
                if ptrs is None:
                    ptrs = {x.data_ptr() for x in inputs if x.numel()}
                if t.data_ptr() in ptrs:
                    outs[i] = t.clone()  # f returned an input: do not alias it
        return tuple(outs)

    def forward(self, tensors):
        xs = _to_jax_many(tensors)
        return self._outputs(self._fwd_plain(*xs), tensors)

    def forward_vjp(self, tensors):
        xs = _to_jax_many(tensors)
        if self._in_avals is None:
            _, jax = _frameworks()
            self._in_avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
        out, vjp = self._fwd_vjp(
            [xs[i] for i in self.diff_idx], [xs[i] for i in self.nondiff_idx]
        )
        return self._outputs(out, tensors, vjp), vjp

    def backward(self, vjp, cts):
        """The gradients of the differentiable inputs (JAX arrays; ``None`` for an input
        that no output with a cotangent reaches), run under the forward's configuration."""
        missing = tuple(ct is None for ct in cts)
        with _configuration(self.context):
            found = self._bwds.get(missing)
            if found is None:
                found = self._bwds.setdefault(missing, self._make_bwd(missing))
            bwd, unreached = found
            float_cts = _to_jax_many(
                [ct for fl, ct, m in zip(self.out_float, cts, missing) if fl and not m]
            )
            grads = list(bwd(vjp, float_cts))
            for k in unreached:
                grads[k] = None
            return grads

    def _make_bwd(self, missing):
        """The jitted VJP for cotangents where ``missing`` says which are absent (zeros of
        the output's shape and dtype stand in for them; ``float0`` for integer outputs),
        and the positions among the gradients of the inputs that no present cotangent
        reaches (they get ``None``)."""
        import numpy as np

        unreached: Tuple[int, ...] = ()
        if any(missing):
            used = frozenset().union(*(r for r, m in zip(self.reaches(), missing) if not m))
            unreached = tuple(k for k, i in enumerate(self.diff_idx) if i not in used)
        _, jax = _frameworks()
        treedef, meta, is_float = self.out_treedef, self.out_meta, self.out_float
        float0 = jax.dtypes.float0

        def bwd(vjp, float_cts):
            it = iter(float_cts)
            full = [
                (jax.numpy.zeros(shape, dtype) if m else next(it)) if fl else np.zeros(shape, float0)
                for (shape, dtype), fl, m in zip(meta, is_float, missing)
            ]
            return vjp(jax.tree_util.tree_unflatten(treedef, full))

        return jax.jit(bwd), unreached

    def reaches(self) -> List[frozenset]:
        """For each output, the inputs (indices of the tensor leaves) it depends on, read
        from the function's jaxpr once: every equation's outputs depend on all its
        inputs (an over-approximation inside control flow, never an under-one)."""
        if self._reach is None:
            _, jax = _frameworks()
            call = self._call
            closed = jax.make_jaxpr(lambda *leaves: call(leaves))(*self._in_avals)
            self._reach = _dependencies(closed.jaxpr)
        return self._reach


def _dependencies(jaxpr) -> List[frozenset]:
    """Which of ``jaxpr``'s inputs each of its outputs depends on."""
    deps: Dict[Any, frozenset] = {v: frozenset((i,)) for i, v in enumerate(jaxpr.invars)}
    none: frozenset = frozenset()

    def of(v):
        return none if type(v).__name__ == "Literal" else deps.get(v, none)

    for eqn in jaxpr.eqns:
        d = none.union(*(of(v) for v in eqn.invars))
        for o in eqn.outvars:
            deps[o] = d
    return [of(v) for v in jaxpr.outvars]


_FUNCTION = None


def _function_class():
    """The ``torch.autograd.Function`` (made on first use: torch is imported lazily)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION.apply
    torch, jax = _frameworks()
    class JaxFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, entry, *tensors):
            outs, vjp = entry.forward_vjp(tensors)
            ctx.entry = entry
            # The residuals: JAX arrays, freed with the autograd graph (a captured
            # forward's: with the CUDA graph too).
            ctx.vjp = vjp
            # Saved only to have PyTorch check that no input was modified in place
            # before the backward (the residuals may view the inputs' memory).
            ctx.save_for_backward(*tensors)
            nondiff = [t for t, fl in zip(outs, entry.out_float) if not fl]
            if nondiff:
                ctx.mark_non_differentiable(*nondiff)
            # An output the loss does not use gets None, not zeros: the backward tells
            # which inputs no used output reaches (they get None, as in PyTorch).
            ctx.set_materialize_grads(False)
            return outs

        @staticmethod
        def backward(ctx, *cts):
            entry = ctx.entry
            if torch.is_grad_enabled():
                raise RuntimeError(
                    f"handoff.torch_function({entry.owner.__name__}): double backward "
                    "(create_graph=True through a JAX function) is not supported"
                )
            ctx.saved_tensors  # raises if an input was modified in place since
            grads = entry.backward(ctx.vjp, cts)
            crossed = iter(_to_torch_many([g for g in grads if g is not None]))
            result: List[Any] = [None] * len(entry.diff)
            for i, g in zip(entry.diff_idx, grads):
                result[i] = None if g is None else next(crossed)
            return (None, *result)

    JaxFunction.__name__ = JaxFunction.__qualname__ = "JaxFunction"
    _FUNCTION = JaxFunction
    return JaxFunction.apply


def _trace_context():
    """JAX's configuration in force on this thread, as JAX keys its jit cache on it."""
    return _config()[0]()


def _configuration(context):
    """A context manager that runs its body under the JAX configuration ``context`` (a
    ``_trace_context()``): each configuration option in it that differs on this thread is
    set here for the body, and restored after. Nothing is done where they agree."""
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


_CONFIG = None


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


def _is_float(jax, dtype) -> bool:
    return bool(jax.numpy.issubdtype(dtype, jax.numpy.inexact))


def _x64(jax) -> bool:
    import numpy as np

    return jax.dtypes.canonicalize_dtype(np.float64) == np.float64


def _where(dynamic: Sequence[Any], positions: Sequence[int], k: int, tree) -> str:
    """Names the k-th tensor leaf: its positional argument and, in a pytree, its path."""
    path, _ = tree.tree_flatten_with_path(list(dynamic))[0][k]
    head, rest = path[0], path[1:]
    pos = positions[getattr(head, "idx", 0)]
    return f"argument {pos}" + "".join(str(p) for p in rest)


_MODULES = None


def _frameworks():
    global _MODULES
    if _MODULES is None:
        import jax
        import jax.dlpack
        import torch

        _MODULES = (torch, jax)
    return _MODULES
