//! Python objects a hand-off keeps alive, and interpreter shutdown.
//!
//! A keep-alive is dropped by the reaper thread (or by whichever thread releases the
//! hand-off): it takes the GIL itself to drop its reference, and never while holding a
//! lock (the reaper holds none that a thread holding the GIL waits for: `flush`
//! releases the GIL first). While the interpreter finalizes, only its finalizing (main)
//! thread drops the reference; elsewhere, and once the interpreter is gone, the
//! reference is leaked instead.

use crate::lifecycle::LIFECYCLE;
use crate::main_thread;
use handoff_runtime::reaper;
use pyo3::prelude::*;

/// Whether [`shutdown`] has run: the interpreter is exiting
/// ([`Lifecycle::is_shutting_down`](crate::lifecycle::Lifecycle::is_shutting_down)).
pub fn shutting_down() -> bool {
    LIFECYCLE.is_shutting_down()
}

/// Called by `atexit` (registered by `handoff/__init__.py`) while the interpreter is
/// still whole: performs the queued releases as their events complete (without the
/// GIL, for at most `reaper::EXIT_DRAIN_TIMEOUT`; what is left then is leaked and
/// reported, so exit never hangs on a device that stopped), then runs the producers'
/// deleters they queued for the main thread (this one) — no pending call is scheduled
/// from here on, as the interpreter would not run it. From then on, hand-offs
/// released behind a device stream are released on the releasing thread after a wait
/// for the consumer stream (see `capsule::release`), so that the producer's deleter
/// runs there, on the finalizing thread, while the producer's objects still exist.
#[pyfunction(name = "_shutdown")]
pub fn shutdown(py: Python<'_>) {
    LIFECYCLE.begin_shutdown();
    LIFECYCLE.close();
    py.detach(|| main_thread::deferring(|| reaper::drain(reaper::EXIT_DRAIN_TIMEOUT)));
    main_thread::run_queued(py);
}

/// A strong reference to a Python object, droppable on any thread.
pub struct PyKeepAlive(Option<Py<PyAny>>);

impl PyKeepAlive {
    /// Keeps `obj` alive until this is dropped.
    pub fn new(obj: Py<PyAny>) -> PyKeepAlive {
        PyKeepAlive(Some(obj))
    }
}

impl Drop for PyKeepAlive {
    fn drop(&mut self) {
        let Some(obj) = self.0.take() else { return };
        if shutting_down() && !LIFECYCLE.on_main_thread() {
            // The interpreter is exiting: another thread that takes the GIL now may be
            // ended inside `PyGILState_Ensure` by the finalizing one. Leaked.
            std::mem::forget(obj);
            return;
        }
        let ptr = obj.into_ptr();
        // With the GIL: attached when the interpreter can be attached to (re-entrant on a
        // thread that holds it already), or on the finalizing main thread (see
        // `main_thread::with_gil`). The reference is dropped directly, not through PyO3,
        // which would defer it when it does not know the GIL is held.
        // Otherwise (`None`) the interpreter is gone, or this thread may not take the GIL
        // while it finalizes: nothing may touch the object, and the reference is leaked.
        main_thread::with_gil(|| {
            // SAFETY: a strong reference we own, dropped once, with the GIL held.
            unsafe { pyo3::ffi::Py_DecRef(ptr) }
        });
    }
}
