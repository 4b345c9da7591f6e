"""GPU checks: handoff's Python crossings inside a PyTorch CUDA graph capture
(``torch.cuda.graph``), with a JAX function between PyTorch ops.

One check per run, so that a crash ends only its own run; exit 1 when it fails::

    python bench/gpu_graph_checks.py --probe crossings --mode thread_local
    python bench/gpu_graph_checks.py --probe torch_function --mode relaxed
    python bench/gpu_graph_checks.py --probe train --prune

- ``crossings``: ``y = to_torch(jax_part(to_jax(x * 2))) + x``, ``jax_part`` a jitted
  JAX function; ``ordered``: the same through ``from_dlpack(handoff.ordered(...))`` both
  ways; ``torch_function``: the same through ``handoff.torch_function(f)``. Each: an
  eager warm-up on a side stream (as ``torch.cuda.graph`` asks), the capture, then 100
  replays with new inputs, each compared with the eager step.
- ``train``: a training step (forward through a JAX layer, backward,
  ``Adam(capturable=True)``) captured once and replayed 30 times, its parameters
  compared with 30 eager steps from the same start (parameters and Adam's state), and the ms a replay takes beside the same step with a PyTorch layer, captured
  the same way (64x256, f32).
- ``graphed_callables``: a module with a JAX layer through
  ``torch.cuda.make_graphed_callables`` and an eager copy, over 20 calls: both forwards,
  then both backwards (``--phases sequential``: each call done before the next begins);
  the outputs and gradients of each side against the eager module's alone, before any
  replay (``--pure``: a PyTorch layer, the control). Interleaved, only the graphed side
  is judged: the eager copy's JAX arrays are alive across the graphed replays. Its
  captures take ``--mode`` too (``torch.cuda.graph``'s default, ``global``, otherwise).
- ``scratch``: JAX arrays made after a capture and alive across its replays, counted
  where the replays overwrote them (XLA reuses a captured execution's scratch memory);
  the check is that the replay is right and handoff warned (``CaptureWarning``).
- ``failed_capture``: a capture that fails after a crossing (``--pure``: without
  handoff, the control); the process must go on right and exit cleanly.

Prints one JSON line: where it failed (the exception, in full) or what was right.
JAX runs with its default flags: what handoff captures is compiled with XLA's command
buffers off for that executable alone, and the scratch probe's own function is compiled
so too (``compiler_options``). ``--command-buffers-flag`` turns them off for the whole
process instead (``XLA_FLAGS``, set before JAX starts: the rule before capture clients,
for a baseline). Capture clients are switched on (``handoff.capture_clients(enabled=True)``);
``--control``: off, crossings inside a capture stay on JAX's own client (the default).
``--prewarm N``: N capture clients made, and each used by a jitted function, before any
capture (a probe of whether a client's first use inside a capture is what crashed 4 of
17 ``graphed_callables`` runs on an H100).
"""

import argparse
import json
import os
import sys
import traceback
import warnings

if "--command-buffers-flag" in sys.argv:  # before JAX starts
    os.environ["XLA_FLAGS"] = "--xla_gpu_enable_command_buffer="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import handoff  # noqa: E402
import harness  # noqa: E402  (beside this script, in bench/ and in the GPU bundle)


def prewarm(n: int) -> None:
    """``n`` capture clients of device 0 made now, each used once by a jitted function,
    and left idle for the captures to lease (``handoff._capture``'s own lists)."""
    from handoff import _capture

    for _ in range(n):
        client = _capture._make_client(0)
        _capture._made.setdefault(0, []).append(client)
        _capture._free.setdefault(0, []).append(client)
        x = jax.device_put(jnp.ones((64, 256)), _capture._device(client, 0))
        jax.block_until_ready(jax.jit(lambda v: jax.nn.gelu(v @ v.T))(x))


def emit(**fields):
    print(json.dumps(fields), flush=True)


def failed(args, stage: str, e: Exception) -> int:
    """Says where the check failed, with the exception in full; the exit code."""
    emit(
        probe=args.probe,
        mode=args.mode,
        captured=False,
        failed_at=stage,
        error=f"{type(e).__name__}: {e}"[:2000],
        where=traceback.format_exc()[-2000:],
    )
    return 1


