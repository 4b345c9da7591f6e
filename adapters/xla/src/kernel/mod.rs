//! Kernels: a compiled XLA program you call on any exportable values — PyTorch
//! tensors, CUDA buffers, XLA buffers, your own types — getting values of the type
//! you ask for back, in one call.
//!
//! ```no_run
//! use handoff_xla::{Client, Kernel};
//! let client = Client::from_env()?;
//! let kernel = Kernel::load(&client, "adapters/xla/programs/ln_gelu_f32_64x64.mlir")?;
//! let h = client.buffer_from_host(&client.device(0)?, &[0.5f32; 64 * 64], &[64, 64])?;
//! let y: handoff_xla::Buffer = kernel.call1(&h)?; // with handoff-torch: `let y: tch::Tensor = kernel.call1(&t)?`
//! # Ok::<(), handoff_xla::XlaError>(())
//! ```
//!
//! What a call does, with no stream written by the caller:
//!
//! 1. Each argument is checked against the program's parameter (device, dtype, shape;
//!    an XLA buffer also for its client), with an error naming the argument index,
//!    the expected and the actual value, before the program runs.
//! 2. Each argument that is not already a buffer of the kernel's client is exported
//!    straight to the kernel device's ready stream (one event wait on CUDA, cached
//!    stream, one `order` per hand-off) and viewed there without a copy.
//! 3. The program is enqueued (no input is donated unless asked for; read-only inputs
//!    never are).
//! 4. Each output is returned as the type asked for: an XLA [`Buffer`] as it is, any
//!    other type through a hand-off made ready on the stream the inputs came from
//!    (PyTorch's current stream for tch tensors), or [`CallOptions::output_stream`].

use crate::artifact::Artifact;
use crate::buffer::{self, Buffer};
use crate::client::{Client, XlaDevice};
use crate::error::{Result, XlaError};
use crate::executable::{CompileOptions, Executable, Program, list};
use crate::few::Few;
use crate::hlo::ArraySpec;
use crate::result::executable::{RawList, all_positions};
use handoff_runtime::{Exportable, Stream};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

mod inputs;
mod outputs;

use inputs::Input;
pub use inputs::{Args, Inputs};
pub use outputs::{AsIs, Imported, Output, OutputBuffers, Outputs};

/// A compiled program with its calling convention, callable on any exportable values.
///
/// Load StableHLO (text or bytecode) or a `jax.export` artifact with [`Kernel::load`],
/// or build one with [`Kernel::compile`]; call it with [`Kernel::call1`] (one input,
/// one output), [`Kernel::call`] (arrays, tuples or vectors of inputs and outputs) or
/// [`Kernel::call_with`] (options); its gradient with [`Kernel::vjp`] (artifacts
/// serialized with `vjp_order=1`). Thread-safe.
pub struct Kernel {
    exe: Executable,
    client: Client,
    device: XlaDevice,
    /// The stream the device reads inputs on (the host on CPU).
    ready: Stream,
    /// The caller-visible parameters, when known.
    params: Option<Vec<ArraySpec>>,
    /// For each caller-visible parameter, whether the program takes it (a
    /// `jax.export` artifact drops unused ones).
    kept: Option<Vec<bool>>,
    /// The platform-index argument a multi-platform `jax.export` artifact takes first.
    platform_index: Option<Buffer>,
    /// Every argument index, made once: what a call passes as non-donatable.
    no_donation: Vec<i64>,
    /// The options it was compiled with (the VJP is compiled with the same).
    options: CompileOptions,
    /// The VJP kernel, compiled on first use.
    vjp: OnceLock<Box<Kernel>>,
    /// What it was compiled from: for its VJP (an artifact's) and for another client
    /// ([`Kernel::on_client`]).
    source: Source,
    /// The same program compiled for other clients (capture clients), kept.
    others: Mutex<Vec<Arc<Kernel>>>,
    /// For a kernel made by [`Kernel::on_client`]: the client it was made from, whose
    /// buffers it takes as views.
    origin: Option<Client>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.exe.name())
            .field("device", &self.device)
            .field("params", &self.params)
            .field("outputs", &self.exe.outputs())
            .finish()
    }
}

