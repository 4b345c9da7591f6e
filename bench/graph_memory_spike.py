"""Spike: can a CUDA graph own the XLA memory its replays write? (GPU; one probe a run)

Today a captured XLA execution gives its scratch back to JAX's allocator at enqueue, and
every replay writes it again: a JAX array made after the capture can land there and be
overwritten. This spike runs the captured executions on a PJRT client of their own
(``--client private``: a second client of the plugin JAX loaded, its own BFC allocator),
so that nothing eager allocates from the memory a replay writes, and compares it with
today's (``--client shared``: JAX's own client). Every executable here is compiled with
XLA's command buffers off for itself (``jax.jit(..., compiler_options=...)``), and
``XLA_FLAGS`` is left alone: the per-executable switch is the other half of the spike.

    python bench/graph_memory_spike.py --probe scratch --client private
    python bench/graph_memory_spike.py --probe graphed --client shared
    python bench/graph_memory_spike.py --probe cost --client private

- ``scratch``: a captured ``tanh(x @ w) @ w.T`` (an intermediate: scratch), then 64 JAX
  arrays made on JAX's client, 5 replays; how many arrays changed, and whether the
  memory the graph's arrays sit in and the later arrays' addresses overlap.
- ``graphed``: a JAX layer (a small ``autograd.Function`` whose JAX work runs on the
  capturing client while PyTorch captures) in ``make_graphed_callables``, interleaved
  with an eager copy over 20 calls: outputs and gradients of both against the eager
  module alone.
- ``cost``: the time to make the private client and its device memory, the first call's
  compile time, and the ms per replay of a 256-wide mixed step (PyTorch, JAX, PyTorch);
  ``--depth 8`` makes the JAX part 16 kernels, enough for XLA to put them in a command
  buffer when ``--command-buffers on`` (the control of the per-executable switch).

Prints JSON lines; exit 1 when a check fails.
"""

import argparse
import json
import os
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import handoff  # noqa: E402
import harness  # noqa: E402  (beside this script, in bench/ and in the GPU bundle)

OFF = {"xla_gpu_enable_command_buffer": ""}


def emit(**fields):
    print(json.dumps(fields), flush=True)


COMMAND_BUFFERS = "off"


def jit(f):
    """``jax.jit`` with XLA's command buffers off for this executable alone (``--command-
    buffers on``: as JAX compiles by default)."""
    return jax.jit(f, compiler_options=OFF) if COMMAND_BUFFERS == "off" else jax.jit(f)


def private_client():
    """A second client of the CUDA plugin JAX loaded: its own streams and BFC allocator,
    growing on demand."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    options = dict(xla_client.generate_pjrt_gpu_plugin_options())
    options.update(allocator="bfc", preallocate=False)
    return xla_bridge.make_pjrt_c_api_client("cuda", options)


class Placement:
    """Where the JAX work of the captured code runs: JAX's own device (``shared``) or the
    private client's (``private``). With ``only_capturing``, the warm-up runs on JAX's
    own device and the first call on the private one is made inside the capture (its
    compile included); else the warm-up already runs there."""

    def __init__(self, client: str, only_capturing: bool):
        self.own = jax.devices("gpu")[0]
        self.kind = client
        self.only_capturing = only_capturing
        self.client = private_client() if client == "private" else None
        self.graph_device = self.client.devices()[0] if self.client else self.own

    def device(self):
        if self.only_capturing and not torch.cuda.is_current_stream_capturing():
            return self.own
        return self.graph_device


def to_jax_on(t: torch.Tensor, device):
    """``t`` as a JAX array viewing its memory on ``device`` (of any client), ready on
    the stream that device reads external data on: handoff orders PyTorch's stream
    before it with a GPU wait."""
    from jax._src.lib import _jax

    stream = device.get_stream_for_external_ready_events()
    capsule = handoff.ordered(t.detach()).__dlpack__(stream=stream)
    try:
        return _jax.dlpack_managed_tensor_to_buffer(capsule, device, stream, False, 2)
    except TypeError:
        return _jax.dlpack_managed_tensor_to_buffer(capsule, device, stream, False)


def to_torch(a) -> torch.Tensor:
    """``a`` as a tensor viewing its memory, ready on PyTorch's current stream."""
    return torch.from_dlpack(handoff.ordered(a))


