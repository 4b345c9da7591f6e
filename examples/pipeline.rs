//! The pipeline demo: a PyTorch program that runs an XLA-compiled fused kernel on its
//! own tensors, looped N times, with no copies (and on CUDA no host syncs):
//!
//! ```text
//! h = x @ w                          PyTorch (tch)
//! y = gelu_tanh(layernorm(h))        XLA, StableHLO exported from JAX (eps 1e-5, no affine, f32 inside)
//! x = x + y                          PyTorch
//! ```
//!
//! It checks its result against the same math done by PyTorch alone (tolerances
//! printed): the kernel's output on the first step and the last step, each elementwise
//! against PyTorch on the same input, and in f32 `x` after N steps against N steps of
//! PyTorch alone (in bf16 that drift is printed, not checked: see
//! `Dtype::end_tolerance`),
//! prints the hand-off stats and the host time of each phase, and exits non-zero
//! when a check fails, when anything was copied, or when a hand-off blocked the host
//! on CUDA.
//!
//! ```text
//! cargo xtask demo                              # CPU unless a GPU is present
//! cargo xtask demo -- --iters 1000 --size 1024
//! cargo xtask demo -- --device cuda             # 4096x4096 bf16 by default, one stream
//! cargo xtask demo -- --device cuda --streams two   # PyTorch on its own stream
//! cargo xtask demo -- --device mock             # the protocol on the simulated device
//! cargo xtask demo -- --device cuda --size 256 --iters 2000 --streams two --seconds 300   # a soak
//! cargo xtask demo -- --device cuda --size 256 --iters 2000 --graph   # one CUDA graph per step
//! ```

use handoff::mock::{Kernel, Mock, MockTensor};
use handoff::{Export, reaper, stats};
use handoff_examples::model::{self, Backend, Dtype, Phases, Pipeline, PipelineError};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: pipeline [--device cpu|cuda|mock] [--dtype f32|bf16] [--size N] [--iters N] [--seed N]
                [--streams one|two] [--seconds S] [--graph]

  --device   cpu (CPU libtorch, the PJRT plugin in HANDOFF_PJRT_PLUGIN), cuda (device 0,
             JAX's CUDA plugin), or mock (the protocol on handoff's simulated device).
             Default: cuda when PyTorch sees a GPU and JAX's CUDA plugin is found, else cpu.
  --dtype    default f32 on cpu, bf16 on cuda
  --size     x and w are N x N; default 256 on cpu, 4096 on cuda
  --iters    model steps; default 100
  --seed     default 0
  --streams  cuda only: one (default) runs PyTorch on the XLA kernel's ready stream, so
             the torch -> XLA hand-off needs no wait; two keeps PyTorch on its own
             current stream and orders the two with an event wait each way
  --seconds  a soak: repeat rounds of --iters steps (each from the same x) until S seconds
             have passed, checking each round's last step against PyTorch and printing
             its hand-off stats and the process's resident memory; at the end every
             release must have happened (none pending, none leaked), with no host sync
             and no copy on CUDA
  --graph    cuda only: the step (matmul, XLA kernel, add, x updated in place) captured
             once into one CUDA graph through PyTorch's CUDAGraph, then replayed: one
             launch per step, no hand-off on the host after the capture";

#[derive(Debug)]
struct Args {
    device: Option<String>,
    dtype: Option<Dtype>,
    size: Option<i64>,
    iters: usize,
    seed: i64,
    streams: Streams,
    /// A soak of this many seconds instead of one run (`--seconds`).
    seconds: Option<f64>,
    /// Replay one CUDA graph of the step (`--graph`).
    graph: bool,
}

