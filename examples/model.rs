//! The model step of the pipeline demo and of the GPU benchmark, shared by both.
//!
//! One step, looped: `h = x @ w` in PyTorch (through tch), `y = gelu_tanh(layernorm(h))`
//! in an XLA executable compiled from StableHLO that JAX exported (layer norm over the
//! last axis, eps 1e-5, no affine, computed in f32 and cast back), then the residual
//! `x = x + y` in PyTorch. `bench/python_pipeline.py` does the same math in Python.
//!
//! The kernel is one call, `let y: Tensor = kernel.call1(&h)?`: `h` goes to XLA and `y`
//! comes back through handoff with no copy and no stream written; on CUDA the
//! readiness is an event wait enqueued on the consumer's stream and the host never
//! waits, and `y` is ready on PyTorch's current stream; on the CPU the XLA-to-torch
//! hand-off waits on the host (a counted host sync) when XLA's CPU execution is still
//! running, since the host is then the consumer.
//!
//! The StableHLO programs are embedded in the binary (`include_str!`), so it runs
//! from anywhere; `adapters/xla/programs/export.py` generates them.

use handoff_xla::{Client, ClientOptions, CompileOptions, Kernel, Plugin, Program, XlaError};
use std::time::{Duration, Instant};
use tch::{Kind, TchError, Tensor};

/// The layer norm's epsilon.
pub const EPS: f64 = 1e-5;

/// Where the pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// CPU libtorch and a CPU PJRT plugin (`HANDOFF_PJRT_PLUGIN`).
    Cpu,
    /// CUDA device 0: PyTorch's CUDA and JAX's CUDA PJRT plugin.
    Cuda,
}

impl Backend {
    /// `cpu` or `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// The element type of `x`, `w` and the kernel's input and output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
}

impl Dtype {
    /// Parses `f32` or `bf16`.
    pub fn parse(s: &str) -> Option<Dtype> {
        match s {
            "f32" | "float32" => Some(Dtype::F32),
            "bf16" | "bfloat16" => Some(Dtype::Bf16),
            _ => None,
        }
    }

    /// `f32` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }

    /// The tch kind.
    pub fn kind(self) -> Kind {
        match self {
            Dtype::F32 => Kind::Float,
            Dtype::Bf16 => Kind::BFloat16,
        }
    }

    /// Tolerance `(rtol, atol)` of one step's kernel output against PyTorch's
    /// (elementwise `|a - b| <= atol + rtol * |b|`): f32 differs by the two libraries'
    /// tanh, rsqrt and reduction order; bf16 by one rounding of the output.
    pub fn step_tolerance(self) -> (f64, f64) {
        match self {
            Dtype::F32 => (1e-5, 1e-5),
            Dtype::Bf16 => (1.6e-2, 1e-2),
        }
    }

    /// Tolerance of `x` after N steps against the same N steps in PyTorch alone,
    /// relative to `max |x|` (`max |a - b| <= tol * max(1, max |b|)`): the one-step
    /// differences feed back through the residual and grow slowly with N. `None` for
    /// bf16: once `|x|` is large, the residual add rounds most of `y` away, so two
    /// correct implementations drift apart by rounding flips of `x`'s last bit (up to
    /// half of `max |x|` after 1000 steps); there the per-step checks decide.
    pub fn end_tolerance(self) -> Option<f64> {
        match self {
            Dtype::F32 => Some(1e-4),
            Dtype::Bf16 => None,
        }
    }
}

macro_rules! programs {
    ($($dtype:ident $n:literal => $file:literal,)*) => {
        /// The embedded StableHLO text of the kernel for `dtype` and `n x n`, if it was
        /// generated (see [`sizes`]).
        pub fn program_text(dtype: Dtype, n: i64) -> Option<&'static str> {
            match (dtype, n) {
                $((Dtype::$dtype, $n) => Some(include_str!(concat!("../adapters/xla/programs/", $file))),)*
                _ => None,
            }
        }

        /// The sizes `n` (programs of `n x n`) embedded for `dtype`.
        pub fn sizes(dtype: Dtype) -> Vec<i64> {
            [$((Dtype::$dtype, $n)),*].into_iter().filter(|(d, _)| *d == dtype).map(|(_, n)| n).collect()
        }
    };
}

