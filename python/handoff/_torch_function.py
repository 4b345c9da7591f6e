"""``handoff.torch_function``: a JAX function PyTorch can train through, as a PyTorch
operator.

The layer flattens its arguments (``handoff._tree``), finds the operator key of the call
(:func:`_program_for`: the function, its static arguments, the tensors' structure,
dtypes and device, which need a gradient, JAX's configuration) and calls the operator
``handoff::call`` (``handoff._torch_ops``), whose autograd formula calls
``handoff::call_bwd``. Eager calls, ``torch.compile``, ``torch.export``, checkpointing
and distributed wrappers all go through those two operators; the JAX side is
``handoff._program``.
"""

from __future__ import annotations

import itertools
import threading
import uuid
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union, overload

from . import _imports, _jax_config, _tree
from ._program import Program

__all__ = ["TorchFunction", "torch_function"]


@overload
def torch_function(
    f: Callable[..., Any],
    *,
    static_argnums: Union[int, Iterable[int]] = (),
    cache_size: int = 64,
    residuals: Any = "dots",
) -> "TorchFunction": ...


@overload
def torch_function(
    f: None = None,
    *,
    static_argnums: Union[int, Iterable[int]] = (),
    cache_size: int = 64,
    residuals: Any = "dots",
) -> Callable[[Callable[..., Any]], "TorchFunction"]: ...


def torch_function(
    f: Optional[Callable[..., Any]] = None,
    *,
    static_argnums: Union[int, Iterable[int]] = (),
    cache_size: int = 64,
    residuals: Any = "dots",
) -> Any:
    """Turns the JAX function ``f`` into a function of PyTorch tensors that autograd
    differentiates and ``torch.compile`` traces (two PyTorch operators underneath,
    ``handoff::call`` and ``handoff::call_bwd``), to call like a module's forward::

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
    ``torch.Tensor`` or a pytree of them (tuples, lists, dicts, namedtuples; not other
    pytree nodes of JAX's), all on one device. ``f`` receives JAX arrays in the same
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
    or an output that the backward reads, modified in place between forward and
    backward, raises PyTorch's usual error, as for its own saved tensors.

    **Residuals.** What the forward keeps for the backward is a ``jax.checkpoint``
    policy's choice, handed to PyTorch as tensors (no copy; a residual that is also an
    input or an output is not handed out again: the backward reads that tensor).
    ``residuals="dots"`` (the default, ``jax.checkpoint_policies.dots_saveable``): the
    results of matmuls are kept, the rest (elementwise work, reductions) is recomputed in
    the backward, fused into it by XLA. ``"save"``: every residual of ``jax.vjp`` is
    kept; the backward recomputes nothing, and more memory and more tensors cross.
    ``"recompute"`` (``nothing_saveable``): only the outputs cross and the backward runs
    the forward again from the inputs, as ``torch.utils.checkpoint`` does. Any other
    ``jax.checkpoint`` policy may be given. On an H200 at host-bound sizes the default
    took 0.64–0.77× the time of ``"save"`` per training step, and at 8192×4096 f32 it
    held 134 MB between the passes where ``"save"`` held 1.2 GB (BENCHMARKS.md). Under
    ``torch.compile``'s dynamic shapes the layer recomputes: which residuals
    ``jax.vjp`` keeps can change with the sizes (a mean's divisor, say), and an
    operator's outputs cannot.

    **Compilation.** The operator key of a call is the structure, dtypes and device of
    the tensors, which of them need a gradient, the static arguments, and JAX's
    configuration at the call (what JAX keys its own jit cache on: x64 mode, default
    matmul precision, default device, ...); the signature is the key and the shapes.
    Under ``torch.compile`` the key is read while Dynamo traces and kept by the graph:
    the graph runs under the JAX configuration it was compiled under. The backward runs
    under the forward's configuration, on whichever thread PyTorch runs it (its own
    autograd thread for CUDA tensors; JAX's configuration contexts are thread-local).
    ``f`` is traced once per new signature (``jax.make_jaxpr``, of its ``jax.vjp`` when a
    gradient is needed; the programs that run are jitted from that trace, without
    tracing ``f`` again), and once per symbolic signature when ``torch.compile`` asks
    for shapes. The object's ``traces`` counts the traces of ``f``. Under
    ``torch.no_grad()``, or when no input requires grad, only the forward runs, with no
    residuals. At most ``cache_size`` (64)
    signatures are kept, the least recently used dropped first; the first time one is
    dropped a warning says the function keeps retracing (a shape that changes every
    call).

    **Memory and streams.** Every hand-off, both ways and both passes, crosses as
    ``handoff.to_jax`` / ``handoff.to_torch`` do (the fastest route, ``handoff.routes()``;
    the tensors of one call in one native call): tensors are made ready on the
    consumer's stream by a GPU wait (no host sync), and memory read by queued kernels is
    given back only after they ran. What the forward handed to PyTorch the backward
    reads as the JAX arrays it was (no crossing back). The JAX view of an
    ``nn.Parameter`` is made once and kept by the layer while the parameter keeps its
    memory (``handoff._views``): in-place updates are seen, in PyTorch's stream order,
    and the layer holds the parameters of its last call. Outputs and residuals are
    PyTorch tensors viewing JAX's buffers (no copy), none aliasing another or an input,
    as PyTorch's operators require: an output that is one of the inputs (``f`` returning
    an argument unchanged), or one returned twice, is cloned.

    **CUDA graphs.** Inside ``torch.cuda.graph`` or ``torch.cuda.make_graphed_callables``
    the layer's programs are compiled with XLA's command buffers off for themselves
    (``compiler_options``: no ``XLA_FLAGS`` to set) and the backward hands every tensor
    to JAX again. With ``handoff.capture_clients(enabled=True)`` the tensors cross to a
    PJRT client the capture holds alone, so the memory a replay writes is never given to
    another JAX array. ``torch.compile(mode="reduce-overhead")`` splits its CUDA graphs
    around the layer (the operators are tagged ``cudagraph_unsafe``).

    **torch.compile, torch.export, checkpointing.** Dynamo and AOTAutograd trace the
    operators' fake implementations (JAX's abstract evaluation, with symbolic sizes
    under dynamic shapes; nothing runs). ``torch.export`` puts the function into the
    exported program as a ``jax.export`` artifact (in the operator key; its
    serialization needs the ``flatbuffers`` package), which ``handoff::call`` loads in
    another process; exported programs run the forward. Selective activation
    checkpointing names the forward ``torch.ops.handoff.call.default``. Under
    ``torch.autocast`` the function receives each tensor in its own dtype.

    Returns a :class:`TorchFunction`.
    """
    options = dict(static_argnums=static_argnums, cache_size=cache_size, residuals=residuals)
    if f is None:
        return lambda g: TorchFunction(g, **options)
    return TorchFunction(f, **options)


