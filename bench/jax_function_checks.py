#!/usr/bin/env python3
"""``handoff.jax_function`` on CUDA: PyTorch modules inside a jitted JAX training step
(GPU machine; JSON lines, exit 1 on a failed check, ``SKIPPED`` without CUDA).

Figures:

- ``grads``: a 2-layer MLP and a block of ``scaled_dot_product_attention`` and an MLP
  (``torch.nn.Module`` s through ``handoff.jax_module``) in ``jax.jit(jax.value_and_grad)``:
  the loss and every parameter's gradient equal PyTorch's own (float32, TF32 off).
- ``no_host_sync``: the step under ``host_syncs="error"`` (PyTorch's sync debug mode
  "error" in every callback) with ~50 ms of JAX work queued ahead of it in the same
  program: every callback finds XLA's stream still busy when it runs (an event recorded
  on it from inside the callback, not yet complete: the callback did not wait), the
  step returns in under a fifth of that, its result is not ready then, and
  ``handoff.stats()["host_syncs"]`` is unchanged. The control, a module that calls
  ``.item()``, is refused with the sync named; with ``host_syncs="allow"`` its callback
  finds the stream idle (it waited).
- ``command_buffers``: with XLA's command buffers as JAX configures them by default
  (``XLA_FLAGS`` unset), ``CALLS`` calls of a jitted training step with JAX work on both
  sides of the PyTorch MLP (a ``sin`` before, a squared mean after), each on a new input:
  the loss and every gradient equal PyTorch's own step on the same input, every call.
- ``lifetime``: the other direction's lifetime trials. A jitted program queues ~50 ms of
  JAX work, then a PyTorch function on its result whose temporaries are freed when it
  returns; right after the call returns, PyTorch allocates tensors of the same size on
  its own stream and fills them, while XLA's stream still has the function's work
  queued. Over ``TRIALS`` trials every result is right: the function ran on XLA's stream,
  after the queued work, and PyTorch's allocator keeps the memory it freed there for that
  stream's later work. The control (``_jax_callback.ON_XLA_STREAM`` off: the function on
  PyTorch's stream, unordered) is wrong in most trials.
- ``random``: a PyTorch function that draws (dropout) inside ``jax.jit(jax.vjp(...))`` on
  CUDA. Its backward re-runs it with the forward's random state, which it reads back to
  the host: one host sync, so with ``host_syncs="error"`` (the default) the call is
  refused with handoff's message; with ``"allow"`` the gradient with respect to ``w`` of
  ``dropout(x) * w`` is exactly the forward's output divided by ``w`` (the same mask),
  with 1 host sync counted. The control (``random=False``: the state not kept) draws
  another mask in the backward, and the two differ.
- ``step_time``: median ms per training step (forward, ``jax.grad`` or ``backward``, an
  SGD update) of handoff.jax_function, rdyro's torch2jax (``torch2jax_with_vjp``, an
  XLA custom call; reported only, skipped where it does not import or build),
  torch-jax-interop's ``torch_module_to_jax``
  (``jax.pure_callback``: every input to the host and back; reported only, skipped
  where the package does not import), the same step in JAX alone and in PyTorch alone,
  at a host-bound and a GPU-bound size of each model, in one run.
"""

import copy
import time

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import check, emit

QUEUED_MS = 50.0
MATRIX = 8192  # bf16 matmuls of MATRIX x MATRIX keep XLA's stream busy
LR = 1e-3
CALLS = 100
TRIALS = 5
SIZES = {  # model -> bound -> (batch, [sequence,] width)
    "mlp": {"host": (64, 256), "gpu": (8192, 2048)},
    "block": {"host": (2, 32, 64), "gpu": (16, 1024, 1024)},
}
VARIANTS = ("handoff", "torch_jax_interop", "torch2jax", "jax", "torch")
PEERS = ("torch_jax_interop", "torch2jax")


def main():
    ap = harness.parser(__doc__)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repetition")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--models", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--bounds", nargs="+", default=["host", "gpu"], choices=["host", "gpu"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = ap.parse_args()
    torch, jax, jnp = harness.import_frameworks()
    import handoff

    why = harness.why_no_cuda(torch, jax, handoff)
    if why:
        harness.skip(why)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    jax.config.update("jax_default_matmul_precision", "highest")
    peers = {"torch_jax_interop": load_torch_jax_interop(), "torch2jax": load_torch2jax()}
    harness.env(torch=torch, jax=jax, handoff=handoff.__version__, gpu=torch.cuda.get_device_name(0),
                torch_jax_interop=peers["torch_jax_interop"][1],
                torch2jax=peers["torch2jax"][1], python=harness.PYTHON)
    for c in (check_grads, check_no_host_sync, check_command_buffers, check_lifetime, check_random):
        try:  # a check that raises fails the run, and the others still run
            c(torch, jax, jnp, handoff)
        except Exception as e:  # noqa: BLE001
            check(False, f"{c.__name__} raised {type(e).__name__}: {str(e)[:600]}")
    for name in args.models:
        for bound in args.bounds:
            time_steps(torch, jax, jnp, handoff, peers, name, bound, args)


