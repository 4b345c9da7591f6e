#!/usr/bin/env python3
"""The host-cost tables from the GPU benchmark logs, with each target's verdict.

    python3 bench/summarize.py LOG [LOG ...]

Each LOG is the output of one process, recognised by what it printed:

- ``pipeline_gpu`` (``BENCH {...}`` JSON lines): handoff's share above the frameworks'
  floor for each path, paired sample by sample, at 4096² and 256², with two streams
  (PyTorch's own and XLA's) and with PyTorch on XLA's ready stream; and the pipeline
  step against tch;
- ``python_pipeline.py`` (bare JSON lines): one ``jax.jit`` of the whole step, which the
  pipeline's 4096² step is held against;
- ``handoff_cuda`` (``BENCH name<TAB>p10<TAB>median<TAB>p90``): the CUDA hand-off
  against the raw ``cuEventRecord`` + ``cuStreamWaitEvent`` pair.

Prints Markdown tables (one column per log, named by its file) and, for each target,
how many of the measured cells meet it. Standard library only: it runs with the GPU
machine's Python as with CI's.
"""

import json
import os
import sys

# (key in pipeline_gpu's floor record, row name, target in µs)
SHARES = [
    ("torch_to_xla", "torch -> XLA", 1.0),
    ("torch_export", "  torch export", None),
    ("xla_view", "  XLA view", None),
    ("xla_to_torch", "XLA -> torch", 1.0),
    ("release_both", "releasing both", None),
    ("kernel_call", "kernel call", 2.0),
    ("kernel_call_composed", "  composed by hand", None),
]
# The four cells of each share: (size, key prefix, name).
CELLS = [(4096, "", "4096² two streams"), (4096, "one_stream_", "4096² one stream"),
         (256, "", "256² two streams"), (256, "one_stream_", "256² one stream")]
CUDA_CROSS_TARGET = 1.5  # cross-stream export + import over the raw pair, one at a time
CUDA_SAME_TARGET_NS = 200.0
PIPE_256_TO_TCH = 0.8
PIPE_4096_TO_JAX = 1.10


def read(path):
    """The kind of log at `path` and what it holds."""
    floor, pipe, cuda, jax = {}, {}, {}, {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("BENCH {"):
                d = json.loads(line[len("BENCH "):])
                if d.get("variant") == "floor":
                    floor[d["n"]] = d
                elif "ms_per_iter" in d and "variant" in d:
                    pipe[(d["n"], d["variant"])] = d["ms_per_iter"]
            elif line.startswith("BENCH "):
                name, *values = line[len("BENCH "):].split("\t")
                if len(values) == 3:
                    cuda[name.strip()] = float(values[1])
            elif line.startswith("{"):
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if d.get("variant") == "jax" and "ms_per_iter" in d:
                    jax[d["n"]] = d["ms_per_iter"]
    return {"floor": floor, "pipe": pipe, "cuda": cuda, "jax": jax}


def label(path):
    return os.path.basename(path).rsplit(".", 1)[0]


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def share_tables(logs):
    runs = [(label(p), d) for p, d in logs if d["floor"]]
    if not runs:
        return []
    out = ["**Paired shares** (µs above the floor, medians; cells: "
           + " / ".join(c[2] for c in CELLS) + ")", "",
           "| path | " + " | ".join(name for name, _ in runs) + " |",
           "|---|" + "---|" * len(runs)]
    verdicts = []
    for key, row, target in SHARES:
        cells, met, seen = [], 0, 0
        for _, d in runs:
            values = [d["floor"].get(n, {}).get(f"{pre}{key}_paired_share_us") for n, pre, _ in CELLS]
            cells.append(" / ".join(fmt(v) for v in values))
            for v in values:
                if target is not None and v is not None:
                    seen += 1
                    met += v <= target
        out.append(f"| {row} | " + " | ".join(cells) + " |")
        if target is not None:
            verdicts.append(f"- {row.strip()} <= {target:g} µs: {met} of {seen} cells")
    return out + [""] + verdicts + [""]


def pipeline_table(logs):
    jax = {}
    for _, d in logs:
        jax.update(d["jax"])
    runs = [(label(p), d["pipe"]) for p, d in logs if d["pipe"]]
    if not runs:
        return []
    out = ["**Pipeline** (ms per step; ratio to tch" + (", and to one `jax.jit`" if jax else "") + ")", "",
           "| process | 256² tch | two streams | one stream | 4096² tch | two streams | one stream |",
           "|---|---|---|---|---|---|---|"]
    met_256, met_4096, seen_4096 = 0, 0, 0
    for name, pipe in runs:
        cells = []
        for n in (256, 4096):
            tch = pipe.get((n, "tch"))
            cells.append(fmt(tch, 4))
            for variant in ("handoff", "handoff_shared_stream"):
                ms = pipe.get((n, variant))
                if ms is None or not tch:
                    cells.append("-")
                    continue
                cell = f"{ms:.4f} ({ms / tch:.3f}"
                if n == 256:
                    met_256 += ms / tch <= PIPE_256_TO_TCH
                if n in jax:
                    cell += f"; {ms / jax[n]:.3f}x jax.jit"
                    if n == 4096:
                        seen_4096 += 1
                        met_4096 += ms / jax[n] <= PIPE_4096_TO_JAX
                cells.append(cell + ")")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", f"- 256² <= {PIPE_256_TO_TCH}x tch: {met_256} of {2 * len(runs)} steps"]
    if jax:
        out.append(f"- `jax.jit` ms per step: " + ", ".join(f"{n}² {ms:.4f}" for n, ms in sorted(jax.items())))
        out.append(f"- 4096² <= {PIPE_4096_TO_JAX}x one `jax.jit`: {met_4096} of {seen_4096} steps")
    return out + [""]


def cuda_table(logs):
    runs = [(label(p), d["cuda"]) for p, d in logs if d["cuda"]]
    if not runs:
        return []

    def median(c, prefix):
        return next((v for k, v in c.items() if k.startswith(prefix)), None)

    out = ["**CUDA** (`handoff_cuda`, ns, medians)", "",
           "| process | raw pair | cross-stream | ratio | same-stream | same-stream, 16 at a time |",
           "|---|---|---|---|---|---|"]
    met_cross = met_same = 0
    for name, c in runs:
        raw, cross = median(c, "raw pair, one at a time"), median(c, "cross-stream, one at a time")
        same, batch = median(c, "same-stream, one at a time"), median(c, "same-stream, 16 at a time")
        ratio = cross / raw if raw and cross else None
        met_cross += ratio is not None and ratio <= CUDA_CROSS_TARGET
        met_same += batch is not None and batch <= CUDA_SAME_TARGET_NS
        out.append(f"| {name} | {fmt(raw, 0)} | {fmt(cross, 0)} | {fmt(ratio)} | {fmt(same, 0)} | {fmt(batch, 0)} |")
    return out + ["", f"- cross-stream <= {CUDA_CROSS_TARGET}x the raw pair (one at a time): "
                  f"{met_cross} of {len(runs)} runs",
                  f"- same-stream <= {CUDA_SAME_TARGET_NS:g} ns (16 at a time, no clock): "
                  f"{met_same} of {len(runs)} runs", ""]


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    logs = [(p, read(p)) for p in paths if os.path.isfile(p)]
    lines = share_tables(logs) + pipeline_table(logs) + cuda_table(logs)
    if not lines:
        print("summarize: no benchmark lines in " + ", ".join(paths), file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
