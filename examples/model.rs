//! The model step of the pipeline demo and of the GPU benchmark, shared by both.
//!
//! One step, looped: `h = x @ w` in PyTorch (through tch), `y = gelu_tanh(layernorm(h))`
//! in an XLA executable compiled from StableHLO that JAX exported (layer norm over the
//! last axis, eps 1e-5, no affine, computed in f32 and cast back), then the residual
//! `x = x + y` in PyTorch. `bench/python_pipeline.py` does the same math in Python.
//!
//! `h` goes to XLA and `y` comes back through handoff: no copy; on CUDA the readiness
//! is an event wait enqueued on the consumer's stream and the host never waits; on the
//! CPU the XLA-to-torch hand-off waits on the host (a counted host sync) when XLA's
//! CPU execution is still running, since the host is then the consumer.
//!
//! The StableHLO programs are embedded in the binary (`include_str!`), so it runs
//! from anywhere; `adapters/xla/programs/export.py` generates them.

use handoff::{Device, Handoff, Stream};
use handoff_xla::{Buffer, Client, ClientOptions, Executable, Plugin, Program, XlaError};
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

/// How the pipeline hands off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Stream-ordered hand-offs: the host never waits.
    None,
    /// A host sync before each hand-off (PyTorch's stream before `h` goes to XLA, the
    /// XLA output before it comes back): what naive interop does. Counted.
    EachHandoff,
}

/// Host time spent in each phase of the step, summed over the steps timed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Steps timed.
    pub steps: u32,
    /// `h = x @ w` (tch dispatch).
    pub matmul: Duration,
    /// torch -> XLA: export `h` + import as a PJRT view.
    pub to_xla: Duration,
    /// PJRT execute of the kernel.
    pub execute: Duration,
    /// XLA -> torch: export the output + import as a tensor.
    pub to_torch: Duration,
    /// `x + y` (tch dispatch).
    pub add: Duration,
    /// Dropping the views (stream-ordered releases).
    pub release: Duration,
}

impl Phases {
    /// The phases as `(name, total)`.
    pub fn list(&self) -> [(&'static str, Duration); 6] {
        [
            ("torch matmul", self.matmul),
            ("hand-off torch->xla", self.to_xla),
            ("xla execute", self.execute),
            ("hand-off xla->torch", self.to_torch),
            ("torch residual add", self.add),
            ("release views", self.release),
        ]
    }

    /// The sum of the phases.
    pub fn total(&self) -> Duration {
        self.list().iter().map(|(_, d)| *d).sum()
    }
}

/// The pipeline: a compiled kernel, the weight, and the streams of both frameworks.
pub struct Pipeline {
    /// Where it runs.
    pub backend: Backend,
    /// The element type.
    pub dtype: Dtype,
    /// `x` and `w` are `n x n`.
    pub n: i64,
    client: Client,
    exe: Executable,
    torch_device: tch::Device,
    /// PyTorch's current stream (the host on CPU): where matmul and add run.
    torch_stream: Stream,
    /// XLA's stream for external ready events (the host on CPU).
    ready: Stream,
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
        let exe = client.compile(&Program::text(text))?;
        let (torch_stream, ready) = match backend {
            Backend::Cpu => (Stream::host(), Stream::host()),
            Backend::Cuda => {
                let torch = handoff_torch::current_stream(Device::Cuda(0))?
                    .ok_or_else(|| PipelineError::NoCuda("PyTorch has no current stream".into()))?;
                let ready = client.ready_stream(&client.device_by_ordinal(0)?)?;
                (torch, ready)
            }
        };
        tch::manual_seed(seed);
        let w = Tensor::f_randn([n, n], (Kind::Float, torch_device))?
            .f_div_scalar((n as f64).sqrt())?
            .f_to_kind(dtype.kind())?;
        Ok(Pipeline { backend, dtype, n, client, exe, torch_device, torch_stream, ready, w })
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

    /// The tch device.
    pub fn torch_device(&self) -> tch::Device {
        self.torch_device
    }

    /// PyTorch's stream (the host on CPU).
    pub fn torch_stream(&self) -> &Stream {
        &self.torch_stream
    }

    /// XLA's ready stream (the host on CPU).
    pub fn xla_stream(&self) -> &Stream {
        &self.ready
    }

