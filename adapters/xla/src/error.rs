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

    /// An argument or value refused before calling PJRT.
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