# ---- models -----------------------------------------------------------------------------


def make_model(torch, name, size):
    """``(module, input)`` on CUDA, seeded."""
    torch.manual_seed(0)
    nn = torch.nn
    if name == "mlp":
        b, d = size
        model = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        return model.cuda(), torch.randn(b, d, device="cuda")
    b, s, d = size
    return Block(torch, d, heads=max(1, d // 64)).cuda(), torch.randn(b, s, d, device="cuda")


def Block(torch, d, heads):
    """Causal attention through ``scaled_dot_product_attention``, then an MLP, each with
    a residual."""
    nn = torch.nn

    class _Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return x + self.mlp(x)

    return _Block()


def jax_model(jax, jnp, name, heads):
    """The same forward in JAX, on the module's parameter names (weights as PyTorch
    keeps them: ``(out, in)``)."""
    def linear(p, key, x):
        return x @ p[key + ".weight"].T + p[key + ".bias"]

    def mlp(p, x, prefix):
        return linear(p, prefix + "2", jax.nn.gelu(linear(p, prefix + "0", x), approximate=False))

    if name == "mlp":
        return lambda p, x: mlp(p, x, "")

    def block(p, x):
        b, s, d = x.shape
        q, k, v = (linear(p, "qkv", x).reshape(b, s, 3, heads, d // heads)[:, :, i] for i in range(3))
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + linear(p, "proj", a.reshape(b, s, d))
        return x + mlp(p, x, "mlp.")

    return block


def jax_step(jax, jnp, forward):
    """A jitted training step of ``forward(params, x)``: ``(loss, new params, grads)``."""
    @jax.jit
    def step(p, x):
        loss, g = jax.value_and_grad(lambda p: jnp.mean(forward(p, x) ** 2))(p)
        return loss, jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g), g

    return step


def torch_grads(torch, model, x):
    model.zero_grad(set_to_none=True)
    loss = (model(x) ** 2).mean()
    loss.backward()
    return loss.item(), {k: p.grad.detach().clone() for k, p in model.named_parameters()}


# ---- checks -----------------------------------------------------------------------------


def grad_errors(grads, want):
    """Per parameter: the largest difference between JAX's gradient and PyTorch's,
    relative to PyTorch's largest magnitude."""
    import numpy as np

    return {k: float(np.max(np.abs(np.asarray(grads[k]) - want[k].cpu().numpy())) /
                     (float(want[k].abs().max()) + 1e-12)) for k in want}


def check_grads(torch, jax, jnp, handoff):
    for name, bounds in SIZES.items():
        model, x = make_model(torch, name, bounds["host"])
        fn, params = handoff.jax_module(model)
        loss, _, grads = jax_step(jax, jnp, fn)(params, handoff.to_jax(x))
        want_loss, want = torch_grads(torch, model, x)
        errors = grad_errors(grads, want)
        worst = max(errors.values())
        emit(figure="grads", model=name, size=list(bounds["host"]), loss=float(loss), torch_loss=want_loss,
             max_rel_error=worst, worst_param=max(errors, key=errors.get))
        check(abs(float(loss) - want_loss) <= 1e-5 * max(1.0, abs(want_loss)),
              f"{name}: loss differs from PyTorch's")
        check(worst <= 1e-4, f"{name}: gradients differ from PyTorch's (max relative error {worst:.2e})")


def check_command_buffers(torch, jax, jnp, handoff):
    import os

    model, _ = make_model(torch, "mlp", SIZES["mlp"]["host"])
    fn, params = handoff.jax_module(model)

    @jax.jit
    def step(p, x):  # JAX fusions on both sides of the callbacks: XLA's command buffers
        return jax.value_and_grad(lambda p: jnp.mean(fn(p, jnp.sin(x) * 0.5 + x) ** 2))(p)

    wrong, worst = [], 0.0
    for i in range(CALLS):
        x = torch.randn(SIZES["mlp"]["host"], device="cuda") * (1 + i % 4)
        loss, grads = step(params, handoff.to_jax(x))
        want_loss, want = torch_grads(torch, model, torch.sin(x) * 0.5 + x)
        err = max(*grad_errors(grads, want).values(), abs(float(loss) - want_loss) / max(1.0, abs(want_loss)))
        worst = max(worst, err)
        if err > 1e-4:
            wrong.append(i)
    emit(figure="command_buffers", xla_flags=os.environ.get("XLA_FLAGS"), calls=CALLS, wrong=len(wrong),
         first_wrong=wrong[:5], max_rel_error=worst)
    check(not wrong, f"with XLA's command buffers, {len(wrong)} of {CALLS} steps differ from PyTorch's")


def random_mismatch(torch, jax, jnp, handoff, random, host_syncs="allow"):
    """``(elements where the gradient is not the forward's mask, zeros in the mask)``."""
    import numpy as np

    fn = handoff.jax_function(lambda x, w: torch.nn.functional.dropout(x, 0.5, training=True) * w,
                              random=random, host_syncs=host_syncs)

    @jax.jit
    def step(x, w):
        y, pull = jax.vjp(lambda w: fn(x, w), w)
        return y, pull(jnp.ones_like(y))[0]

    x, w = jnp.ones((256, 256)) + jnp.arange(256.0), jnp.full((256, 256), 2.0)
    y, gw = (np.asarray(a) for a in step(x, w))
    return int(np.sum(gw != y / 2.0)), int(np.sum(y == 0))


def check_random(torch, jax, jnp, handoff):
    try:
        random_mismatch(torch, jax, jnp, handoff, None, host_syncs="error")
        refused = None
    except Exception as e:  # noqa: BLE001
        refused = "host sync" in str(e)
    before = handoff.stats()["host_syncs"]
    differ, dropped = random_mismatch(torch, jax, jnp, handoff, None)
    syncs = handoff.stats()["host_syncs"] - before
    control, _ = random_mismatch(torch, jax, jnp, handoff, False, host_syncs="error")
    emit(figure="random", elements=256 * 256, refused_under_error=refused, dropped=dropped,
         grad_not_forward_mask=differ, host_syncs=syncs, control_grad_not_forward_mask=control)
    check(refused is True, f"a random function's backward was not refused under host_syncs='error' ({refused})")
    check(differ == 0 and 0 < dropped < 256 * 256, f"the backward's mask differs from the forward's in {differ} "
          f"elements ({dropped} dropped)")
    check(syncs == 1, f"{syncs} host syncs counted, not the one the backward's state needs")
    check(control > 0, "the control (random=False) drew the same mask: the check cannot see a lost state")


def lifetime_trials(torch, jax, jnp, handoff, flag, eye):
    """How many of ``TRIALS`` results were wrong, and the ms each call took to return."""
    import numpy as np

    n = 1 << 20

    def fn(a):
        t1 = a * 2  # temporaries: freed when the function returns
        t2 = t1 + 1
        return t2 * 1.0

    jf = handoff.jax_function(fn)
    step = jax.jit(lambda x, w: jf(x + flag(w)))
    for _ in range(2):
        jax.block_until_ready(step(jnp.zeros(n), eye))  # compiled and warm
    wrong, call_ms = 0, []
    for i in range(TRIALS):
        x = jnp.full(n, float(i + 1), jnp.float32)  # not weakly typed: the warm-up's signature
        jax.block_until_ready(x)
        ms, out = _timed(lambda: step(x, eye))
        call_ms.append(round(ms, 3))
        # On PyTorch's stream, idle, while XLA's stream has ~50 ms queued before the function.
        scribbles = [torch.full((n,), -7.0, device="cuda") for _ in range(16)]
        got = np.asarray(out)
        del scribbles
        wrong += int(not np.all(got == (i + 1) * 2 + 1))
    return wrong, call_ms


def check_lifetime(torch, jax, jnp, handoff):
    from handoff import _jax_callback

    flag, eye, reps = busy_program(jax, jnp)
    wrong, call_ms = lifetime_trials(torch, jax, jnp, handoff, flag, eye)
    _jax_callback.ON_XLA_STREAM = False
    try:
        control_wrong, _ = lifetime_trials(torch, jax, jnp, handoff, flag, eye)
    finally:
        _jax_callback.ON_XLA_STREAM = True
    emit(figure="lifetime", queued_ms=QUEUED_MS, matmuls=reps, trials=TRIALS, wrong=wrong, call_ms=call_ms,
         control_wrong=control_wrong)
    check(wrong == 0, f"{wrong} of {TRIALS} results wrong with the function on XLA's stream")
    check(max(call_ms) < QUEUED_MS / 5, f"a call took {max(call_ms)} ms to return (a host wait)")
    check(control_wrong > 0, "the control (the function on PyTorch's stream) was never wrong: "
          "the trial cannot detect a missing order")


def busy_program(jax, jnp):
    """``(flag, reps, busy_ms)``: ``flag(w)`` is ~50 ms of bf16 matmuls in one program (a
    chain multiplying by the identity, which XLA cannot know) ending in a 0.0 that
    depends on all of it."""
    eye = jnp.eye(MATRIX, dtype=jnp.bfloat16)

    def chain(reps):
        def flag(w):
            m = w
            for _ in range(reps):
                m = m @ w
            return jnp.where(m[0, 0] == 3.0, 1.0, 0.0).astype(jnp.float32)

        return flag

    probe = jax.jit(chain(8))
    probe(eye).block_until_ready()
    t0 = time.perf_counter()
    probe(eye).block_until_ready()
    reps = max(1, min(400, round(QUEUED_MS / ((time.perf_counter() - t0) * 1e3 / 8))))
    return chain(reps), eye, reps


def check_no_host_sync(torch, jax, jnp, handoff):
    found = []  # per callback run: was XLA's stream still busy when it ran?
    waited = []  # ms the control's .item() took

    class Probe(torch.nn.Module):
        def __init__(self, inner, sync=False):
            super().__init__()
            self.inner, self.sync = inner, sync

        def forward(self, x):
            if self.sync:
                ms, value = _timed(lambda: x.sum().item())  # a host sync
                waited.append(ms)
                x = x * (value * 0 + 1)
            ev = torch.cuda.Event()
            ev.record()  # on the current stream: XLA's
            found.append(not ev.query())  # cudaEventQuery never blocks
            return self.inner(x)

    flag, eye, reps = busy_program(jax, jnp)
    model, x = make_model(torch, "mlp", SIZES["mlp"]["host"])
    fn, params = handoff.jax_module(Probe(model))

    def program(fn):
        @jax.jit
        def step(p, x, w):
            x = x + flag(w)  # the step's callbacks are queued behind the chain
            return jax.value_and_grad(lambda p: jnp.mean(fn(p, x) ** 2))(p)

        return step

    step, xj = program(fn), handoff.to_jax(x)
    jax.block_until_ready(step(params, xj, eye))  # compiled and warm
    busy_ms = _timed(lambda: jax.block_until_ready(step(params, xj, eye)))[0]
    found.clear()
    before = handoff.stats()["host_syncs"]
    call_ms, (loss, grads) = _timed(lambda: step(params, xj, eye))
    ready = loss.is_ready()
    jax.block_until_ready((loss, grads))
    syncs = handoff.stats()["host_syncs"] - before
    emit(figure="no_host_sync", queued_ms=QUEUED_MS, matmuls=reps, step_busy_ms=round(busy_ms, 1),
         call_ms=round(call_ms, 3), result_ready_at_return=ready, callbacks=len(found),
         stream_busy_in_callback=sum(found), host_syncs=syncs)
    check(len(found) >= 2 and all(found),
          f"a callback found XLA's stream idle: {found} (it waited on the host)")
    check(call_ms < QUEUED_MS / 5 and not ready, f"the step took {call_ms:.1f} ms to return, ready={ready}")
    check(syncs == 0, f"{syncs} host syncs counted by handoff during the step")

    # The control: a host sync inside the module is refused, and allowed, waits.
    # random=False: the fake run cannot run .item(), and a function it cannot run counts as random.
    bad, bad_params = handoff.jax_module(Probe(model, sync=True), out_shapes=lambda p, x: x, random=False)
    error = None
    try:
        jax.block_until_ready(program(bad)(bad_params, xj, eye))
        refused = None
    except Exception as e:  # noqa: BLE001
        refused, error = "synchronized the host" in str(e), f"{type(e).__name__}: {e}"[-1200:]
    allowed, _ = handoff.jax_module(Probe(model, sync=True), out_shapes=lambda p, x: x, random=False,
                                    host_syncs="allow")
    allowed_step = program(allowed)
    jax.block_until_ready(allowed_step(bad_params, xj, eye))
    waited.clear()
    jax.block_until_ready(allowed_step(bad_params, xj, eye))
    emit(figure="control_sync", refused_with_message=refused, error=error,
         allowed_item_ms=[round(w, 2) for w in waited])
    check(refused is True,
          f"a host sync in the PyTorch function was not refused with its message ({refused})")
    check(bool(waited) and waited[0] > QUEUED_MS / 2,
          f"with host_syncs='allow' the control's .item() did not wait for the queued work ({waited} ms)")


def _timed(f):
    t0 = time.perf_counter()
    r = f()
    return (time.perf_counter() - t0) * 1e3, r


# ---- step time --------------------------------------------------------------------------


def time_steps(torch, jax, jnp, handoff, peers, name, bound, args):
    size = SIZES[name][bound]
    n = args.steps if bound == "gpu" else 10 * args.steps
    base, x = make_model(torch, name, size)
    heads = max(1, size[-1] // 64)
    results = {}
    for variant in args.variants:
        model = copy.deepcopy(base)
        try:
            step, sync = make_step(torch, jax, jnp, handoff, peers, variant, model, x, name, heads)
        except _Unavailable as e:
            emit(figure="step_time", model=name, bound=bound, size=list(size), variant=variant,
                 skipped=str(e))
            continue
        try:
            ms = harness.median_ms(step, n, reps=args.reps, warmup=3, sync=sync)
        except Exception as e:  # noqa: BLE001 - a peer's failure is reported, handoff's fails the run
            emit(figure="step_time", model=name, bound=bound, size=list(size), variant=variant,
                 error=f"{type(e).__name__}: {str(e)[:300]}")
            if variant not in PEERS:
                check(False, f"{name}/{bound}/{variant}: {type(e).__name__}: {e}")
            continue
        results[variant] = ms
        emit(figure="step_time", model=name, bound=bound, size=list(size), variant=variant, ms=round(ms, 4),
             vs_torch=round(ms / results["torch"], 3) if "torch" in results else None)
    if "torch" in results:
        emit(figure="step_time_summary", model=name, bound=bound, size=list(size),
             ratio_to_torch={v: round(ms / results["torch"], 3) for v, ms in results.items()})


class _Unavailable(Exception):
    pass


def make_step(torch, jax, jnp, handoff, peers, variant, model, x, name, heads):
    """``(step, sync)`` for :func:`harness.median_ms`: one training step of ``variant``
    per call, ``sync`` waiting for the last one."""
    last = []

    def jax_sync():
        jax.block_until_ready(last[-1])

    if variant == "torch":
        opt = torch.optim.SGD(model.parameters(), lr=LR)

        def step():
            opt.zero_grad(set_to_none=True)
            (model(x) ** 2).mean().backward()
            opt.step()

        return step, torch.cuda.synchronize
    if variant == "handoff":
        fn, params = handoff.jax_module(model)
        xs = handoff.to_jax(x)
    elif variant == "jax":
        params = {k: handoff.to_jax(p.detach().clone()) for k, p in model.named_parameters()}
        fn, xs = jax_model(jax, jnp, name, heads), handoff.to_jax(x)
    else:
        peer, why = peers[variant]
        if peer is None:
            raise _Unavailable(why)
        if variant == "torch_jax_interop":
            with torch.no_grad():
                example = model(x)
            fn, params = peer(model, example_output=example)
        else:  # torch2jax: a function of (parameters, input), its VJP through PyTorch
            weights = {k: p.detach() for k, p in model.named_parameters()}
            fn = peer(lambda p, v: torch.func.functional_call(model, p, (v,)), weights, x, depth=1)
            params = {k: handoff.to_jax(w.clone()) for k, w in weights.items()}
        xs = handoff.to_jax(x)
    train = jax_step(jax, jnp, fn)
    state = [params]

    def step():
        loss, state[0], _ = train(state[0], xs)
        last[:] = [loss]

    return step, jax_sync


def load_torch2jax():
    """``(torch2jax_with_vjp, version)`` of rdyro's torch2jax (an XLA custom call that
    synchronizes PyTorch's stream around each call; it compiles its C++/CUDA extension at
    first use), or ``(None, why)``."""
    try:
        from torch2jax import torch2jax_with_vjp
        import importlib.metadata

        return torch2jax_with_vjp, importlib.metadata.version("torch2jax")
    except Exception as e:  # noqa: BLE001
        return None, f"not run: {type(e).__name__}: {e}"


def load_torch_jax_interop():
    """``(torch_module_to_jax, version)``, or ``(None, why)`` where it does not import
    (``gpu-bundle/run.sh`` installs torch-jax-interop 0.0.8 and chex beside the
    scripts)."""
    try:
        from torch_jax_interop import torch_module_to_jax
    except Exception as e:  # noqa: BLE001
        return None, f"not run: {type(e).__name__}: {e}"
    import importlib.metadata

    try:
        return torch_module_to_jax, importlib.metadata.version("torch_jax_interop")
    except Exception:  # noqa: BLE001
        return torch_module_to_jax, "unknown"


if __name__ == "__main__":
    harness.run(main)
