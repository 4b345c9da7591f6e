//! The GPU benchmark of the pipeline (`examples/model.rs`), in one process, at each size
//! (default 4096x4096 and 256x256 bf16):
//!
//! 1. `tch`: the step in PyTorch alone (tch), same math;
//! 2. `handoff`: the pipeline with handoff (tch -> XLA -> tch), stream-ordered;
//! 3. `handoff_host_sync`: the same with a forced host sync at every hand-off (what
//!    naive interop does).
//!
//! It reports the median ms per step over `--reps` runs of `--iters` steps (x10 below
//! 1024) and the ratio to (1); the host cost of each hand-off direction (median of
//! `--samples`, default 10,000) and of each phase of a step; and the no-host-sync
//! proof: with ~50 ms of GPU work queued first (`at::cuda::sleep` on PyTorch's stream),
//! a whole step is enqueued in under 1 ms, with no host sync, the GPU still busy
//! afterwards, and a correct result. It also times the step's parts alone (the matmul,
//! the step without its residual add, the add), the kernel call's GPU span in the real
//! step (CUDA timing events on PyTorch's stream), and the step made of the bare
//! framework calls instead of handoff's (its floor), to show where a GPU-bound step's
//! time goes against one `jax.jit` of the whole step, which fuses the add. It exits non-zero
//! when the proof or a result check fails. One machine-readable `BENCH {json}` line per
//! figure, next to `bench/python_pipeline.py`'s lines (the same keys: variant, n,
//! dtype, ms_per_iter, ratio_to_torch).
//!
//! Without a GPU it prints `SKIPPED: reason` and exits 0 (1 when
//! `HANDOFF_REQUIRE_GPU=1`, as the GPU bundle sets).
//!
//! ```text
//! cargo xtask gpu-bundle --only handoff-examples   # then gpu-bundle/run.sh on the H200
//! pipeline_gpu [--sizes 4096,256] [--iters 50] [--reps 7] [--samples 10000] [--trials 10]
//! pipeline_gpu --loop call|floor|export|export-floor|to-xla|to-xla-floor [--loop-secs 10] [--sizes 256]   # for a sampling profiler
//! ```

#[path = "pipeline_gpu/floor.rs"]
mod floor;

use handoff::{Device, Export, Handoff, Stream, stats};
use handoff_examples::model::{self, Backend, Dtype, Phases, Pipeline, PipelineError};
use handoff_xla::Buffer;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tch::Tensor;

/// The GPU work queued before each proof trial.
const QUEUED_MS: f64 = 50.0;
/// The enqueue-time limit of the no-host-sync proof: a fifth of the queued work, far
/// from both a real wait (50 ms) and scheduler noise (a few ms at worst).
const ENQUEUE_LIMIT: Duration = Duration::from_millis(QUEUED_MS as u64 / 5);

/// What the kernel call does inside, step by step, through the lower-level API:
/// each hand-off half timed on its own, and the host-synced baseline.
struct Lower<'p> {
    p: &'p Pipeline,
    /// PyTorch's current stream.
    torch: Stream,
    /// XLA's ready stream.
    ready: Stream,
}

