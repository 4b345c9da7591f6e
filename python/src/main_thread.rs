//! Python producers' deleters, run on the interpreter's main thread.
//!
//! A producer's deleter may assume it never runs beside the producer's own calls on
//! another thread, and holding the GIL does not make that so: JAX's deleter takes an
//! entry off its buffer's list of external references (a plain vector in the PJRT C
//! API), and JAX's `__dlpack__` adds one to that list with the GIL released. Called
//! from the runtime's reaper thread, the two raced: a reference was lost and JAX
//! aborted at exit ("Non-zero type 1 hold on destruction"), or memory was corrupted.
//!
//! So a deleter that becomes due on any other thread is queued here and run on the
//! main thread between two bytecodes (a CPython pending call), with the GIL: where a
//! Python consumer would have called it, in the usual single-threaded program. It is
//! run at once when it becomes due on the main thread itself. [`run_queued`] runs what
//! is queued on the calling thread: `flush()` and the exit drain call it, so that
//! "every release has happened" includes the producers' deleters.
//!
//! The main thread runs pending calls only while it runs Python code: a program whose
//! main thread blocks for long (a `join` while workers hand off) gets its producers'
//! memory back when it returns, or at a `flush()`.

use pyo3::ffi;
use pyo3::prelude::*;
use std::cell::Cell;
use std::ffi::{c_int, c_ulong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A deleter to run with the GIL held.
pub type Job = Box<dyn FnOnce() + Send>;

/// The main thread's identifier (`PyThread_get_thread_ident`), set at import.
static MAIN: AtomicU64 = AtomicU64::new(0);
/// Deleters waiting for the main thread.
static QUEUE: Mutex<Vec<Job>> = Mutex::new(Vec::new());
/// Whether a pending call to [`run_pending`] is scheduled and has not started yet.
static SCHEDULED: AtomicBool = AtomicBool::new(false);
/// Set once the interpreter is exiting: no pending call is scheduled any more (they
/// would never run); whoever drains runs the queue.
static CLOSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while this thread runs a flush or drain of the reaper (see [`deferring`]).
    static DEFERRING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (a reaper flush or drain) with the deleters that become due on this
/// thread queued instead of run; the caller runs them with [`run_queued`] afterwards.
/// A deleter run inside the flush that calls `handoff.flush()` would wait for the very
/// releases being done, forever.
pub fn deferring<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEFERRING.set(self.0);
        }
    }
    let _restore = Restore(DEFERRING.replace(true));
    f()
}

/// Records which thread is the main one (`threading.main_thread()`, whichever thread
/// imports the module).
pub fn init(py: Python<'_>) -> PyResult<()> {
    let ident: u64 = py.import("threading")?.call_method0("main_thread")?.getattr("ident")?.extract()?;
    MAIN.store(ident, Ordering::Relaxed);
    Ok(())
}

fn on_main_thread() -> bool {
    // SAFETY: returns the calling thread's identifier; needs no GIL.
    let me: c_ulong = unsafe { ffi::PyThread_get_thread_ident() };
    me as u64 == MAIN.load(Ordering::Relaxed)
}

/// Runs `job` with the GIL on the main thread: now when called there (inside
/// [`deferring`]: at its caller's [`run_queued`]), else at the main thread's next
/// bytecode boundary (or the next [`run_queued`]). Any thread, with
/// or without the GIL; it never waits for the GIL while it holds the queue's lock.
pub fn run_on_main(job: Job) {
    if on_main_thread() {
        if DEFERRING.get() {
            QUEUE.lock().unwrap_or_else(|e| e.into_inner()).push(job); // run_queued soon, here
        } else {
            run_attached(job);
        }
        return;
    }
    QUEUE.lock().unwrap_or_else(|e| e.into_inner()).push(job);
    if !CLOSED.load(Ordering::Acquire) && !SCHEDULED.swap(true, Ordering::AcqRel) {
        // SAFETY: CPython's pending-call queue takes a plain function and argument
        // from any thread, without the GIL; the interpreter is still running (not
        // closed by the exit drain).
        let failed = unsafe { ffi::Py_AddPendingCall(Some(run_pending), std::ptr::null_mut()) } != 0;
        if failed {
            // CPython's queue is full: the next job, flush() or exit runs this one.
            SCHEDULED.store(false, Ordering::Release);
        }
    }
}

/// Runs every queued job on the calling thread, with the GIL (`py`). Jobs queued
/// while these run wait for the next call.
pub fn run_queued(_py: Python<'_>) {
    let jobs = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|e| e.into_inner()));
    for job in jobs {
        run_attached(job);
    }
}

/// No pending call is scheduled from now on: the interpreter is exiting and would
/// not run it. Jobs queued later are run by the exit path's [`run_queued`].
pub fn close() {
    CLOSED.store(true, Ordering::Release);
}

/// The pending call: runs on the main thread between two bytecodes, with the GIL.
extern "C" fn run_pending(_: *mut c_void) -> c_int {
    SCHEDULED.store(false, Ordering::Release);
    // Each job catches its own panics; this catches anything else, so that nothing
    // unwinds into CPython.
    let r = catch_unwind(|| {
        // SAFETY: CPython calls pending calls on the main thread with the GIL held.
        let py = unsafe { Python::assume_attached() };
        run_queued(py);
    });
    if r.is_err() {
        report("a panic while running producers' deleters was caught");
    }
    0
}

/// Runs `job` with the GIL (taken if this thread does not hold it); never after the
/// interpreter can no longer be attached to (the producer's tensor is kept then).
fn run_attached(job: Job) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if Python::try_attach(|_py| job()).is_none() {
            report("a producer's deleter was not called after interpreter shutdown (the tensor is kept)");
        }
    }));
    if r.is_err() {
        report("a panic in a producer's deleter was caught");
    }
}

fn report(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "handoff: {what}");
}