class TorchFunction:
    """What :func:`torch_function` returns: call it with PyTorch tensors (see there).

    ``traces``: how many times the wrapped function was traced (a new operator key or
    new input shapes; with symbolic sizes under ``torch.compile`` too). ``signatures``:
    how many traced input signatures are kept (at most ``cache_size``). ``executions``:
    how many JAX programs ran for it (each forward and each backward is one; tracing by
    ``torch.compile`` or ``torch.export`` runs none). ``fun``: the wrapped JAX function."""

    def __init__(
        self,
        f: Callable[..., Any],
        *,
        static_argnums: Union[int, Iterable[int]] = (),
        cache_size: int = 64,
        residuals: Any = "dots",
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
        if residuals not in ("dots", "save", "recompute") and not callable(residuals):
            raise ValueError(
                'handoff.torch_function: residuals must be "dots", "save", "recompute" or a '
                f"jax.checkpoint policy (jax.checkpoint_policies), got {residuals!r}"
            )
        self.fun = f
        self.residuals = residuals
        self.static_argnums = frozenset(nums)
        self.cache_size = cache_size
        self.__name__ = getattr(f, "__name__", type(self).__name__)
        self._label = f"handoff.torch_function({self.__name__})"  # errors start with it
        self.__doc__ = getattr(f, "__doc__", None)
        self.__wrapped__ = f
        self._id = f"{self.__name__}#{next(_IDS)}.{_PROCESS}"
        self._programs: Dict[Any, Program] = {}
        self._traced: "OrderedDict[Any, Program]" = OrderedDict()
        self._lock = threading.Lock()
        self._warned = False
        self._traces = 0
        self._executions = 0
        _OWNERS[self._id] = self
        _torch()  # registers the operators

    @property
    def traces(self) -> int:
        return self._traces

    @property
    def signatures(self) -> int:
        return len(self._traced)

    @property
    def executions(self) -> int:
        return self._executions

    def __repr__(self) -> str:
        return f"handoff.torch_function({self.fun!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # torch.compile traces this method: PyTorch and Python only (no JAX), the
        # operator key from a function Dynamo keeps as a constant.
        import torch
        if self.static_argnums:
            static, dynamic, positions = self._split(args)
        else:
            static, dynamic, positions = (), args, range(len(args))
        leaves: List[Any] = []
        desc = _tree.flatten(list(dynamic), leaves)
        if not leaves:
            raise TypeError(
                f"{self._label}: no tensor argument (every argument "
                "is static): at least one torch.Tensor must be passed to choose the device"
            )
        # One pass over the tensors: checked, and what the operator key holds of each.
        grad_on = torch.is_grad_enabled()
        device = None
        signature = []
        for k, t in enumerate(leaves):
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"{self._label}: {_where(desc, positions, k)} is a "
                    f"{type(t).__name__} ({t!r:.60}), not a torch.Tensor: pass tensors, or make the "
                    "argument static (static_argnums, a keyword argument, or functools.partial)"
                )
            if device is None:
                device = t.device
                if device.type not in ("cpu", "cuda"):
                    raise ValueError(
                        f"{self._label}: {_where(desc, positions, k)} is on "
                        f"{device}; only CPU and CUDA tensors can be handed to JAX"
                    )
            elif t.device != device:
                raise ValueError(
                    f"{self._label}: {_where(desc, positions, k)} is on "
                    f"{t.device} but {_where(desc, positions, 0)} is on {device}: all tensor "
                    "arguments must be on one device"
                )
            if t.is_complex():
                raise TypeError(
                    f"{self._label}: {_where(desc, positions, k)} is "
                    f"{t.dtype}: complex tensors are not supported (PyTorch and JAX use different "
                    "conventions for complex gradients)"
                )
            signature.append((t.dtype, t.dim(), grad_on and t.requires_grad and t.is_floating_point()))
        # Symbolic sizes (torch.compile's dynamic shapes): the VJP's residuals could differ
        # with the sizes, so the backward recomputes the forward (``_policy``).
        symbolic = any(isinstance(d, torch.SymInt) for t in leaves for d in t.shape)
        program = _program_for(self._id, static, tuple(sorted(kwargs.items())) if kwargs else (),
                               len(args), desc, tuple(signature), device, symbolic)
        key = program.key
        if _exporting():
            key = _artifact_key(program, leaves)
        outs = _torch_ops().call(key, leaves)
        return _tree.unflatten(iter(outs[: program.n_out]), program.out_desc)

    def _split(self, args: Tuple[Any, ...]) -> Tuple[Tuple[Tuple[int, Any], ...], List[Any], List[int]]:
        """The static arguments (with their positions), the others, and their positions."""
        for n in self.static_argnums:
            if n >= len(args):
                raise TypeError(
                    f"{self._label}: static_argnums has {n}, but only "
                    f"{len(args)} positional arguments were given"
                )
        static = tuple((i, a) for i, a in enumerate(args) if i in self.static_argnums)
        positions = [i for i in range(len(args)) if i not in self.static_argnums]
        return static, [args[i] for i in positions], positions

    def _program(self, static, kwargs, nargs, desc, signature, device, symbolic) -> Program:
        context = _jax_config.current()
        whole = (static, kwargs, nargs, desc, signature, device, context, symbolic)
        try:
            found = self._programs.get(whole)
        except TypeError as e:
            self._refuse_arrays(static, kwargs)  # the clearer error, where it applies
            raise TypeError(
                f"handoff.torch_function({self.__name__}): static arguments must be hashable "
                f"(static positions {sorted(self.static_argnums)} and keyword arguments): {e}"
            ) from None
        if found is not None:
            return found
        # A tensor in a static argument is hashed by identity: each call is a new key, so
        # checking new keys is enough.
        self._refuse_arrays(static, kwargs)
        dtypes, ranks, diff = zip(*signature)
        if any(str(d) == "torch.float64" for d in dtypes) and not _jax_config.x64():
            k = next(k for k, d in enumerate(dtypes) if str(d) == "torch.float64")
            raise TypeError(
                f"handoff.torch_function({self.__name__}): {_where(desc, _dynamic_positions(self, nargs), k)} "
                "is torch.float64 but JAX's x64 mode is off (JAX would compute in float32): "
                "jax.config.update('jax_enable_x64', True), or call inside "
                "`with jax.enable_x64(True):`"
            )
        with self._lock:
            found = self._programs.get(whole)
            if found is None:
                key = f"{self._id}/{len(self._programs)}"
                found = Program(self, key, self._caller(static, kwargs, nargs, desc), diff, dtypes,
                                ranks, device, context, self._policy(symbolic))
                self._programs[whole] = found
                _torch_ops().PROGRAMS[key] = found
        return found

    def _policy(self, symbolic: bool) -> Any:
        """The ``jax.checkpoint`` policy of the VJP's residuals (``None``: all saved).
        Under symbolic sizes nothing but the inputs is saved: which residuals
        ``jax.vjp`` keeps can change with the sizes, and an operator's outputs cannot."""
        import jax

        if symbolic or self.residuals == "recompute":
            return jax.checkpoint_policies.nothing_saveable
        if self.residuals == "dots":
            return jax.checkpoint_policies.dots_saveable
        return None if self.residuals == "save" else self.residuals

    def _caller(self, static, kwargs, nargs, desc) -> Callable[[Any], Any]:
        """The wrapped function called on a program's leaves (JAX arrays, in order)."""
        f, static, kwargs = self.fun, dict(static), dict(kwargs)

        def call(leaves):
            self._count_trace()
            dyn = iter(_tree.unflatten(iter(leaves), desc))
            return f(*[static[i] if i in static else next(dyn) for i in range(nargs)], **kwargs)

        return call

    def _remember(self, program: Program, shapes: Any) -> None:
        """Keeps a new trace, dropping the least recently used past ``cache_size``."""
        with self._lock:
            self._traced[(program.key, shapes)] = program
            if len(self._traced) <= self.cache_size:
                return
            (_, old_shapes), old = self._traced.popitem(last=False)
            old.forget(old_shapes)
            warn, self._warned = not self._warned, True
        if warn:
            warnings.warn(
                f"handoff.torch_function({self.__name__}) keeps retracing: more than "
                f"cache_size={self.cache_size} signatures (shapes, dtypes, static arguments, "
                "JAX configuration); the least recently used are dropped and compiled again "
                "when they come back",
                UserWarning,
                stacklevel=5,
            )

    def _touch(self, program: Program, shapes: Any) -> None:
        try:
            self._traced.move_to_end((program.key, shapes))  # atomic under the GIL
        except KeyError:  # dropped by another thread meanwhile
            pass

    def _refuse_arrays(self, static, kwargs) -> None:
        """A static argument holding a tensor or an array is refused (it would be hashed
        by identity, retrace on every call and be baked into the program as a constant)."""
        import jax
        import numpy as np

        torch = _torch()
        named = [(f"argument {i}", v) for i, v in static]
        named += [(f"keyword argument {k!r}", v) for k, v in kwargs]
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
        with self._lock:
            self._traces += 1

    def _count_execution(self) -> None:
        self._executions += 1  # a statistic: racing increments may lose a count


