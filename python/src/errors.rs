//! The exceptions of `handoff`, and the mapping of the runtime's errors onto them.

use pyo3::create_exception;
use pyo3::exceptions::{PyBufferError, PyModuleNotFoundError, PyRuntimeError, PyRuntimeWarning};
use pyo3::prelude::*;

create_exception!(
    handoff,
    HandoffError,
    PyRuntimeError,
    "A hand-off could not be made: CUDA unavailable, a driver error, streams that cannot be ordered."
);

create_exception!(
    handoff,
    InvalidTensorError,
    PyBufferError,
    "The producer's DLPack tensor failed validation (the message names the field and the value). \
     The producer's deleter has been called exactly once."
);

create_exception!(
    handoff,
    CaptureWarning,
    PyRuntimeWarning,
    "Work of JAX's own client was captured into a CUDA graph: JAX arrays made after the capture \
     and still alive at one of its replays can be overwritten by it (XLA reuses a captured \
     execution's scratch memory). With handoff.capture_clients(enabled=True), work on arrays \
     handed over inside the capture runs on a client of the graph's own and does not warn. Given \
     once per process."
);

/// The Python exception for a runtime error: [`InvalidTensorError`] for a tensor that
/// failed validation, [`HandoffError`] for everything else. The message is the
/// runtime's own.
pub fn to_py(e: handoff_runtime::Error) -> PyErr {
    match e {
        handoff_runtime::Error::Validation(_) => InvalidTensorError::new_err(e.to_string()),
        _ => HandoffError::new_err(e.to_string()),
    }
}

/// `e` with what to do, where JAX's own error says that XLA launched a CUDA graph of its
/// own (a command buffer) into a stream capturing PyTorch's graph, which CUDA refuses:
/// a [`HandoffError`] naming the compile option (and the flag) that turns XLA's
/// command buffers off, caused by `e`. Any other error as it is.
pub fn with_capture_hint(py: Python<'_>, e: PyErr) -> PyErr {
    let message = e.value(py).to_string();
    if !message.contains("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED") || !message.contains("CUDA graph") {
        return e;
    }
    let hinted = HandoffError::new_err(
        "XLA ran a JAX function as a CUDA graph of its own (a command buffer), which cannot be \
         launched inside PyTorch's CUDA graph capture: compile that function with its command \
         buffers off, jax.jit(f, compiler_options={'xla_gpu_enable_command_buffer': ''}) \
         (handoff.torch_function does so for what it captures), or set \
         XLA_FLAGS=--xla_gpu_enable_command_buffer= before JAX starts (every JAX program of \
         the process) (JAX's error follows as the cause)",
    );
    hinted.set_cause(py, Some(e));
    hinted
}

/// `e` naming what needs the package, where `e` says a package of the frameworks
/// handoff crosses between is not installed (`ModuleNotFoundError` for `torch`, `jax`
/// or `jaxlib`): a `ModuleNotFoundError` that names `what` (`handoff.to_torch`), the
/// framework and how to install it, caused by `e`. Any other error as it is.
pub fn with_missing_package(py: Python<'_>, e: PyErr, what: &str) -> PyErr {
    if !e.is_instance_of::<PyModuleNotFoundError>(py) {
        return e;
    }
    let Ok(Some(name)) = e.value(py).getattr("name").and_then(|n| n.extract::<Option<String>>()) else {
        return e;
    };
    let top = name.split('.').next().unwrap_or_default();
    let (framework, install) = match top {
        "torch" => ("PyTorch", "pip install torch"),
        "jax" | "jaxlib" => ("JAX", "pip install jax"),
        _ => return e,
    };
    let named = PyModuleNotFoundError::new_err(format!(
        "{what} needs {framework}, which is not installed in this environment (no module named \
         {name:?}): {install}"
    ));
    named.set_cause(py, Some(e));
    named
}