programs! {
    F32 64 => "ln_gelu_f32_64x64.mlir",
    F32 256 => "ln_gelu_f32_256x256.mlir",
    F32 1024 => "ln_gelu_f32_1024x1024.mlir",
    F32 4096 => "ln_gelu_f32_4096x4096.mlir",
    Bf16 256 => "ln_gelu_bf16_256x256.mlir",
    Bf16 1024 => "ln_gelu_bf16_1024x1024.mlir",
    Bf16 4096 => "ln_gelu_bf16_4096x4096.mlir",
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A PyTorch operation failed.
    #[error("PyTorch: {0}")]
    Torch(#[from] TchError),
    /// A hand-off failed.
    #[error("handoff: {0}")]
    Handoff(#[from] handoff::Error),
    /// XLA (PJRT) failed.
    #[error("XLA: {0}")]
    Xla(#[from] XlaError),
    /// No kernel was generated for this size.
    #[error(
        "no {dtype} kernel of {n}x{n} is embedded (sizes: {available:?}; add one to adapters/xla/programs/export.py)"
    )]
    NoProgram {
        /// The dtype asked for.
        dtype: &'static str,
        /// The size asked for.
        n: i64,
        /// The sizes there are.
        available: Vec<i64>,
    },
    /// The CUDA path cannot be used here.
    #[error("CUDA is not usable: {0}")]
    NoCuda(String),
    /// The PJRT plugin does not fit the backend.
    #[error("{0}")]
    Plugin(String),
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, PipelineError>;

/// Why CUDA cannot be used, or `None` when PyTorch and handoff both see a GPU.
pub fn cuda_unavailable() -> Option<String> {
    if !handoff_torch::shim_has_cuda() {
        return Some("handoff-torch's shim was built without the CUDA headers".into());
    }
    if !handoff_torch::init() {
        return Some(format!(
            "libtorch_cuda.so does not load ({})",
            handoff_torch::cuda_load_error().unwrap_or_default()
        ));
    }
    if !tch::Cuda::is_available() {
        return Some("PyTorch sees no CUDA device".into());
    }
    if !handoff::cuda::is_available() {
        return Some("handoff's CUDA backend cannot use the driver".into());
    }
    None
}

/// The PJRT plugin for `backend`: for CUDA, `HANDOFF_PJRT_PLUGIN` when it names a GPU
/// plugin, else JAX's CUDA plugin found by [`Plugin::cuda`]; for CPU,
/// `HANDOFF_PJRT_PLUGIN` (what `cargo xtask setup` installs).
pub fn plugin(backend: Backend) -> Result<&'static Plugin> {
    match backend {
        Backend::Cuda => {
            if let Ok(p) = Plugin::from_env()
                && p.is_gpu()
            {
                return Ok(p);
            }
            Ok(Plugin::cuda()?)
        }
        Backend::Cpu => {
            let p = Plugin::from_env()?;
            if p.is_gpu() {
                return Err(PipelineError::Plugin(format!(
                    "{} is a GPU plugin; run with --device cuda, or point HANDOFF_PJRT_PLUGIN at a CPU plugin",
                    p.path().display()
                )));
            }
            Ok(p)
        }
    }
}

/// `gelu_tanh(layernorm(h))` in PyTorch alone (f32 inside, cast back to `h`'s kind).
pub fn ln_gelu_torch(h: &Tensor) -> Result<Tensor> {
    let hf = h.f_to_kind(Kind::Float)?;
    let mean = hf.f_mean_dim([-1i64].as_slice(), true, Kind::Float)?;
    let centered = hf.f_sub(&mean)?;
    let var = centered.f_square()?.f_mean_dim([-1i64].as_slice(), true, Kind::Float)?;
    let normed = centered.f_mul(&var.f_add_scalar(EPS)?.f_rsqrt()?)?;
    Ok(normed.f_gelu("tanh")?.f_to_kind(h.kind())?)
}

/// Host time spent in each phase of the step, summed over the steps timed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Steps timed.
    pub steps: u32,
    /// `h = x @ w` (tch dispatch).
    pub matmul: Duration,
    /// The kernel call: `h` to XLA, the execution enqueued, `y` back to PyTorch.
    pub kernel: Duration,
    /// `x + y` (tch dispatch).
    pub add: Duration,
    /// Dropping `h` and `y` (stream-ordered releases).
    pub release: Duration,
}

