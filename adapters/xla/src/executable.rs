//! Programs (StableHLO text or bytecode), compilation and execution.

use crate::buffer::{Buffer, OutputBuffer, Owned, query_parts};
use crate::client::{Client, ClientInner, XlaDevice};
use crate::dtype;
use crate::error::{Result, XlaError};
use crate::few::Few;
use crate::hlo::{self, ArraySpec};
use crate::result::executable::{RawList, all_positions};
use crate::result::{self, Api};
use crate::sys;
use std::path::Path;
use std::sync::Arc;

/// A StableHLO program, as MLIR text or bytecode (PJRT's `mlir` format takes both).
///
/// ```
/// let p = handoff_xla::Program::text("module @m { func.func public @main() { return } }");
/// assert!(!p.is_bytecode());
/// ```
#[derive(Debug, Clone)]
pub struct Program {
    code: Vec<u8>,
    name: String,
}

const MLIR_BYTECODE_MAGIC: &[u8] = b"ML\xefR";

impl Program {
    /// StableHLO (MLIR) text.
    pub fn text(text: impl Into<String>) -> Program {
        let code = text.into().into_bytes();
        let name = module_name(&code).unwrap_or_else(|| "module".into());
        Program { code, name }
    }

    /// MLIR bytecode (such as `jax.export`'s serialized StableHLO).
    pub fn bytecode(bytes: impl Into<Vec<u8>>) -> Program {
        Program { code: bytes.into(), name: "bytecode module".into() }
    }

    /// Reads a `.mlir` (text) or `.mlirbc` (bytecode) file; bytecode is recognized by
    /// its magic number.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Program> {
        let path = path.as_ref();
        let code = std::fs::read(path)
            .map_err(|e| XlaError::invalid("program path", path.display(), e.to_string()))?;
        Program::read_from(path, code)
    }

    /// The program in `code`, read from the file at `path` (which names it).
    pub(crate) fn read_from(path: &Path, code: Vec<u8>) -> Result<Program> {
        let mut p = if code.starts_with(MLIR_BYTECODE_MAGIC) {
            Program::bytecode(code)
        } else {
            Program::text(String::from_utf8(code).map_err(|e| {
                XlaError::invalid(
                    "program path",
                    path.display(),
                    format!("neither MLIR bytecode nor UTF-8 text: {e}"),
                )
            })?)
        };
        if let Some(stem) = path.file_stem() {
            p.name = stem.to_string_lossy().into_owned();
        }
        Ok(p)
    }

    /// Whether it is MLIR bytecode.
    pub fn is_bytecode(&self) -> bool {
        Program::is_bytecode_bytes(&self.code)
    }

    /// Whether `code` starts with MLIR bytecode's magic number.
    pub(crate) fn is_bytecode_bytes(code: &[u8]) -> bool {
        code.starts_with(MLIR_BYTECODE_MAGIC)
    }

    /// The same program under another name (used in errors and `Debug`).
    pub fn named(mut self, name: impl Into<String>) -> Program {
        self.name = name.into();
        self
    }

    /// The program's name (its module name or file stem).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The code.
    pub fn code(&self) -> &[u8] {
        &self.code
    }
}

fn module_name(code: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(code).ok()?;
    let rest = &text[text.find("module @")? + 8..];
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')).unwrap_or(rest.len());
    // `module @"quoted"` or a bare `module @` has no bare name: the default is kept.
    (end > 0).then(|| rest[..end].to_string())
}

#[cfg(test)]
#[test]
fn a_module_without_a_bare_name_keeps_the_default_name() {
    // From the `stablehlo` fuzz target: `module @>` must not be named "" (errors would name no program).
    for (text, name) in [
        ("module @> {}", "module"),
        ("module @\"quoted\" {}", "module"),
        ("module @", "module"),
        ("module @m_1.x {}", "m_1.x"),
        ("module @tail", "tail"),
        ("no module here", "module"),
    ] {
        assert_eq!(Program::text(text).name(), name, "{text:?}");
    }
}

