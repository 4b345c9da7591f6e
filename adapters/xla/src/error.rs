//! The errors of handoff-xla. Every variant names the field or call at fault and
//! the value that was refused.

use std::path::PathBuf;

/// A `Result` with [`XlaError`].
pub type Result<T, E = XlaError> = std::result::Result<T, E>;

/// A `PJRT_Error_Code` (abseil status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub i32);

impl ErrorCode {
    /// `INVALID_ARGUMENT`.
    pub const INVALID_ARGUMENT: ErrorCode = ErrorCode(3);
    /// `UNIMPLEMENTED`.
    pub const UNIMPLEMENTED: ErrorCode = ErrorCode(12);

    /// The code's name, as abseil spells it.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "OK",
            1 => "CANCELLED",
            2 => "UNKNOWN",
            3 => "INVALID_ARGUMENT",
            4 => "DEADLINE_EXCEEDED",
            5 => "NOT_FOUND",
            6 => "ALREADY_EXISTS",
            7 => "PERMISSION_DENIED",
            8 => "RESOURCE_EXHAUSTED",
            9 => "FAILED_PRECONDITION",
            10 => "ABORTED",
            11 => "OUT_OF_RANGE",
            12 => "UNIMPLEMENTED",
            13 => "INTERNAL",
            14 => "UNAVAILABLE",
            15 => "DATA_LOSS",
            16 => "UNAUTHENTICATED",
            _ => "UNRECOGNIZED",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Everything that can go wrong in handoff-xla.
///
/// # Bad input to the loaders
///
/// What a user hands handoff-xla to compile ([`Source::from_file`](crate::Source::from_file),
/// [`Source::from_bytes`](crate::Source::from_bytes),
/// [`Artifact::from_bytes`](crate::Artifact::from_bytes),
/// [`Kernel::load`](crate::Kernel::load), [`Kernel::load_bytes`](crate::Kernel::load_bytes),
/// [`Kernel::compile`](crate::Kernel::compile)) is refused with a typed error:
/// [`Invalid`](XlaError::Invalid) for what handoff's own format checks refuse,
/// [`PluginException`](XlaError::PluginException) for a C++ exception the plugin throws,
/// [`Refused`](XlaError::Refused) for bytes the isolated loader's child did not pass. Only
/// a plugin defect met in-process (`Kernel::compile`, or a load with
/// [`LoadOptions::trusted`](crate::LoadOptions::trusted)) can end the calling process;
/// the isolated loads contain those too. Each of those variants lists the inputs that
/// reach it, with the message and the test (in `adapters/xla/tests/`:
/// `artifact_faults.rs`, `kernel_cpu.rs`, `isolation.rs`); the `artifact` and `stablehlo`
/// fuzz targets check that every failure on arbitrary bytes is a typed error with a
/// non-empty message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XlaError {
    /// A PJRT call returned an error (its message and code; the error was destroyed).
    #[error("{call} failed with {code}: {message}")]
    Pjrt {
        /// The PJRT function.
        call: &'static str,
        /// The status code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },

    /// A C++ exception escaped a PJRT call (a plugin bug, often reached through input
    /// the plugin does not expect, such as a malformed StableHLO module given to
    /// `PJRT_Client_Compile`). handoff's guard around every PJRT call caught it, so the
    /// process goes on; without the guard it would have aborted ("Rust cannot catch
    /// foreign exceptions").
    ///
    /// The plugin's state after an exception escaped it is the plugin's problem: PJRT
    /// functions are not meant to throw, so nothing says what the call left half done
    /// (memory it leaked, a lock it held). handoff destroys nothing the call did not
    /// return. The client may be unusable afterwards; to be safe, drop it and make a
    /// new one (or restart the process), and report the input to the plugin's authors.
    ///
    /// Reached by a module on which the CPU plugin's `PJRT_Client_Compile` throws (a
    /// mutated `jax.export` artifact) when it is compiled in-process
    /// ([`Kernel::compile`](crate::Kernel::compile), or a load with
    /// [`LoadOptions::trusted`](crate::LoadOptions::trusted)); the isolated
    /// loader reports the same bytes as [`Refused`](XlaError::Refused). Test:
    /// `artifact_faults::a_cpp_exception_in_compile_is_a_typed_error_and_the_client_still_works`
    /// (it aborted the test binary before the guard).
    ///
    /// ```text
    /// PJRT_Client_Compile threw a C++ exception, caught at the FFI boundary: std::exception: SmallVector unable to grow. Requested capacity (361699103270574851) is larger than maximum value for size type (4294967295); the plugin's state after this is unknown (a plugin bug: its client may be unusable)
    /// ```
    #[error(
        "{call} threw a C++ exception, caught at the FFI boundary: {exception}; \
         the plugin's state after this is unknown (a plugin bug: its client may be unusable)"
    )]
    PluginException {
        /// The PJRT function that threw.
        call: &'static str,
        /// What was thrown: `std::exception: <what()>`, or the type of anything else.
        exception: String,
    },

    /// `HANDOFF_PJRT_PLUGIN` is not set.
    #[error(
        "HANDOFF_PJRT_PLUGIN is not set: point it at a PJRT plugin (.so), e.g. \
         `cargo xtask setup` fetches the CPU plugin to .deps/pjrt/pjrt_c_api_cpu_plugin.so \
         and `cargo xtask env` prints the variable"
    )]
    PluginEnvUnset,

    /// The plugin file could not be loaded.
    #[error("cannot load the PJRT plugin at {path}: {reason}")]
    PluginLoad {
        /// The path given.
        path: PathBuf,
        /// Why (missing file, not a shared library, no `GetPjrtApi`).
        reason: String,
    },

    /// The plugin speaks an API version these bindings cannot use.
    #[error(
        "the PJRT plugin at {path} reports C API {major}.{minor} with a {api_size}-byte PJRT_Api; \
         handoff-xla binds {bound_major}.{bound_minor} and needs a plugin at least as new"
    )]
    ApiVersion {
        /// The plugin.
        path: PathBuf,
        /// Its major version.
        major: i32,
        /// Its minor version.
        minor: i32,
        /// Its `PJRT_Api.struct_size`.
        api_size: usize,
        /// The bound major version.
        bound_major: i32,
        /// The bound minor version.
        bound_minor: i32,
    },

    /// No JAX CUDA plugin was found.
    #[error(
        "no JAX CUDA PJRT plugin found (looked in: {searched}); install jax-cuda13-plugin or set HANDOFF_PJRT_PLUGIN"
    )]
    NoCudaPlugin {
        /// The places searched.
        searched: String,
    },

    /// An argument or value refused before calling PJRT: `{field} is {value}: {reason}`.
    ///
    /// The loaders' bad inputs that end here:
    ///
    /// - an empty kernel file, or empty bytes (never handed to the plugin). Tests:
    ///   `kernel_cpu::a_jaxexport_file_is_read_as_an_artifact_and_refused_as_one`,
    ///   `kernel_cpu::kernel_source_is_recognized_by_content`.
    ///   ```text
    ///   kernel file is /tmp/x/empty.jaxexport: empty file
    ///   kernel bytes is 0 bytes: empty: no program or artifact
    ///   ```
    /// - a `.jaxexport` file that is not an artifact (here the first 7 bytes of one): refused
    ///   as an artifact, never read as StableHLO text. Test:
    ///   `kernel_cpu::a_jaxexport_file_is_read_as_an_artifact_and_refused_as_one`.
    ///   ```text
    ///   kernel file is /tmp/x/cut.jaxexport: not a jax.export artifact (7 bytes): they lie past the artifact's end (7 bytes): ...
    ///   ```
    /// - bytes that are not a valid flatbuffer (offsets past the end, a string that is not
    ///   UTF-8 or has no NUL, misaligned data, more tables or depth than the verifier's
    ///   limits for that size), naming the field's path in `Exported` and the bytes where
    ///   there is one. Test:
    ///   `artifact_faults::a_malformed_artifact_is_refused_naming_the_field_and_the_offset`.
    ///   ```text
    ///   jax.export artifact: Exported.platforms[1] is bytes 2368..2372: the string there is not UTF-8 (invalid utf-8 sequence of 1 bytes from index 0): a truncated or corrupted artifact (the bytes of jax.export's Exported.serialize() are a flatbuffer)
    ///   ```
    /// - an artifact cut short into its last string (cutting only its padding reads the same
    ///   artifact: see [`Artifact::from_bytes`](crate::Artifact::from_bytes)). Test:
    ///   `artifact_faults::truncated_artifacts_load_identically_or_are_refused_by_field`.
    ///   ```text
    ///   jax.export artifact: Exported.function_name is bytes 2244..2251: the string there has no NUL terminator within the artifact (2251 bytes): ...
    ///   ```
    /// - an artifact whose listed shapes or dtypes are not its module's (a dimension or an
    ///   aval index changed), at compile. Test:
    ///   `artifact_faults::an_artifact_whose_shapes_are_not_its_modules_is_refused_naming_both`.
    ///   ```text
    ///   jax.export artifact parameters[0] is f32[9, 16]: its module's parameter 0 is f32[8, 16]: the file is damaged or was not written by jax.export
    ///   ```
    /// - an isolated load whose child is not a program that links handoff-xla (a Python
    ///   interpreter, say), or a child that cannot load the plugin (field `isolated check`).
    ///   Test: `isolation::a_program_without_the_hook_is_reported_and_a_hung_child_is_killed`.
    ///   ```text
    ///   isolated check is the child process: /bin/true is not a program that links handoff-xla (it did not answer the handshake; its last line: (nothing)): set HANDOFF_XLA_CHECKER to the handoff-check binary
    ///   ```
    #[error("{field} is {value}: {reason}")]
    Invalid {
        /// The field or argument.
        field: String,
        /// Its value.
        value: String,
        /// Why it is refused and what to do instead.
        reason: String,
    },

    /// An execution input does not match the program.
    #[error("input {index} of {program}: {what} is {got}, the program takes {expected}")]
    InputMismatch {
        /// The program's name.
        program: String,
        /// The input position.
        index: usize,
        /// `dtype`, `shape` or `device`.
        what: &'static str,
        /// The program's parameter.
        expected: String,
        /// The input given.
        got: String,
    },

    /// A buffer of one client given to an executable of another.
    #[error(
        "input {index} of {program} is {got}: it belongs to another client than the program's ({expected}); \
         import the value into the program's client instead"
    )]
    ClientMismatch {
        /// The program's name.
        program: String,
        /// The input position.
        index: usize,
        /// The program's client.
        expected: String,
        /// The buffer and its client.
        got: String,
    },

    /// A call with the wrong number of inputs or outputs.
    #[error("{program} takes {expected} {what}, {got} given ({detail})")]
    Arity {
        /// The program's name.
        program: String,
        /// `inputs` or `outputs`.
        what: &'static str,
        /// The program's count.
        expected: usize,
        /// The count given (or asked for).
        got: usize,
        /// The program's parameters or results.
        detail: String,
    },

    /// The plugin lacks an extension this path needs.
    #[error("the PJRT plugin has no {extension} extension, which {needed_for} needs")]
    MissingExtension {
        /// The extension.
        extension: &'static str,
        /// The operation.
        needed_for: &'static str,
    },

    /// A `jax.export` artifact uses a feature handoff-xla does not support yet.
    #[error("this jax.export artifact uses {feature}, which handoff-xla does not support yet: {detail}")]
    Unsupported {
        /// The feature (shape polymorphism, effects, sharding over several devices, ...).
        feature: String,
        /// Where the artifact uses it.
        detail: String,
    },

    /// [`Kernel::vjp`](crate::Kernel::vjp) or [`Artifact::vjp`](crate::Artifact::vjp) on a
    /// program that carries no VJP (gradient): StableHLO, a `jax.export` artifact
    /// serialized without one (`vjp_order=0`, the default), or one whose VJP is refused.
    #[error("{program} has no VJP: {reason}")]
    NoVjp {
        /// The program's name.
        program: String,
        /// Why, and how to export one.
        reason: String,
    },

    /// Bytes the isolated loader's child did not pass: the plugin refused them, or the
    /// child died on them (a signal, an exit status) or ran past its time limit. The
    /// calling process is unharmed; nothing was compiled in it.
    ///
    /// Returned by [`Kernel::load`](crate::Kernel::load) and
    /// [`Kernel::load_bytes`](crate::Kernel::load_bytes) (isolated, the default) for a module
    /// that makes the plugin `abort()`, corrupt its heap, fault or never return. Test:
    /// `isolation::damaged_artifacts_that_kill_an_in_process_load_are_refused_and_the_caller_survives`
    /// (each of its files kills a process that compiles it in-process);
    /// `isolation::a_program_without_the_hook_is_reported_and_a_hung_child_is_killed` for the
    /// time limit.
    ///
    /// ```text
    /// adapters/xla/tests/damaged/ln_gelu_f32_8x16_cpu-seed7-854.jaxexport: refused by the isolated check: killed by signal 6 (SIGABRT); the child's last line: LLVM ERROR: Property conversion failed.
    /// ```
    ///
    /// Bytes the child's plugin refuses with an error come back here too, with the outcome
    /// "the plugin refused them" and the plugin's message as the last line. Test:
    /// `isolation::bytes_the_plugin_refuses_come_back_with_its_message`.
    ///
    /// ```text
    /// kernel bytes (2252 bytes): refused by the isolated check: the plugin refused them; the child's last line: PJRT_Client_Compile threw a C++ exception, caught at the FFI boundary: ...
    /// ```
    ///
    /// Not returned: the same module compiled in-process ([`Kernel::compile`](crate::Kernel::compile),
    /// [`LoadOptions::trusted`](crate::LoadOptions::trusted)) is a plugin defect no in-process
    /// caller can contain (the process ends or stalls). A pass kept on disk
    /// ([`LoadOptions::verdict_cache`](crate::LoadOptions::verdict_cache),
    /// `HANDOFF_XLA_VERDICT_CACHE`) whose file was changed, or that was kept for other bytes,
    /// plugin, device or limits, is read as no pass: the bytes are checked in a child again
    /// (tests `isolation::a_pass_kept_on_disk_spares_later_processes_the_child_and_only_for_the_same_bytes`,
    /// `isolation::disk::tests::a_pass_is_found_only_for_the_same_header_and_bytes`).
    #[error("{name}: refused by the isolated check: {outcome}; the child's last line: {last_line}")]
    Refused {
        /// The file, or the bytes' size.
        name: String,
        /// What happened to the child ("killed by signal 6 (SIGABRT)", ...).
        outcome: String,
        /// The last line the child wrote on standard error (the plugin's own message).
        last_line: String,
    },
    /// A runtime (hand-off) error.
    #[error(transparent)]
    Runtime(Box<handoff_runtime::Error>),
}

impl XlaError {
    // Cold: every refusal formats its message away from the paths that succeed.
    #[cold]
    #[inline(never)]
    pub(crate) fn invalid(field: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> Self {
        XlaError::Invalid { field: field.into(), value: value.to_string(), reason: reason.into() }
    }

    /// The PJRT status code, for [`XlaError::Pjrt`].
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            XlaError::Pjrt { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<handoff_runtime::Error> for XlaError {
    fn from(e: handoff_runtime::Error) -> Self {
        XlaError::Runtime(Box::new(e))
    }
}

impl From<XlaError> for handoff_runtime::Error {
    fn from(e: XlaError) -> Self {
        match e {
            XlaError::Pjrt { call, code, message } => handoff_runtime::Error::Backend {
                backend: "pjrt",
                call,
                message: format!("{code}: {message}"),
            },
            XlaError::PluginException { call, exception } => handoff_runtime::Error::Backend {
                backend: "pjrt",
                call,
                message: format!("threw a C++ exception: {exception}"),
            },
            XlaError::Runtime(e) => *e,
            other => handoff_runtime::Error::Adapter { adapter: "xla", message: other.to_string() },
        }
    }
}
