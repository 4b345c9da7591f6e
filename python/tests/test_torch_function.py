"""handoff.torch_function on the CPU: PyTorch autograd through jitted JAX functions.

Gradients are checked with torch.autograd.gradcheck in float64 (JAX's x64 mode on only
inside each test, through ``jax.enable_x64``, so the other tests keep JAX's default)
and against ``jax.grad`` of the same loss.
"""

import functools
import importlib.util

import numpy as np
import pytest

import handoff

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402


def _torch():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed", allow_module_level=True)
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch does not import: {e}", allow_module_level=True)
    return torch


torch = _torch()

from seams import ROUTES, set_route  # noqa: E402


@pytest.fixture(autouse=True, params=ROUTES)
def route(request):
    """Every test runs on both routes of the crossings (``handoff.routes()``): the native
    one (where the frameworks offer it) and the public one (forced with ``_set_route``,
    a test seam: marked ``hooks``)."""
    set_route(request.param)
    yield request.param
    set_route("auto")


@pytest.fixture
def x64():
    """JAX's x64 mode for one test (thread-local; restored after)."""
    with jax.enable_x64(True):
        yield


def ln_gelu_matmul(h, gamma, beta, w):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    z = (h - mu) * jax.lax.rsqrt(var + 1e-5) * gamma + beta
    return jax.nn.gelu(z, approximate=True) @ w


def two_outputs(a, b):
    """A tuple of two outputs of different shapes, both depending on both inputs."""
    return jnp.tanh(a @ b), jnp.sin(a).sum(0) * b[:, 0].sum()


def scaled_gather(x, scale, idx):
    """scale: a float input that does not require grad; idx: an integer input."""
    return jnp.exp(x[idx] * scale)


def rand(*shape, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_(grad)


def test_gradcheck_layernorm_gelu_matmul(x64):
    layer = handoff.torch_function(ln_gelu_matmul)
    args = (rand(3, 5), rand(5, seed=1), rand(5, seed=2), rand(5, 4, seed=3))
    assert torch.autograd.gradcheck(layer, args)
    assert layer.signatures == 1


def test_gradcheck_two_outputs(x64):
    fn = handoff.torch_function(two_outputs)
    a, b = rand(4, 3), rand(3, 2, seed=1)
    ya, yb = fn(a, b)
    assert ya.shape == (4, 2) and yb.shape == (3,)
    assert torch.autograd.gradcheck(fn, (a, b))


def test_gradcheck_with_non_grad_and_integer_inputs(x64):
    fn = handoff.torch_function(scaled_gather)
    x, scale = rand(6, 3), rand(3, grad=False, seed=1)
    idx = torch.tensor([4, 0, 4, 2])
    assert torch.autograd.gradcheck(lambda x: fn(x, scale, idx), (x,))
    # Inputs that do not require grad get None; integer inputs are not differentiable.
    y = fn(x, scale, idx)
    y.sum().backward()
    assert x.grad is not None and scale.grad is None and idx.grad is None
    expected = torch.zeros(6, 3, dtype=torch.float64)
    expected.index_add_(0, idx, scale * torch.exp(x.detach()[idx] * scale))
    torch.testing.assert_close(x.grad, expected)


def test_gradients_match_jax_grad():
    """float32, JAX's defaults: the PyTorch gradients of loss(layer(...)) equal
    jax.grad of the same loss."""
    layer = handoff.torch_function(ln_gelu_matmul)
    rng = np.random.default_rng(0)
    arrays = [
        rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16,), (16,), (16, 4)]
    ]
    target = rng.standard_normal((8, 4)).astype(np.float32)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    loss = ((layer(*ts) - torch.tensor(target)) ** 2).mean()
    loss.backward()

    def jloss(*xs):
        return ((ln_gelu_matmul(*xs) - target) ** 2).mean()

    jl, jgrads = jax.value_and_grad(jloss, argnums=(0, 1, 2, 3))(*map(jnp.asarray, arrays))
    assert loss.item() == pytest.approx(float(jl), rel=1e-6)
    for t, g in zip(ts, jgrads):
        np.testing.assert_allclose(t.grad.numpy(), np.asarray(g), rtol=1e-5, atol=1e-6)