/// Options of [`Client::compile_with`].
///
/// ```
/// let opts = handoff_xla::CompileOptions::default();
/// assert_eq!(opts.encode(), [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// Compile a portable executable for this device (by index in the client's
    /// devices) and execute there. `None`: the default device assignment (device 0).
    pub device: Option<usize>,
}

impl CompileOptions {
    /// The serialized `CompileOptionsProto` (one replica, one partition).
    pub fn encode(&self) -> Vec<u8> {
        hlo::compile_options(self.device.map(|d| d as i64))
    }
}

/// A compiled, loaded program. Thread-safe: several threads may execute it at once.
pub struct Executable {
    pub(crate) client: Arc<ClientInner>,
    raw: *mut sys::PJRT_LoadedExecutable,
    name: String,
    parameters: Option<Vec<ArraySpec>>,
    outputs: Vec<ArraySpec>,
    pub(crate) device: Option<usize>,
    /// The device of the outputs when `device` is `None` (see `output_device`).
    output_device: std::sync::OnceLock<usize>,
}

// SAFETY: PJRT loaded executables are thread-safe handles.
unsafe impl Send for Executable {}
// SAFETY: as above.
unsafe impl Sync for Executable {}

impl Drop for Executable {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once.
        if let Err(e) = unsafe { result::executable::destroy_loaded(self.client.api(), self.raw) } {
            eprintln!("handoff-xla: destroying a PJRT executable failed: {e}");
        }
    }
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("name", &self.name)
            .field("parameters", &self.parameters)
            .field("outputs", &self.outputs)
            .finish()
    }
}

impl Client {
    /// Compiles a program with default options.
    ///
    /// ```no_run
    /// use handoff_xla::{Client, Program};
    /// let client = Client::from_env()?;
    /// let exe = client.compile(&Program::from_file("adapters/xla/programs/row_sum_f32_8x16.mlir")?)?;
    /// let x = client.buffer_from_host(&client.device(0)?, &[1.0f32; 128], &[8, 16])?;
    /// let sums = exe.execute(&[&x])?[0].to_vec::<f32>()?;
    /// assert_eq!(sums, [16.0; 8]);
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn compile(&self, program: &Program) -> Result<Executable> {
        self.compile_with(program, &CompileOptions::default())
    }

    /// Compiles a program.
    pub fn compile_with(&self, program: &Program, options: &CompileOptions) -> Result<Executable> {
        compile(self, program, options)
    }
}

/// [`Client::compile_with`]: compiles `program` and reads its outputs (and, when the
/// plugin gives its optimized program, its parameters).
pub(crate) fn compile(client: &Client, program: &Program, options: &CompileOptions) -> Result<Executable> {
    if let Some(d) = options.device {
        client.device(d)?;
    }
    let api = client.inner.api();
    // SAFETY: live client; code and options outlive the call.
    let raw =
        unsafe { result::client::compile(api, client.inner.raw, program.code(), "mlir", &options.encode())? };
    // SAFETY: the executable was just created and is live, and so is its
    // `PJRT_Executable` inside `with_executable`.
    let info = unsafe {
        with_executable(api, raw, |exe| {
            let outputs = outputs(api, exe)?;
            let parameters = optimized_program(api, exe).ok().and_then(|m| hlo::parameters(&m));
            Ok((outputs, parameters))
        })
    };
    let exe = |outputs, parameters| Executable {
        client: client.inner.clone(),
        raw,
        name: program.name().to_string(),
        parameters,
        outputs,
        device: options.device,
        output_device: std::sync::OnceLock::new(),
    };
    match info {
        Ok((outputs, parameters)) => Ok(exe(outputs, parameters)),
        Err(e) => {
            drop(exe(Vec::new(), None));
            Err(e)
        }
    }
}

/// Runs `f` on the `PJRT_Executable` of a loaded executable, destroying it after.
///
/// # Safety
/// `exe` must be live.
unsafe fn with_executable<R>(
    api: Api,
    exe: *mut sys::PJRT_LoadedExecutable,
    f: impl FnOnce(*mut sys::PJRT_Executable) -> Result<R>,
) -> Result<R> {
    // SAFETY: a live loaded executable; the returned executable is ours.
    let executable = unsafe { result::executable::get_executable(api, exe)? };
    let r = f(executable);
    // SAFETY: destroyed exactly once, here.
    let destroyed = unsafe { result::executable::destroy(api, executable) };
    let r = r?;
    destroyed?;
    Ok(r)
}

