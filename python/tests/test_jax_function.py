"""handoff.jax_function and handoff.jax_module on the CPU: PyTorch code inside jax.jit,
jax.grad and jax.vmap.

Values are compared with PyTorch's own, gradients with torch.autograd's (float32
tolerance). GPU-only behaviour (XLA's stream, host-sync detection) is in the test at the
end, skipped without CUDA, and in bench/jax_function_checks.py.
"""

import functools
import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import handoff

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed", allow_module_level=True)
import torch  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def t(a, grad=False):
    return torch.tensor(np.asarray(a)).requires_grad_(grad)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), b.detach().numpy() if isinstance(b, torch.Tensor) else b, **TOL)


def ln_gelu_matmul(h, gamma, w):
    z = torch.nn.functional.layer_norm(h, h.shape[-1:]) * gamma
    return torch.nn.functional.gelu(z) @ w


def two_outputs(a, b):
    return {"y": torch.tanh(a @ b), "norm": (a * a).sum(-1)}


class Block(torch.nn.Module):
    """Attention through scaled_dot_product_attention, then an MLP."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(x)


def test_import_handoff_imports_neither_framework():
    code = "import sys, handoff; print('torch' in sys.modules, 'jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_values_equal_pytorch_eager_and_jitted():
    a, b = rand(5, 4), rand(4, 3)
    fn = handoff.jax_function(two_outputs)
    want = two_outputs(t(a), t(b))
    for got in (fn(a, b), jax.jit(fn)(jnp.asarray(a), jnp.asarray(b))):
        assert set(got) == {"y", "norm"}
        close(got["y"], want["y"]), close(got["norm"], want["norm"])
    assert fn.traces == 1  # eager and jitted calls of one signature share its trace


def test_grad_through_jitted_step_equals_autograd():
    h, gamma, w = rand(6, 8), rand(8), rand(8, 3)
    fn = handoff.jax_function(ln_gelu_matmul)
    loss = lambda h, g, w: jnp.mean(jnp.sin(fn(h, g, w)))  # noqa: E731
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(h, gamma, w)
    th, tg, tw = t(h, True), t(gamma, True), t(w, True)
    want = torch.sin(ln_gelu_matmul(th, tg, tw)).mean()
    want.backward()
    close(value, want)
    for g, x in zip(grads, (th, tg, tw)):
        close(g, x.grad)


def test_symbolic_zero_cotangents_and_undifferentiated_inputs():
    """Only the inputs JAX differentiates are tracked by PyTorch's autograd, and an
    output the loss does not use gets no cotangent."""
    tracked = []

    def spy(a, b):
        tracked.append(tuple(torch._C._functorch.is_gradtrackingtensor(x) for x in (a, b)))
        return two_outputs(a, b)

    fn = handoff.jax_function(spy)
    a, b = rand(5, 4), rand(4, 3)
    grad_b = jax.grad(lambda a, b: fn(a, b)["y"].sum(), argnums=1)
    g = jax.jit(grad_b)(a, b)
    tb = t(b, True)
    two_outputs(t(a), tb)["y"].sum().backward()
    close(g, tb.grad)
    assert tracked[-1] == (False, True)  # the backward's run: b only
    # The backward callback takes a, b and one cotangent (y's; "norm" is unused) and
    # gives one gradient (b's).
    calls = [e for e in jax.make_jaxpr(grad_b)(a, b).jaxpr.eqns if e.primitive.name == "buffer_callback"]
    assert [(len(e.invars), len(e.outvars)) for e in calls][-1] == (3, 1)


def test_mlp_module_params_and_input_grads():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    fn, params = handoff.jax_module(model)
    assert set(params) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    x = rand(16, 4)
    step = jax.jit(jax.value_and_grad(lambda p, x: jnp.mean(fn(p, x) ** 2), argnums=(0, 1)))
    value, (gp, gx) = step(params, x)
    tx = t(x, True)
    want = (model(tx) ** 2).mean()
    want.backward()
    close(value, want)
    close(gx, tx.grad)
    for name, p in model.named_parameters():
        close(gp[name], p.grad)


def test_sdpa_block_module_trains_like_pytorch():
    torch.manual_seed(1)
    block = Block()
    fn, params = handoff.jax_module(block)
    x = rand(2, 6, 16)
    value, grads = jax.jit(jax.value_and_grad(lambda p, x: jnp.mean(fn(p, x) ** 2)))(params, x)
    want = (block(t(x)) ** 2).mean()
    want.backward()
    close(value, want)
    for name, p in block.named_parameters():
        np.testing.assert_allclose(np.asarray(grads[name]), p.grad.numpy(), rtol=1e-4, atol=1e-5)
    # An SGD step in JAX leaves the module's tensors as they were.
    before = block.proj.weight.detach().clone()
    jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    assert torch.equal(block.proj.weight.detach(), before)


def test_integer_inputs_get_float0_cotangents():
    fn = handoff.jax_function(lambda x, idx: x[idx] * 2.0)
    x, idx = rand(5, 3), jnp.array([4, 0, 4], dtype=jnp.int32)
    gx, gi = jax.jit(jax.grad(lambda x, i: fn(x, i).sum(), argnums=(0, 1), allow_int=True))(x, idx)
    assert gi.dtype == jax.dtypes.float0 and gi.shape == (3,)
    tx = t(x, True)
    (tx[torch.tensor([4, 0, 4])] * 2.0).sum().backward()
    close(gx, tx.grad)


def test_int64_result_is_cast_to_int32_without_x64():
    fn = handoff.jax_function(lambda x: x.argmax(-1))
    x = rand(4, 7)
    got = jax.jit(fn)(x)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), x.argmax(-1))


def test_in_place_change_of_an_input_is_refused_at_trace_time():
    def scale(x):
        x.mul_(2.0)
        return x + 1

    with pytest.raises(ValueError, match=r"modified argument 0 in place"):
        jax.jit(handoff.jax_function(scale))(jnp.ones(3))


def test_in_place_change_seen_only_at_run_time_is_refused():
    """FakeTensorMode cannot run .item(): the change is found after the call."""
    def scale(x, w):
        w["k"].add_(float(x.sum().item()))
        return x * 2

    fn = handoff.jax_function(scale, lambda x, w: x)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"modified argument 1\['k'\] in place"):
        jax.block_until_ready(jax.jit(fn)(jnp.ones(3), {"k": jnp.ones(2)}))
    assert isinstance(fn.last_error, ValueError)


def test_wrong_shape_and_dtype_name_the_output():
    x = jnp.ones((3, 4))
    spec = {"a": jax.ShapeDtypeStruct((3, 4), jnp.float32)}
    with pytest.raises(ValueError, match=r"output \['a'\] has shape \(4, 3\), out_shapes says \(3, 4\)"):
        jax.jit(handoff.jax_function(lambda x: {"a": x.T}, spec))(x)
    with pytest.raises(TypeError, match=r"output \['a'\] is torch.float64, out_shapes says torch.float32"):
        jax.jit(handoff.jax_function(lambda x: {"a": x.double()}, spec))(x)
    with pytest.raises(TypeError, match="float64 but JAX's x64 mode is off"):
        jax.jit(handoff.jax_function(lambda x: x, jax.ShapeDtypeStruct((3, 4), np.float64)))(x)
    # A shape only the run shows (FakeTensorMode cannot run .item()).
    fn = handoff.jax_function(lambda x: x[: int(x.sum().item())], jax.ShapeDtypeStruct((3,), jnp.float32))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"output has shape \(2,\), out_shapes says \(3,\)"):
        jax.block_until_ready(jax.jit(fn)(jnp.ones(2)))


def test_a_raising_function_is_reported_with_its_exception():
    def broken(x):
        if x.sum() > 0:  # real tensors only: the fake run cannot branch on values
            raise KeyError("no such layer")
        return x

    fn = handoff.jax_function(broken, lambda x: x)
    raised = r"jax_function\(broken\): the PyTorch function raised KeyError: 'no such layer'"
    with pytest.raises(jax.errors.JaxRuntimeError, match=raised):
        jax.block_until_ready(jax.jit(fn)(jnp.ones(3)))
    assert isinstance(fn.last_error, RuntimeError) and isinstance(fn.last_error.__cause__, KeyError)
    with pytest.raises(TypeError, match="FakeTensorMode could not compute the output shapes"):
        jax.jit(handoff.jax_function(broken))(jnp.ones(3))


def test_jvp_is_refused_by_custom_vjp():
    fn = handoff.jax_function(torch.tanh)
    with pytest.raises(TypeError, match=r"can't apply forward-mode autodiff \(jvp\) to a custom_vjp"):
        jax.jvp(fn, (jnp.ones(3),), (jnp.ones(3),))


def test_vmap_runs_torch_func_vmap_once():
    calls = []

    def proj(x, w):
        calls.append(x.shape)
        return torch.tanh(x @ w)

    fn = handoff.jax_function(proj)
    xs, w = rand(3, 5, 4), rand(4, 2)
    got = jax.jit(jax.vmap(fn, in_axes=(0, None)))(xs, w)
    close(got, torch.tanh(t(xs) @ t(w)))
    assert calls[-1] == (5, 4)  # inside torch.func.vmap: one example's shape, one call
    # Nested, batched in different arguments, and per-example gradients.
    ws = rand(2, 4, 2)
    got = jax.vmap(jax.vmap(fn, in_axes=(None, 0)), in_axes=(0, None))(xs, ws)
    assert got.shape == (3, 2, 5, 2)
    close(got[2, 1], torch.tanh(t(xs[2]) @ t(ws[1])))
    grad_w = jax.grad(lambda x, w: fn(x, w).sum(), argnums=1)
    per_example = jax.jit(jax.vmap(grad_w, in_axes=(0, None)))(xs, w)
    for i in range(3):
        tw = t(w, True)
        torch.tanh(t(xs[i]) @ tw).sum().backward()
        close(per_example[i], tw.grad)


def test_vmap_sequential_and_refused():
    xs = rand(3, 4)
    seq = handoff.jax_function(torch.tanh, vmap_method="sequential")
    close(jax.vmap(seq)(xs), torch.tanh(t(xs)))
    with pytest.raises(NotImplementedError, match="vmap_method"):
        jax.vmap(handoff.jax_function(torch.tanh, vmap_method=None))(xs)


def test_out_tensors_skip_the_copy():
    def sincos(x, out=None):
        if out is None:
            return torch.sin(x), torch.cos(x)
        torch.sin(x, out=out[0])
        torch.cos(x, out=out[1])
        return None

    x = rand(64)
    copied = {}
    for out in (False, True):
        step = jax.jit(handoff.jax_function(sincos, out=out))
        jax.block_until_ready(step(x))  # compiled outside the count
        before = handoff.stats()
        s, c = step(x)
        jax.block_until_ready((s, c))
        after = handoff.stats()
        copied[out] = (after["copies"] - before["copies"], after["bytes_copied"] - before["bytes_copied"])
        close(s, np.sin(x)), close(c, np.cos(x))
    assert copied == {False: (2, 2 * 64 * 4), True: (0, 0)}
    # The backward calls the function without out= (autograd cannot write into out=).
    g = jax.grad(lambda x: handoff.jax_function(sincos, out=True)(x)[0].sum())(x)
    close(g, np.cos(x))


def test_out_that_is_not_written_is_refused():
    fn = handoff.jax_function(lambda x, out=None: torch.sin(x), out=True)
    with pytest.raises(jax.errors.JaxRuntimeError, match="must write its results into the tensors passed as"):
        jax.block_until_ready(jax.jit(fn)(jnp.ones(3)))


def test_dropout_backward_replays_the_forward_mask():
    torch.manual_seed(4)
    layer = handoff.jax_function(torch.nn.Dropout(0.5))

    @jax.jit
    def step(x):
        y, pullback = jax.vjp(layer, x)
        return y, pullback(jnp.ones_like(y))[0]

    x = jnp.full((256,), 3.0)
    masks = []
    for _ in range(2):
        y, g = step(x)
        kept = np.asarray(y) != 0
        assert 0 < kept.sum() < 256
        np.testing.assert_array_equal(np.asarray(g), np.where(kept, 2.0, 0.0))  # the forward's mask
        masks.append(kept)
    assert (masks[0] != masks[1]).any()  # each step draws a new mask
    assert [s.random for s in layer._signatures.values()] == [True]
    deterministic = handoff.jax_function(torch.tanh)
    deterministic(jnp.ones(2))
    assert [s.random for s in deterministic._signatures.values()] == [False]


def test_operators_that_could_draw_but_are_told_not_to_are_not_random():
    """An operator tagged nondeterministic_seeded draws only where its arguments allow:
    attention without dropout (every plain scaled_dot_product_attention), a dropout of
    p=0 or in eval mode. The controls draw."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    cases = {
        "attention": (lambda q: sdpa(q, q, q, is_causal=True), False),
        "attention with dropout": (lambda q: sdpa(q, q, q, dropout_p=0.1), True),
        "dropout p=0": (lambda q: torch.nn.functional.dropout(q, 0.0), False),
        "dropout eval": (lambda q: torch.ops.aten.native_dropout(q, 0.5, False)[0], False),
        "dropout": (lambda q: torch.nn.functional.dropout(q, 0.5), True),
    }
    for name, (f, random) in cases.items():
        fn = handoff.jax_function(f)
        fn(jnp.ones((1, 2, 4, 8)))
        assert [s.random for s in fn._signatures.values()] == [random], name