def pointer(a) -> int:
    return a.unsafe_buffer_pointer()


def failed(args, stage, e) -> int:
    emit(probe=args.probe, client=args.client, failed_at=stage,
         error=f"{type(e).__name__}: {e}"[:1500], where=traceback.format_exc()[-1500:])
    return 1


def memory(device) -> dict:
    stats = device.memory_stats() or {}
    return {k: stats.get(k) for k in ("bytes_in_use", "peak_bytes_in_use", "pool_bytes", "bytes_reserved")
            if k in stats}


def scratch(args, place: Placement) -> int:
    f = jit(lambda a, b: jnp.tanh(a @ b) @ b.T + 1.0)
    x = torch.randn(512, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda") / 512**0.5
    graph_arrays = []

    def step():
        d = place.device()
        out = f(to_jax_on(x, d), to_jax_on(w, d))
        if torch.cuda.is_current_stream_capturing():
            graph_arrays.append(out)
        return to_torch(out)

    stage = "warm-up"
    try:
        expected = harness.on_side_stream(torch, step).clone()
        stage = "capture"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = step()
        stage = "replays"
        held = [jnp.full((512, 512), float(i)) for i in range(64)]
        jax.block_until_ready(held)
        changed_runs = []
        for _ in range(5):
            for _ in range(5):
                graph.replay()
            torch.cuda.synchronize()
            changed_runs.append(sum(not bool(jnp.all(a == float(i))) for i, a in enumerate(held)))
        right = bool(torch.allclose(y, expected, rtol=1e-4, atol=1e-4))
        held_at = sorted(pointer(a) for a in held)
        graph_at = [pointer(a) for a in graph_arrays]
        result = dict(
            probe="scratch",
            client=place.kind,
            replay_right=right,
            held=len(held),
            changed_by_replays=changed_runs,
            graph_output_at=[hex(p) for p in graph_at],
            held_range=[hex(held_at[0]), hex(held_at[-1] + 512 * 512 * 4)],
            graph_output_in_held_range=any(held_at[0] <= p < held_at[-1] + 512 * 512 * 4 for p in graph_at),
            own_memory=memory(place.own),
        )
        if place.client:
            result["private_memory"] = memory(place.graph_device)
        emit(**result)
        return 0 if right and not any(changed_runs) else 1
    except Exception as e:
        return failed(args, stage, e)


def jax_layer(device, fn):
    """``fn`` as an autograd.Function whose JAX work runs on ``device()``: the backward
    recomputes the forward from the inputs it saved."""
    fwd = jit(fn)
    bwd = jit(lambda h, w, ct: jax.vjp(fn, h, w)[1](ct))

    class Layer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, w):
            ctx.save_for_backward(h, w)
            d = device()
            return to_torch(fwd(to_jax_on(h, d), to_jax_on(w, d)))

        @staticmethod
        def backward(ctx, ct):
            h, w = ctx.saved_tensors
            d = device()
            gh, gw = bwd(to_jax_on(h, d), to_jax_on(w, d), to_jax_on(ct.contiguous(), d))
            return to_torch(gh), to_torch(gw)

    return Layer.apply


def graphed(args, place: Placement) -> int:
    width = 256
    fn = lambda h, w: jax.nn.gelu(h @ w)  # noqa: E731
    layers = {"eager": jax_layer(lambda: place.own, fn), "graphed": jax_layer(place.device, fn)}

    class Block(torch.nn.Module):
        def __init__(self, side):
            super().__init__()
            self.layer = layers[side]
            self.lin = torch.nn.Linear(width, width)
            self.w = torch.nn.Parameter(torch.randn(width, width) / width**0.5)

        def forward(self, x):
            return self.layer(torch.tanh(self.lin(x)), self.w)

    forward, backward = harness.graphed_forward, harness.graphed_backward

    stage = "setup"
    try:
        torch.manual_seed(0)
        eager = Block("eager").cuda()
        graphed_module = Block("graphed").cuda()
        graphed_module.load_state_dict(eager.state_dict())
        sample = torch.randn(64, width, device="cuda", requires_grad=True)
        xs = [torch.randn(64, width, device="cuda") * (1 + i % 3) for i in range(20)]
        stage = "make_graphed_callables"
        graphed_fn = torch.cuda.make_graphed_callables(graphed_module, (sample,))
        stage = "calls"
        reference = [backward(eager, *forward(eager, x)) for x in xs]
        torch.cuda.synchronize()
        found = {"graphed": [], "eager": []}
        for x in xs:  # eager JAX arrays alive across each replay
            g, e = forward(graphed_fn, x), forward(eager, x)
            found["graphed"].append(backward(graphed_fn, *g))
            found["eager"].append(backward(eager, *e))
        torch.cuda.synchronize()
        right = {side: harness.count_right(torch, calls, reference) for side, calls in found.items()}
        emit(probe="graphed", client=place.kind, calls=len(xs), right=right)
        return 0 if all(n == len(xs) for side in right.values() for n in side.values()) else 1
    except Exception as e:
        return failed(args, stage, e)


