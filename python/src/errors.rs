//! The exceptions of `handoff`, and the mapping of the runtime's errors onto them.

use pyo3::create_exception;
use pyo3::exceptions::{PyBufferError, PyRuntimeError};
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

/// The Python exception for a runtime error: [`InvalidTensorError`] for a tensor that
/// failed validation, [`HandoffError`] for everything else. The message is the
/// runtime's own.
pub fn to_py(e: handoff_runtime::Error) -> PyErr {
    match e {
        handoff_runtime::Error::Validation(_) => InvalidTensorError::new_err(e.to_string()),
        _ => HandoffError::new_err(e.to_string()),
    }
}