def test_random_backward_on_cuda_is_refused_at_trace_time_under_host_syncs_error():
    """On CUDA the forward's generator state would have to be read back (a host sync):
    refused while jax.grad traces, before anything runs. The signature's device is set
    to CUDA by hand: only fake tensors are made, so no GPU is needed."""
    fn = handoff.JaxFunction(torch.nn.Dropout(0.5), _device=torch.device("cuda", 0))
    with pytest.raises(RuntimeError, match="draws random numbers, and on CUDA its backward"):
        jax.grad(lambda x: fn(x).sum())(jnp.ones(4))


def test_dropout_inside_scan_replays_each_steps_mask():
    """The generator state is a residual like any other: a scan's backward gets each
    step's own."""
    torch.manual_seed(3)
    drop = handoff.jax_function(lambda x, w: torch.nn.functional.dropout(x, 0.5) * w)

    def body(c, w):
        y = drop(c, w)
        return y, y

    def f(ws, x):
        c, ys = jax.lax.scan(body, x, ws)
        return c.sum(), ys

    (_, ys), g = jax.jit(jax.value_and_grad(f, has_aux=True))(jnp.ones((3, 64)), jnp.ones(64))
    alive = np.asarray(ys[-1]) != 0  # an element survives only if every step kept it
    assert 0 < alive.sum() < 64
    for k in range(3):  # d(sum)/d(w_k) = y_final / w_k: nonzero exactly where alive
        np.testing.assert_array_equal(np.asarray(g[k]) != 0, alive)