impl Phases {
    /// The phases as `(name, total)`.
    pub fn list(&self) -> [(&'static str, Duration); 4] {
        [
            ("torch matmul", self.matmul),
            ("xla kernel call", self.kernel),
            ("torch residual add", self.add),
            ("release", self.release),
        ]
    }

    /// The sum of the phases.
    pub fn total(&self) -> Duration {
        self.list().iter().map(|(_, d)| *d).sum()
    }
}

/// The pipeline: the XLA kernel and the weight.
pub struct Pipeline {
    /// Where it runs.
    pub backend: Backend,
    /// The element type.
    pub dtype: Dtype,
    /// `x` and `w` are `n x n`.
    pub n: i64,
    client: Client,
    kernel: Kernel,
    torch_device: tch::Device,
    w: Tensor,
}

impl Pipeline {
    /// Loads the plugin, creates the client (CUDA: `preallocate=false`, so XLA shares
    /// the GPU with PyTorch), compiles the kernel and makes `w` (`randn / sqrt(n)`,
    /// seeded).
    pub fn new(backend: Backend, dtype: Dtype, n: i64, seed: i64) -> Result<Pipeline> {
        let text = program_text(dtype, n).ok_or_else(|| PipelineError::NoProgram {
            dtype: dtype.name(),
            n,
            available: sizes(dtype),
        })?;
        let torch_device = match backend {
            Backend::Cpu => tch::Device::Cpu,
            Backend::Cuda => {
                if let Some(why) = cuda_unavailable() {
                    return Err(PipelineError::NoCuda(why));
                }
                tch::Device::Cuda(0)
            }
        };
        let plugin = plugin(backend)?;
        let options = match backend {
            Backend::Cuda => ClientOptions::default().preallocate(false),
            Backend::Cpu => ClientOptions::default(),
        };
        let client = Client::new(plugin, &options)?;
        let kernel = Kernel::compile(&client, Program::text(text), &CompileOptions::default())?;
        tch::manual_seed(seed);
        let w = Tensor::f_randn([n, n], (Kind::Float, torch_device))?
            .f_div_scalar((n as f64).sqrt())?
            .f_to_kind(dtype.kind())?;
        Ok(Pipeline { backend, dtype, n, client, kernel, torch_device, w })
    }

    /// A starting `x`: `randn * 0.1`, seeded.
    pub fn initial_x(&self, seed: i64) -> Result<Tensor> {
        tch::manual_seed(seed);
        Ok(Tensor::f_randn([self.n, self.n], (Kind::Float, self.torch_device))?
            .f_mul_scalar(0.1)?
            .f_to_kind(self.dtype.kind())?)
    }

    /// The XLA client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The XLA kernel.
    pub fn xla_kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The tch device.
    pub fn torch_device(&self) -> tch::Device {
        self.torch_device
    }

    /// `h = x @ w`.
    pub fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.f_matmul(&self.w)?)
    }

    /// The kernel on a PyTorch tensor, in one call: `h` goes to XLA and `y` comes
    /// back without a copy, ready on PyTorch's current stream (on CUDA, ordered by
    /// stream waits; the host never waits).
    pub fn kernel(&self, h: &Tensor) -> Result<Tensor> {
        Ok(self.kernel.call1(h)?)
    }

    /// One step: torch matmul, the XLA kernel, torch residual add. With `phases`, the
    /// host time of each phase is added to it.
    pub fn step(&self, x: &Tensor, phases: Option<&mut Phases>) -> Result<Tensor> {
        let Some(p) = phases else {
            let y = self.kernel(&self.matmul(x)?)?;
            return Ok(x.f_add(&y)?);
        };
        let t0 = Instant::now();
        let h = self.matmul(x)?;
        let t1 = Instant::now();
        let y = self.kernel(&h)?;
        let t2 = Instant::now();
        let out = x.f_add(&y)?;
        let t3 = Instant::now();
        drop((y, h));
        let t4 = Instant::now();
        p.steps += 1;
        p.matmul += t1 - t0;
        p.kernel += t2 - t1;
        p.add += t3 - t2;
        p.release += t4 - t3;
        Ok(out)
    }

    /// Makes the XLA kernel's ready stream PyTorch's current stream until the guard
    /// drops (PyTorch's previous stream is restored then, on every path): one stream
    /// for both frameworks. The torch -> XLA hand-off then needs no event and no wait
    /// (the runtime sees one stream), and PyTorch's memory goes back as soon as XLA
    /// lets go of it. `None` on the CPU, where the ready stream is the host.
    ///
    /// Tensors carry no stream of their own: a hand-off orders after PyTorch's
    /// *current* stream. Switch when the work PyTorch queued on its previous stream is
    /// done (the demo switches after a synchronize) or ordered before the ready
    /// stream, and keep the guard until the work on the shared stream is.
    ///
    /// ```no_run
    /// # use handoff_examples::model::{Backend, Dtype, Pipeline};
    /// let p = Pipeline::new(Backend::Cuda, Dtype::Bf16, 256, 0)?;
    /// let x = p.initial_x(1)?;
    /// let _one_stream = p.share_stream()?; // PyTorch now runs on XLA's ready stream
    /// let x = p.step(&x, None)?;
    /// # Ok::<(), handoff_examples::model::PipelineError>(())
    /// ```
    pub fn share_stream(&self) -> Result<Option<handoff_torch::cuda::StreamGuard>> {
        match handoff::cuda::raw_stream(self.kernel.ready_stream()) {
            Some((ordinal, raw)) => Ok(Some(handoff_torch::cuda::use_raw_stream(ordinal, raw)?)),
            None => Ok(None),
        }
    }

    /// One step with `x` updated in place (`x += y`): what a CUDA graph of the step
    /// replays, reading and writing the same memory every time.
    pub fn step_in_place(&self, x: &mut Tensor) -> Result<()> {
        let y = self.kernel(&self.matmul(x)?)?;
        let _ = x.f_add_(&y)?;
        Ok(())
    }

    /// [`torch_step`](Self::torch_step) with `x` updated in place.
    pub fn torch_step_in_place(&self, x: &mut Tensor) -> Result<()> {
        let y = ln_gelu_torch(&x.f_matmul(&self.w)?)?;
        let _ = x.f_add_(&y)?;
        Ok(())
    }

    /// A CUDA graph of one step (`mixed`: the pipeline's, with its XLA kernel; else
    /// PyTorch's alone), capturing `x` as its one input, updated in place by every
    /// replay (`graph.inputs()[0]`). The graph keeps the pipeline (its weight and XLA
    /// kernel) alive. CUDA only.
    pub fn graph(self: &std::rc::Rc<Self>, x: &Tensor, mixed: bool) -> Result<handoff_torch::graph::Graph> {
        use handoff_torch::graph::{CaptureOptions, Graph};
        let p = self.clone();
        let graph = Graph::capture(0, vec![x.copy()], &CaptureOptions::default().warmup(0), move |inputs| {
            let mut x = inputs[0].shallow_clone();
            let done = if mixed { p.step_in_place(&mut x) } else { p.torch_step_in_place(&mut x) };
            done.map_err(|e| handoff::Error::Adapter { adapter: "pipeline", message: e.to_string() })?;
            Ok(Vec::new())
        })?;
        Ok(graph)
    }

    /// One step in PyTorch alone (the reference, and the benchmark's baseline).
    pub fn torch_step(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.f_add(&ln_gelu_torch(&x.f_matmul(&self.w)?)?)?)
    }

    /// Median ms per call of `step` over `reps` runs of `iters` calls, after 3 warm-up
    /// calls; each run ends with a device sync (the benchmark's, not a hand-off's).
    pub fn median_ms(&self, iters: usize, reps: usize, mut step: impl FnMut() -> Result<()>) -> Result<f64> {
        for _ in 0..3 {
            step()?;
        }
        self.synchronize();
        let mut per_iter = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t = Instant::now();
            for _ in 0..iters {
                step()?;
            }
            self.synchronize();
            per_iter.push(t.elapsed() / iters as u32);
        }
        Ok(median_us(&mut per_iter) / 1e3)
    }

    /// Waits for all work on the device (the benchmark's and the checks' own sync;
    /// not on any hand-off path, not counted by handoff). Nothing on CPU.
    pub fn synchronize(&self) {
        if self.backend == Backend::Cuda {
            tch::Cuda::synchronize(0);
        }
    }
}

