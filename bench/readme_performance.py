"""The README's performance table and figure, from the JSON lines of the current GPU run.

    python bench/readme_performance.py          # rewrites the README's table and docs/performance.svg
    python bench/readme_performance.py --check  # exit 1 if either differs from what the logs give

Reads the logs of the run BENCHMARKS.md shows (``RUN`` below: its folder in
``docs/gpu-runs/``, date, commit and device), and writes:

- the table between ``<!-- performance:begin -->`` and ``<!-- performance:end -->`` in
  README.md: each measure, handoff's value, the same run's baseline, device, date, commit;
- ``docs/performance.svg``: ms per training step through a JAX layer at the host-bound
  sizes, for pure PyTorch, jax2torch, torch-jax-interop, handoff and the JAX layer alone.

Only the standard library: the figure is plain SVG.
"""

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUN = {
    "dir": "docs/gpu-runs/2026-12-06-h100-run2",
    "date": "2026-12-06",
    "commit": "e19ed9b",
    "device": "H100",
}
README = ROOT / "README.md"
FIGURE = ROOT / "docs" / "performance.svg"
BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"
VARIANTS = [
    ("torch", "PyTorch", "#7f7f7f"),
    ("jax2torch", "jax2torch 0.0.7", "#d62728"),
    ("torch_jax_interop", "torch-jax-interop 0.0.8", "#ff7f0e"),
    ("handoff", "handoff", "#1f77b4"),
    ("floor", "JAX layer alone", "#2ca02c"),
]


def json_lines(name):
    """The JSON objects of one log of the run (lines starting with ``{``, or ``BENCH {``)."""
    out = []
    for line in (ROOT / RUN["dir"] / name).read_text().splitlines():
        line = line.strip()
        if line.startswith("BENCH {"):
            line = line[len("BENCH "):]
        if not line.startswith("{"):
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line the bundle's summary cut short
    return out


def span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def rows():
    """The table's rows: (measure, handoff, baseline)."""
    targets = {(t["direction"], t["field"]): t["values"]
               for t in json_lines("call1-host_cost.out") if t.get("figure") == "host_cost_target"}
    steps = {(s["model"], s["variant"], s["dtype"], s["bound"]): s
             for s in json_lines("call2-train_three_way.log") if s.get("figure") == "step"}
    lifetime = {(x["model"], x["variant"]): x for x in json_lines("call2-train_three_way.log")
                if x.get("figure") == "lifetime"}
    ab = [x for x in json_lines("call3-wheel_ab-report.txt") if x.get("figure") == "ab"]
    bench = [x for x in json_lines("call1-rust-bundle.out") if x.get("bench") == "pipeline_gpu"]
    out = [
        ("PyTorch → JAX, host time of one crossing (256² f32)",
         f"`handoff.to_jax(t)` {span(targets[('torch->jax', 'native_us')], '{:.1f}')} µs",
         f"{span(targets[('torch->jax', 'native_ratio')], '{:.2f}')}× `jax.dlpack.from_dlpack(t)`"),
        ("JAX → PyTorch, host time of one crossing (256² f32)",
         f"`handoff.to_torch(a)` {span(targets[('jax->torch', 'native_us')], '{:.1f}')} µs",
         f"{span(targets[('jax->torch', 'native_ratio')], '{:.2f}')}× `torch.from_dlpack(a)`"),
    ]
    for model, size, label in [("mlp", "64x256", "MLP 64×256"), ("attn", "8x64x128", "attention 8×64×128")]:
        for dtype in ("f32", "bf16"):
            h, t = steps[(model, "handoff", dtype, "host")], steps[(model, "torch", dtype, "host")]
            others = [steps[(model, v, dtype, "host")]["ms_per_step"] / t["ms_per_step"]
                      for v in ("jax2torch", "torch_jax_interop")]
            out.append((f"training step through a JAX layer, {label} {dtype} (host-bound)",
                        f"{h['ms_per_step']:.2f} ms, {h['ms_per_step'] / t['ms_per_step']:.2f}× PyTorch, "
                        f"{h['host_syncs']} host syncs",
                        f"pure PyTorch {t['ms_per_step']:.2f} ms; other bridges {span(others, '{:.2f}')}×"))
    life = lifetime[("mlp", "handoff")]
    others = [lifetime[("mlp", v)] for v in ("jax2torch", "torch_jax_interop")]
    out.append(("gradients right while PyTorch reuses the memory (lifetime trials)",
                f"{life['right']}/{life['trials']}",
                "other bridges " + ", ".join(f"{o['right']}/{o['trials']}" for o in others)))
    out.append(("GPU-bound training step, this wheel / the previous one (A/B, same run)",
                span([x["ratio"] for x in ab], "{:.3f}") + "×", "target ≤ 1.03×"))
    for n in (256, 4096):
        tch = next(b for b in bench if b["variant"] == "tch" and b["n"] == n)
        one = next(b for b in bench if b["variant"] == "handoff_shared_stream" and b["n"] == n)
        out.append((f"Rust pipeline step, tch → XLA kernel → tch, {n}² bf16",
                    f"{one['ms_per_iter']:.4f} ms ({one['ms_per_iter'] / tch['ms_per_iter']:.2f}×), "
                    f"{one['host_syncs']} host syncs",
                    f"tch alone {tch['ms_per_iter']:.4f} ms"))
    return out


