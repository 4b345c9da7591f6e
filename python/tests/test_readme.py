"""The README's Python examples, run as written, on the CPU.

Every ```` ```python ```` block of README.md runs in a fresh namespace and must not raise;
the blocks named in ``CHECKS`` must also leave behind what their text promises. A block
fenced ```` ```python cuda ```` needs a CUDA device (and the names of the example above
it): it is compiled, and its run is skipped with that reason. Its Rust blocks are
doctests of ``examples/src.rs``, and ``cargo xtask layout`` keeps the first examples in
the first 60 lines."""

import os
import re
from typing import Callable, Dict, List, NamedTuple

import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
from torch._dynamo.utils import counters  # noqa: E402

import handoff  # noqa: E402

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")

#: What a fence's info string may add after ``python``, and why such a block only compiles.
MARKERS = {"cuda": "it needs a CUDA device, and the names of the example above it"}


class Block(NamedTuple):
    line: int  # of the opening fence, from 1
    heading: str  # the heading it stands under, as written (``### ...``)
    markers: List[str]
    code: str


def python_blocks(text: str) -> List[Block]:
    """The ```python blocks of ``text``, each with the heading above it."""
    blocks, heading, fence, start, markers = [], "", None, 0, []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        ticks = len(line) - len(line.lstrip("`"))
        if fence is None and ticks >= 3:
            info = re.split(r"[\s,]+", line[ticks:].strip())
            fence, start, markers = ticks, i, info[1:] if info[0] == "python" else None
        elif fence is not None and ticks >= fence and not line[ticks:].strip():
            if markers is not None:
                blocks.append(Block(start + 1, heading, markers, "\n".join(lines[start + 1 : i]) + "\n"))
            fence = None
        elif fence is None and line.startswith("#"):
            heading = line
    return blocks


with open(README, encoding="utf-8") as f:
    BLOCKS = python_blocks(f.read())


# ---- what the examples promise ------------------------------------------------------------


def first_example(run: Callable[[], dict]) -> None:
    syncs = handoff.stats()["host_syncs"]
    scope = run()
    t = scope["t"]
    torch.testing.assert_close(scope["y"], torch.tanh(t))
    torch.testing.assert_close(scope["z"], t)
    grad = scope["w"].grad
    assert grad is not None and bool(grad.abs().sum() > 0), f"w.grad after backward: {grad}"
    assert handoff.stats()["host_syncs"] == syncs, "the example synchronized the host"


def torch_compile_example(run: Callable[[], dict]) -> None:
    torch._dynamo.reset()
    counters.clear()
    try:
        scope = run()
        breaks = sum(counters["graph_break"].values())
        assert breaks == 0, f"graph breaks: {dict(counters['graph_break'])}"
        executions = scope["ln_gelu"].executions
        assert executions == 6, f"ln_gelu.executions {executions}: three steps, each a forward and a backward"
    finally:
        torch._dynamo.reset()


def jax_function_example(run: Callable[[], dict]) -> None:
    scope = run()
    first = float(scope["loss"])
    loss, _ = scope["step"](scope["params"], scope["jnp"].ones((16, 4)))
    assert float(loss) < first, f"an SGD step through the PyTorch module: loss {first} -> {float(loss)}"


#: The heading of each checked block (each must have exactly one ```python block).
CHECKS: Dict[str, Callable[[Callable[[], dict]], None]] = {
    "# handoff": first_example,
    "### torch.compile, torch.export, checkpointing, DDP and FSDP2": torch_compile_example,
    "### The other direction: PyTorch inside `jax.jit`": jax_function_example,
}


def test_every_checked_example_is_in_the_readme():
    found = {h: [b.line for b in BLOCKS if b.heading == h] for h in CHECKS}
    wrong = {h: lines for h, lines in found.items() if len(lines) != 1}
    assert not wrong, f"headings of CHECKS without exactly one ```python block (lines found): {wrong}"
    assert len(BLOCKS) >= len(CHECKS) + 1, f"{len(BLOCKS)} ```python blocks in README.md"


@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}" for b in BLOCKS])
def test_a_readme_python_block_runs_as_written(block):
    where = f"README.md:{block.line} ({block.heading})"
    unknown = [m for m in block.markers if m not in MARKERS]
    assert not unknown, f"{where}: fence marker {unknown} unknown: known are {sorted(MARKERS)}"
    # Compiled at the README's own line numbers, for tracebacks.
    code = compile("\n" * block.line + block.code, "README.md", "exec")
    if block.markers:
        reasons = "; ".join(MARKERS[m] for m in block.markers)
        pytest.skip(f"{where}: compiled, not run: fenced ```python {' '.join(block.markers)}: {reasons}")

    def run() -> dict:
        scope = {"__name__": "readme"}
        exec(code, scope)  # noqa: S102
        return scope

    CHECKS.get(block.heading, lambda run: run())(run)