impl<'p> Lower<'p> {
    fn new(p: &'p Pipeline) -> Result<Lower<'p>, PipelineError> {
        let torch = handoff_torch::current_stream(Device::Cuda(0))?
            .ok_or_else(|| PipelineError::NoCuda("PyTorch has no current stream".into()))?;
        Ok(Lower { p, torch, ready: p.xla_kernel().ready_stream().clone() })
    }

    /// `h` made ready on XLA's stream.
    fn export_for_xla(&self, h: &Tensor) -> Result<Handoff, PipelineError> {
        Ok(handoff_torch::export(h, &self.ready)?)
    }

    /// The view of `h` in XLA.
    fn import_into_xla(&self, handoff: Handoff) -> Result<Buffer, PipelineError> {
        Ok(self.p.client().import(handoff)?)
    }

    /// The executable alone, on a buffer.
    fn execute(&self, hx: &Buffer) -> Result<Buffer, PipelineError> {
        Ok(self.p.xla_kernel().executable().execute(&[hx])?.remove(0))
    }

    /// `y` made ready on PyTorch's stream.
    fn export_for_torch(&self, y: &Buffer) -> Result<Handoff, PipelineError> {
        Ok(y.clone().export(&self.torch)?)
    }

    /// The tensor view of `y`.
    fn import_into_torch(&self, handoff: Handoff) -> Result<Tensor, PipelineError> {
        Ok(handoff_torch::import(handoff)?)
    }

    /// One step with a host sync before each hand-off (PyTorch's stream before `h`
    /// goes to XLA, the XLA output before it comes back): what naive interop does.
    fn step_synced(&self, x: &Tensor) -> Result<Tensor, PipelineError> {
        let h = self.p.matmul(x)?;
        self.torch.synchronize()?;
        let hx = self.import_into_xla(self.export_for_xla(&h)?)?;
        let y = self.execute(&hx)?;
        drop(hx);
        y.block_until_ready()?;
        let yt = self.import_into_torch(self.export_for_torch(&y)?)?;
        Ok(x.f_add(&yt)?)
    }
}

struct Args {
    sizes: Vec<i64>,
    iters: usize,
    reps: usize,
    samples: usize,
    trials: usize,
    /// `--loop call|floor|export|export-floor|to-xla|to-xla-floor`: only repeat that
    /// path for `--loop-secs` (for a sampling profiler run around the process).
    profile: Option<(floor::Looped, f64)>,
}

fn parse_args() -> Result<Args, String> {
    let mut a =
        Args { sizes: vec![4096, 256], iters: 50, reps: 7, samples: 10_000, trials: 10, profile: None };
    let mut loop_secs = 10.0;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} takes a value"));
        let num = |name: &str, v: String| v.parse::<usize>().map_err(|e| format!("{name}: {e}"));
        match arg.as_str() {
            "--sizes" => {
                a.sizes = value("--sizes")?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--iters" => a.iters = num("--iters", value("--iters")?)?,
            "--reps" => a.reps = num("--reps", value("--reps")?)?,
            "--samples" => a.samples = num("--samples", value("--samples")?)?,
            "--trials" => a.trials = num("--trials", value("--trials")?)?,
            "--loop" => {
                let name = value("--loop")?;
                let looped = floor::Looped::ALL.into_iter().find(|l| l.name() == name);
                a.profile = Some((
                    looped.ok_or_else(|| {
                        format!("--loop: {name:?} is none of {:?}", floor::Looped::ALL.map(|l| l.name()))
                    })?,
                    0.0,
                ));
            }
            "--loop-secs" => {
                loop_secs = value("--loop-secs")?.parse::<f64>().map_err(|e| format!("--loop-secs: {e}"))?
            }
            // What `cargo bench` passes to harness-less benches.
            "--bench" | "--" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.iters == 0 || a.reps == 0 || a.samples == 0 || a.trials == 0 {
        return Err("--iters, --reps, --samples and --trials must be at least 1".into());
    }
    if let Some((_, secs)) = &mut a.profile {
        *secs = loop_secs;
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "pipeline_gpu: {e}\nusage: pipeline_gpu [--sizes 4096,256] [--iters 50] [--reps 7] [--samples 10000] [--trials 10]"
            );
            return ExitCode::from(2);
        }
    };
    handoff_torch::init();
    if let Some(skipped) = model::gpu_or_skip("pipeline_gpu") {
        return skipped;
    }
    if let Some((which, secs)) = args.profile {
        let n = args.sizes[0];
        let looped = Pipeline::new(Backend::Cuda, Dtype::Bf16, n, 0).and_then(|p| {
            let h = p.matmul(&p.initial_x(1)?)?;
            floor::repeat(&p, &h, which, secs)
        });
        return match looped {
            Ok(t) => {
                println!(
                    "loop {n}x{n}: {}, {} calls, mean {:.2} us, median {:.2} us, wall per call {:.2} us",
                    which.name(),
                    t.calls,
                    t.mean,
                    t.median,
                    t.wall
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pipeline_gpu: loop: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut ok = true;
    for &n in &args.sizes {
        match bench_size(n, &args) {
            Ok(passed) => ok &= passed,
            Err(e) => {
                eprintln!("pipeline_gpu: {n}x{n}: {e}");
                ok = false;
            }
        }
    }
    if ok {
        println!("pipeline_gpu: all checks passed");
        ExitCode::SUCCESS
    } else {
        println!("pipeline_gpu: FAILED");
        ExitCode::FAILURE
    }
}

/// A flat JSON object, written by hand (no serde in the examples).
#[derive(Default)]
struct Json(String);

impl Json {
    fn field(&mut self, key: &str, value: impl std::fmt::Display, quoted: bool) -> &mut Json {
        self.0.push(if self.0.is_empty() { '{' } else { ',' });
        if quoted {
            let _ = write!(self.0, "\"{key}\":\"{value}\"");
        } else {
            let _ = write!(self.0, "\"{key}\":{value}");
        }
        self
    }
    fn s(&mut self, key: &str, value: impl std::fmt::Display) -> &mut Json {
        self.field(key, value, true)
    }
    fn n(&mut self, key: &str, value: impl std::fmt::Display) -> &mut Json {
        self.field(key, value, false)
    }
    fn f(&mut self, key: &str, value: f64, digits: usize) -> &mut Json {
        if value.is_finite() {
            self.field(key, format!("{value:.digits$}"), false)
        } else {
            self.n(key, "null")
        }
    }
    fn print(&mut self) {
        println!("BENCH {}}}", self.0);
    }
}

fn base(variant: &str, p: &Pipeline) -> Json {
    let mut j = Json::default();
    j.s("bench", "pipeline_gpu")
        .s("impl", "rust")
        .s("variant", variant)
        .n("n", p.n)
        .s("dtype", p.dtype.name());
    j
}

/// Median ms per step over `reps` runs of `iters` steps from `x0`, after 3 warm-up
/// steps; each run ends with a device sync (the benchmark's, not a hand-off's).
fn timed(
    p: &Pipeline,
    x0: &Tensor,
    iters: usize,
    reps: usize,
    mut step: impl FnMut(&Tensor) -> Result<Tensor, PipelineError>,
) -> Result<f64, PipelineError> {
    let mut x = x0.shallow_clone();
    p.median_ms(iters, reps, || {
        x = step(&x)?;
        Ok(())
    })
}

/// The pipeline with PyTorch working on XLA's ready stream, and what it counted.
struct Shared {
    ms: f64,
    stats: stats::Stats,
    correct: bool,
}

/// Times the handoff pipeline with PyTorch's current stream set to the XLA kernel's
/// ready stream, so that both frameworks work on one stream: the torch -> XLA wait is
/// elided (the runtime sees one stream) and the memory goes back at once. PyTorch's
/// stream is restored after. `None` when the ready stream is not a CUDA stream.
fn shared_stream(
    p: &Pipeline,
    x0: &Tensor,
    iters: usize,
    reps: usize,
) -> Result<Option<Shared>, PipelineError> {
    p.synchronize();
    // PyTorch's stream is restored when the guard drops, on every path.
    let Some(_one_stream) = p.share_stream()? else {
        return Ok(None);
    };
    let (rtol, atol) = Dtype::Bf16.step_tolerance();
    let correct = model::allclose(&p.step(x0, None)?, &p.torch_step(x0)?, rtol, atol)?;
    let before = stats::stats();
    let ms = timed(p, x0, iters, reps, |x| p.step(x, None))?;
    let counted = stats::stats().since(&before);
    p.synchronize();
    Ok(Some(Shared { ms, stats: counted, correct }))
}

/// The step's parts timed alone, ms each (same loop as [`timed`], on a fixed `x`): where
/// the GPU time of a step goes when the GPU is the limit (4096²; at 256² the host is).
struct Parts {
    /// PyTorch's matmul alone.
    matmul: f64,
    /// The step without its residual add: the matmul and the kernel call (both
    /// hand-offs and the XLA kernel) — what one `jax.jit` of the whole step does in its
    /// own kernels, the add fused into the last one.
    without_add: f64,
    /// PyTorch's residual add alone: a kernel of its own here, fused away by `jax.jit`.
    add: f64,
}

fn gpu_parts(p: &Pipeline, x0: &Tensor, iters: usize, reps: usize) -> Result<Parts, PipelineError> {
    let y = p.kernel(&p.matmul(x0)?)?;
    let parts = Parts {
        matmul: timed(p, x0, iters, reps, |x| {
            drop(p.matmul(x)?); // dropped at once: its memory is reused in stream order
            Ok(x.shallow_clone())
        })?,
        without_add: timed(p, x0, iters, reps, |x| {
            drop(p.kernel(&p.matmul(x)?)?);
            Ok(x.shallow_clone())
        })?,
        add: timed(p, x0, iters, reps, |x| {
            drop(x.f_add(&y)?);
            Ok(x.shallow_clone())
        })?,
    };
    p.synchronize();
    Ok(parts)
}

/// Where a step's GPU time goes, seen from PyTorch's stream: two CUDA timing events
/// recorded on it in each real step, after the matmul and after the kernel call (the
/// host runs ahead, so each span is GPU time), medians in ms. The kernel call's span
/// runs from the matmul's end to the moment its output is ready on PyTorch's stream:
/// XLA's wait for its input, its layer norm + gelu kernel, and PyTorch's wait for its
/// output, the two cross-framework dependencies included; the rest of the step (from
/// one step's matmul end to the next's) is PyTorch's add and matmul.
struct Timeline {
    call: f64,
    rest: f64,
    step: f64,
}

fn gpu_timeline(p: &Pipeline, x0: &Tensor, steps: usize) -> Result<Timeline, PipelineError> {
    use cudarc::driver::sys;
    let failed = |what: &str, r: sys::CUresult| PipelineError::NoCuda(format!("timeline: {what}: {r:?}"));
    let stream = handoff_torch::cuda::current_raw_stream(0)? as usize as sys::CUstream;
    let mut events = vec![[std::ptr::null_mut::<sys::CUevent_st>(); 2]; steps + 1];
    for e in events.iter_mut().flat_map(|s| s.iter_mut()) {
        // SAFETY: a valid out pointer; PyTorch made the primary context current.
        let r = unsafe { sys::cuEventCreate(e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(failed("cuEventCreate", r));
        }
    }
    // SAFETY: a live event of this context and PyTorch's live current stream.
    let record = |e: sys::CUevent| unsafe { sys::cuEventRecord(e, stream) };
    let mut x = x0.shallow_clone();
    for _ in 0..3 {
        x = p.step(&x, None)?;
    }
    p.synchronize();
    for e in &events {
        let h = p.matmul(&x)?;
        record(e[0]);
        let y = p.kernel(&h)?;
        record(e[1]);
        x = x.f_add(&y)?;
    }
    p.synchronize();
    let elapsed = |a: sys::CUevent, b: sys::CUevent| {
        let mut ms = 0f32;
        // SAFETY: both recorded on the same stream and complete (synchronized above).
        let r = unsafe { sys::cuEventElapsedTime_v2(&mut ms, a, b) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(f64::from(ms))
        } else {
            Err(failed("cuEventElapsedTime", r))
        }
    };
    let (mut call, mut step) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
    for w in events.windows(2) {
        call.push(elapsed(w[0][0], w[0][1])?);
        step.push(elapsed(w[0][0], w[1][0])?);
    }
    for e in events.iter().flatten() {
        // SAFETY: created above, complete, destroyed once.
        unsafe { sys::cuEventDestroy_v2(*e) };
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (call, step) = (median(call), median(step));
    Ok(Timeline { call, rest: step - call, step })
}

/// GPU clock cycles of `at::cuda::sleep` that keep PyTorch's stream busy for `ms`.
fn cycles_for(p: &Pipeline, ms: f64) -> Result<i64, PipelineError> {
    handoff_torch::cuda::sleep(0, 1000)?; // loads the kernel
    p.synchronize();
    let probe = 20_000_000i64;
    let t = Instant::now();
    handoff_torch::cuda::sleep(0, probe)?;
    p.synchronize();
    let per_ms = probe as f64 / (t.elapsed().as_secs_f64() * 1e3);
    Ok((per_ms * ms) as i64)
}

/// Prints one floor table (and the composed kernel call's steps) and adds it to `json`
/// under keys that start with `prefix`.
fn print_floor(
    label: &str,
    prefix: &str,
    rows: &[floor::Row],
    call_steps: &floor::CallSteps,
    samples: usize,
    json: &mut Json,
) {
    println!("host cost against the floor, {label}, medians of {samples} (us):");
    println!("  {:<36} {:>9} {:>9} {:>9} {:>9}", "path", "handoff", "floor", "share", "paired");
    for r in rows {
        println!(
            "  {:<36} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            r.name,
            r.handoff,
            r.floor,
            r.handoff - r.floor,
            r.paired
        );
        json.f(&format!("{prefix}{}_handoff_us", r.key), r.handoff, 2)
            .f(&format!("{prefix}{}_floor_us", r.key), r.floor, 2)
            .f(&format!("{prefix}{}_share_us", r.key), r.handoff - r.floor, 2)
            .f(&format!("{prefix}{}_paired_share_us", r.key), r.paired, 2);
    }
    println!("the kernel call composed by hand, {label}, step by step, medians of {samples} (us):");
    let (mut sum_h, mut sum_f) = (0.0, 0.0);
    for (name, h, f) in &call_steps.steps {
        println!("  {name:<36} {h:>9.2} {f:>9.2} {:>9.2}", h - f);
        let key = name.replace(' ', "_").to_lowercase();
        json.f(&format!("{prefix}call_step_{key}_handoff_us"), *h, 2).f(
            &format!("{prefix}call_step_{key}_floor_us"),
            *f,
            2,
        );
        (sum_h, sum_f) = (sum_h + h, sum_f + f);
    }
    println!("  {:<36} {sum_h:>9.2} {sum_f:>9.2} {:>9.2}", "sum of the steps", sum_h - sum_f);
    let ((whole_h, whole_f), paired) = (call_steps.whole, call_steps.paired);
    println!(
        "  {:<36} {whole_h:>9.2} {whole_f:>9.2} {:>9.2} {paired:>9.2} (paired)",
        "median of each call's sum",
        whole_h - whole_f
    );
    json.f(&format!("{prefix}call_whole_handoff_us"), whole_h, 2)
        .f(&format!("{prefix}call_whole_floor_us"), whole_f, 2)
        .f(&format!("{prefix}call_whole_paired_share_us"), paired, 2);
}

fn bench_size(n: i64, args: &Args) -> Result<bool, PipelineError> {
    let dtype = Dtype::Bf16;
    let p = Pipeline::new(Backend::Cuda, dtype, n, 0)?;
    let x0 = p.initial_x(1)?;
    let iters = if n >= 1024 { args.iters } else { args.iters * 10 };
    let device = p.client().device_by_ordinal(0)?;
    println!(
        "== {n}x{n} {}: {} ({}), XLA {}; {iters} steps x {} reps",
        dtype.name(),
        device.kind(),
        p.client().platform(),
        p.client().platform_version(),
        args.reps
    );
    let mut ok = true;

    // Correctness first: the XLA kernel against PyTorch's on the same h, and one step.
    let (rtol, atol) = dtype.step_tolerance();
    let h = p.matmul(&x0)?;
    let kernel_ok = model::allclose(&p.kernel(&h)?, &model::ln_gelu_torch(&h)?, rtol, atol)?;
    let step_ok = model::allclose(&p.step(&x0, None)?, &p.torch_step(&x0)?, rtol, atol)?;
    let lower = Lower::new(&p)?;
    println!(
        "check: kernel and one step vs PyTorch (|a-b| <= {atol:e} + {rtol:e}*|b|): {}",
        if kernel_ok && step_ok { "ok" } else { "FAILED" }
    );
    ok &= kernel_ok && step_ok;
    drop(h);

    // (1) PyTorch alone, (2) handoff, (3) handoff with a host sync at each hand-off.
    let ms_torch = timed(&p, &x0, iters, args.reps, |x| p.torch_step(x))?;
    let before = stats::stats();
    let ms_handoff = timed(&p, &x0, iters, args.reps, |x| p.step(x, None))?;
    let s_handoff = stats::stats().since(&before);
    let before = stats::stats();
    let ms_synced = timed(&p, &x0, iters, args.reps, |x| lower.step_synced(x))?;
    let s_synced = stats::stats().since(&before);
    let steps = ((iters * args.reps) + 3) as f64;
    let shared = shared_stream(&p, &x0, iters, args.reps)?;
    let parts = gpu_parts(&p, &x0, iters, args.reps)?;
    // The GPU timeline on PyTorch's own stream, then with PyTorch on XLA's ready stream.
    // And the step made of the bare framework calls (its floor), both ways.
    let mut timelines = vec![("two streams", "two", gpu_timeline(&p, &x0, iters)?)];
    // Each beside handoff's step timed again, in turns, so that all see the same machine.
    let floors = || -> Result<[(&str, f64, f64); 4], PipelineError> {
        use floor::OutputRelease::{Inline, InlineInputDroppedElsewhere, Reaper};
        let mut ms: [Vec<(f64, f64)>; 4] = Default::default();
        for _ in 0..5 {
            ms[0].push((timed(&p, &x0, iters, args.reps, |x| p.step(x, None))?, f64::NAN));
            ms[1].push(floor::pipeline_ms(&p, &x0, iters, args.reps, Inline)?);
            ms[2].push(floor::pipeline_ms(&p, &x0, iters, args.reps, Reaper)?);
            ms[3].push(floor::pipeline_ms(&p, &x0, iters, args.reps, InlineInputDroppedElsewhere)?);
        }
        let [h, i, r, e] = ms.map(|mut v| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v[v.len() / 2]
        });
        Ok([
            ("handoff", h.0, h.1),
            ("inline", i.0, i.1),
            ("reaper", r.0, r.1),
            ("inline, h dropped on another thread", e.0, e.1),
        ])
    };
    let (view_here, view_elsewhere) = floor::view_release_threads(&p, &x0, 1000)?;
    println!(
        "a kernel call's input view: PJRT let go of its keep-alive on the calling thread {view_here} times, \
         on another thread {view_elsewhere} times (of 1000)"
    );
    let mut step_floors = vec![("two streams", "two", floors()?)];
    if let Some(_one_stream) = p.share_stream()? {
        timelines.push(("one stream", "one", gpu_timeline(&p, &x0, iters)?));
        step_floors.push(("one stream", "one", floors()?));
    }

    // Where the host time of a step goes.
    let mut phases = Phases::default();
    let mut x = x0.shallow_clone();
    for _ in 0..iters {
        x = p.step(&x, Some(&mut phases))?;
    }
    p.synchronize();
    drop(x);
    let per_step = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(phases.steps);

    // Host cost of each hand-off direction.
    let h = p.matmul(&x0)?;
    let y = lower.execute(&lower.import_into_xla(lower.export_for_xla(&h)?)?)?;
    p.synchronize();
    let (mut to_xla, mut to_torch, mut release) = (
        Vec::with_capacity(args.samples),
        Vec::with_capacity(args.samples),
        Vec::with_capacity(args.samples),
    );
    // Each direction split into its export and its import half.
    let mut halves: [Vec<Duration>; 4] = std::array::from_fn(|_| Vec::with_capacity(args.samples));
    let before = stats::stats();
    for _ in 0..args.samples {
        let t0 = Instant::now();
        let handoff = lower.export_for_xla(&h)?;
        let ta = Instant::now();
        let hx = lower.import_into_xla(handoff)?;
        let t1 = Instant::now();
        let handoff = lower.export_for_torch(&y)?;
        let tb = Instant::now();
        let yt = lower.import_into_torch(handoff)?;
        let t2 = Instant::now();
        drop(hx);
        drop(yt);
        let t3 = Instant::now();
        to_xla.push(t1 - t0);
        to_torch.push(t2 - t1);
        release.push(t3 - t2);
        halves[0].push(ta - t0);
        halves[1].push(t1 - ta);
        halves[2].push(tb - t1);
        halves[3].push(t2 - tb);
    }
    let [mut torch_export, mut xla_import, mut xla_export, mut torch_import] = halves;
    println!(
        "hand-off halves, median of {} (us): torch export {:.2}, XLA import (view) {:.2}; XLA export {:.2}, torch import {:.2}",
        args.samples,
        model::median_us(&mut torch_export),
        model::median_us(&mut xla_import),
        model::median_us(&mut xla_export),
        model::median_us(&mut torch_import)
    );
    let s_samples = stats::stats().since(&before);
    p.synchronize();
    drop(y);
    // The whole kernel call (both hand-offs and the execution), and the bare execution.
    let (mut call, mut bare) = (Vec::with_capacity(args.samples), Vec::with_capacity(args.samples));
    let hx = lower.import_into_xla(lower.export_for_xla(&h)?)?;
    for i in 0..args.samples {
        let t0 = Instant::now();
        let y = p.kernel(&h)?;
        let t1 = Instant::now();
        let yx = lower.execute(&hx)?;
        let t2 = Instant::now();
        drop((y, yx));
        call.push(t1 - t0);
        bare.push(t2 - t1);
        if i % 256 == 255 {
            p.synchronize();
        }
    }
    p.synchronize();
    drop((h, hx));
    let (us_call, us_bare_execute) = (model::median_us(&mut call), model::median_us(&mut bare));
    println!(
        "kernel call, median of {} (us): {us_call:.2} (both hand-offs + execute); bare PJRT execute {us_bare_execute:.2}",
        args.samples
    );
    let (us_to_xla, us_to_torch, us_release) =
        (model::median_us(&mut to_xla), model::median_us(&mut to_torch), model::median_us(&mut release));

    // Each path against its floor: the bare framework calls it cannot avoid.
    let h = p.matmul(&x0)?;
    let before = stats::stats();
    let (rows, steps_in_company, call_steps) = floor::measure(&p, &h, args.samples)?;
    let s_floor = stats::stats().since(&before);
    drop(h);
    let mut floor_json = base("floor", &p);
    floor_json.n("samples", args.samples).n("host_syncs", s_floor.host_syncs);
    print_floor("two streams", "", &rows, &call_steps, args.samples, &mut floor_json);
    // The same on one stream (PyTorch on XLA's ready stream), the demo's default: a
    // perfect adapter makes no event for torch -> XLA there, and the floor makes none.
    let h = p.matmul(&x0)?;
    p.synchronize();
    let before = stats::stats();
    let one_stream = {
        let _one_stream = p.share_stream()?;
        let measured = floor::measure(&p, &h, args.samples);
        p.synchronize();
        measured
    };
    let (one_rows, _, one_call_steps) = one_stream?;
    let one_stream_syncs = stats::stats().since(&before).host_syncs;
    drop(h);
    floor_json.n("one_stream_host_syncs", one_stream_syncs);
    print_floor("one stream", "one_stream_", &one_rows, &one_call_steps, args.samples, &mut floor_json);
    // A step's host time can go no lower than its PyTorch dispatches plus the kernel
    // call's floor: the bound on the step at sizes where the host is the limit.
    let call_floor = rows.iter().find(|r| r.key == "kernel_call").map_or(f64::NAN, |r| r.floor);
    let step_floor = per_step(phases.matmul) + per_step(phases.add) + call_floor;
    println!(
        "host time per step {:.2} us; its floor (torch matmul + torch add + the kernel call's floor) {step_floor:.2} us; \
         tch step {:.2} us",
        per_step(phases.total()),
        ms_torch * 1e3
    );
    floor_json.f("host_us_step", per_step(phases.total()), 2).f("host_us_step_floor", step_floor, 2);
    // Where the torch export's time goes, step by step: alone, and in the floor loop's
    // company.
    let h = p.matmul(&x0)?;
    let export_steps = floor::torch_export_steps(&p, &h, args.samples)?;
    // What in the loop's company slows it: the same export beside a thread of each kind.
    let mut company = Vec::new();
    for neighbour in floor::Neighbour::ALL {
        let (whole, bare) = floor::torch_export_in_company(&p, &h, args.samples, neighbour)?;
        company.push(format!("{} {whole:.2} / {bare:.2} ({:.2})", neighbour.key(), whole - bare));
        floor_json.f(&format!("torch_export_beside_{}_us", neighbour.key()), whole, 2).f(
            &format!("torch_export_floor_beside_{}_us", neighbour.key()),
            bare,
            2,
        );
    }
    println!("torch export / its floor (share), µs, beside a neighbour thread: {}", company.join(", "));
    drop(h);
    for (label, key, steps) in [
        ("alone", "torch_export_step", export_steps),
        ("in the floor loop", "torch_export_step_in_loop", steps_in_company.medians()),
    ] {
        let line: Vec<String> = steps.iter().map(|(name, us)| format!("{name} {us:.2}")).collect();
        let total: f64 = steps.iter().take_while(|(name, _)| *name != "release").map(|(_, us)| us).sum();
        println!("torch export step by step, {label}, medians (us): {}; sum {total:.2}", line.join(", "));
        for (name, us) in &steps {
            floor_json.f(&format!("{key}_{}_us", name.replace([' ', '-'], "_").to_lowercase()), *us, 2);
        }
    }
    floor_json.print();
    if s_floor.host_syncs + one_stream_syncs != 0 {
        println!(
            "FAILED: the floor comparison made {} host syncs through handoff (0 expected)",
            s_floor.host_syncs + one_stream_syncs
        );
        ok = false;
    }

    // The no-host-sync proof.
    let cycles = cycles_for(&p, QUEUED_MS)?;
    let t = Instant::now();
    handoff_torch::cuda::sleep(0, cycles)?;
    p.synchronize();
    let queued_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut x = x0.shallow_clone();
    for _ in 0..3 {
        x = p.step(&x, None)?;
    }
    p.synchronize();
    let (mut enqueue, mut syncs, mut busy, mut correct) = (Vec::new(), 0u64, 0usize, 0usize);
    // The slowest step's phases: where a step that took long spent its time.
    let mut slowest: Option<(Duration, model::Phases)> = None;
    for _ in 0..args.trials {
        handoff_torch::cuda::sleep(0, cycles)?;
        let global = stats::stats();
        let mut phases = model::Phases::default();
        let t = Instant::now();
        let (next, local) = stats::measure(|| p.step(&x, Some(&mut phases)));
        let took = t.elapsed();
        if slowest.as_ref().is_none_or(|(d, _)| took > *d) {
            slowest = Some((took, phases));
        }
        let next = next?;
        syncs += local.host_syncs.max(stats::stats().since(&global).host_syncs);
        // Still running the sleep: the step really was only enqueued.
        if !lower.torch.record()?.query()? {
            busy += 1;
        }
        enqueue.push(took);
        p.synchronize();
        if model::allclose(&next, &p.torch_step(&x)?, rtol, atol)? {
            correct += 1;
        }
        x = next;
    }
    p.synchronize();
    let max_enqueue = enqueue.iter().copied().max().unwrap_or_default();
    let median_enqueue = model::median_us(&mut enqueue);
    let trials = args.trials;
    let proof_ok = max_enqueue < ENQUEUE_LIMIT && syncs == 0 && busy == trials && correct == trials;
    println!(
        "no-host-sync: {n}x{n}: {trials} steps each enqueued behind {queued_ms:.1} ms of GPU work in max {:.1} us \
         (median {median_enqueue:.1} us, limit {} us), host syncs {syncs}, GPU still busy after {busy}/{trials}, \
         correct {correct}/{trials}: {}",
        max_enqueue.as_secs_f64() * 1e6,
        ENQUEUE_LIMIT.as_micros(),
        if proof_ok { "ok" } else { "FAILED" }
    );
    if let Some((took, ph)) = slowest {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "no-host-sync: the slowest step ({:.1} us): torch matmul {:.1}, kernel call {:.1}, torch add {:.1}, \
             release {:.1} us",
            us(took),
            us(ph.matmul),
            us(ph.kernel),
            us(ph.add),
            us(ph.release)
        );
    }
    ok &= proof_ok;

    let handoff_ok = s_handoff.host_syncs == 0 && s_handoff.copies == 0 && s_samples.host_syncs == 0;
    if !handoff_ok {
        println!(
            "FAILED: the handoff variant made {} host syncs and {} copies (0 and 0 expected); hand-off samples {} host syncs",
            s_handoff.host_syncs, s_handoff.copies, s_samples.host_syncs
        );
    }
    ok &= handoff_ok;

    base("tch", &p)
        .n("iters", iters)
        .n("reps", args.reps)
        .f("ms_per_iter", ms_torch, 4)
        .f("ratio_to_torch", 1.0, 3)
        .print();
    base("handoff", &p)
        .n("iters", iters)
        .n("reps", args.reps)
        .f("ms_per_iter", ms_handoff, 4)
        .f("ratio_to_torch", ms_handoff / ms_torch, 3)
        .n("host_syncs", s_handoff.host_syncs)
        .n("copies", s_handoff.copies)
        .f("handoffs_per_iter", s_handoff.exports as f64 / steps, 2)
        .f("waits_enqueued_per_iter", s_handoff.waits_enqueued as f64 / steps, 2)
        .f("waits_elided_per_iter", s_handoff.waits_elided as f64 / steps, 2)
        .f("host_us_torch_to_xla", us_to_xla, 2)
        .f("host_us_xla_to_torch", us_to_torch, 2)
        .f("host_us_release_both", us_release, 2)
        .n("handoff_samples", args.samples)
        .f("host_us_step", per_step(phases.total()), 2)
        .f("host_us_torch_matmul", per_step(phases.matmul), 2)
        .f("host_us_kernel_call", per_step(phases.kernel), 2)
        .f("host_us_kernel_call_median", us_call, 2)
        .f("host_us_bare_execute_median", us_bare_execute, 2)
        .f("host_us_torch_add", per_step(phases.add), 2)
        .f("host_us_release", per_step(phases.release), 2)
        .print();
    base("handoff_host_sync", &p)
        .n("iters", iters)
        .n("reps", args.reps)
        .f("ms_per_iter", ms_synced, 4)
        .f("ratio_to_torch", ms_synced / ms_torch, 3)
        .f("host_syncs_per_iter", s_synced.host_syncs as f64 / steps, 2)
        .n("copies", s_synced.copies)
        .print();
    base("no_host_sync_proof", &p)
        .f("queued_ms", queued_ms, 1)
        .n("trials", trials)
        .f("enqueue_us_max", max_enqueue.as_secs_f64() * 1e6, 1)
        .f("enqueue_us_median", median_enqueue, 1)
        .n("host_syncs", syncs)
        .n("gpu_busy_after", busy)
        .n("correct", correct)
        .n("pass", proof_ok)
        .print();
    if let Some(sh) = &shared {
        println!(
            "shared stream {n}x{n}: PyTorch on XLA's ready stream, handoff {:.4} ms ({:.3}x tch); waits enqueued {:.2}, \
             elided {:.2} per step; host syncs {}, copies {}; one step vs PyTorch: {}",
            sh.ms,
            sh.ms / ms_torch,
            sh.stats.waits_enqueued as f64 / steps,
            sh.stats.waits_elided as f64 / steps,
            sh.stats.host_syncs,
            sh.stats.copies,
            if sh.correct { "ok" } else { "FAILED" }
        );
        base("handoff_shared_stream", &p)
            .n("iters", iters)
            .n("reps", args.reps)
            .f("ms_per_iter", sh.ms, 4)
            .f("ratio_to_torch", sh.ms / ms_torch, 3)
            .n("host_syncs", sh.stats.host_syncs)
            .n("copies", sh.stats.copies)
            .f("waits_enqueued_per_iter", sh.stats.waits_enqueued as f64 / steps, 2)
            .f("waits_elided_per_iter", sh.stats.waits_elided as f64 / steps, 2)
            .print();
        ok &= sh.correct && sh.stats.host_syncs == 0 && sh.stats.copies == 0;
    }
    println!(
        "the step's parts alone, ms per step: torch matmul {:.4}, the step without its residual add (matmul + kernel call) \
         {:.4}, torch residual add {:.4}; the handoff step {ms_handoff:.4} (one jax.jit fuses the add into its kernel)",
        parts.matmul, parts.without_add, parts.add
    );
    base("parts", &p)
        .n("iters", iters)
        .n("reps", args.reps)
        .f("ms_torch_matmul", parts.matmul, 4)
        .f("ms_step_without_add", parts.without_add, 4)
        .f("ms_torch_add", parts.add, 4)
        .print();
    for (label, key, [(_, handoff_ms, _), floors @ ..]) in &step_floors {
        for (release, floor_ms, release_us) in floors {
            println!(
                "the step with the bare framework calls (its floor), {label}, the output released {release} \
                 ({release_us:.2} us of host time): {floor_ms:.4} ms per step; handoff's step beside it \
                 {handoff_ms:.4} ms ({:.3}x)",
                handoff_ms / floor_ms
            );
            base("pipeline_floor", &p)
                .s("streams", key)
                .s("release", release)
                .n("iters", iters)
                .n("reps", args.reps)
                .f("ms_per_iter", *floor_ms, 4)
                .f("ratio_to_torch", floor_ms / ms_torch, 3)
                .f("handoff_ms_per_iter", *handoff_ms, 4)
                .f("handoff_to_floor", handoff_ms / floor_ms, 3)
                .f("host_us_release", *release_us, 2)
                .print();
        }
    }
    for (label, key, t) in &timelines {
        println!(
            "GPU timeline on PyTorch's stream, {label}, median of {iters} steps, ms: kernel call (XLA's wait, \
             its kernel, PyTorch's wait) {:.4}, the rest (torch add and matmul) {:.4}; step {:.4}",
            t.call, t.rest, t.step
        );
        base("gpu_timeline", &p)
            .s("streams", key)
            .n("steps", iters)
            .f("ms_kernel_call_span", t.call, 4)
            .f("ms_torch_add_and_matmul", t.rest, 4)
            .f("ms_step", t.step, 4)
            .print();
    }
    println!("host time per step by phase (mean of {} steps):", phases.steps);
    for (name, d) in phases.list() {
        println!("  {name:<22} {:>8.2} us", per_step(d));
    }
    println!(
        "summary {n}x{n}: tch {ms_torch:.4} ms, handoff {ms_handoff:.4} ms ({:.3}x), host-synced {ms_synced:.4} ms ({:.3}x); \
         hand-off host cost torch->xla {us_to_xla:.2} us, xla->torch {us_to_torch:.2} us (medians of {})",
        ms_handoff / ms_torch,
        ms_synced / ms_torch,
        args.samples
    );
    handoff::reaper::flush();
    Ok(ok)
}
