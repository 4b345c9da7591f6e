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
//!
//! # Exit
//!
//! Once the `atexit` hooks ran, CPython runs no pending call, and while it tears the
//! modules down `Py_IsInitialized()` is 0, so PyO3 no longer attaches: a consumer's
//! array that dies then (a module global) is released by CPython's own finalizing
//! thread, the main one, which holds the GIL. Its producer's deleter runs there, at
//! once, as CPython runs any other destructor then ([`with_gil`]). After the interpreter
//! is gone (a `Py_AtExit` callback says so) no deleter runs any more: the tensor is
//! kept, and each one left is reported on stderr, as is each job still queued then.
//!
//! Which thread is the main one, and how far the exit has gone, is
//! [`lifecycle`](crate::lifecycle)'s state; this module keeps only its own work: the
//! queue of deleters, its pending call, and the per-thread [`deferring`] mark.

use crate::lifecycle::LIFECYCLE;
use pyo3::ffi;
use pyo3::prelude::*;
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// A deleter to run with the GIL held.
pub type Job = Box<dyn FnOnce() + Send>;

/// Deleters waiting for the main thread.
static QUEUE: Mutex<Vec<Job>> = Mutex::new(Vec::new());
/// Whether a pending call to [`run_pending`] is scheduled and has not started yet.
static SCHEDULED: AtomicBool = AtomicBool::new(false);

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
/// imports the module), and watches for the end of the interpreter.
pub fn init(py: Python<'_>) -> PyResult<()> {
    let ident: u64 = py.import("threading")?.call_method0("main_thread")?.getattr("ident")?.extract()?;
    LIFECYCLE.set_main_thread(ident);
    LIFECYCLE.watch(|| {
        // SAFETY: registers a plain function, called once by `Py_FinalizeEx` after the
        // interpreter is deleted; the GIL is held (`py`).
        unsafe { ffi::Py_AtExit(Some(interpreter_gone)) == 0 }
    });
    Ok(())
}

/// Called by `Py_FinalizeEx` once the interpreter is deleted (the last thing it does):
/// marks the interpreter gone and reports the jobs still queued.
extern "C" fn interpreter_gone() {
    let r = catch_unwind(|| {
        LIFECYCLE.mark_gone();
        let left = QUEUE.lock().unwrap_or_else(|e| e.into_inner()).len();
        if left > 0 {
            report(&format!(
                "{left} producer's deleter(s) were not called: they became due after the interpreter \
                 could run them (the tensors are kept)"
            ));
        }
    });
    if r.is_err() {
        report("a panic at interpreter exit was caught");
    }
}

/// Runs `job` with the GIL on the main thread: now when called there (inside
/// [`deferring`]: at its caller's [`run_queued`]), else at the main thread's next
/// bytecode boundary (or the next [`run_queued`]). Any thread, with
/// or without the GIL; it never waits for the GIL while it holds the queue's lock.
pub fn run_on_main(job: Job) {
    if LIFECYCLE.on_main_thread() {
        if DEFERRING.get() {
            QUEUE.lock().unwrap_or_else(|e| e.into_inner()).push(job); // run_queued soon, here
        } else {
            run_attached(job);
        }
        return;
    }
    QUEUE.lock().unwrap_or_else(|e| e.into_inner()).push(job);
    if SCHEDULED.swap(true, Ordering::AcqRel) {
        return; // a pending call that has not started yet will run this job too
    }
    // Under the lifecycle's lock, which never waits for the GIL: `close` takes it with
    // the GIL held. Closed: `None`.
    let added = LIFECYCLE.if_open(|| {
        // SAFETY: CPython's pending-call queue takes a plain function and argument
        // from any thread, without the GIL; the interpreter is still whole: `close`
        // (its atexit hook, before finalization) has not run, and cannot while this
        // lock is held.
        unsafe { ffi::Py_AddPendingCall(Some(run_pending), std::ptr::null_mut()) == 0 }
    });
    if added != Some(true) {
        // Closed (the exit path runs the queue), or CPython's queue is full (the next
        // job, flush() or exit runs this one).
        SCHEDULED.store(false, Ordering::Release);
    }
}

/// Runs every queued job on the calling thread, with the GIL (`py`); returns how many.
/// Jobs queued while these run wait for the next call.
pub fn run_queued(_py: Python<'_>) -> usize {
    let jobs = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|e| e.into_inner()));
    let n = jobs.len();
    for job in jobs {
        run_attached(job);
    }
    n
}

/// Runs what is queued when called on the main thread while the interpreter exits
/// (`capsule::release` after the exit drain): during finalization too, where this
/// thread holds the GIL ([`with_gil`]). On another thread it leaves the queue to the
/// main thread's next release (or reports it at the end, see [`interpreter_gone`]): a
/// producer's deleter runs on the main thread only.
pub fn run_queued_exiting() {
    if !LIFECYCLE.on_main_thread() {
        return;
    }
    let jobs = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|e| e.into_inner()));
    for job in jobs {
        run_attached(job);
    }
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

/// Runs `job` with the GIL (taken if this thread does not hold it, see [`with_gil`]);
/// never once the interpreter is gone (the producer's tensor is kept then).
fn run_attached(job: Job) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if with_gil(job).is_none() {
            report("a producer's deleter was not called after interpreter shutdown (the tensor is kept)");
        }
    }));
    if r.is_err() {
        report("a panic in a producer's deleter was caught");
    }
}

/// Runs `f` with the GIL on this thread, or returns `None` where that cannot be.
///
/// PyO3 attaches while the interpreter is initialized. Once it is finalizing
/// (`Py_IsInitialized()` is 0 while CPython tears the modules down and collects what
/// is left), PyO3 refuses, yet the finalizing thread (the main one) still runs
/// destructors, holding the GIL: there `f` runs under `PyGILState_Ensure`, which
/// CPython lets the finalizing thread take (re-entrant when it holds the GIL). Never on
/// another thread then (CPython would end it inside `PyGILState_Ensure`), and never
/// once the interpreter is gone ([`interpreter_gone`]) or where that cannot be told.
pub fn with_gil<R>(f: impl FnOnce() -> R) -> Option<R> {
    if LIFECYCLE.is_gone() {
        return None;
    }
    let mut f = Some(f);
    if let Some(r) = Python::try_attach(|_py| f.take().map(|f| f())) {
        return r;
    }
    let f = f.take()?;
    if !LIFECYCLE.may_attach_while_finalizing() {
        return None;
    }
    struct Release(ffi::PyGILState_STATE);
    impl Drop for Release {
        fn drop(&mut self) {
            // SAFETY: pairs the `PyGILState_Ensure` below, on the same thread.
            unsafe { ffi::PyGILState_Release(self.0) };
        }
    }
    // SAFETY: this is the main thread, which runs `Py_FinalizeEx` (the only thread
    // CPython lets take the GIL while finalizing), and the interpreter still exists:
    // `interpreter_gone` runs on this same thread, at the end of `Py_FinalizeEx`, and
    // has not run. Released when `_gil` drops, also if `f` panics.
    let _gil = Release(unsafe { ffi::PyGILState_Ensure() });
    Some(f())
}

fn report(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "handoff: {what}");
}