/// What a kernel is compiled from: a StableHLO [`Program`] or a `jax.export` [`Artifact`].
#[derive(Debug, Clone)]
pub enum Source {
    /// StableHLO text or bytecode.
    Program(Program),
    /// A `jax.export` artifact (its module and calling convention).
    Artifact(Artifact),
}

impl From<Program> for Source {
    fn from(p: Program) -> Source {
        Source::Program(p)
    }
}

impl From<Artifact> for Source {
    fn from(a: Artifact) -> Source {
        Source::Artifact(a)
    }
}

impl Source {
    /// Reads a file: `.mlir` is StableHLO text, `.mlirbc` bytecode, `.jaxexport` a
    /// `jax.export` artifact (refused as one when it is not: never handed to the
    /// StableHLO parser); anything else is recognized by its content (MLIR bytecode
    /// magic, a `jax.export` flatbuffer, or text). An empty file is refused.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join("handoff-doc-source");
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let path = dir.join("empty.jaxexport");
    /// std::fs::write(&path, b"").unwrap();
    /// let e = handoff_xla::Source::from_file(&path).unwrap_err();
    /// assert!(e.to_string().contains("empty file"), "{e}");
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<Source> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| XlaError::invalid("kernel path", path.display(), e.to_string()))?;
        Source::read_from(path, bytes)
    }

    /// What `bytes`, read from the file at `path`, hold (see [`Source::from_file`]).
    pub(crate) fn read_from(path: &Path, bytes: Vec<u8>) -> Result<Source> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("mlir") | Some("mlirbc") => return Ok(Source::Program(Program::read_from(path, bytes)?)),
            _ => {}
        }
        if bytes.is_empty() {
            return Err(XlaError::invalid("kernel file", path.display(), "empty file"));
        }
        if path.extension().is_some_and(|e| e == "jaxexport") {
            return Artifact::from_bytes(&bytes).map(Source::Artifact).map_err(|e| match e {
                XlaError::Invalid { reason, .. } => XlaError::invalid(
                    "kernel file",
                    path.display(),
                    format!("not a jax.export artifact ({} bytes): {reason}", bytes.len()),
                ),
                other => other,
            });
        }
        Source::from_bytes(bytes, path.file_stem().map(|s| s.to_string_lossy().into_owned()))
    }

    /// Recognizes bytes by their content: MLIR bytecode, a `jax.export` artifact, or
    /// StableHLO text. No bytes are refused.
    pub fn from_bytes(bytes: Vec<u8>, name: Option<String>) -> Result<Source> {
        if bytes.is_empty() {
            return Err(XlaError::invalid("kernel bytes", "0 bytes", "empty: no program or artifact"));
        }
        let program = if Program::is_bytecode_bytes(&bytes) {
            Program::bytecode(bytes)
        } else {
            match Artifact::from_bytes(&bytes) {
                Ok(a) => return Ok(Source::Artifact(a)),
                // An artifact that is read but refused says why.
                Err(e @ XlaError::Unsupported { .. }) => return Err(e),
                Err(not_artifact) => match String::from_utf8(bytes) {
                    Ok(text) => Program::text(text),
                    Err(_) => return Err(not_artifact),
                },
            }
        };
        Ok(Source::Program(match name {
            Some(n) => program.named(n),
            None => program,
        }))
    }
}