/// For a GPU benchmark: `None` when PyTorch sees a GPU and JAX's CUDA plugin is found;
/// otherwise the exit code, after saying why (`SKIPPED: reason`, success; a failure when
/// `HANDOFF_REQUIRE_GPU=1`, as the GPU bundle sets).
pub fn gpu_or_skip(bench: &str) -> Option<std::process::ExitCode> {
    let why = cuda_unavailable().or_else(|| plugin(Backend::Cuda).err().map(|e| e.to_string()))?;
    if std::env::var_os("HANDOFF_REQUIRE_GPU").is_some_and(|v| v == "1") {
        eprintln!("{bench}: a GPU is required (HANDOFF_REQUIRE_GPU=1) but: {why}");
        return Some(std::process::ExitCode::FAILURE);
    }
    println!("SKIPPED: {why}");
    Some(std::process::ExitCode::SUCCESS)
}

/// `max |a - b|` and `max |b|`, in f64 (waits for both: a host sync of the checker).
pub fn max_diff(a: &Tensor, b: &Tensor) -> Result<(f64, f64)> {
    let (af, bf) = (a.f_to_kind(Kind::Float)?, b.f_to_kind(Kind::Float)?);
    let diff = af.f_sub(&bf)?.f_abs()?.f_max()?.f_double_value(&[])?;
    let scale = bf.f_abs()?.f_max()?.f_double_value(&[])?;
    Ok((diff, scale))
}

/// Whether `|a - b| <= atol + rtol * |b|` everywhere (and nothing is NaN).
pub fn allclose(a: &Tensor, b: &Tensor, rtol: f64, atol: f64) -> Result<bool> {
    let (af, bf) = (a.f_to_kind(Kind::Float)?, b.f_to_kind(Kind::Float)?);
    Ok(af.f_allclose(&bf, rtol, atol, false)?)
}

/// The median of some durations, in microseconds.
pub fn median_us(samples: &mut [Duration]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_unstable();
    let mid = samples.len() / 2;
    let m =
        if samples.len().is_multiple_of(2) { (samples[mid - 1] + samples[mid]) / 2 } else { samples[mid] };
    m.as_secs_f64() * 1e6
}
