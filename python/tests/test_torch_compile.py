"""A model holding a ``handoff.torch_function`` layer under PyTorch's program
transformations, on the CPU: ``torch.library.opcheck`` of the two operators,
``torch.compile`` (Inductor and AOTAutograd, ``fullgraph=True``, dynamic batch sizes),
``torch.export`` saved and loaded in a fresh process, activation checkpointing (plain and
selective, naming the operator), ``no_grad``, ``inference_mode``, mixed
``requires_grad`` and autocast. Each runs against eager PyTorch with the same layer:
values and gradients equal (Inductor's tolerance where it compiles PyTorch's layers
around the JAX one), and 0 graph breaks.

DDP and FSDP2 are in ``test_distributed.py``.
"""

import contextlib
import os
import subprocess
import sys
import textwrap

import pytest

import handoff

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
import jax.numpy as jnp  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402


from distributed_train import Model, ln_gelu_matmul  # noqa: E402


def model_pair(seed=0):
    """Two models with equal parameters, each with its own layer (its own counters)."""
    torch.manual_seed(seed)
    a = Model(handoff.torch_function(ln_gelu_matmul))
    b = Model(handoff.torch_function(ln_gelu_matmul))
    b.load_state_dict(a.state_dict())
    return a, b


def train(model, step, batches, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for x in batches:
        opt.zero_grad(set_to_none=True)
        loss = step(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def batches(n, sizes=(8,), seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(sizes[i % len(sizes)], 16, generator=g) for i in range(n)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def graph_breaks():
    return sum(counters["graph_break"].values())


class CountingBackend:
    """A ``torch.compile`` backend (AOTAutograd, eager kernels) that counts the graphs it
    compiles and the calls of the compiled code: a call that Dynamo ran eagerly instead
    (past its recompile limit, say) is not counted."""

    def __init__(self, inner="aot_eager"):
        self.inner = torch._dynamo.lookup_backend(inner)
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        compiled = self.inner(gm, example_inputs)

        def run(*args):
            self.calls += 1
            return compiled(*args)

        return run


# ---- the operators ------------------------------------------------------------------------


@pytest.mark.parametrize("residuals", ["save", "dots", "recompute"])
def test_opcheck_passes_on_both_operators(residuals):
    """Every check of ``torch.library.opcheck``, but for a forward that hands out the
    VJP's residuals chosen by a policy other than ``recompute``: their number can change
    with the sizes (a mean's divisor is one residual more when the size is symbolic), so
    the dynamic-shape check cannot hold for it; under symbolic sizes the layer
    recomputes instead (the ten-batch-size test)."""
    utils = ["test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static"]
    if residuals == "recompute":
        utils.append("test_aot_dispatch_dynamic")
    layer = handoff.torch_function(ln_gelu_matmul, residuals=residuals)
    h, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 3, requires_grad=True)
    g, b = torch.ones(6, requires_grad=True), torch.zeros(6)
    layer(h, g, b, w)  # registers the program (its key)
    (program,) = layer._programs.values()
    assert (program.policy is None) == (residuals == "save")
    args = [h, g, b, w]
    torch.library.opcheck(torch.ops.handoff.call.default, (program.key, args), test_utils=utils)
    outs = torch.ops.handoff.call(program.key, args)
    saved = program.saved(args, outs)
    shapes = [d for a in args for d in a.shape]
    cts = [torch.randn(4, 3)]
    torch.library.opcheck(torch.ops.handoff.call_bwd.default, (program.key, shapes, saved, cts), test_utils=utils)
    # Without gradients: the forward alone, its own key.
    with torch.no_grad():
        layer(h, g, b, w)
    plain = [p for p in layer._programs.values() if not p.vjp]
    torch.library.opcheck(torch.ops.handoff.call.default, (plain[0].key, [t.detach() for t in args]))


def test_outputs_never_alias_inputs_or_each_other():
    """Custom operators' outputs may not alias: an input returned, an output returned
    twice, a residual that is an input or an output are each their own tensor."""
    layer = handoff.torch_function(lambda x, y: (x, x * y, x * y, jnp.tanh(y)), residuals="save")
    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    outs = layer(x, y)
    ptrs = [t.data_ptr() for t in outs]
    assert len(set(ptrs)) == 4 and x.data_ptr() not in ptrs and y.data_ptr() not in ptrs
    sum(o.sum() for o in outs).backward()
    torch.testing.assert_close(x.grad, 1 + 2 * y.detach())
    torch.testing.assert_close(y.grad, 2 * x.detach() + 1 - torch.tanh(y.detach()) ** 2)


def test_the_eager_fast_path_and_the_dispatcher_give_the_same():
    """Eager calls skip the dispatcher where nothing could see them; under a dispatch
    mode (here one that only records what it sees) they go through it, the operator is
    seen, and values and gradients are the same."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    runs = []
    for observed in (False, True):
        torch.manual_seed(0)
        model = Model(handoff.torch_function(ln_gelu_matmul))
        seen = Seen()
        with seen if observed else contextlib.nullcontext():
            y = model(torch.randn(4, 16))
            y.square().sum().backward()
        runs.append((y.detach(), [p.grad for p in model.parameters()]))
        names = {str(op) for op in seen.ops}
        assert ("handoff.call.default" in names and "handoff.call_bwd.default" in names) == observed
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


# ---- torch.compile ------------------------------------------------------------------------


def test_a_compiled_step_hands_no_parameter_to_jax_again(monkeypatch):
    """After the first step, the compiled forward and backward read the layer's kept
    parameter views (``handoff._views``), as eager calls do: only activations and
    cotangents cross. The control, a backward that does not look for the views, hands
    the three parameters it reads (saved inputs) to JAX again at every step."""
    from handoff import _program, _views

    params = set()
    crossed = []

    def spy(real):
        def counting(tensors):
            crossed.extend(id(t) in params for t in tensors)
            return real(tensors)
        return counting

    monkeypatch.setattr(_program, "_to_jax_many", spy(_program._to_jax_many))
    monkeypatch.setattr(_views, "_to_jax_many", spy(_views._to_jax_many))

    def params_crossed():
        torch._dynamo.reset()
        model = Model(handoff.torch_function(ln_gelu_matmul))
        params.clear()
        params.update(id(p) for p in model.parameters())
        step = torch.compile(model, backend="aot_eager")
        per_step = []
        for x in batches(4):
            crossed.clear()
            step(x).square().mean().backward()
            per_step.append(sum(crossed))
        return per_step

    assert params_crossed() == [3, 0, 0, 0]  # gamma, beta, w: the first forward keeps them
    assert graph_breaks() == 0
    monkeypatch.setattr(_program.Traced, "_kept_view", lambda self, p, t: None)
    assert params_crossed() == [6, 3, 3, 3]  # the control: all three in every backward


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compile_trains_as_eager_for_20_steps(fullgraph):
    """Inductor (the default backend) compiles the PyTorch layers around the JAX one:
    its tolerance (rtol 1e-4, atol 1e-5, float32) bounds the difference."""
    eager, compiled = model_pair()
    data = batches(20)
    want = train(eager, eager, data)
    got = train(compiled, torch.compile(compiled, fullgraph=fullgraph), data)
    assert graph_breaks() == 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for p, q in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_ten_batch_sizes_compile_once_dynamic_and_never_fall_back():
    eager, compiled = model_pair()
    backend = CountingBackend()
    step = torch.compile(compiled, backend=backend, fullgraph=True)
    sizes = (3, 5, 7, 8, 9, 11, 13, 16, 17, 31, 2, 64)
    data = batches(len(sizes), sizes)
    want = train(eager, eager, data)
    got = train(compiled, step, data)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert graph_breaks() == 0
    # The first size is compiled static, the second makes the batch size dynamic:
    # every later size runs the dynamic graph, none eagerly.
    assert backend.graphs == 2, backend.graphs
    assert backend.calls == len(sizes)


def test_a_function_that_cannot_take_symbolic_sizes_says_what_to_do():
    def by_size(x):  # a Python branch on a size
        return x * 2 if x.shape[0] > 4 else x * 3

    layer = handoff.torch_function(by_size)
    x = torch.randn(6, 2)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(Exception, match=r"symbolic sizes.*dynamic=False"):
        torch.compile(lambda t: layer(t), backend="aot_eager", fullgraph=True)(x)
    # Static shapes compile.
    static = torch.compile(lambda t: layer(t), backend="aot_eager", dynamic=False)
    torch.testing.assert_close(static(torch.ones(6, 2)), torch.full((6, 2), 2.0))


def test_no_grad_inference_mode_and_mixed_requires_grad_compile():
    layer = handoff.torch_function(ln_gelu_matmul)
    step = torch.compile(lambda *a: layer(*a), backend="aot_eager", fullgraph=True)
    h, g, b, w = torch.randn(4, 6), torch.ones(6), torch.zeros(6), torch.randn(6, 3)
    want = layer(h, g, b, w)
    with torch.no_grad():
        torch.testing.assert_close(step(h, g, b, w), want)
    with torch.inference_mode():
        torch.testing.assert_close(step(h, g, b, w), want)
    hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
    y = step(hg, g, b, wg)
    y.square().sum().backward()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    layer(h2, g, b, w2).square().sum().backward()
    torch.testing.assert_close(hg.grad, h2.grad)
    torch.testing.assert_close(wg.grad, w2.grad)
    assert graph_breaks() == 0


def test_tracing_runs_no_jax():
    """Dynamo's and AOTAutograd's tracing use the fake implementations: the compiled
    step's first call runs exactly one forward and one backward of JAX, as an eager
    step does."""
    eager, compiled = model_pair()
    x = torch.randn(8, 16)
    eager(x).sum().backward()
    step = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    step(x).sum().backward()
    assert compiled.layer.executions == eager.layer.executions == 2


def test_the_jax_configuration_at_compile_is_the_graphs():
    """Dynamo does not guard on JAX's configuration: it is part of the operator key, so a
    graph compiled under x64 runs in x64 wherever it is called."""
    layer = handoff.torch_function(lambda x: x * 2)
    step = torch.compile(lambda t: layer(t), backend="aot_eager", fullgraph=True)
    with jax.enable_x64(True):
        x = torch.ones(3, dtype=torch.float64)
        assert step(x).dtype == torch.float64
    assert step(x).dtype == torch.float64


def test_autocast_passes_the_tensors_dtypes_as_they_are():
    """Policy: under ``torch.autocast`` the JAX function receives each tensor in its own
    dtype (the operator is on no autocast list, as any custom operator); PyTorch's
    layers around it are cast as usual. Cast inside JAX where a lower precision is
    wanted."""
    seen = []

    def f(x, w):
        seen.append((x.dtype, w.dtype))
        return x @ w

    layer = handoff.torch_function(f)
    lin = torch.nn.Linear(4, 4)
    x, w = torch.randn(2, 4), torch.randn(4, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = lin(x)
        y = layer(h, w)
    assert h.dtype == torch.bfloat16 and y.dtype == torch.float32
    assert seen[-1] == (jnp.bfloat16, jnp.float32)
    y.sum().backward()
    assert w.grad.dtype == torch.float32


# ---- torch.export -------------------------------------------------------------------------


@pytest.mark.parametrize("dynamic", [False, True])
def test_export_saves_and_loads_in_a_fresh_process(tmp_path, dynamic):
    torch.manual_seed(0)
    model = Model(handoff.torch_function(ln_gelu_matmul)).eval()
    x = torch.randn(8, 16)
    shapes = {"x": {0: torch.export.Dim("batch", min=2, max=64)}} if dynamic else None
    before = model.layer.executions
    ep = torch.export.export(model, (x,), dynamic_shapes=shapes)
    assert model.layer.executions == before, "export traced without running JAX"
    assert any("handoff.call" in str(n.target) for n in ep.graph.nodes)
    torch.export.save(ep, tmp_path / "model.pt2")
    xs = [x, torch.randn(5, 16)] if dynamic else [x]
    torch.save({"xs": xs, "want": [model(t).detach() for t in xs]}, tmp_path / "io.pt")
    script = textwrap.dedent(
        f"""
        import torch, handoff
        ep = torch.export.load({str(tmp_path / "model.pt2")!r})
        io = torch.load({str(tmp_path / "io.pt")!r})
        for x, want in zip(io["xs"], io["want"]):
            torch.testing.assert_close(ep.module()(x), want)
        print("loaded and equal", len(io["xs"]))
        """
    )
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"loaded and equal {len(xs)}" in run.stdout


# ---- checkpointing ------------------------------------------------------------------------


def test_checkpoint_and_selective_checkpointing_naming_the_operator():
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    eager, ckpt = model_pair()
    x = torch.randn(8, 16)
    eager(x).square().mean().backward()
    runs = ckpt.layer.executions
    checkpoint(ckpt, x, use_reentrant=False).square().mean().backward()
    assert ckpt.layer.executions - runs == 3, "forward, recomputed forward, backward"
    for p, q in zip(ckpt.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)

    def policy(ctx, op, *args, **kwargs):
        if op is torch.ops.handoff.call.default:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    ckpt.zero_grad(set_to_none=True)
    runs = ckpt.layer.executions
    contexts = lambda: create_selective_checkpoint_contexts(policy)  # noqa: E731
    checkpoint(ckpt, x, use_reentrant=False, context_fn=contexts).square().mean().backward()
    assert ckpt.layer.executions - runs == 2, "the JAX layer's outputs saved, not recomputed"
    for p, q in zip(ckpt.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    # Compiled, too.
    ckpt.zero_grad(set_to_none=True)
    step = torch.compile(lambda t: checkpoint(ckpt, t, use_reentrant=False), backend="aot_eager", fullgraph=True)
    step(x).square().mean().backward()
    assert graph_breaks() == 0
    for p, q in zip(ckpt.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)