/// An artifact's signature against its compiled module's: the module's parameters
/// are the platform index (an `i32` scalar) when the artifact takes one, then the kept
/// inputs; its results are the outputs. Calls are checked against the artifact's
/// inputs, so a file whose listed shapes or dtypes are not its module's (a damaged or
/// hand-made one) would hand the program buffers of other sizes than it reads: refused
/// here, naming the first difference. Skipped when the plugin gives no program shape.
fn check_against_module(artifact: &Artifact, exe: &Executable) -> Result<()> {
    let parameters = artifact
        .takes_platform_index()
        .then(|| ArraySpec { dtype: Some(handoff_runtime::dtype::DataType::I32), shape: Vec::new() })
        .into_iter()
        .chain(artifact.kept_inputs().iter().map(|&i| artifact.inputs()[i].clone()));
    let expected = [
        ("parameter", parameters.collect::<Vec<_>>(), exe.parameters()),
        ("result", artifact.outputs().to_vec(), Some(exe.outputs())),
    ];
    for (what, listed, compiled) in expected {
        let Some(compiled) = compiled else { continue };
        let field = format!("jax.export artifact {what}s");
        if listed.len() != compiled.len() {
            return Err(XlaError::invalid(
                field,
                format!("{} listed", listed.len()),
                format!(
                    "its module has {} {what}(s): the file is damaged or was not written by jax.export",
                    compiled.len()
                ),
            ));
        }
        if let Some((i, (l, c))) = listed.iter().zip(compiled).enumerate().find(|(_, (l, c))| l != c) {
            return Err(XlaError::invalid(
                format!("{field}[{i}]"),
                l,
                format!(
                    "its module's {what} {i} is {c}: the file is damaged or was not written by jax.export"
                ),
            ));
        }
    }
    Ok(())
}

/// Options of a kernel call, for the rare cases.
///
/// ```
/// let o = handoff_xla::CallOptions::default().allow_copy();
/// assert!(o.allow_copy && !o.donate && o.output_stream.is_none());
/// ```
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// The stream the outputs are made ready on and consumed on (default: the stream
    /// the first input with a stream came from; else the kernel's ready stream, the
    /// host on CPU). Outputs returned as XLA buffers need none.
    pub output_stream: Option<Stream>,
    /// Copy host memory XLA's CPU client cannot view (not 64-byte aligned) instead of
    /// refusing it (counted, see [`ViewOptions::allow_copy`](crate::ViewOptions::allow_copy)).
    pub allow_copy: bool,
    /// Let the program donate inputs it aliases to outputs (off by default: the
    /// inputs are the caller's tensors). Read-only inputs are never donated.
    pub donate: bool,
}

impl CallOptions {
    /// Outputs made ready on, and consumed on, `stream`.
    pub fn output_stream(mut self, stream: Stream) -> Self {
        self.output_stream = Some(stream);
        self
    }

    /// Allows a copy where a zero-copy view is impossible.
    pub fn allow_copy(mut self) -> Self {
        self.allow_copy = true;
        self
    }

    /// Allows donation of writable inputs.
    pub fn donate(mut self) -> Self {
        self.donate = true;
        self
    }
}

impl Kernel {
    /// Compiles a program or artifact with options (the device to run on).
    ///
    /// An artifact must have been exported for the client's platform; one exported
    /// for several platforms gets its platform-index argument from the kernel, so
    /// callers pass only their own inputs. One whose listed input or output shapes and
    /// dtypes are not its module's is refused ([`XlaError::Invalid`] naming the first
    /// parameter or result that differs, with both), since calls are checked against
    /// what it lists.
    pub fn compile(client: &Client, source: impl Into<Source>, options: &CompileOptions) -> Result<Kernel> {
        Kernel::compile_named(client, source.into(), options, None)
    }