def test_batchnorm_buffers_are_constants():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    model[1].running_mean.uniform_()
    x = rand(16, 4)
    fn, params = handoff.jax_module(model)  # training mode: the statistics would change
    with pytest.raises(ValueError, match=r"modified buffer '1\.(running_mean|num_batches_tracked)' in place"):
        jax.jit(fn)(params, x)
    assert int(model[1].num_batches_tracked) == 0  # refused before anything ran
    model.eval()
    fn, params = handoff.jax_module(model)
    close(jax.jit(fn)(params, x), model(t(x)))


def test_argument_errors():
    with pytest.raises(TypeError, match="must be callable"):
        handoff.jax_function(3)
    with pytest.raises(ValueError, match="vmap_method"):
        handoff.jax_function(torch.tanh, vmap_method="loop")
    with pytest.raises(ValueError, match="host_syncs"):
        handoff.jax_function(torch.tanh, host_syncs="sometimes")
    fn = handoff.jax_function(torch.tanh)
    with pytest.raises(TypeError, match=r"argument 0 is a Tensor: pass JAX arrays"):
        fn(torch.ones(3))
    with pytest.raises(TypeError, match="keyword arguments are not supported"):
        fn(x=jnp.ones(3))
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        handoff.jax_module(torch.tanh)
    with pytest.raises(TypeError, match="complex arrays are not supported"):
        fn(jnp.ones(3, jnp.complex64))