_IDS = itertools.count()
#: This process's mark in every operator key. PyTorch's compile caches (AOTAutograd's,
#: Inductor's, kept on disk across processes) key a graph on its operator calls, not on
#: what the operators' fake implementations return; the same key in another process may
#: name another function (edited since, or with another residual policy), so no graph
#: holding a key is reused by another process.
_PROCESS = uuid.uuid4().hex[:12]
#: Every live TorchFunction by its id (the first part of its operator keys).
_OWNERS: "weakref.WeakValueDictionary[str, TorchFunction]" = weakref.WeakValueDictionary()


def _program_for(fid, static, kwargs, nargs, desc, signature, device, symbolic) -> Program:
    """The :class:`Program` (operator key) of a call: ``signature`` holds each tensor's
    dtype, rank and whether it needs a gradient. ``torch.compile`` calls this while it
    traces and keeps the result as a constant of the graph (so JAX's configuration at
    that time is the graph's); every argument is a Python constant that Dynamo guards
    on."""
    return _OWNERS[fid]._program(static, kwargs, nargs, desc, signature, device, symbolic)


_program_for._dynamo_marked_constant = True  # torch._dynamo.assume_constant_result


def _exporting() -> bool:
    """Whether ``torch.export`` is tracing. (Dynamo answers ``torch.compiler.is_exporting()``
    with True under ``torch.compile`` too; it calls this function instead and keeps its
    result.)"""
    return bool(_torch().compiler._is_exporting_flag)


_exporting._dynamo_marked_constant = True  # torch._dynamo.assume_constant_result


def _artifact_key(program: Program, leaves: List[Any]) -> str:
    """While ``torch.export`` traces: the key that holds the function itself."""
    from . import _artifact

    return _artifact.key_for(program, leaves)


def _where(desc: Any, positions: List[int], k: int) -> str:
    """Names the k-th tensor leaf: its positional argument and, in a pytree, its path."""
    path = _tree.paths(desc)[k]
    i, rest = path[1:].split("]", 1)
    return f"argument {positions[int(i)]}{rest}"


def _dynamic_positions(owner: TorchFunction, nargs: int) -> List[int]:
    return [i for i in range(nargs) if i not in owner.static_argnums]


_TORCH = None


def _torch():
    global _TORCH
    if _TORCH is None:
        torch = _imports.need("torch", "handoff.torch_function")
        _imports.need("jax", "handoff.torch_function")

        from . import _torch_ops  # noqa: F401 - registers handoff::call and handoff::call_bwd

        _TORCH = torch
    return _TORCH


def _torch_ops():
    from . import _torch_ops

    return _torch_ops
