//! `handoff._handoff`: the native module of the Python package `handoff`.
//!
//! It speaks DLPack capsules and the CUDA driver through `handoff-runtime`, so it
//! needs neither libtorch nor PJRT: the protocol is the runtime's, not a copy of it.
//!
//! - [`ordered::ordered`] wraps any object with `__dlpack__` (or only
//!   `__cuda_array_interface__`); the wrapper's `__dlpack__` forwards to the producer
//!   with the consumer's arguments, takes the producer's managed tensor in through
//!   `Handoff::from_raw` (every validation rule, the producer's deleter exactly once
//!   on every path) and returns a capsule whose deleter gives the producer's tensor
//!   back only after the work queued on the consumer's stream before the release has
//!   run (an event and the runtime's reaper, never a host wait).
//! - [`streams`]: the DLPack stream values and the rules for each.
//! - [`capsule`]: taking the producer's capsule, making the consumer's.
//! - [`cai`]: objects that only expose `__cuda_array_interface__`.
//! - [`keep_alive`]: Python objects kept alive by a hand-off, and shutdown.
//! - [`stats`], [`flush`]: the runtime's counters and its reaper's flush.
//! - [`main_thread`]: producers' deleters, run on the interpreter's main thread.
//! - [`lifecycle`]: the interpreter's lifecycle (main thread, shutdown, closed, gone).
//!
//! `_`-prefixed names are not the package's API. Two kinds:
//!
//! - The package's own internals, in every build: `_shutdown` (the `atexit` hook
//!   `handoff/__init__.py` registers), `_to_jax_many` and `_to_torch_many` (what
//!   `handoff.torch_function` crosses with), `_count_copy` and `_host_sync` (the
//!   copies and host syncs `handoff.jax_function` makes, counted in `stats()`).
//! - Test and benchmark seams, only with the cargo feature `test-hooks` (off in the
//!   wheel users install): `_set_route` (forces a route in this process; users have
//!   `HANDOFF_ROUTE=public`), `_mock_ordered` and `Ordered._mock_advance` (a simulated
//!   consumer stream, `mock`). `cargo xtask test` runs pytest on the wheel without them
//!   and the tests marked `hooks` on a second wheel built with them.
//!
//! The runtime releases on any thread (its reaper's, mostly); a Python producer's
//! deleter is queued for the main thread (see [`main_thread`] for why the GIL is not
//! enough). Nothing here holds a lock while it waits for the GIL, and every call that
//! may wait for the reaper releases the GIL first. Every `extern "C"` function catches panics.

mod cai;
mod capsule;
mod capture;
mod crossing;
mod errors;
mod jax_api;
mod keep_alive;
mod lifecycle;
mod main_thread;
mod mock;
mod ordered;
mod streams;
mod torch_api;

use handoff_runtime::reaper;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The runtime's counters (process-wide) and the reaper's queue, as a dict:
/// `exports`, `imports`, `host_syncs`, `events_created`, `events_recorded`,
/// `waits_enqueued`, `waits_elided`, `copies`, `bytes_copied`,
/// `releases_immediate`, `releases_deferred`, `releases_leaked`, `pending` (releases queued and not yet
/// done) and `released` (deferred releases done).
#[pyfunction]
fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = handoff_runtime::stats();
    let d = PyDict::new(py);
    let counters = [
        ("exports", s.exports),
        ("imports", s.imports),
        ("host_syncs", s.host_syncs),
        ("events_created", s.events_created),
        ("events_recorded", s.events_recorded),
        ("waits_enqueued", s.waits_enqueued),
        ("waits_elided", s.waits_elided),
        ("copies", s.copies),
        ("bytes_copied", s.bytes_copied),
        ("releases_immediate", s.releases_immediate),
        ("releases_deferred", s.releases_deferred),
        ("releases_leaked", s.releases_leaked),
        ("pending", reaper::pending() as u64),
        ("released", reaper::released()),
    ];
    for (k, v) in counters {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// Blocks until every release queued so far has happened (one counted host sync per
/// stream with pending releases), then runs the producers' deleters those releases
/// queued for the main thread, here (the calling thread), with the GIL. The GIL is
/// released while it waits.
#[pyfunction]
fn flush(py: Python<'_>) {
    py.detach(|| main_thread::deferring(reaper::flush));
    main_thread::run_queued(py);
}

/// Counts one copy of `bytes` bytes that the package's Python code made (in
/// `handoff.stats()`: `copies`, `bytes_copied`): `handoff.jax_function` copies each
/// output of a PyTorch function into XLA's buffer.
#[pyfunction(name = "_count_copy")]
fn count_copy(bytes: u64) {
    handoff_runtime::stats::count_copy(bytes);
}

/// Runs `f()`, a call that blocks the host until a device has done some work, counted
/// in `handoff.stats()["host_syncs"]`; its result. The GIL is held: `f` is Python.
#[pyfunction(name = "_host_sync")]
fn host_sync<'py>(f: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    handoff_runtime::stats::host_sync(|| f.call0())
}

/// Whether the CUDA driver can be used (`libcuda.so.1` loads and there is a device).
#[pyfunction]
fn cuda_available(py: Python<'_>) -> bool {
    py.detach(handoff_runtime::cuda::is_available)
}

/// The Python module `handoff._handoff`.
#[pymodule]
fn _handoff(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    main_thread::init(py)?;
    crossing::init()?;
    m.add_class::<ordered::Ordered>()?;
    dlpark::python::producer::install_exchange_api::<ordered::Ordered>(py)?;
    m.add_function(wrap_pyfunction!(ordered::ordered, m)?)?;
    m.add_function(wrap_pyfunction!(crossing::to_jax, m)?)?;
    m.add_function(wrap_pyfunction!(crossing::to_torch, m)?)?;
    m.add_function(wrap_pyfunction!(crossing::to_jax_many, m)?)?;
    m.add_function(wrap_pyfunction!(crossing::to_torch_many, m)?)?;
    m.add_function(wrap_pyfunction!(crossing::routes, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(flush, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(capture::prune_graph, m)?)?;
    m.add_function(wrap_pyfunction!(keep_alive::shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(count_copy, m)?)?;
    m.add_function(wrap_pyfunction!(host_sync, m)?)?;
    #[cfg(feature = "test-hooks")]
    {
        m.add_function(wrap_pyfunction!(crossing::set_route, m)?)?;
        m.add_function(wrap_pyfunction!(ordered::mock_ordered, m)?)?;
    }
    m.add("HandoffError", py.get_type::<errors::HandoffError>())?;
    m.add("InvalidTensorError", py.get_type::<errors::InvalidTensorError>())?;
    m.add("CaptureWarning", py.get_type::<errors::CaptureWarning>())?;
    let v = handoff_runtime::ffi::DLPackVersion::CURRENT;
    m.add("DLPACK_VERSION", (v.major, v.minor))?;
    Ok(())
}