@jax.jit
def jax_part(h):
    """The JAX function the crossings checks put between PyTorch ops."""
    return jax.nn.gelu(h) * 1.1 + 0.5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--probe",
        choices=[
            "crossings",
            "ordered",
            "torch_function",
            "train",
            "graphed_callables",
            "failed_capture",
            "scratch",
        ],
        required=True,
    )
    ap.add_argument("--mode", choices=["global", "thread_local", "relaxed"],
                    help="capture mode (default: thread_local; graphed_callables: global, as PyTorch)")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--prune", action="store_true", help="keep_graph=True, handoff.prune_graph, instantiate")
    ap.add_argument(
        "--pure",
        action="store_true",
        help="failed_capture, graphed_callables: the step without handoff (the control)",
    )
    ap.add_argument(
        "--phases",
        choices=["interleaved", "sequential"],
        default="interleaved",
        help="graphed_callables: both forwards, then both backwards (eager JAX arrays alive "
        "across the graphed backward's replay), or each call done before the next",
    )
    ap.add_argument("--command-buffers-flag", action="store_true",
                    help="XLA_FLAGS=--xla_gpu_enable_command_buffer= for the process (a baseline)")
    ap.add_argument("--control", action="store_true",
                    help="crossings inside a capture stay on JAX's own client (the path before)")
    ap.add_argument("--prewarm", type=int, default=0,
                    help="capture clients made and used before any capture")
    args = ap.parse_args()
    args.mode = args.mode or ("global" if args.probe == "graphed_callables" else "thread_local")
    handoff.capture_clients(enabled=not args.control)
    if not torch.cuda.is_available():
        emit(probe=args.probe, skipped="no CUDA device")
        return 0
    if args.prewarm:
        prewarm(args.prewarm)

    if args.probe == "train":
        return train(args)
    if args.probe == "graphed_callables":
        return graphed_callables(args)
    if args.probe == "failed_capture":
        return failed_capture(args)
    if args.probe == "scratch":
        return scratch(args)

    layer = handoff.torch_function(lambda h: jax.nn.gelu(h) * 1.1 + 0.5)

    def step(x):
        h = x * 2.0
        if args.probe == "crossings":
            y = handoff.to_torch(jax_part(handoff.to_jax(h)))
        elif args.probe == "ordered":
            y = torch.from_dlpack(handoff.ordered(jax_part(jax.dlpack.from_dlpack(handoff.ordered(h)))))
        else:
            y = layer(h)
        return y + x

    static_x = torch.randn(4096, device="cuda")
    stage = "warm-up"
    try:
        harness.on_side_stream(torch, lambda: [step(static_x) for _ in range(3)])
        stage = "capture"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode=args.mode):
            static_y = step(static_x)
        stage = "replays"
        right = 0
        for i in range(args.replays):
            x = torch.randn(4096, device="cuda") * (1 + i % 5)
            static_x.copy_(x)
            graph.replay()
            # Eager JAX work among the replays: its allocator would reuse the graph's
            # memory if the graph did not keep it.
            eager = step(x)
            torch.cuda.synchronize()
            right += bool(torch.allclose(static_y, eager, rtol=1e-5, atol=1e-5))
        emit(probe=args.probe, mode=args.mode, captured=True, replays=args.replays, right=right)
        del graph
        torch.cuda.synchronize()
        return 0 if right == args.replays else 1
    except Exception as e:  # the check's finding, not a crash
        return failed(args, stage, e)


