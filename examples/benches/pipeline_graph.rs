//! The pipeline step (`examples/model.rs`: torch matmul -> XLA layer norm + gelu ->
//! torch add) replayed as one CUDA graph, beside the same step run eagerly, at each size
//! (default 256x256 and 4096x4096 bf16), in one process:
//!
//! 1. `tch`: the step in PyTorch alone, eager;
//! 2. `handoff`: the pipeline with handoff, eager (PyTorch on its own current stream);
//! 3. `tch_graph`: PyTorch's step captured into one CUDA graph (`x += y` in place);
//! 4. `handoff_graph`: the pipeline's step, its XLA kernel included, captured into one
//!    CUDA graph through `handoff_torch::graph` (`x += y` in place).
//!
//! The four run in turns (`--rounds`, each the median ms per step over `--reps` runs of
//! `--iters` steps, x10 below 1024), so that all see the same machine; the figure of
//! each is the median of its rounds. Values: one replay of each graph against the same
//! step run eagerly on the same `x`, before the timings and again after them (the
//! graphs then replayed thousands of times among eager XLA executions, which reuse
//! PJRT's memory). One `BENCH {json}` line per figure, with `bench/python_pipeline.py`'s
//! keys (variant, n, dtype, ms_per_iter, ratio_to_torch), so that its `jax.jit` of the
//! whole step, run in the same device call, compares. Exits non-zero when a value
//! check fails.
//!
//! Without a GPU it prints `SKIPPED: reason` and exits 0 (1 when
//! `HANDOFF_REQUIRE_GPU=1`, as the GPU bundle sets).
//!
//! ```text
//! pipeline_graph [--sizes 256,4096] [--iters 50] [--reps 7] [--rounds 3] [--samples 2000]
//! ```

use handoff::stats;
use handoff_examples::model::{self, Backend, Dtype, Pipeline, PipelineError};
use std::process::ExitCode;
use std::rc::Rc;
use std::time::Instant;
use tch::Tensor;