/// The element types and dimensions of an executable's outputs.
///
/// # Safety
/// `exe` must be live.
unsafe fn outputs(api: Api, exe: *mut sys::PJRT_Executable) -> Result<Vec<ArraySpec>> {
    // SAFETY: forwarded from the caller.
    let (count, types, dims) = unsafe {
        (
            result::executable::num_outputs(api, exe)?,
            result::executable::output_element_types(api, exe)?,
            result::executable::output_dimensions(api, exe)?,
        )
    };
    if types.len() != count || dims.len() != count {
        return Err(XlaError::invalid(
            "PJRT_Executable_OutputElementTypes.num_output_types",
            types.len(),
            format!("the executable reports {count} outputs"),
        ));
    }
    Ok(types
        .into_iter()
        .zip(dims)
        .map(|(t, shape)| ArraySpec { dtype: dtype::from_pjrt(t), shape })
        .collect())
}

/// The serialized `HloModuleProto` of the optimized program: its size is asked
/// first, then it is read into a buffer of that size, as the header asks.
///
/// # Safety
/// `exe` must be live.
unsafe fn optimized_program(api: Api, exe: *mut sys::PJRT_Executable) -> Result<Vec<u8>> {
    // SAFETY: forwarded from the caller.
    let mut code = vec![0u8; unsafe { result::executable::optimized_program_size(api, exe)? }];
    // SAFETY: as above; `code` has the size the plugin asked for.
    let written = unsafe { result::executable::optimized_program_into(api, exe, &mut code)? };
    code.truncate(written);
    Ok(code)
}

impl Executable {
    /// The program's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameters the program takes, read from the compiled HLO module
    /// (`None` if the plugin does not give its optimized program).
    pub fn parameters(&self) -> Option<&[ArraySpec]> {
        self.parameters.as_deref()
    }

    /// The outputs it produces.
    pub fn outputs(&self) -> &[ArraySpec] {
        &self.outputs
    }

    /// Checks `inputs` against the program: each must be a buffer of this
    /// executable's client (always checked), and, when the program's parameters are
    /// known, of the parameter's dtype and shape, in the right count.
    pub fn check_inputs(&self, inputs: &[&Buffer]) -> Result<()> {
        for (index, b) in inputs.iter().enumerate() {
            self.check_client(index, b)?;
        }
        let Some(params) = &self.parameters else { return Ok(()) };
        if params.len() != inputs.len() {
            return Err(XlaError::Arity {
                program: self.name.clone(),
                what: "inputs",
                expected: params.len(),
                got: inputs.len(),
                detail: list(params),
            });
        }
        for (index, (p, b)) in params.iter().zip(inputs).enumerate() {
            check_spec(&self.name, index, p, b.dtype(), b.shape())?;
        }
        Ok(())
    }

    /// Refuses a buffer of another client (its memory and device handles mean
    /// nothing to this executable's client).
    pub(crate) fn check_client(&self, index: usize, b: &Buffer) -> Result<()> {
        if Arc::ptr_eq(&b.inner.client, &self.client) {
            return Ok(());
        }
        Err(XlaError::ClientMismatch {
            program: self.name.clone(),
            index,
            expected: format!("{:?}", Client { inner: self.client.clone() }),
            got: format!("{:?} of {:?}", b, b.client()),
        })
    }

    /// Enqueues an execution on the executable's device and returns its outputs
    /// (which become ready when the execution is done; nothing here waits). No input
    /// is donated.
    pub fn execute(&self, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
        self.check_inputs(inputs)?;
        let raw = RawList::of(inputs.iter().map(|b| b.raw()));
        let outputs = self.execute_raw(raw.as_slice(), &all_positions(inputs.len()))?;
        Ok(outputs.into_iter().map(OutputBuffer::into_buffer).collect())
    }