def cost(args, place: Placement) -> int:
    n = 256

    def layers(a, b):  # --depth matmuls, each with its activation: 2 x depth kernels
        for _ in range(args.depth):
            a = jax.nn.gelu(a @ b) * 1.1
        return a

    f = jit(layers)
    x = torch.randn(n, n, device="cuda")
    w = torch.randn(n, n, device="cuda") / n**0.5

    def step():
        d = place.device()
        h = torch.relu(x * 2.0)
        return to_torch(f(to_jax_on(h, d), to_jax_on(w, d))) + x

    stage = "warm-up"
    try:
        t0 = time.perf_counter()
        expected = harness.on_side_stream(torch, step).clone()
        warm_ms = (time.perf_counter() - t0) * 1e3
        stage = "capture"
        graph = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        with torch.cuda.graph(graph):
            y = step()
        capture_ms = (time.perf_counter() - t0) * 1e3  # includes the private client's compile
        stage = "replays"
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        right = bool(torch.allclose(y, expected, rtol=1e-4, atol=1e-4))
        reps = []
        for _ in range(7):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                graph.replay()
            torch.cuda.synchronize()
            reps.append((time.perf_counter() - t0) / 200 * 1e3)
        reps.sort()
        result = dict(probe="cost", client=place.kind, depth=args.depth, command_buffers=COMMAND_BUFFERS,
                      replay_right=right, warm_up_ms=round(warm_ms, 2),
                      capture_ms=round(capture_ms, 2), replay_ms_median=round(reps[3], 5),
                      replay_ms_min=round(reps[0], 5), own_memory=memory(place.own))
        if place.client:
            result["private_memory"] = memory(place.graph_device)
            result["client_ms"] = args.client_ms
        emit(**result)
        return 0 if right else 1
    except Exception as e:
        return failed(args, stage, e)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", choices=["scratch", "graphed", "cost"], required=True)
    ap.add_argument("--client", choices=["shared", "private"], required=True)
    ap.add_argument("--only-capturing", action="store_true",
                    help="warm up on JAX's own client: the private client's first call (and compile) is captured")
    ap.add_argument("--depth", type=int, default=1, help="cost: matmul + gelu layers in the JAX function")
    ap.add_argument("--command-buffers", choices=["on", "off"], default="off",
                    help="on: compiled as JAX does by default (XLA's command buffers on)")
    args = ap.parse_args()
    global COMMAND_BUFFERS
    COMMAND_BUFFERS = args.command_buffers
    if not torch.cuda.is_available():
        print("SKIPPED: torch sees no CUDA device")
        return 0
    emit(probe=args.probe, client=args.client, only_capturing=args.only_capturing,
         xla_flags=os.environ.get("XLA_FLAGS"),
         torch=torch.__version__, jax=jax.__version__, device=torch.cuda.get_device_name())
    before = torch.cuda.mem_get_info()[0]
    t0 = time.perf_counter()
    try:
        place = Placement(args.client, args.only_capturing)
        jax.block_until_ready(jax.device_put(jnp.zeros(4), place.graph_device))
    except Exception as e:
        return failed(args, "client", e)
    args.client_ms = round((time.perf_counter() - t0) * 1e3, 1)
    emit(probe=args.probe, client=args.client, client_ms=args.client_ms,
         device_bytes_taken=before - torch.cuda.mem_get_info()[0])
    return {"scratch": scratch, "graphed": graphed, "cost": cost}[args.probe](args, place)


if __name__ == "__main__":
    sys.exit(main())
