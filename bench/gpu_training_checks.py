"""``handoff.torch_function`` on CUDA, as PyTorch's own code would behave (GPU machine;
JSON lines, exit 1 on a failed check, ``SKIPPED`` without CUDA):

- gradcheck in float64 on three functions, the forward under ``jax.enable_x64(True)``
  and the backward on PyTorch's autograd thread (where CUDA backwards run);
- inputs that no used output reaches get ``None``;
- ``handoff.ordered`` keeps odd strides of CUDA tensors as plain ``from_dlpack`` does;
- parameters viewed out of one flat buffer at offsets that are not 16-byte aligned
  train to the same values as aligned ones (torch_function copies them, counted);
- which byte offsets of a CUDA view XLA itself takes (`handoff.to_jax` passes a view on
  as it is): a probe, reported;
- the JAX views a layer keeps of its parameters (``handoff._views``) are ordered: a
  parameter updated in place behind ~50 ms of queued PyTorch work is read updated, with
  the parameter alone (the call hands it to JAX again for the order) and beside an
  activation made before the update; the control (``_views.ORDER`` off) reads it stale.
"""

import time

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import check, emit


def main():
    import torch

    if not torch.cuda.is_available():
        harness.skip("no CUDA device")
    import jax
    import jax.numpy as jnp

    import handoff

    harness.env(torch=torch, jax=jax, gpu=torch.cuda.get_device_name(0), routes=handoff.routes())

    def ln_gelu_matmul(h, gamma, beta, w):
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return jax.nn.gelu((h - mu) * jax.lax.rsqrt(var + 1e-5) * gamma + beta) @ w

    def two_outputs(a, b):
        return jnp.tanh(a @ b), (a**2).sum(-1)

    def attention(x, wq, wk):
        q, k = x @ wq, x @ wk
        s = q @ k.T / jnp.sqrt(q.shape[-1])
        return jax.nn.softmax(s, axis=-1) @ x

    dev = "cuda"
    f64 = dict(dtype=torch.float64, device=dev)
    cases = {
        "ln_gelu_matmul": (ln_gelu_matmul, lambda: [torch.randn(3, 4, **f64, requires_grad=True),
                                                    torch.randn(4, **f64, requires_grad=True),
                                                    torch.randn(4, **f64),
                                                    torch.randn(4, 2, **f64, requires_grad=True)]),
        "two_outputs": (two_outputs, lambda: [torch.randn(3, 4, **f64, requires_grad=True),
                                              torch.randn(4, 5, **f64, requires_grad=True)]),
        "attention": (attention, lambda: [torch.randn(5, 4, **f64, requires_grad=True),
                                          torch.randn(4, 4, **f64, requires_grad=True),
                                          torch.randn(4, 4, **f64, requires_grad=True)]),
    }
    for name, (f, make) in cases.items():
        fn = handoff.torch_function(f)
        args = make()
        try:
            with jax.enable_x64(True):
                ok = torch.autograd.gradcheck(lambda *a: fn(*a), args, eps=1e-6, atol=1e-5)
            error = None
        except Exception as e:  # noqa: BLE001
            ok, error = False, f"{type(e).__name__}: {e}"[:300]
        emit(figure="gradcheck_f64_cuda", function=name, ok=bool(ok), error=error)
        check(ok, f"gradcheck {name} on CUDA")

    # None for inputs no used output reaches.
    fn = handoff.torch_function(lambda a, b, c: (a * 2.0, (b * c).sum()))
    a, b, c = (torch.randn(3, device=dev, requires_grad=True) for _ in range(3))
    ya, _ = fn(a, b, c)
    before = handoff.stats()
    ya.sum().backward()
    torch.cuda.synchronize()
    after = handoff.stats()
    ok = a.grad is not None and b.grad is None and c.grad is None
    emit(figure="unreached_inputs", a_grad=a.grad is not None, b_grad_none=b.grad is None,
         c_grad_none=c.grad is None, host_syncs=after["host_syncs"] - before["host_syncs"])
    check(ok and after["host_syncs"] == before["host_syncs"], "None for unreached inputs on CUDA")

    # Strides of CUDA views, wrapped and plain.
    wrong = []
    for shape, strides in [((1,), (3,)), ((2, 1), (1, 7)), ((1, 3), (9, 1)), ((0,), (5,)), ((2, 0, 3), (3, 3, 1))]:
        t = torch.as_strided(torch.arange(64.0, device=dev), shape, strides)
        plain, wrapped = torch.from_dlpack(t), torch.from_dlpack(handoff.ordered(t))
        if plain.stride() != wrapped.stride():
            wrong.append((shape, strides, plain.stride(), wrapped.stride()))
    emit(figure="strides_cuda", cases=5, wrong=wrong)
    check(not wrong, "strides of CUDA views")

    # Views at offsets that are not 16-byte aligned (parameters viewed out of one flat
    # buffer) train to the same parameters as aligned tensors; the copies are counted.
    def train(params):
        layer = handoff.torch_function(lambda x, w, b: jnp.tanh(x @ w + b))
        opt = torch.optim.SGD(params, lr=0.1)
        x = torch.linspace(-1, 1, 24, device=dev).reshape(6, 4)
        for _ in range(5):
            opt.zero_grad()
            layer(x, *params).square().mean().backward()
            opt.step()
        return [p.detach().clone() for p in params]

    # Parameters (nn.Parameter): a kept JAX view of a copy would miss the updates.
    w0, b0 = torch.randn(4, 3, device=dev), torch.randn(3, device=dev)
    aligned = train([torch.nn.Parameter(w0.clone()), torch.nn.Parameter(b0.clone())])
    flat = torch.zeros(1 + 12 + 3, device=dev)
    flat[1:13], flat[13:] = w0.flatten(), b0
    # 4 and 52 bytes into the buffer
    w_view, b_view = torch.nn.Parameter(flat[1:13].view(4, 3)), torch.nn.Parameter(flat[13:])
    before = handoff.stats()
    try:
        viewed, error = train([w_view, b_view]), None
    except Exception as e:  # noqa: BLE001
        viewed, error = None, f"{type(e).__name__}: {str(e)[:200]}"
    after = handoff.stats()
    same = viewed is not None and all(torch.allclose(a, v) for a, v in zip(aligned, viewed))
    emit(figure="misaligned_views_train", offsets=[w_view.data_ptr() % 16, b_view.data_ptr() % 16],
         same_parameters=same, error=error, copies=after["copies"] - before["copies"],
         host_syncs=after["host_syncs"] - before["host_syncs"])
    check(same and after["host_syncs"] == before["host_syncs"], "misaligned views train as aligned tensors")

    kept_views_ordered(torch, handoff, dev)

    # Probe: which byte offsets of a view XLA takes at execution, f32 and bf16.
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        taken = {}
        flat = torch.arange(64, device=dev).to(dtype)
        for k in (1, 2, 4, 8):
            v = flat[k: k + 16]
            offset = v.data_ptr() % 256
            try:
                y = jax.jit(lambda x: x * 2)(handoff.to_jax(v))
                y.block_until_ready()
                taken[offset] = True
            except Exception as e:  # noqa: BLE001
                taken[offset] = f"{type(e).__name__}: {str(e)[:120]}"
        emit(figure="alignment_probe", dtype=str(dtype), element_bytes=size, taken=taken)


