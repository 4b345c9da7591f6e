//! The interpreter's lifecycle as the extension sees it: which thread is the main one,
//! and how far the interpreter's exit has gone.
//!
//! One state, [`LIFECYCLE`], read by every thread (the reaper's included, without the
//! GIL). Its stages, in the order they happen:
//!
//! 1. Running: the main thread's identifier is known ([`Lifecycle::set_main_thread`],
//!    at import) and, where CPython had room, the end of the interpreter is watched
//!    ([`Lifecycle::watch`]).
//! 2. Shutting down ([`Lifecycle::begin_shutdown`]) and closed ([`Lifecycle::close`]):
//!    both set by the `atexit` hook `handoff._handoff._shutdown`
//!    (`keep_alive::shutdown`), while the interpreter is still whole. From then on only
//!    the main (finalizing) thread touches Python objects, and no CPython pending call
//!    is scheduled any more.
//! 3. Gone ([`Lifecycle::mark_gone`]): set by a `Py_AtExit` callback
//!    (`main_thread::interpreter_gone`), the last thing `Py_FinalizeEx` does. Nothing
//!    may take the GIL or touch a Python object any more.
//!
//! No stage is ever left once entered. The deleters' queue and its pending call
//! (`main_thread`) are not part of this state: they are the main thread's work, which
//! the lifecycle only gates.

use pyo3::ffi;
use std::ffi::c_ulong;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The extension's one lifecycle state.
pub static LIFECYCLE: Lifecycle = Lifecycle::new();

/// Where the interpreter is in its life (see the module's documentation).
pub struct Lifecycle {
    /// The main thread's identifier (`PyThread_get_thread_ident`), set at import by
    /// `main_thread::init` ([`Lifecycle::set_main_thread`]).
    main: AtomicU64,
    /// Set by the `atexit` hook (`keep_alive::shutdown`) when it starts: the
    /// interpreter is exiting. A thread other than the main one that takes the GIL
    /// from then on may be ended inside `PyGILState_Ensure` by the finalizing thread,
    /// so such threads leak references instead of dropping them, and releases behind a
    /// device stream are done on the releasing thread (`capsule::release`).
    shutting_down: AtomicBool,
    /// Set by the same hook, right after [`Lifecycle::begin_shutdown`]: no CPython
    /// pending call is scheduled any more (it would never run); whoever drains runs
    /// the deleters' queue. A mutex, not a flag: a pending call is added under it
    /// ([`Lifecycle::if_open`]), so none is added once [`Lifecycle::close`] returned
    /// (a thread that read "open" just before could otherwise add one after the
    /// interpreter was freed).
    closed: Mutex<bool>,
    /// Set by a `Py_AtExit` callback (`main_thread::interpreter_gone`), at the very
    /// end of `Py_FinalizeEx`: the interpreter is gone, nothing may take the GIL or
    /// touch a Python object any more.
    gone: AtomicBool,
    /// Whether that callback was registered (CPython has room for 32), set at import
    /// by `main_thread::init` ([`Lifecycle::watch`]): without it the end of the
    /// interpreter cannot be told, and no deleter runs during finalization.
    watched: AtomicBool,
}

impl Lifecycle {
    const fn new() -> Lifecycle {
        Lifecycle {
            main: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
            closed: Mutex::new(false),
            gone: AtomicBool::new(false),
            watched: AtomicBool::new(false),
        }
    }

    /// Records `ident` (`threading.main_thread().ident`) as the main thread's.
    pub fn set_main_thread(&self, ident: u64) {
        self.main.store(ident, Ordering::Relaxed);
    }

    /// Whether the calling thread is the interpreter's main thread.
    pub fn on_main_thread(&self) -> bool {
        // SAFETY: returns the calling thread's identifier; needs no GIL.
        let me: c_ulong = unsafe { ffi::PyThread_get_thread_ident() };
        me as u64 == self.main.load(Ordering::Relaxed)
    }

    /// Unless the end of the interpreter is watched already, calls `register` (which
    /// registers the `Py_AtExit` callback that calls [`Lifecycle::mark_gone`]) and
    /// records whether it succeeded.
    pub fn watch(&self, register: impl FnOnce() -> bool) {
        if !self.watched.load(Ordering::Acquire) {
            let registered = register();
            self.watched.store(registered, Ordering::Release);
        }
    }

    /// Whether the end of the interpreter is watched (see [`Lifecycle::watch`]).
    pub fn is_watched(&self) -> bool {
        self.watched.load(Ordering::Acquire)
    }

    /// The interpreter is exiting (called by the `atexit` hook).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Whether [`Lifecycle::begin_shutdown`] has run: the interpreter is exiting.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// No pending call is scheduled from now on (called by the `atexit` hook): the
    /// interpreter is exiting and would not run it. Jobs queued later are run by the
    /// exit path's `main_thread::run_queued`. Waits for an [`Lifecycle::if_open`] in
    /// progress on another thread.
    pub fn close(&self) {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// Runs `f` unless [`Lifecycle::close`] has run (then returns `None`), holding the
    /// lock that `close` takes across `f`: `close` cannot return while `f` runs. `f`
    /// must not wait for the GIL (`close` is called with the GIL held).
    pub fn if_open<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        let r = if *closed { None } else { Some(f()) };
        drop(closed);
        r
    }

    /// The interpreter is gone (called by the `Py_AtExit` callback, the last thing
    /// `Py_FinalizeEx` does).
    pub fn mark_gone(&self) {
        self.gone.store(true, Ordering::Release);
    }

    /// Whether [`Lifecycle::mark_gone`] has run: nothing may take the GIL or touch a
    /// Python object any more.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Whether the calling thread may take the GIL with `PyGILState_Ensure` while the
    /// interpreter finalizes: the end of the interpreter is watched, this is the main
    /// (finalizing) thread, and the interpreter is not gone yet.
    pub fn may_attach_while_finalizing(&self) -> bool {
        self.is_watched() && self.on_main_thread() && !self.is_gone()
    }
}