struct Args {
    sizes: Vec<i64>,
    iters: usize,
    reps: usize,
    rounds: usize,
    samples: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { sizes: vec![256, 4096], iters: 50, reps: 7, rounds: 3, samples: 2000 };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} takes a value"));
        let number = |v: String, name: &str| v.parse::<usize>().map_err(|e| format!("{name}: {e}"));
        match a.as_str() {
            "--sizes" => {
                args.sizes = value("--sizes")?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--iters" => args.iters = number(value("--iters")?, "--iters")?,
            "--reps" => args.reps = number(value("--reps")?, "--reps")?,
            "--rounds" => args.rounds = number(value("--rounds")?, "--rounds")?,
            "--samples" => args.samples = number(value("--samples")?, "--samples")?,
            "--bench" | "--" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.iters == 0 || args.reps == 0 || args.rounds == 0 {
        return Err("--iters, --reps and --rounds must be at least 1".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "pipeline_graph: {e}\nusage: pipeline_graph [--sizes 256,4096] [--iters 50] [--reps 7] [--rounds 3] [--samples 2000]"
            );
            return ExitCode::from(2);
        }
    };
    handoff_torch::init();
    if let Some(skipped) = model::gpu_or_skip("pipeline_graph") {
        return skipped;
    }
    let mut ok = true;
    for &n in &args.sizes {
        match bench_size(n, &args) {
            Ok(size_ok) => ok &= size_ok,
            Err(e) => {
                eprintln!("pipeline_graph: {n}x{n}: {e}");
                ok = false;
            }
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Whether one replay of `graph` matches `eager` run on the graph's input as it was.
fn replay_matches(
    p: &Pipeline,
    graph: &handoff_torch::graph::Graph,
    eager: impl Fn(&Tensor) -> Result<Tensor, PipelineError>,
) -> Result<(bool, f64), PipelineError> {
    let before = graph.inputs()[0].copy();
    graph.replay()?;
    let want = eager(&before)?;
    let (rtol, atol) = p.dtype.step_tolerance();
    let ok = model::allclose(&graph.inputs()[0], &want, rtol, atol)?;
    let (diff, _) = model::max_diff(&graph.inputs()[0], &want)?;
    Ok((ok, diff))
}

fn bench_size(n: i64, args: &Args) -> Result<bool, PipelineError> {
    let p = Rc::new(Pipeline::new(Backend::Cuda, Dtype::Bf16, n, 0)?);
    let x0 = p.initial_x(1)?;
    let iters = if n >= 1024 { args.iters } else { args.iters * 10 };
    println!("== {n}x{n} bf16: {iters} steps x {} reps, {} rounds", args.reps, args.rounds);
    // Eager first: XLA compiles and autotunes, cuBLAS makes its workspace.
    let _ = p.step(&x0, None)?;
    let _ = p.torch_step(&x0)?;
    p.synchronize();

    let torch_graph = p.graph(&x0, false)?;
    let before = stats::stats();
    let t = Instant::now();
    let mixed = p.graph(&x0, true)?;
    let capture_ms = t.elapsed().as_secs_f64() * 1e3;
    let captured = stats::stats().since(&before);
    println!("captured in {capture_ms:.1} ms: {captured}");
    println!("the graphs: handoff {}; tch {}", mixed.description(), torch_graph.description());

    let mut ok = true;
    let mut check = |when: &str| -> Result<(), PipelineError> {
        let (m, dm) = replay_matches(&p, &mixed, |x| p.step(x, None))?;
        let (t, dt) = replay_matches(&p, &torch_graph, |x| p.torch_step(x))?;
        println!(
            "check ({when}): one replay vs the eager step on the same x: handoff graph max |diff| {dm:.3e} {}, \
             tch graph {dt:.3e} {}",
            if m { "ok" } else { "FAILED" },
            if t { "ok" } else { "FAILED" }
        );
        ok &= m && t;
        Ok(())
    };
    check("before the timings")?;

    let names = ["tch", "handoff", "tch_graph", "handoff_graph"];
    let mut ms: [Vec<f64>; 4] = Default::default();
    let before = stats::stats();
    for _ in 0..args.rounds {
        let mut x = x0.shallow_clone();
        ms[0].push(p.median_ms(iters, args.reps, || {
            x = p.torch_step(&x)?;
            Ok(())
        })?);
        let mut x = x0.shallow_clone();
        ms[1].push(p.median_ms(iters, args.reps, || {
            x = p.step(&x, None)?;
            Ok(())
        })?);
        ms[2].push(p.median_ms(iters, args.reps, || Ok(torch_graph.replay()?))?);
        ms[3].push(p.median_ms(iters, args.reps, || Ok(mixed.replay()?))?);
    }
    let during = stats::stats().since(&before);
    check("after the timings")?;

    // The host time of one replay, against one eager step.
    let (mut replay, mut eager) = (Vec::with_capacity(args.samples), Vec::with_capacity(args.samples));
    let mut x = x0.shallow_clone();
    for i in 0..args.samples {
        let t0 = Instant::now();
        mixed.replay()?;
        let t1 = Instant::now();
        x = p.step(&x, None)?;
        let t2 = Instant::now();
        replay.push(t1 - t0);
        eager.push(t2 - t1);
        if i % 64 == 63 {
            p.synchronize();
        }
    }
    p.synchronize();
    let (us_replay, us_eager) = (model::median_us(&mut replay), model::median_us(&mut eager));

    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let figures: Vec<(&str, f64)> = names.iter().zip(ms.iter_mut()).map(|(n, v)| (*n, median(v))).collect();
    let torch_ms = figures[0].1;
    println!("{:<14} {:>10} {:>9}   (median of {} rounds)", "variant", "ms/step", "vs tch", args.rounds);
    for (name, m) in &figures {
        println!("{name:<14} {m:>10.4} {:>8.3}x", m / torch_ms);
        println!(
            "BENCH {{\"bench\":\"pipeline_graph\",\"impl\":\"rust\",\"variant\":\"{name}\",\"n\":{n},\"dtype\":\"bf16\",\
             \"ms_per_iter\":{m:.5},\"ratio_to_torch\":{:.4},\"rounds\":[{}]}}",
            m / torch_ms,
            ms[names.iter().position(|x| x == name).unwrap_or(0)]
                .iter()
                .map(|v| format!("{v:.5}"))
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    println!(
        "handoff graph / handoff eager: {:.3}x; host time of a replay {us_replay:.2} us (median of {}), of an eager \
         step {us_eager:.2} us",
        figures[3].1 / figures[1].1,
        args.samples
    );
    println!(
        "BENCH {{\"bench\":\"pipeline_graph\",\"impl\":\"rust\",\"variant\":\"replay_host\",\"n\":{n},\"dtype\":\"bf16\",\
         \"us_replay\":{us_replay:.3},\"us_eager_step\":{us_eager:.3}}}"
    );
    println!("stats over the timings (replays make no hand-off; the eager steps do): {during}");
    if during.host_syncs != 0 {
        println!("FAILED: {} host syncs", during.host_syncs);
        ok = false;
    }
    Ok(ok)
}