def test_traces_once_per_signature():
    calls = []

    def f(x, w):
        calls.append(x.shape)
        return jnp.tanh(x @ w)

    fn = handoff.torch_function(f)
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, 2, requires_grad=True)
    for _ in range(5):
        fn(x, w).sum().backward()
    assert fn.traces == 1 and len(calls) == 1 and fn.signatures == 1
    fn(torch.randn(4, 3, requires_grad=True), torch.randn(3, 2)).sum().backward()
    assert fn.traces == 2, "another set of inputs needing grad is another signature"
    fn(torch.randn(7, 3, requires_grad=True), w).sum().backward()
    assert fn.traces == 3, "a new shape retraces"
    xb, wb = (t.detach().bfloat16().requires_grad_() for t in (x, w))
    fn(xb, wb).sum().backward()
    assert fn.traces == 4, "a new dtype retraces"
    with torch.no_grad():
        for _ in range(3):
            y = fn(x, w)
    assert not y.requires_grad
    assert fn.traces == 5, "the forward alone (no residuals) is traced once"
    for _ in range(3):
        fn(torch.randn(7, 3, requires_grad=True), w).sum().backward()
    assert fn.traces == 5 and fn.signatures == 5
    assert len(calls) == fn.traces


def test_static_arguments():
    calls = []

    def f(x, power, *, shift):
        calls.append((power, shift))
        return x**power + shift

    fn = handoff.torch_function(f, static_argnums=(1,))
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = fn(x, 2, shift=1.0)
    y.sum().backward()
    assert y.tolist() == [2.0, 5.0, 10.0] and x.grad.tolist() == [2.0, 4.0, 6.0]
    fn(x, 2, shift=1.0)
    assert fn.traces == 1
    x.grad = None
    fn(x, 3, shift=1.0).sum().backward()
    assert x.grad.tolist() == [3.0, 12.0, 27.0] and fn.traces == 2
    fn(x, 3, shift=0.5)
    assert calls == [(2, 1.0), (3, 1.0), (3, 0.5)]
    with pytest.raises(TypeError, match="hashable"):
        fn(x, [2], shift=1.0)
    # functools.partial and the decorator forms.
    part = handoff.torch_function(functools.partial(f, power=2, shift=0.0))
    assert part(x).tolist() == [1.0, 4.0, 9.0]
    dec = handoff.torch_function(static_argnums=1)(f)
    assert dec(x, 1, shift=0.0).tolist() == [1.0, 2.0, 3.0]


def test_pytree_inputs_and_outputs():
    @handoff.torch_function
    def mlp(params, x):
        h = jnp.tanh(x @ params["w1"])
        return {"out": h @ params["w2"], "aux": (h.mean(), jnp.argmax(h, axis=-1))}

    params = {
        "w1": torch.randn(3, 5, requires_grad=True),
        "w2": torch.randn(5, 2, requires_grad=True),
    }
    x = torch.randn(4, 3)
    res = mlp(params, x)
    assert set(res) == {"out", "aux"} and isinstance(res["aux"], tuple)
    out, (mean, arg) = res["out"], res["aux"]
    assert out.shape == (4, 2) and mean.shape == () and arg.shape == (4,)
    assert not arg.is_floating_point() and not arg.requires_grad, "integer outputs: no grad"
    (out.sum() + mean).backward()
    p = {k: jnp.asarray(v.detach().numpy()) for k, v in params.items()}

    def jloss(p):
        r = mlp.fun(p, jnp.asarray(x.numpy()))
        return r["out"].sum() + r["aux"][0]

    g = jax.grad(jloss)(p)
    for k in params:
        np.testing.assert_allclose(params[k].grad.numpy(), np.asarray(g[k]), rtol=1e-5, atol=1e-6)
    assert x.grad is None


def test_refusals_name_the_argument_and_value():
    fn = handoff.torch_function(lambda x, y: x * y)
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(TypeError, match=r"argument 1 is a float \(2.0\), not a torch.Tensor"):
        fn(x, 2.0)
    with pytest.raises(TypeError, match=r"argument 1 is torch.complex64: complex tensors are not"):
        fn(x, torch.ones(3, dtype=torch.complex64))
    with pytest.raises(TypeError, match=r"argument 0 is torch.float64 but JAX's x64 mode is off"):
        fn(x.double(), x.double())
    with pytest.raises(ValueError, match=r"argument 1 is on meta"):
        fn(x, torch.ones(3, device="meta"))
    with pytest.raises(TypeError, match=r"argument 0\['b'\] is a str"):
        handoff.torch_function(lambda d: d["a"])({"a": x, "b": "text"})
    with pytest.raises(TypeError, match="no tensor argument"):
        handoff.torch_function(lambda n: jnp.ones(n), static_argnums=(0,))(3)
    with pytest.raises(TypeError, match="static_argnums has 2"):
        handoff.torch_function(lambda x, *a: x, static_argnums=(2,))(x)
    with pytest.raises(ValueError, match="static_argnums must hold non-negative ints, got -1"):
        handoff.torch_function(lambda x: x, static_argnums=(-1,))
    with pytest.raises(TypeError, match="f must be callable, got int 3"):
        handoff.torch_function(3)