    /// [`compile`](Self::compile), naming an artifact's program `name` (default: the
    /// function name JAX recorded).
    fn compile_named(
        client: &Client,
        source: Source,
        options: &CompileOptions,
        name: Option<String>,
    ) -> Result<Kernel> {
        let device = client.device(options.device.unwrap_or(0))?;
        let kept_source = source.clone();
        let (exe, params, kept, platform_index) = match source {
            Source::Program(program) => {
                let exe = client.compile_with(&program, options)?;
                let params = exe.parameters().map(<[ArraySpec]>::to_vec);
                (exe, params, None, None)
            }
            Source::Artifact(artifact) => {
                let platform = client.platform().to_ascii_lowercase();
                let Some(index) = artifact.platform_index(&platform) else {
                    return Err(XlaError::invalid(
                        "jax.export artifact platforms",
                        format!("{:?}", artifact.platforms()),
                        format!("the client's platform is {platform}: export for it too"),
                    ));
                };
                let name = name.unwrap_or_else(|| artifact.function_name().to_owned());
                let program = Program::bytecode(artifact.module().to_vec()).named(name);
                let exe = client.compile_with(&program, options)?;
                check_against_module(&artifact, &exe)?;
                let platform_index = if artifact.takes_platform_index() {
                    Some(buffer::platform_index_buffer(client, &device, index)?)
                } else {
                    None
                };
                // Callers pass every input but the float0 ones (no data, never read:
                // `Artifact` refuses a module that reads one).
                let (params, kept): (Vec<ArraySpec>, Vec<bool>) = artifact
                    .inputs()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !artifact.float0_inputs().contains(i))
                    .map(|(i, spec)| (spec.clone(), artifact.kept_inputs().contains(&i)))
                    .unzip();
                (exe, Some(params), Some(kept), platform_index)
            }
        };
        let ready = client.ready_stream(&device)?;
        let arguments = params.as_ref().map_or(0, Vec::len) + usize::from(platform_index.is_some());
        let no_donation = (0..arguments as i64).collect();
        Ok(Kernel {
            exe,
            client: client.clone(),
            device,
            ready,
            params,
            kept,
            platform_index,
            no_donation,
            options: options.clone(),
            vjp: OnceLock::new(),
            source: kept_source,
            others: Mutex::new(Vec::new()),
            origin: None,
        })
    }

    /// This kernel compiled for `client` (another client of the same plugin) on the
    /// device with the same ordinal, once per client and kept: what a CUDA graph capture
    /// runs on its own client ([`capture_clients`](crate::capture_clients)). It takes
    /// buffers of this kernel's client as views (no copy), besides its own client's;
    /// its VJP is compiled for `client` too.
    ///
    /// ```no_run
    /// # use handoff_xla::{Buffer, Client, Kernel};
    /// let (a, b) = (Client::from_env()?, Client::from_env()?);
    /// let kernel = Kernel::load(&a, "adapters/xla/programs/gelu_scale_f32_4x8.mlir")?;
    /// let x = a.buffer_from_host(&a.device(0)?, &[0.5f32; 32], &[4, 8])?;
    /// let y: Buffer = kernel.on_client(&b)?.call1(&x)?; // runs on `b`, reads `x` in place
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn on_client(&self, client: &Client) -> Result<Arc<Kernel>> {
        let mut others = self.others.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(k) = others.iter().find(|k| Arc::ptr_eq(&k.client.inner, &client.inner)) {
            return Ok(k.clone());
        }
        let mut options = self.options.clone();
        options.device = Some(client.index_of_ordinal(self.device.ordinal())?);
        let mut k =
            Kernel::compile_named(client, self.source.clone(), &options, Some(self.name().to_owned()))?;
        k.origin = Some(self.client.clone());
        let k = Arc::new(k);
        others.push(k.clone());
        Ok(k)
    }

    /// Whether `b` is a buffer of the client this kernel was made from ([`on_client`](Self::on_client)),
    /// which it takes as a view.
    pub(crate) fn views_buffers_of(&self, b: &Buffer) -> bool {
        self.origin.as_ref().is_some_and(|o| Arc::ptr_eq(&o.inner, &b.inner.client))
    }

    /// The kernel to run instead of this one: inside a CUDA graph capture its thread
    /// announced, with capture clients on, this kernel compiled for the capture's own
    /// client (`handoff_xla::capture_clients`).
    fn for_capture(&self) -> Result<Option<Arc<Kernel>>> {
        if !crate::capture_clients::is_enabled() || self.origin.is_some() || !self.client.is_gpu() {
            return Ok(None);
        }
        match handoff_runtime::graph::current() {
            Some(c) if c.stream().device() == self.device.handoff_device() => {
                crate::capture_clients::on_leased(&self.client, self.device.ordinal(), &c, |client| {
                    self.on_client(client)
                })
                .map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Whether [`Kernel::vjp`] has a VJP to compile (an artifact serialized with one).
    pub(crate) fn has_vjp(&self) -> bool {
        self.vjp_artifact().is_ok()
    }

    /// The artifact of the kernel's VJP, or why there is none (the reason of
    /// [`XlaError::NoVjp`]).
    fn vjp_artifact(&self) -> std::result::Result<&Artifact, String> {
        match &self.source {
            Source::Program(_) => {
                Err("it was compiled from StableHLO, which carries no VJP: export the function \
                                       with jax.export and `serialize(vjp_order=1)`"
                    .to_owned())
            }
            Source::Artifact(a) => a.vjp().map_err(|e| match e {
                XlaError::NoVjp { reason, .. } => reason,
                e => e.to_string(),
            }),
        }
    }

    /// The program's name.
    pub fn name(&self) -> &str {
        self.exe.name()
    }

    /// The parameters callers pass, when known (`None` when the plugin gives no
    /// program shape; then only clients and devices are checked).
    pub fn parameters(&self) -> Option<&[ArraySpec]> {
        self.params.as_deref()
    }

    /// The outputs it returns.
    pub fn outputs(&self) -> &[ArraySpec] {
        self.exe.outputs()
    }

    /// The device it runs on.
    pub fn device(&self) -> &XlaDevice {
        &self.device
    }

    /// The client it belongs to.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The stream inputs are made ready on (the device's ready stream; the host on CPU).
    pub fn ready_stream(&self) -> &Stream {
        &self.ready
    }

    /// The compiled executable, for adapter authors who execute buffers themselves.
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// The kernel's VJP (vector-Jacobian product, the gradient's building block), from
    /// a `jax.export` artifact serialized with it (`exported.serialize(vjp_order=1)`),
    /// compiled for the same device on first use and kept.
    ///
    /// JAX's calling convention (`Exported.vjp()`), which the VJP kernel checks like
    /// any call, each input against its exported shape and dtype, before it runs:
    ///
    /// - **inputs**: the primal inputs, as [`call`](Self::call) takes them, then the
    ///   cotangent of each output (the gradient of the loss with respect to it: same
    ///   shape and dtype), except integer and boolean outputs, which have none (JAX's
    ///   `float0`);
    /// - **outputs**: the cotangent of each primal input (the gradient of the loss
    ///   with respect to it: same shape and dtype), in order; that of an integer or
    ///   boolean input is a `bool` array of `false` (JAX's `float0`).
    ///
    /// An input error names its index: the primals first, then the cotangents. The
    /// VJP runs the primal's forward again (JAX exports no residuals); an artifact
    /// exported for several platforms gets its platform index from the kernel, as
    /// the primal does. The VJP kernel is named `vjp(<name>)`.
    ///
    /// [`XlaError::NoVjp`] for a kernel compiled from StableHLO, from an artifact
    /// serialized without a VJP (`vjp_order=0`, JAX's default), or from one whose VJP
    /// uses what handoff does not support yet, with the reason.
    ///
    /// ```no_run
    /// # use handoff_xla::{Buffer, Client, Kernel};
    /// # let client = Client::from_env()?;
    /// // y = x + gelu_tanh(layernorm(x @ w)), exported with `serialize(vjp_order=1)`
    /// let kernel = Kernel::load(&client, "adapters/xla/programs/block_f32_8x16_cpu_vjp.jaxexport")?;
    /// let d = client.device(0)?;
    /// let x = client.buffer_from_host(&d, &[0.5f32; 128], &[8, 16])?;
    /// let w = client.buffer_from_host(&d, &[0.1f32; 256], &[16, 16])?;
    /// let [y]: [Buffer; 1] = kernel.call([&x, &w])?;
    /// let dy = client.buffer_from_host(&d, &[1.0f32; 128], &[8, 16])?; // d loss / d y
    /// let [dx, dw]: [Buffer; 2] = kernel.vjp()?.call([&x, &w, &dy])?; // d loss / d x, d loss / d w
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn vjp(&self) -> Result<&Kernel> {
        if let Some(k) = self.vjp.get() {
            return Ok(k);
        }
        let artifact = match self.vjp_artifact() {
            Ok(a) => a.clone(),
            Err(reason) => return Err(XlaError::NoVjp { program: self.name().to_owned(), reason }),
        };
        let name = format!("vjp({})", self.name());
        let k = Kernel::compile_named(&self.client, Source::Artifact(artifact), &self.options, Some(name))?;
        // Two threads asking at once both compile; one keeps its kernel.
        Ok(self.vjp.get_or_init(|| Box::new(k)))
    }

    /// Calls the kernel on one input and returns its one output, as the type asked for.
    ///
    /// ```no_run
    /// # use handoff_xla::{Buffer, Client, Kernel};
    /// # let client = Client::from_env()?;
    /// # let kernel = Kernel::load(&client, "adapters/xla/programs/gelu_scale_f32_4x8.mlir")?;
    /// let x = client.buffer_from_host(&client.device(0)?, &[0.5f32; 32], &[4, 8])?;
    /// let y: Buffer = kernel.call1(&x)?;
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn call1<X: Exportable<V>, V, Y: Output<W>, W>(&self, x: X) -> Result<Y> {
        let [y] = self.call_with(&CallOptions::default(), [x])?;
        Ok(y)
    }

    /// Calls the kernel on several inputs (an array, a tuple or a `Vec`) and returns
    /// its outputs as an array, a tuple or a `Vec`.
    ///
    /// ```no_run
    /// # use handoff_xla::{Buffer, Client, Kernel};
    /// # let client = Client::from_env()?;
    /// let kernel = Kernel::load(&client, "adapters/xla/programs/matmul_f32_16x32x8.mlir")?;
    /// let d = client.device(0)?;
    /// let (a, b) = (client.buffer_from_host(&d, &[1.0f32; 512], &[16, 32])?, client.buffer_from_host(&d, &[1.0f32; 256], &[32, 8])?);
    /// let [c]: [Buffer; 1] = kernel.call([&a, &b])?;
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn call<A: Args<V>, V, R: Outputs<W>, W>(&self, args: A) -> Result<R> {
        self.call_with(&CallOptions::default(), args)
    }

    /// [`call`](Self::call) with options.
    pub fn call_with<A: Args<V>, V, R: Outputs<W>, W>(&self, options: &CallOptions, args: A) -> Result<R> {
        if let Some(other) = self.for_capture()? {
            return other.call_with(options, args);
        }
        if let Some(params) = &self.params
            && params.len() != args.len()
        {
            return Err(arity(self.name(), "inputs", params, args.len()));
        }
        let outputs = self.exe.outputs();
        if let Some(n) = R::COUNT
            && n != outputs.len()
        {
            return Err(arity(self.name(), "outputs", outputs, n));
        }
        let mut inputs = Inputs {
            kernel: self,
            options,
            index: 0,
            buffers: Few::with_capacity(args.len() + 1),
            read_only: Vec::new(),
            stream: None,
        };
        if let Some(p) = &self.platform_index {
            inputs.buffers.push(Input::Shared(p.clone()));
        }
        args.visit(&mut inputs)?;
        let raw = RawList::of(inputs.buffers.iter().map(Input::raw));
        let all;
        let non_donatable: &[i64] = match self.no_donation.get(..inputs.buffers.len()) {
            _ if options.donate => &inputs.read_only,
            Some(known) => known,
            None => {
                all = all_positions(inputs.buffers.len());
                &all
            }
        };
        let outs = self.exe.execute_raw(raw.as_slice(), non_donatable)?;
        drop(inputs.buffers);
        let consumer = match (&options.output_stream, inputs.stream) {
            (Some(s), _) => s.clone(),
            (None, Some(s)) => s,
            (None, None) => self.ready.clone(),
        };
        R::from_outputs(OutputBuffers::new(outs), &consumer)
    }
}

/// The refusal of a call with `got` inputs or outputs where the program has `specs`.
#[cold]
#[inline(never)]
fn arity(program: &str, what: &'static str, specs: &[ArraySpec], got: usize) -> XlaError {
    XlaError::Arity { program: program.to_string(), what, expected: specs.len(), got, detail: list(specs) }
}