def kept_views_ordered(torch, handoff, dev):
    """A parameter updated in place behind ~50 ms of queued work, then read by a layer
    through its kept JAX view: right with the order, stale in the control."""
    from handoff import _views

    side = torch.cuda.Stream()
    cycles = int(harness.cuda_sleep_cycles_per_ms(torch, side) * 50)
    n, trials = 1 << 20, 5
    alone = handoff.torch_function(lambda p: p * 2.0)
    beside = handoff.torch_function(lambda x, p: x + p * 2.0)
    p = torch.nn.Parameter(torch.zeros(n, device=dev), requires_grad=False)

    def trial(k, layer):
        with torch.cuda.stream(side):
            x = torch.zeros(n, device=dev)  # made before the update
            layer(x, p) if layer is beside else layer(p)  # the view is made, then kept
            torch.cuda._sleep(cycles)
            with torch.no_grad():
                p.fill_(float(k))  # an optimizer's in-place update, queued behind 50 ms
            t0 = time.perf_counter()
            y = layer(x, p) if layer is beside else layer(p)
            call_ms = (time.perf_counter() - t0) * 1e3
            busy = not side.query()
        side.synchronize()
        return int((y != 2.0 * k).sum().item()), call_ms, busy

    results = {}
    for name, layer, order in (("alone", alone, True), ("beside", beside, True), ("control", alone, False)):
        _views.ORDER = order
        try:
            runs = [trial(k + 1, layer) for k in range(trials)]
        finally:
            _views.ORDER = True
        results[name] = dict(wrong=sum(1 for w, _, _ in runs if w), call_ms_max=round(max(c for _, c, _ in runs), 2),
                             busy_after=all(b for _, _, b in runs))
    kept = any(tr.views._kept[1] is not None for prog in beside._programs.values() for tr in prog._traced.values())
    emit(figure="kept_views_ordered", trials=trials, queued_ms=50, kept=kept, **results)
    check(kept, "the layer keeps the parameter's JAX view")
    check(results["alone"]["wrong"] == 0 and results["beside"]["wrong"] == 0,
          "kept parameter views read the update queued before the call")
    check(results["alone"]["call_ms_max"] < 10 and results["alone"]["busy_after"],
          "the call makes no host wait (well under the 50 ms queued; the GPU still busy after)")
    check(results["control"]["wrong"] > 0, "the control (no order) never read a stale view: the check proves nothing")


if __name__ == "__main__":
    harness.run(main)