def test_integer_inputs_are_not_differentiable():
    """The choice made: integer and bool tensors are accepted as non-differentiable
    inputs (None gradient); PyTorch itself refuses requires_grad on them."""
    fn = handoff.torch_function(lambda x, mask, n: jnp.where(mask, x * n, 0.0))
    x = torch.arange(4.0, requires_grad=True)
    mask = torch.tensor([True, False, True, False])
    n = torch.tensor(3, dtype=torch.int32)
    y = fn(x, mask, n)
    y.sum().backward()
    assert y.tolist() == [0.0, 0.0, 6.0, 0.0]
    assert x.grad.tolist() == [3.0, 0.0, 3.0, 0.0]
    with pytest.raises(RuntimeError, match="floating point"):
        torch.tensor([1, 2]).requires_grad_()


def test_backward_refuses_inputs_modified_in_place():
    fn = handoff.torch_function(lambda x, w: jnp.sin(x) * w)
    x, w = torch.randn(5, requires_grad=True), torch.randn(5)
    y = fn(x, w)
    w.add_(1.0)  # a residual of the VJP views w's memory
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_double_backward_is_refused():
    fn = handoff.torch_function(lambda x: jnp.sin(x))
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"double backward \(create_graph=True"):
        torch.autograd.grad(fn(x).sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(fn(x).sum(), x)  # the plain backward still works
    torch.testing.assert_close(g, torch.cos(x.detach()))


def test_output_that_is_an_input_is_not_aliased():
    fn = handoff.torch_function(lambda x, y: (x, x + y))
    x, y = torch.ones(3, requires_grad=True), torch.ones(3)
    a, b = fn(x, y)
    assert a.data_ptr() != x.data_ptr()
    a.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_unused_outputs_and_retain_graph():
    fn = handoff.torch_function(two_outputs)
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(3, 2, requires_grad=True)
    ya, yb = fn(a, b)
    ya.sum().backward(retain_graph=True)  # yb unused: PyTorch passes zeros for it
    first = a.grad.clone()
    ya.sum().backward()  # the residuals are still there
    torch.testing.assert_close(a.grad, 2 * first)


def test_every_exchange_goes_through_handoff_and_is_released():
    fn = handoff.torch_function(ln_gelu_matmul, residuals="save")
    h, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 2, requires_grad=True)
    args = [h, torch.ones(6), torch.zeros(6), w]
    fn(*args).sum().backward()  # compile outside the counted window
    (program,) = fn._programs.values()
    (traced,) = program._traced.values()
    residuals = len(traced.res_avals)
    saved = len(traced.saved_in) + len(traced.saved_out) + residuals
    assert residuals > 0 and saved > residuals
    handoff.flush()
    before = handoff.stats()
    y = fn(*args)
    mid = handoff.stats()
    y.sum().backward()
    del y
    handoff.flush()
    after = handoff.stats()
    # Forward: 4 inputs to JAX, then the output and the VJP's new residuals to PyTorch;
    # backward: the residual outputs and 1 cotangent to JAX (the new residuals and the
    # residual inputs are read as the JAX arrays they were), then 2 gradients (only h
    # and w require grad) to PyTorch.
    assert mid["imports"] - before["imports"] == 4 + 1 + residuals
    assert after["imports"] - mid["imports"] == len(traced.saved_out) + 1 + 2
    assert after["host_syncs"] == before["host_syncs"]
    assert after["pending"] == 0