    /// Executes on raw input buffers (checked by the caller, held by it for the
    /// call), with the inputs at `non_donatable` never donated.
    pub(crate) fn execute_raw(
        &self,
        raw_inputs: &[*mut sys::PJRT_Buffer],
        non_donatable: &[i64],
    ) -> Result<Few<OutputBuffer>> {
        let api = self.client.api();
        let device = match self.device {
            Some(i) => self.client.devices[i].raw,
            None => std::ptr::null_mut(),
        };
        // SAFETY: the executable, the inputs (held by the caller) and the device are live.
        let outs = unsafe {
            result::executable::execute(api, self.raw, raw_inputs, self.outputs.len(), device, non_donatable)?
        };
        // Each output owned at once (PJRT handed them over): an error below destroys
        // those not yet made into an `OutputBuffer` as they drop.
        let owned: Few<Option<Owned>> = outs
            .as_slice()
            .iter()
            .map(|&raw| (!raw.is_null()).then(|| Owned { client: self.client.clone(), raw }))
            .collect();
        let mut buffers = Few::with_capacity(owned.len());
        for (output, spec) in owned.into_iter().zip(&self.outputs) {
            let Some(output) = output else { continue };
            let (dtype, queried, index) = match (spec.dtype, self.output_device(output.raw)) {
                // The output signature is known since compilation, and the device
                // since then or the first call: no PJRT query per output.
                (Some(dtype), Some(index)) => (dtype, None, index),
                // SAFETY: a live output buffer of this client.
                _ => unsafe { query_parts(&self.client, output.raw) }
                    .map(|(d, shape, i)| (d, Some(shape), i))?,
            };
            let shape = queried.as_deref().unwrap_or(&spec.shape);
            // SAFETY: an output buffer of this client, of the compiled (or asked) output
            // type and shape, on the device it was run on.
            buffers.push(unsafe { OutputBuffer::from_owned(output, dtype, shape, index) });
        }
        Ok(buffers)
    }

    /// The index of the device outputs are on: the one it was compiled for, or else
    /// (the compile-time default) asked of PJRT on the first output and kept.
    fn output_device(&self, output: *mut sys::PJRT_Buffer) -> Option<usize> {
        if let Some(i) = self.device {
            return Some(i);
        }
        if let Some(&i) = self.output_device.get() {
            return Some(i);
        }
        // SAFETY: a live output buffer of this client.
        let raw = unsafe { result::buffer::device(self.client.api(), output) }.ok()?;
        let index = self.client.devices.iter().position(|d| d.raw == raw)?;
        Some(*self.output_device.get_or_init(|| index))
    }

    /// The raw handle (owned by `self`), for the bare calls of `floor`.
    #[cfg(feature = "bench-internals")]
    pub(crate) fn raw(&self) -> *mut sys::PJRT_LoadedExecutable {
        self.raw
    }

    /// The device it executes on.
    pub fn device(&self) -> XlaDevice {
        XlaDevice { client: self.client.clone(), index: self.device.unwrap_or(0) }
    }
}

/// Checks one input's dtype and shape against its parameter.
pub(crate) fn check_spec(
    program: &str,
    index: usize,
    p: &ArraySpec,
    dtype: handoff_runtime::dtype::DataType,
    shape: &[i64],
) -> Result<()> {
    let what = if p.dtype.is_some_and(|d| d != dtype) {
        "dtype"
    } else if p.shape != shape {
        "shape"
    } else {
        return Ok(());
    };
    Err(spec_mismatch(program, index, p, what, dtype, shape))
}

/// The refusal of an input that does not match its parameter (`what` differs).
#[cold]
#[inline(never)]
fn spec_mismatch(
    program: &str,
    index: usize,
    p: &ArraySpec,
    what: &'static str,
    dtype: handoff_runtime::dtype::DataType,
    shape: &[i64],
) -> XlaError {
    XlaError::InputMismatch {
        program: program.to_string(),
        index,
        what,
        expected: p.to_string(),
        got: ArraySpec { dtype: Some(dtype), shape: shape.to_vec() }.to_string(),
    }
}

pub(crate) fn list(specs: &[ArraySpec]) -> String {
    specs.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
}
