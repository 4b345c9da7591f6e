"""The package with one framework missing: ``import handoff`` and what needs neither
framework work, ``handoff.routes()`` reports the missing one, and every call that needs
it raises a ``ModuleNotFoundError`` that names the call, the framework and how to
install it. Each case runs in a fresh interpreter where importing the framework fails
as it does where it is not installed (an import hook raises ``ModuleNotFoundError``)."""

import json
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    BLOCKED = set(sys.argv[1].split(","))
    sys.meta_path.insert(0, Absent())
    import numpy as np
    import handoff

    out = {"imported": [m for m in ("torch", "jax") if m in sys.modules]}
    for label, expr in json.loads(sys.argv[2]).items():
        try:
            out[label] = ["ok", repr(eval(expr))[:200]]
        except Exception as e:
            out[label] = [type(e).__name__, str(e)]
    print(json.dumps(out))
    """
)


def probe(blocked, exprs):
    run = subprocess.run([sys.executable, "-c", PROBE, blocked, json.dumps(exprs)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_without_pytorch():
    got = probe("torch", {
        "routes": "handoff.routes()",
        "ordered": "np.asarray(handoff.ordered(np.arange(3.0)))",
        "to_jax": "handoff.to_jax(np.arange(3.0))",
        "to_torch": "handoff.to_torch(np.arange(3.0))",
        "torch_function": "handoff.torch_function(lambda x: x)",
        "jax_function": "handoff.jax_function(lambda x: x)(np.arange(3.0))",
    })
    assert got["ordered"][0] == "ok" and got["to_jax"][0] == "ok", got
    routes = got["routes"]
    assert routes[0] == "ok" and "not installed" in routes[1] and "'public'" in routes[1], routes
    for call in ("to_torch", "torch_function", "jax_function"):
        kind, message = got[call]
        assert kind == "ModuleNotFoundError", got[call]
        assert f"handoff.{call} needs PyTorch" in message and "pip install torch" in message, message


def test_without_jax():
    got = probe("jax,jaxlib", {
        "routes": "handoff.routes()",
        "ordered": "np.asarray(handoff.ordered(np.arange(3.0)))",
        "to_torch": "handoff.to_torch(np.arange(3.0))",
        "to_jax": "handoff.to_jax(np.arange(3.0))",
        "torch_function": "handoff.torch_function(lambda x: x)",
        "jax_function": "handoff.jax_function(lambda x: x)",
    })
    assert got["ordered"][0] == "ok" and got["to_torch"][0] == "ok", got
    routes = got["routes"]
    assert routes[0] == "ok" and "not installed" in routes[1] and "'public'" in routes[1], routes
    for call in ("to_jax", "torch_function", "jax_function"):
        kind, message = got[call]
        assert kind == "ModuleNotFoundError", got[call]
        assert f"handoff.{call} needs JAX" in message and "pip install jax" in message, message