def test_an_output_that_is_a_residual_modified_in_place_is_refused():
    """tanh's VJP keeps tanh(x) as its residual: the backward reads the output PyTorch
    holds (one buffer, not two), so writing into it before the backward raises PyTorch's
    usual error instead of giving a wrong gradient. Without the change it is right. (The
    default, ``residuals="dots"``, recomputes tanh(x) in the backward: the next test.)"""
    fn = handoff.torch_function(jnp.tanh, residuals="save")
    x = torch.randn(5, requires_grad=True)
    y = fn(x)
    y.add_(100.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    fn(x).sum().backward()
    torch.testing.assert_close(x.grad, 1 - torch.tanh(x.detach()) ** 2)



def test_by_default_what_is_not_a_matmul_is_recomputed():
    """``residuals="dots"``: tanh's result is not kept; the backward recomputes it from
    the input, so an output changed in place does not change the gradient, and nothing
    but the output crosses to PyTorch."""
    fn = handoff.torch_function(lambda x, w: jnp.tanh(x) @ w)
    x, w = torch.randn(3, 5, requires_grad=True), torch.randn(5, 2, requires_grad=True)
    y = fn(x, w)
    (program,) = fn._programs.values()
    (traced,) = program._traced.values()
    assert [a[0] for a in traced.res_avals] == [], "tanh(x) @ w keeps no new residual but inputs"
    y.add_(100.0)
    y.sum().backward()
    xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (torch.tanh(xs) @ ws).sum().backward()
    torch.testing.assert_close(x.grad, xs.grad)
    torch.testing.assert_close(w.grad, ws.grad)

def test_the_training_comparison_runs_on_the_cpu(route):
    """bench/train_three_way.py (the GPU comparison) in its CPU mode, small, on each
    route: its gradient checks pass and it prints its figures and table."""
    import json
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "train_three_way.py")
    args = ["--device", "cpu", "--small", "--route", route]
    r = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    agreement = [x for x in lines if x["figure"] == "grad_agreement"]
    # Both models (the MLP and the two-output attention block), both dtypes, PyTorch
    # and handoff, each against jax.grad.
    assert {(x["model"], x["variant"], x["dtype"]) for x in agreement} == {
        (m, v, d) for m in ("mlp", "attn") for v in ("torch", "handoff") for d in ("f32", "bf16")
    }
    assert all(x["ok"] for x in agreement)
    handoff_steps = [x for x in lines if x["figure"] == "step" and x["variant"] == "handoff"]
    assert len(handoff_steps) == 4 and all(x["host_syncs"] == 0 for x in handoff_steps)
    assert lines[-1] == {"figure": "result", "ok": True, "failures": []}
    assert "| mlp | handoff | f32 |" in r.stdout and "| attn | handoff | bf16 |" in r.stdout


def test_training_matches_pure_pytorch(x64):
    """Ten SGD steps of a 2-layer MLP whose middle layer is the JAX function give the
    parameters that the same model in PyTorch alone gives (float64)."""

    def middle_torch(h, gamma, beta, w):
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        z = (h - mu) * torch.rsqrt(var + 1e-5) * gamma + beta
        return torch.nn.functional.gelu(z, approximate="tanh") @ w

    class MLP(torch.nn.Module):
        def __init__(self, middle):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.w1 = torch.nn.Parameter(torch.randn(8, 16, dtype=torch.float64, generator=g) / 3)
            self.gamma = torch.nn.Parameter(torch.ones(16, dtype=torch.float64))
            self.beta = torch.nn.Parameter(torch.zeros(16, dtype=torch.float64))
            self.w2 = torch.nn.Parameter(torch.randn(16, 4, dtype=torch.float64, generator=g) / 4)
            self.middle = middle

        def forward(self, x):
            return self.middle(x @ self.w1, self.gamma, self.beta, self.w2)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, dtype=torch.float64, generator=g)
    y = torch.randn(32, 4, dtype=torch.float64, generator=g)
    models = [MLP(middle_torch), MLP(handoff.torch_function(ln_gelu_matmul))]
    losses = []
    for m in models:
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        ls = []
        for _ in range(10):
            loss = torch.nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ls.append(loss.item())
        losses.append(ls)
    assert losses[1][-1] < losses[1][0]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-10)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    assert models[1].middle.traces == 1


# ---- the backward as PyTorch's own code would behave ------------------------------------


def _on_thread(f):
    """Runs ``f`` on another thread, as PyTorch runs the backward of CUDA tensors."""
    import threading

    errors = []

    def run():
        try:
            f()
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("where", ["another thread", "after the context"])
def test_the_backward_runs_under_the_forwards_jax_configuration(where):
    """JAX's configuration contexts are thread-local: a forward under
    ``jax.enable_x64(True)`` whose backward runs on another thread (PyTorch's autograd
    thread, for CUDA tensors) or after the ``with`` block still runs it in x64."""
    fn = handoff.torch_function(lambda x: jnp.sin(x) * 2)
    with jax.enable_x64(True):
        x = torch.linspace(0, 1, 5, dtype=torch.float64, requires_grad=True)
        y = fn(x)
    if where == "another thread":
        _on_thread(lambda: y.sum().backward())
    else:
        y.sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.cos(x.detach()))