def train(args) -> int:
    import time

    batch, width = 64, 256
    layer = handoff.torch_function(lambda h, w: jax.nn.gelu(h @ w))

    def make(use_jax):
        torch.manual_seed(0)
        w1 = (torch.randn(width, width, device="cuda") / width**0.5).requires_grad_()
        w2 = (torch.randn(width, width, device="cuda") / width**0.5).requires_grad_()
        opt = torch.optim.Adam([w1, w2], lr=1e-3, capturable=True)

        def step(x, t):
            h = torch.tanh(x @ w1)
            y = layer(h, w2) if use_jax else torch.nn.functional.gelu(h @ w2, approximate="tanh")
            loss = ((y - t) ** 2).mean()
            loss.backward()
            opt.step()
            return loss

        return [w1, w2], opt, step

    results = {}
    stage = "setup"
    try:
        for use_jax in (True, False):
            params, opt, step = make(use_jax)
            x = torch.randn(batch, width, device="cuda")
            t = torch.randn(batch, width, device="cuda")
            stage = "warm-up"

            def warm_up():
                for _ in range(3):
                    opt.zero_grad(set_to_none=True)
                    step(x, t)

            harness.on_side_stream(torch, warm_up)

            def state():  # the parameters and Adam's state, which the step updates in place
                return params + [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]

            def restore(saved):
                with torch.no_grad():
                    for dst, src in zip(state(), saved):
                        dst.copy_(src)

            start = [v.detach().clone() for v in state()]
            stage = "capture"
            graph = torch.cuda.CUDAGraph(keep_graph=True) if args.prune else torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph, capture_error_mode=args.mode):
                step(x, t)
            if args.prune:
                results["pruned_" + ("jax" if use_jax else "torch")] = handoff.prune_graph(graph)
                graph.instantiate()
            stage = "replays"
            restore(start)
            for _ in range(30):
                graph.replay()
            torch.cuda.synchronize()
            replayed = [p.detach().clone() for p in params]
            restore(start)
            for _ in range(30):
                opt.zero_grad(set_to_none=True)
                step(x, t)
            torch.cuda.synchronize()
            same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(replayed, params))
            per_step = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(200):
                    graph.replay()
                torch.cuda.synchronize()
                per_step.append((time.perf_counter() - t0) / 200 * 1e3)
            per_step.sort()
            results["jax_layer" if use_jax else "torch_layer"] = {"ms": round(per_step[3], 5), "same_as_eager": same}
            del graph
            torch.cuda.synchronize()
        ratio = results["jax_layer"]["ms"] / results["torch_layer"]["ms"]
        results["prune"] = args.prune
        results["control"] = args.control
        results["xla_flags"] = os.environ.get("XLA_FLAGS")
        results["capture_clients"] = handoff.capture_clients()
        emit(probe="train", mode=args.mode, captured=True, **results, ratio=round(ratio, 3))
        return 0 if results["jax_layer"]["same_as_eager"] and results["torch_layer"]["same_as_eager"] else 1
    except Exception as e:
        return failed(args, stage, e)


def graphed_callables(args) -> int:
    width = 256
    if args.pure:
        layer = lambda h, w: torch.nn.functional.gelu(h @ w)  # noqa: E731
    else:
        layer = handoff.torch_function(lambda h, w: jax.nn.gelu(h @ w))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(width, width)
            self.w = torch.nn.Parameter(torch.randn(width, width) / width**0.5)

        def forward(self, x):
            return layer(torch.tanh(self.lin(x)), self.w)

    forward, backward = harness.graphed_forward, harness.graphed_backward

    stage = "setup"
    try:
        torch.manual_seed(0)
        eager = Block().cuda()
        graphed_module = Block().cuda()
        graphed_module.load_state_dict(eager.state_dict())
        sample = torch.randn(64, width, device="cuda", requires_grad=True)
        xs = [torch.randn(64, width, device="cuda") * (1 + i % 3) for i in range(20)]
        stage = "make_graphed_callables"
        if args.mode != "global":  # make_graphed_callables captures with torch.cuda.graph's default
            plain = torch.cuda.graph
            torch.cuda.graph = lambda *a, **k: plain(*a, capture_error_mode=args.mode, **k)
        graphed = torch.cuda.make_graphed_callables(graphed_module, (sample,))
        stage = "calls"
        # The reference: the eager module alone, no replay anywhere near.
        reference = [backward(eager, *forward(eager, x)) for x in xs]
        torch.cuda.synchronize()
        found = {"graphed": [], "eager": []}
        for x in xs:
            if args.phases == "interleaved":  # eager JAX arrays alive across a replay
                g, e = forward(graphed, x), forward(eager, x)
                found["graphed"].append(backward(graphed, *g))
                found["eager"].append(backward(eager, *e))
            else:  # each call done before the next begins
                found["graphed"].append(backward(graphed, *forward(graphed, x)))
                found["eager"].append(backward(eager, *forward(eager, x)))
        torch.cuda.synchronize()
        right = {side: harness.count_right(torch, calls, reference) for side, calls in found.items()}
        emit(
            probe="graphed_callables",
            pure=args.pure,
            phases=args.phases,
            xla_flags=os.environ.get("XLA_FLAGS"),
            control=args.control,
            captured=True,
            calls=len(xs),
            right=right,
        )
        # With --control (JAX's own client for the captured work) the eager copy's JAX
        # arrays, alive across the graphed backward's replay when interleaved, can be
        # overwritten by it (the scratch probe): only the graphed side counts then.
        judged = {"graphed": right["graphed"]} if args.control and args.phases == "interleaved" else right
        return 0 if all(n == len(xs) for side in judged.values() for n in side.values()) else 1
    except Exception as e:
        return failed(args, stage, e)