def test_decorator_forms():
    @handoff.jax_function
    def double(x):
        return x * 2

    @functools.partial(handoff.jax_function, out_shapes=lambda x: x)
    def triple(x):
        return x * 3

    assert isinstance(double, handoff.JaxFunction) and double.__name__ == "double"
    close(double(jnp.ones(2)) + triple(jnp.ones(2)), np.full(2, 5.0))


def test_on_cuda_pytorch_runs_on_xlas_stream_without_host_syncs():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: XLA's stream and host-sync detection are checked on a GPU "
                    "(here and in bench/jax_function_checks.py)")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as e:
        pytest.skip(f"JAX has no GPU backend: {e}")
    streams = []

    def on_stream(x):
        streams.append(torch.cuda.current_stream().cuda_stream)
        return x * 2

    x = jax.device_put(jnp.ones(4), gpu)
    before = handoff.stats()["host_syncs"]
    got = jax.jit(handoff.jax_function(on_stream))(x)
    close(jax.device_get(got), np.full(4, 2.0))
    assert streams[-1] != torch.cuda.default_stream().cuda_stream
    assert handoff.stats()["host_syncs"] == before
    syncing = handoff.jax_function(lambda x: x * x.sum().item(), lambda x: x)
    with pytest.raises(jax.errors.JaxRuntimeError, match="synchronized the host with the GPU"):
        jax.block_until_ready(jax.jit(syncing)(x))