def test_each_jax_configuration_is_its_own_signature():
    fn = handoff.torch_function(lambda x: x * 2)
    x = torch.ones(3, requires_grad=True)
    fn(x)
    with jax.numpy_rank_promotion("raise"):
        fn(x)
    fn(x)
    assert fn.signatures == 2


def test_gradcheck_with_the_backward_on_another_thread():
    fn = handoff.torch_function(ln_gelu_matmul)
    with jax.enable_x64(True):
        args = [
            torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
            torch.randn(4, dtype=torch.float64, requires_grad=True),
            torch.randn(4, dtype=torch.float64),
            torch.randn(4, 2, dtype=torch.float64, requires_grad=True),
        ]
        y = fn(*args)
    g = torch.randn_like(y)
    _on_thread(lambda: y.backward(g))
    with jax.enable_x64(True):
        ref = torch.autograd.grad(fn(*args), [args[0], args[1], args[3]], g)
    for got, want in zip([args[0].grad, args[1].grad, args[3].grad], ref):
        torch.testing.assert_close(got, want)


def two_branches(a, b, c):
    return a * 2.0, (b * c).sum()


def test_inputs_that_no_used_output_reaches_get_none_as_in_pytorch():
    fn = handoff.torch_function(two_branches)
    a, b, c = (torch.randn(3, requires_grad=True) for _ in range(3))
    ya, yb = fn(a, b, c)
    ya.sum().backward()  # yb unused: b and c are not reached
    assert a.grad.tolist() == [2.0, 2.0, 2.0]
    assert b.grad is None and c.grad is None
    # The same model in PyTorch.
    a2, b2, c2 = (t.detach().clone().requires_grad_() for t in (a, b, c))
    (a2 * 2.0).sum().backward()
    assert (a2.grad is None, b2.grad is None, c2.grad is None) == (False, True, True)
    # The other output: a is not reached.
    _, yb = fn(a, b, c)
    yb.backward()
    assert a.grad.tolist() == [2.0, 2.0, 2.0]  # unchanged
    torch.testing.assert_close(b.grad, c.detach())
    torch.testing.assert_close(c.grad, b.detach())


def test_a_zero_gradient_by_value_is_still_a_gradient():
    """Structure decides, not values: an input the used output reaches gets its
    gradient, zeros included (no host read of the cotangents)."""
    fn = handoff.torch_function(lambda a, b: (a * 0.0 + b, b))
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    y0, _ = fn(a, b)
    before = handoff.stats()
    y0.sum().backward()
    assert a.grad.tolist() == [0.0, 0.0, 0.0] and b.grad.tolist() == [1.0, 1.0, 1.0]
    assert handoff.stats()["host_syncs"] == before["host_syncs"]


def test_a_weight_that_only_an_unused_output_reaches_is_not_moved_by_the_optimizer():
    fn = handoff.torch_function(two_branches)
    a, b, c = (torch.randn(3, requires_grad=True) for _ in range(3))
    opt = torch.optim.SGD([a, b, c], lr=0.1, momentum=0.9, weight_decay=0.1)
    b0 = b.detach().clone()
    for _ in range(3):
        ya, _ = fn(a, b, c)
        opt.zero_grad()
        ya.sum().backward()
        opt.step()
    assert torch.equal(b.detach(), b0)


# ---- static arguments, the cache, the counters ------------------------------------------


@pytest.mark.parametrize("how", ["keyword", "static_argnums"])
def test_a_tensor_as_a_static_argument_is_refused_naming_it(how):
    fn = handoff.torch_function(lambda x, w: x * w, static_argnums=(1,) if how == "static_argnums" else ())
    x = torch.ones(2)
    with pytest.raises(TypeError, match="argument 1" if how == "static_argnums" else "keyword argument 'w'"):
        if how == "keyword":
            fn(x, w=torch.ones(2))
        else:
            fn(x, torch.ones(2))
    with pytest.raises(TypeError, match="array"):
        fn(x, w=np.ones(2)) if how == "keyword" else fn(x, jnp.ones(2))