    /// `h = x @ w`.
    pub fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.f_matmul(&self.w)?)
    }

    /// Hands a PyTorch tensor to XLA as a zero-copy PJRT view.
    pub fn to_xla(&self, h: &Tensor) -> Result<Buffer> {
        self.import_into_xla(self.export_for_xla(h)?)
    }

    /// The PyTorch half of [`to_xla`](Self::to_xla): `h` made ready on XLA's stream.
    pub fn export_for_xla(&self, h: &Tensor) -> Result<Handoff> {
        Ok(handoff_torch::export_from(h, &self.torch_stream, &self.ready)?)
    }

    /// The XLA half of [`to_xla`](Self::to_xla): the view.
    pub fn import_into_xla(&self, handoff: Handoff) -> Result<Buffer> {
        Ok(self.client.import(handoff)?)
    }

    /// Hands an XLA buffer back to PyTorch as a zero-copy tensor on PyTorch's stream.
    pub fn to_torch(&self, y: &Buffer) -> Result<Tensor> {
        self.import_into_torch(self.export_for_torch(y)?)
    }

    /// The XLA half of [`to_torch`](Self::to_torch): `y` made ready on PyTorch's stream.
    pub fn export_for_torch(&self, y: &Buffer) -> Result<Handoff> {
        Ok(y.export(&self.torch_stream)?)
    }

    /// The PyTorch half of [`to_torch`](Self::to_torch): the tensor view.
    pub fn import_into_torch(&self, handoff: Handoff) -> Result<Tensor> {
        let options = handoff_torch::ImportOptions::new().stream(self.torch_stream.clone());
        Ok(handoff_torch::import_with(handoff, &options)?)
    }

    /// Runs the compiled kernel on a PJRT buffer.
    pub fn execute(&self, h: &Buffer) -> Result<Buffer> {
        let mut out = self.exe.execute(&[h])?;
        Ok(out.remove(0))
    }

    /// The kernel on a PyTorch tensor, through XLA: to XLA, execute, back.
    pub fn kernel(&self, h: &Tensor) -> Result<Tensor> {
        let hx = self.to_xla(h)?;
        let y = self.execute(&hx)?;
        self.to_torch(&y)
    }

    /// One step with hand-offs: torch matmul, the XLA kernel, torch residual add.
    /// With `phases`, the host time of each phase is added to it.
    pub fn step(&self, x: &Tensor, mode: SyncMode, phases: Option<&mut Phases>) -> Result<Tensor> {
        let Some(p) = phases else {
            let h = self.matmul(x)?;
            if mode == SyncMode::EachHandoff {
                self.torch_stream.synchronize()?;
            }
            let hx = self.to_xla(&h)?;
            let y = self.execute(&hx)?;
            drop(hx);
            if mode == SyncMode::EachHandoff {
                y.block_until_ready()?;
            }
            let yt = self.to_torch(&y)?;
            return Ok(x.f_add(&yt)?);
        };
        let t0 = Instant::now();
        let h = self.matmul(x)?;
        if mode == SyncMode::EachHandoff {
            self.torch_stream.synchronize()?;
        }
        let t1 = Instant::now();
        let hx = self.to_xla(&h)?;
        let t2 = Instant::now();
        let y = self.execute(&hx)?;
        if mode == SyncMode::EachHandoff {
            y.block_until_ready()?;
        }
        let t3 = Instant::now();
        let yt = self.to_torch(&y)?;
        let t4 = Instant::now();
        let out = x.f_add(&yt)?;
        let t5 = Instant::now();
        drop((yt, y, hx, h));
        let t6 = Instant::now();
        p.steps += 1;
        p.matmul += t1 - t0;
        p.to_xla += t2 - t1;
        p.execute += t3 - t2;
        p.to_torch += t4 - t3;
        p.add += t5 - t4;
        p.release += t6 - t5;
        Ok(out)
    }

    /// One step in PyTorch alone (the reference, and the benchmark's baseline).
    pub fn torch_step(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.f_add(&ln_gelu_torch(&x.f_matmul(&self.w)?)?)?)
    }

    /// Waits for all work on the device (the benchmark's and the checks' own sync;
    /// not on any hand-off path, not counted by handoff). Nothing on CPU.
    pub fn synchronize(&self) {
        if self.backend == Backend::Cuda {
            tch::Cuda::synchronize(0);
        }
    }
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