def table():
    lines = [BEGIN,
             f"Measured on an {RUN['device']}, {RUN['date']}, commit `{RUN['commit']}` "
             "(BENCHMARKS.md has every figure, with its command). Regenerated by "
             "`python bench/readme_performance.py`.",
             "",
             "| measure | handoff | same-run baseline |",
             "|---|---|---|"]
    lines += [f"| {m} | {v} | {b} |" for m, v, b in rows()]
    lines += ["", "![ms per training step through a JAX layer](docs/performance.svg)", END]
    return "\n".join(lines)


def figure():
    """Grouped bars: ms per host-bound training step, per model and dtype, per variant."""
    steps = {(s["model"], s["variant"], s["dtype"]): s["ms_per_step"]
             for s in json_lines("call2-train_three_way.log")
             if s.get("figure") == "step" and s["bound"] == "host"}
    groups = [(m, d) for m in ("mlp", "attn") for d in ("f32", "bf16")]
    top = max(steps.values())
    w, h, left, bottom, bar = 720, 340, 60, 50, 22
    group_w = (w - left - 20) / len(groups)
    scale = (h - bottom - 50) / top
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           f'font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="14">ms per training step through a JAX layer, host-bound sizes '
           f'({RUN["device"]}, {RUN["date"]})</text>']
    for tick in range(int(top) + 1):
        y = h - bottom - tick * scale
        svg.append(f'<line x1="{left}" x2="{w - 20}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    for g, (model, dtype) in enumerate(groups):
        x0 = left + g * group_w + (group_w - bar * len(VARIANTS)) / 2
        for i, (variant, _, color) in enumerate(VARIANTS):
            ms = steps[(model, variant, dtype)]
            y = h - bottom - ms * scale
            svg.append(f'<rect x="{x0 + i * bar:.1f}" y="{y:.1f}" width="{bar - 3}" height="{ms * scale:.1f}" '
                       f'fill="{color}"><title>{variant}: {ms:.3f} ms</title></rect>')
        name = {"mlp": "MLP 64×256", "attn": "attention 8×64×128"}[model]
        svg.append(f'<text x="{left + (g + 0.5) * group_w:.1f}" y="{h - bottom + 18}" text-anchor="middle">'
                   f'{name} {dtype}</text>')
    for i, (_, label, color) in enumerate(VARIANTS):
        x = left + i * 130
        svg.append(f'<rect x="{x}" y="{h - 18}" width="10" height="10" fill="{color}"/>')
        svg.append(f'<text x="{x + 14}" y="{h - 9}">{label}</text>')
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="exit 1 if the README or the figure is stale")
    args = ap.parse_args()
    readme = README.read_text()
    if BEGIN not in readme or END not in readme:
        sys.exit(f"README.md has no {BEGIN} ... {END} section")
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    new_readme = readme[:start] + table() + readme[end:]
    new_figure = figure()
    if args.check:
        stale = [str(p.relative_to(ROOT)) for p, new in ((README, new_readme), (FIGURE, new_figure))
                 if not p.exists() or p.read_text() != new]
        if stale:
            sys.exit(f"stale: {', '.join(stale)}; run python bench/readme_performance.py")
        print("README performance table and docs/performance.svg are current")
        return
    README.write_text(new_readme)
    FIGURE.write_text(new_figure)
    print(f"wrote the README's performance table and {FIGURE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