/// Whether PyTorch and XLA share one stream on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Streams {
    /// PyTorch on the XLA kernel's ready stream (`Pipeline::share_stream`).
    One,
    /// PyTorch on its own current stream: a wait each way.
    Two,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        device: None,
        dtype: None,
        size: None,
        iters: 100,
        seed: 0,
        streams: Streams::One,
        seconds: None,
        graph: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} takes a value"));
        match a.as_str() {
            "--device" => args.device = Some(value("--device")?),
            "--dtype" => {
                let v = value("--dtype")?;
                args.dtype = Some(Dtype::parse(&v).ok_or_else(|| format!("unknown dtype {v:?}"))?);
            }
            "--size" => args.size = Some(value("--size")?.parse().map_err(|e| format!("--size: {e}"))?),
            "--iters" => args.iters = value("--iters")?.parse().map_err(|e| format!("--iters: {e}"))?,
            "--seed" => args.seed = value("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--streams" => {
                args.streams = match value("--streams")?.as_str() {
                    "one" => Streams::One,
                    "two" => Streams::Two,
                    v => return Err(format!("--streams: {v:?} is not one or two")),
                }
            }
            "--seconds" => {
                let v: f64 = value("--seconds")?.parse().map_err(|e| format!("--seconds: {e}"))?;
                if !(v > 0.0 && v.is_finite()) {
                    return Err(format!("--seconds: {v} is not a positive number of seconds"));
                }
                args.seconds = Some(v);
            }
            "--graph" => args.graph = true,
            "-h" | "--help" => return Err(String::new()),
            // `cargo xtask demo -- <args>` passes the `--` on.
            "--" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if args.graph && (args.device.as_deref() != Some("cuda") || args.seconds.is_some()) {
        return Err("--graph needs --device cuda (and no --seconds)".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("pipeline: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Before any tch CUDA query: loads libtorch_cuda.so where it exists.
    handoff_torch::init();
    let backend = match args.device.as_deref() {
        Some("mock") => return mock_demo(args.iters),
        Some("cpu") => Backend::Cpu,
        Some("cuda") => Backend::Cuda,
        Some(other) => {
            eprintln!("pipeline: unknown device {other:?}\n{USAGE}");
            return ExitCode::from(2);
        }
        None => match gpu_present() {
            Ok(()) => Backend::Cuda,
            Err(why) => {
                println!("no GPU ({why}): running on the CPU");
                Backend::Cpu
            }
        },
    };
    let outcome = match args.seconds {
        Some(seconds) => soak(backend, &args, seconds),
        None => run(backend, &args),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("pipeline: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the CUDA path can run: PyTorch sees a GPU and JAX's CUDA plugin is there.
fn gpu_present() -> Result<(), String> {
    if let Some(why) = model::cuda_unavailable() {
        return Err(why);
    }
    model::plugin(Backend::Cuda).map(drop).map_err(|e| e.to_string())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Runs the pipeline; `Ok(false)` when a check failed.
fn run(backend: Backend, args: &Args) -> Result<bool, PipelineError> {
    let (dtype, n) = dtype_and_size(backend, args);
    let iters = args.iters;
    let t_setup = Instant::now();
    let p = std::rc::Rc::new(Pipeline::new(backend, dtype, n, args.seed)?);
    let x0 = p.initial_x(args.seed + 1)?;
    println!(
        "pipeline: x = x + gelu_tanh(layernorm(x @ w)), {n}x{n} {}, {iters} steps on {}",
        dtype.name(),
        backend.name()
    );
    println!(
        "  PyTorch {} (tch) -> XLA {} {} (PJRT plugin {}) -> PyTorch",
        match backend {
            Backend::Cpu => "cpu".to_string(),
            Backend::Cuda => "cuda:0, its current stream".to_string(),
        },
        p.client().platform(),
        p.client().platform_version(),
        p.client().plugin().path().display()
    );
    println!("  setup (plugin, client, compile, weights): {:.1} ms", t_setup.elapsed().as_secs_f64() * 1e3);

    // Check 1: the XLA kernel against PyTorch's, on the same h (also the warm-up).
    let h = p.matmul(&x0)?;
    let y_xla = p.kernel(&h)?;
    let y_ref = model::ln_gelu_torch(&h)?;
    let (rtol, atol) = dtype.step_tolerance();
    let step_ok = model::allclose(&y_xla, &y_ref, rtol, atol)?;
    let (step_diff, _) = model::max_diff(&y_xla, &y_ref)?;
    drop((h, y_xla, y_ref));
    p.synchronize();
    reaper::flush();
    // One stream for both frameworks from here to the end (the device is idle now, so
    // nothing PyTorch queued before is left on its previous stream).
    let _one_stream = match (backend, args.streams) {
        (Backend::Cuda, Streams::One) => p.share_stream()?,
        _ => None,
    };
    if backend == Backend::Cuda {
        println!(
            "  streams: {}",
            match args.streams {
                Streams::One => "one (PyTorch on the XLA kernel's ready stream: no torch -> XLA wait)",
                Streams::Two => "two (PyTorch's own current stream: an event wait each way)",
            }
        );
    }

    // The run, every phase timed on the host.
    let before = stats::stats();
    let mut phases = Phases::default();
    let mut x = x0.shallow_clone();
    let mut last_input = x0.shallow_clone();
    let report_every = (iters / 4).max(1);
    let graph = if args.graph {
        let t = Instant::now();
        let g = p.graph(&x0, true)?;
        println!(
            "  graph: the step captured once ({:.1} ms); each step below is one replay",
            t.elapsed().as_secs_f64() * 1e3
        );
        Some(g)
    } else {
        None
    };
    let t0 = Instant::now();
    for i in 0..iters {
        if let Some(g) = &graph {
            if i + 1 == iters {
                last_input = g.inputs()[0].copy();
            }
            g.replay()?;
            x = g.inputs()[0].shallow_clone();
        } else {
            if i + 1 == iters {
                last_input = x.shallow_clone();
            }
            x = p.step(&x, Some(&mut phases))?;
        }
        if (i + 1) % report_every == 0 || i + 1 == iters {
            println!(
                "  step {:>6}/{iters} enqueued after {:>9.1} ms",
                i + 1,
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
    }
    let enqueued = t0.elapsed();
    let during = stats::stats().since(&before);
    p.synchronize();
    let wall = t0.elapsed();

    if phases.steps > 0 {
        println!("host time per step, by phase (mean over {} steps):", phases.steps);
        for (name, d) in phases.list() {
            println!("  {name:<22} {:>9.1} us", us(d) / f64::from(phases.steps));
        }
        println!("  {:<22} {:>9.1} us", "total", us(phases.total()) / f64::from(phases.steps));
    }
    println!(
        "wall time: {:.2} ms enqueued, {:.2} ms with the device done ({:.1} us per step)",
        enqueued.as_secs_f64() * 1e3,
        wall.as_secs_f64() * 1e3,
        us(wall) / iters as f64
    );

    let steps = iters as u64;
    println!("hand-off stats over the {iters} steps: {during}");
    if graph.is_some() {
        println!(
            "  hand-offs     {:>7}  (made once, in the capture; a replay makes none), {} kept with the graph",
            during.exports, during.releases_with_graph
        );
    } else {
        println!(
            "  hand-offs     {:>7}  ({} per step: torch->xla, xla->torch)",
            during.exports,
            during.exports / steps
        );
    }
    println!("  waits         {:>7} enqueued, {} elided", during.waits_enqueued, during.waits_elided);
    let syncs_note = match backend {
        Backend::Cuda => "0 expected: ordering stays on the GPU",
        Backend::Cpu => "CPU: the host is XLA's consumer, it waits when an execution is still running",
    };
    println!("  host syncs    {:>7}  ({syncs_note})", during.host_syncs);
    println!("  copies        {:>7}  (0 expected), {} bytes", during.copies, during.bytes_copied);

    // Check 2: the last step against PyTorch's step on the same input.
    let last_ref = p.torch_step(&last_input)?;
    let last_ok = model::allclose(&x, &last_ref, rtol, atol)?;
    let (last_diff, _) = model::max_diff(&x, &last_ref)?;
    // Check 3: x after N steps against the same N steps in PyTorch alone.
    let mut r = x0;
    for _ in 0..iters {
        r = p.torch_step(&r)?;
    }
    let (diff, scale) = model::max_diff(&x, &r)?;
    let end = dtype.end_tolerance().map(|t| (t, t * scale.max(1.0)));
    let end_ok = end.is_none_or(|(_, tol)| diff <= tol && diff.is_finite());
    reaper::flush();

    let verdict = |ok: bool| if ok { "ok" } else { "FAILED" };
    println!(
        "check: kernel output of step 1 vs PyTorch on the same h: max |diff| {step_diff:.3e}, \
         tolerance |a-b| <= {atol:e} + {rtol:e}*|b|: {}",
        verdict(step_ok)
    );
    println!(
        "check: step {iters} vs PyTorch's step on the same x: max |diff| {last_diff:.3e}, same tolerance: {}",
        verdict(last_ok)
    );
    match end {
        Some((t, tol)) => println!(
            "check: x after {iters} steps vs {iters} steps of PyTorch alone: max |diff| {diff:.3e} \
             (max |x| {scale:.3}), tolerance {t:e} * max(1, max |x|) = {tol:.3e}: {}",
            verdict(end_ok)
        ),
        None => println!(
            "info:  x after {iters} steps vs {iters} steps of PyTorch alone: max |diff| {diff:.3e} \
             (max |x| {scale:.3}); not a check in {}: the residual rounds y away once |x| is large, \
             so the per-step checks decide",
            dtype.name()
        ),
    }
    let mut ok = step_ok && last_ok && end_ok;
    if during.copies != 0 {
        println!("FAILED: {} copies were made; the hand-offs must be zero-copy", during.copies);
        ok = false;
    }
    if backend == Backend::Cuda && during.host_syncs != 0 {
        println!("FAILED: {} host syncs on the CUDA hand-off path", during.host_syncs);
        ok = false;
    }
    if let Some(g) = graph {
        // What the graph kept (PJRT's holds, the kernel's input and output) is released
        // once the driver says it is gone: waited for here, before the process exits.
        drop(g);
        if !handoff::graph::wait_released(Duration::from_secs(5)) {
            println!(
                "FAILED: {} releases kept with the graph were not done 5 s after it was dropped",
                handoff::graph::pending()
            );
            ok = false;
        }
        reaper::flush();
    }
    println!("result: {}", if ok { "correct" } else { "WRONG" });
    Ok(ok)
}

/// The protocol on the mock device: a "model" stream produces activations, a "kernel"
/// stream consumes them through a hand-off, the result comes back, N times; then it
/// checks the values, reports hazards (none expected) and prints the hand-off stats.
/// The dtype and size asked for, else the backend's defaults.
fn dtype_and_size(backend: Backend, args: &Args) -> (Dtype, i64) {
    let dtype = args.dtype.unwrap_or(match backend {
        Backend::Cpu => Dtype::F32,
        Backend::Cuda => Dtype::Bf16,
    });
    let n = args.size.unwrap_or(match backend {
        Backend::Cpu => 256,
        Backend::Cuda => 4096,
    });
    (dtype, n)
}

/// The soak (`--seconds`): rounds of `--iters` steps, each from the same `x0` (so the
/// values stay bounded however long it runs), until `seconds` have passed. A round's
/// steps are enqueued with nothing waited for, so its releases are deferred behind the
/// consumer's queued work; its last step is then checked against PyTorch (a host sync
/// of the checker, not of a hand-off). A line every 10 s: that round's hand-off stats,
/// the releases still pending and the resident memory, for a long run's log to show
/// that nothing accumulates. `Ok(false)` when a check failed.
fn soak(backend: Backend, args: &Args, seconds: f64) -> Result<bool, PipelineError> {
    let (dtype, n) = dtype_and_size(backend, args);
    let p = Pipeline::new(backend, dtype, n, args.seed)?;
    let x0 = p.initial_x(args.seed + 1)?;
    let _one_stream = match (backend, args.streams) {
        (Backend::Cuda, Streams::One) => p.share_stream()?,
        _ => None,
    };
    let (rtol, atol) = dtype.step_tolerance();
    println!(
        "soak: {n}x{n} {}, rounds of {} steps on {} for {seconds} s",
        dtype.name(),
        args.iters,
        backend.name()
    );
    let start = stats::stats();
    let t0 = Instant::now();
    let (mut round, mut ok, mut printed) = (0u64, true, None::<Instant>);
    while t0.elapsed().as_secs_f64() < seconds {
        round += 1;
        let before = stats::stats();
        let (mut x, mut last_input) = (x0.shallow_clone(), x0.shallow_clone());
        for i in 0..args.iters {
            if i + 1 == args.iters {
                last_input = x.shallow_clone();
            }
            x = p.step(&x, None)?;
        }
        let during = stats::stats().since(&before);
        let pending = reaper::pending();
        let step_ok = model::allclose(&x, &p.torch_step(&last_input)?, rtol, atol)?;
        let round_ok = step_ok && during.copies == 0 && (backend == Backend::Cpu || during.host_syncs == 0);
        ok &= round_ok;
        // A line every 10 s (and for any round that failed), so an hour's log stays short.
        if !round_ok || printed.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            printed = Some(Instant::now());
            println!(
                "soak: round {round:>5} at {:>6.1} s: last step {}, host syncs {}, copies {}, releases deferred {}, \
             immediate {}, leaked {}, pending after the round {pending}, rss {:.1} MiB",
                t0.elapsed().as_secs_f64(),
                if step_ok { "ok" } else { "WRONG" },
                during.host_syncs,
                during.copies,
                during.releases_deferred,
                during.releases_immediate,
                during.releases_leaked,
                resident_mib().unwrap_or(f64::NAN),
            );
        }
    }
    p.synchronize();
    reaper::flush();
    let total = stats::stats().since(&start);
    let (pending, leaked) = (reaper::pending(), total.releases_leaked);
    println!("soak: {round} rounds in {:.1} s; hand-off stats: {total}", t0.elapsed().as_secs_f64());
    println!("soak: after the flush: {pending} releases pending, {leaked} leaked (0 and 0 expected)");
    ok &= pending == 0 && leaked == 0 && total.copies == 0;
    if backend == Backend::Cuda && total.host_syncs != 0 {
        println!("FAILED: {} host syncs on the CUDA hand-off path", total.host_syncs);
        ok = false;
    }
    println!("result: {}", if ok { "correct" } else { "WRONG" });
    Ok(ok)
}

/// This process's resident memory (`/proc/self/statm`), in MiB; `None` where there is
/// no procfs.
fn resident_mib() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0 / (1024.0 * 1024.0))
}

fn mock_demo(iters: usize) -> ExitCode {
    let mock = Mock::new();
    let model = mock.stream(0, "model");
    let kernel = mock.stream(0, "xla-kernel");
    let before = stats::stats();
    let mut expected = 0.0f32;
    let mut x = mock.tensor_f32(&model, "x", &[1024], &[0.0; 1024]);
    for i in 0..iters {
        // The model step: x = x + 1 on the model stream.
        let id = x.buffer();
        mock.launch(
            &model,
            Kernel::new("model step").micros(40).reads(id).writes(id).run(move |k| {
                let v: Vec<f32> = k.read_f32(id).iter().map(|v| v + 1.0).collect();
                k.write_f32(id, &v);
            }),
        );
        // Hand x to the kernel stream, which doubles it into a fresh buffer.
        let seen: MockTensor = match x.export(&kernel).and_then(|h| h.import()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("pipeline: hand-off to the kernel stream failed: {e}");
                return ExitCode::FAILURE;
            }
        };
        let out = mock.tensor_f32(&kernel, "y", &[1024], &[0.0; 1024]);
        let (s, o) = (seen.buffer(), out.buffer());
        mock.launch(
            &kernel,
            Kernel::new("fused kernel").micros(10).reads(s).writes(o).run(move |k| {
                let v: Vec<f32> = k.read_f32(s).iter().map(|v| v * 2.0).collect();
                k.write_f32(o, &v);
            }),
        );
        drop(seen); // released only after the fused kernel is done
        // And back to the model stream.
        x = match out.export(&model).and_then(|h| h.import()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("pipeline: hand-off back to the model stream failed: {e}");
                return ExitCode::FAILURE;
            }
        };
        expected = (expected + 1.0) * 2.0;
        if (i + 1) % (iters / 4).max(1) == 0 {
            println!(
                "iteration {:>5}/{iters} enqueued (device time so far: {} us)",
                i + 1,
                mock.now() / 1_000
            );
        }
    }
    mock.synchronize();
    println!("all work done after {} us of simulated device time", mock.now() / 1_000);
    let got = mock.read_f32(&x);
    let ok = got.iter().all(|&v| v == expected);
    reaper::flush_stream(&kernel);
    reaper::flush_stream(&model);
    let hazards = mock.hazards();
    let d = stats::stats().since(&before);
    println!("result: {} (every element {expected}, checked)", if ok { "correct" } else { "WRONG" });
    println!("hazards: {}", hazards.len());
    for h in &hazards {
        println!("  {h}");
    }
    println!("hand-off stats: {d}");
    println!("host syncs on the hand-off path: {} (the demo's own final sync is the mock's)", d.host_syncs);
    if ok && hazards.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
