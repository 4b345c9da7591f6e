"""handoff.ordered between JAX (CPU), NumPy and, when it imports, PyTorch (CPU)."""

import importlib.util

import numpy as np
import pytest

import handoff

jax = pytest.importorskip("jax")
import jax.dlpack  # noqa: E402
import jax.numpy as jnp  # noqa: E402


def torch_or_skip():
    # PyPI's torch 2.11 wheel needs the CUDA libraries (cuDNN, cuBLAS, NCCL, ...) to
    # import at all, even on a CPU: CI has only the minimal set libtorch links.
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch does not import: {e}")
    return torch


def test_jax_to_numpy():
    x = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    b = np.from_dlpack(handoff.ordered(x))
    np.testing.assert_array_equal(np.asarray(x), b)
    assert b.flags.writeable is False or True  # JAX decides; the values are what matter


def test_numpy_to_jax():
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    x = jax.dlpack.from_dlpack(handoff.ordered(a))
    np.testing.assert_array_equal(np.asarray(x), a)
    y = handoff.to_jax(a)
    np.testing.assert_array_equal(np.asarray(y), a)


def test_jax_to_jax():
    x = jnp.linspace(0.0, 1.0, 17, dtype=jnp.float32)
    y = jax.dlpack.from_dlpack(handoff.ordered(x))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert float((y * 2).sum()) == pytest.approx(float((x * 2).sum()))


def test_jax_capsules_are_released():
    before = handoff.stats()
    for _ in range(100):
        x = jnp.ones((32,), dtype=jnp.float32)
        b = np.from_dlpack(handoff.ordered(x))
        assert b.sum() == 32
        del b, x
    handoff.flush()
    after = handoff.stats()
    assert after["imports"] - before["imports"] == 100
    assert after["releases_immediate"] - before["releases_immediate"] >= 100
    assert after["pending"] == 0


def test_jax_to_torch():
    torch = torch_or_skip()
    x = jnp.arange(6.0, dtype=jnp.float32)
    t = torch.from_dlpack(handoff.ordered(x))
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert handoff.to_torch(x).tolist() == t.tolist()


def test_torch_to_jax():
    torch = torch_or_skip()
    t = torch.arange(6, dtype=torch.float32)
    x = jax.dlpack.from_dlpack(handoff.ordered(t))
    assert np.asarray(x).tolist() == t.tolist()
    assert np.asarray(handoff.to_jax(t)).tolist() == t.tolist()


def test_torch_to_numpy_and_back():
    torch = torch_or_skip()
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    b = np.from_dlpack(handoff.ordered(t))
    np.testing.assert_array_equal(b, t.numpy())
    u = torch.from_dlpack(handoff.ordered(b))
    assert torch.equal(u, t)
