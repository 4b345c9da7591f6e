"""``handoff.torch_function`` on CUDA, as PyTorch's own code would behave (GPU machine;
JSON lines, exit 1 on a failed check, ``SKIPPED`` without CUDA):

- gradcheck in float64 on three functions, the forward under ``jax.enable_x64(True)``
  and the backward on PyTorch's autograd thread (where CUDA backwards run);
- inputs that no used output reaches get ``None``;
- ``handoff.ordered`` keeps odd strides of CUDA tensors as plain ``from_dlpack`` does;
- parameters viewed out of one flat buffer at offsets that are not 16-byte aligned
  train to the same values as aligned ones (torch_function copies them, counted);
- which byte offsets of a CUDA view XLA itself takes (`handoff.to_jax` passes a view on
  as it is): a probe, reported.
"""

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

    w0, b0 = torch.randn(4, 3, device=dev), torch.randn(3, device=dev)
    aligned = train([w0.clone().requires_grad_(), b0.clone().requires_grad_()])
    flat = torch.zeros(1 + 12 + 3, device=dev)
    flat[1:13], flat[13:] = w0.flatten(), b0
    w_view, b_view = flat[1:13].view(4, 3), flat[13:]  # 4 and 52 bytes into the buffer
    w_view.requires_grad_(), b_view.requires_grad_()
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


if __name__ == "__main__":
    harness.run(main)
