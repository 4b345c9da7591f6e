"""The frameworks, imported where a feature first needs them, with an error that says
which feature needs which package where one is not installed (``import handoff`` itself
needs neither PyTorch nor JAX)."""

from __future__ import annotations

import importlib
from typing import Any

_INSTALL = {"torch": ("PyTorch", "pip install torch"), "jax": ("JAX", "pip install jax")}


def need(module: str, what: str) -> Any:
    """``import module`` (``"torch"`` or ``"jax"``) for ``what`` (``"handoff.torch_function"``):
    the module, or a ``ModuleNotFoundError`` naming ``what``, the framework and how to
    install it.

    ::

        torch = need("torch", "handoff.jax_function")
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("torch", "jax", "jaxlib"):
            raise
        framework, install = _INSTALL[module]
        raise ModuleNotFoundError(
            f"{what} needs {framework}, which is not installed in this environment (no module "
            f"named {e.name!r}): {install}", name=e.name) from e
