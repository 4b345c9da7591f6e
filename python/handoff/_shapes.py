"""Dtypes and shapes between PyTorch and JAX, for ``handoff.torch_function``'s
operators: JAX avals of PyTorch tensors (concrete, or symbolic where PyTorch's sizes are
``torch.SymInt``s), and JAX's shapes back in PyTorch's sizes."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple


def _jax_dtype(torch_dtype: Any) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.dtypes.canonicalize_dtype(jnp.dtype(str(torch_dtype).rpartition(".")[2]))


def is_float(jax_dtype: Any) -> bool:
    """Whether arrays of this JAX dtype are differentiable (floating point)."""
    import jax.numpy as jnp

    return bool(jnp.issubdtype(jax_dtype, jnp.inexact))


def _torch_dtype(jax_dtype: Any) -> Any:
    import numpy as np
    import torch

    return getattr(torch, np.dtype(jax_dtype).name)


def _aval(shape: Sequence[Any], torch_dtype: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(tuple(shape), _jax_dtype(torch_dtype))


def torch_shape(shape: Sequence[Any], env: Dict[str, Any]) -> Tuple[Any, ...]:
    """A JAX shape (ints and symbolic dimensions) in PyTorch's sizes, ``env`` mapping each
    JAX dimension's name to PyTorch's size. A dimension that is an expression (``2*b +
    1``, ``floordiv(b, 2)``) is computed with PyTorch's symbolic arithmetic: JAX's own
    evaluation compares sizes with integers, which would make PyTorch specialize them."""
    import torch

    functions = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
                 "max": torch.sym_max, "min": torch.sym_min, "non_negative": lambda a: torch.sym_max(a, 0)}
    out = []
    for d in shape:
        text = "" if type(d) is int else str(d)
        out.append(d if type(d) is int else env[text] if text in env
                   else eval(text, {"__builtins__": {}}, {**functions, **env}))  # noqa: S307 - JAX's own text
    return tuple(out)


def symbolic_avals(shapes: Sequence[Sequence[Any]], dtypes: Sequence[Any]) -> Tuple[List[Any], Dict[str, Any]]:
    """JAX avals for shapes holding ``torch.SymInt`` sizes: one JAX symbolic dimension per
    distinct size (named as PyTorch names it where that is an identifier), and the
    environment that maps each dimension's name back to PyTorch's size."""
    from jax import export

    names: Dict[str, str] = {}
    env: Dict[str, Any] = {}
    for s in shapes:
        for d in s:
            if type(d) is int:
                continue
            text = str(d)
            if text not in names:
                name = text if text.isidentifier() else f"_h{len(names)}"
                names[text] = name
                env[name] = d
    dims = dict(zip(names.values(), export.symbolic_shape(", ".join(names.values())))) if names else {}
    avals = [_aval([d if type(d) is int else dims[names[str(d)]] for d in s], t) for s, t in zip(shapes, dtypes)]
    return avals, env