def scratch(args) -> int:
    """JAX arrays made after a capture and alive across its replays: how many did the
    replays overwrite? A captured XLA execution writes its scratch memory at every
    replay, and XLA's allocator took that memory back at the capture. The check: the
    replay is right, none of 64 arrays is overwritten over 5 replays, no
    ``CaptureWarning``, and the captured work ran on a client of the graph's own (a
    separate allocator: its memory and JAX's later arrays cannot overlap; their address
    ranges are reported). ``--control`` (JAX's own client, as before capture clients):
    the count is the overwrite, and handoff warns once."""
    f = jax.jit(lambda a, b: jnp.tanh(a @ b) @ b.T + 1.0,  # an intermediate: scratch
                compiler_options={"xla_gpu_enable_command_buffer": ""})
    x = torch.randn(512, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda") / 512**0.5
    captured = []

    def step():
        out = f(handoff.to_jax(x), handoff.to_jax(w))
        captured.append(out)
        return handoff.to_torch(out)

    stage = "warm-up"
    try:
        expected = harness.on_side_stream(torch, step).clone()
        captured.clear()
        stage = "capture"
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            with torch.cuda.graph(graph, capture_error_mode=args.mode):
                y = step()
        ours = [str(w.message) for w in warned if issubclass(w.category, handoff.CaptureWarning)]
        stage = "replays"
        held = [jnp.full((512, 512), float(i)) for i in range(64)]
        jax.block_until_ready(held)
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        changed = sum(not bool(jnp.all(a == float(i))) for i, a in enumerate(held))
        right = bool(torch.allclose(y, expected, rtol=1e-4, atol=1e-4))
        own = held[0].sharding._device
        graph_device = captured[0].sharding._device
        span = lambda arrays: [min(a.unsafe_buffer_pointer() for a in arrays),  # noqa: E731
                               max(a.unsafe_buffer_pointer() + a.nbytes for a in arrays)]
        emit(
            probe="scratch",
            mode=args.mode,
            control=args.control,
            captured=True,
            replay_right=right,
            warned=[m[:60] for m in ours],
            held=len(held),
            replays=5,
            changed_by_replays=changed,
            graph_client_is_jax_own=graph_device.client is own.client,
            graph_output_span=span(captured),
            held_span=span(held),
            capture_clients=handoff.capture_clients(),
        )
        if args.control:
            return 0 if right and len(ours) == 1 else 1
        return 0 if right and not ours and changed == 0 and graph_device.client is not own.client else 1
    except Exception as e:
        return failed(args, stage, e)


def failed_capture(args) -> int:
    """A capture that fails (a device sync inside it) after a crossing was captured:
    the error reaches the caller, the process goes on computing the eager step right and
    exits cleanly (the runner sees its exit status). With ``--pure`` the same step without
    handoff, the control: a crash in both is PyTorch's or CUDA's, in this one only is
    handoff's."""

    def step(x):
        h = x * 2.0
        if args.pure:
            return torch.nn.functional.gelu(h, approximate="tanh") * 1.1 + 0.5 + x
        return handoff.to_torch(jax_part(handoff.to_jax(h))) + x

    x = torch.randn(4096, device="cuda")
    stage = "eager"
    try:
        expected = harness.on_side_stream(torch, lambda: step(x)).clone()
        stage = "capture"
        error = None
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode=args.mode):
                step(x)
                torch.cuda.synchronize()  # refused while capturing
        except Exception as e:  # the failure this check wants
            error = f"{type(e).__name__}: {e}"[:300]
        stage = "after"
        right = 0
        for _ in range(10):
            right += bool(torch.allclose(step(x), expected, rtol=1e-5, atol=1e-5))
        torch.cuda.synchronize()
        emit(
            probe="failed_capture",
            mode=args.mode,
            pure=args.pure,
            capture_failed=error is not None,
            error=error,
            right_after=right,
        )
        return 0 if error is not None and right == 10 else 1
    except Exception as e:
        return failed(args, stage, e)


if __name__ == "__main__":
    sys.exit(main())