def test_the_cache_is_bounded_and_warns_once_when_it_keeps_retracing():
    fn = handoff.torch_function(lambda x: x + 1, cache_size=3)
    with pytest.warns(UserWarning, match="retrac") as record:
        for n in range(1, 8):
            fn(torch.ones(n))
    assert fn.signatures == 3
    assert len([w for w in record if "retrac" in str(w.message)]) == 1
    assert fn(torch.ones(7)).tolist() == [2.0] * 7  # the newest are kept
    with pytest.raises(ValueError, match="cache_size"):
        handoff.torch_function(lambda x: x, cache_size=0)


def test_the_trace_counter_is_right_under_threads():
    import threading

    fn = handoff.torch_function(lambda x: x * 3)
    shapes = list(range(1, 17))
    barrier = threading.Barrier(4)

    def work(mine):
        barrier.wait()
        for n in mine:
            fn(torch.ones(n))

    threads = [threading.Thread(target=work, args=(shapes[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fn.signatures == 16 and fn.traces == 16


def test_a_copy_made_for_xla_is_counted():
    """torch_function hands XLA dense tensors (and, on CUDA, 16-byte aligned ones: the
    GPU script checks that): a tensor that is not is copied, and the copy counted."""
    fn = handoff.torch_function(lambda x: x * 2)
    t = torch.arange(12.0).reshape(3, 4)
    fn(t.T)  # compile outside the counted window
    before = handoff.stats()
    y = fn(t.T)
    after = handoff.stats()
    assert y.tolist() == (t.T * 2).tolist()
    assert after["copies"] - before["copies"] == 1
    assert after["bytes_copied"] - before["bytes_copied"] == 12 * 4
    before = handoff.stats()
    fn(t)  # dense: no copy
    assert handoff.stats()["copies"] == before["copies"]


def test_a_parameters_jax_view_is_kept_across_calls_and_sees_in_place_updates():
    """A layer keeps the JAX view of an ``nn.Parameter`` (``handoff._views``): later calls
    hand JAX only the other tensors, read the parameter's updates in place, and cross it
    again when it has new memory."""
    fn = handoff.torch_function(lambda x, w: x @ w)
    x, w = torch.randn(3, 4), torch.nn.Parameter(torch.randn(4, 2))
    fn(x, w)  # compile outside the counted window; the view is made
    before = handoff.stats()
    y = fn(x, w)
    after = handoff.stats()
    assert after["imports"] - before["imports"] == 1 + 1  # x to JAX, y to PyTorch
    torch.testing.assert_close(y, x @ w.detach())
    with torch.no_grad():
        w.mul_(-2.0)  # an optimizer's step
    torch.testing.assert_close(fn(x, w), x @ w.detach())
    w.data = torch.randn(4, 2)  # new memory: crossed again
    before = handoff.stats()
    torch.testing.assert_close(fn(x, w), x @ w.detach())
    assert handoff.stats()["imports"] - before["imports"] == 2 + 1


def test_a_call_of_kept_views_only_still_hands_one_tensor_to_jax_for_the_order():
    """The crossing makes JAX's stream wait for PyTorch's (the GPU check shows a stale
    read without it); a plain tensor is never kept."""
    from handoff import _views

    fn = handoff.torch_function(lambda w: w * 2.0)
    w = torch.nn.Parameter(torch.randn(5))
    fn(w)
    before = handoff.stats()
    fn(w)
    assert handoff.stats()["imports"] - before["imports"] == 1 + 1
    _views.ORDER = False
    try:
        before = handoff.stats()
        fn(w)
        assert handoff.stats()["imports"] - before["imports"] == 0 + 1
    finally:
        _views.ORDER = True
    t = torch.randn(5, requires_grad=True)
    fn(t)
    before = handoff.stats()
    fn(t)
    assert handoff.stats()["imports"] - before["imports"] == 1 + 1


def test_a_parameter_that_crosses_as_a_copy_is_not_kept():
    """A parameter XLA cannot read in place (here: not dense) is copied at each call, so
    its updates are seen."""
    fn = handoff.torch_function(lambda w: w * 2.0)
    w = torch.nn.Parameter(torch.arange(12.0).reshape(3, 4).T)
    fn(w)
    with torch.no_grad():
        w.add_(1.0)
    torch.testing.assert_close(fn(w), w.detach() * 2.0)
    (program,) = fn._programs.values()
    (traced,) = program._traced.values()
    assert traced.views._kept == [None]
