//! The C++ guard every PJRT call goes through (`csrc/guard.cpp`).
//!
//! A plugin is C++: a bug in it, or input it does not expect (a malformed StableHLO
//! module given to `PJRT_Client_Compile`), can let a C++ exception escape a C API
//! function. Unwinding into a Rust frame aborts the whole process ("Rust cannot
//! catch foreign exceptions"). The guard is a C++ frame between Rust and the plugin
//! that catches every exception and reports it, so that the call returns
//! [`XlaError::PluginException`] naming the function and the exception's `what()`.
//!
//! What the plugin's state is after an exception escaped it is the plugin's
//! business: PJRT promises none (its functions are not meant to throw), so the error
//! says that the client may be unusable afterwards. handoff destroys nothing the call
//! may have half made (a handle the call did not return is not handoff's to destroy).
//!
//! Cost: one call through a C function that is not inlined (zero-cost exception
//! tables: nothing runs on the path that returns), small beside the PJRT calls it
//! wraps. The ignored test `guard_cost` times it against a direct call of a
//! PJRT-shaped function that does nothing (figures in `docs/PERFORMANCE.md`).

use crate::error::XlaError;
use crate::sys;
use std::ffi::{c_char, c_int, c_void};
use std::mem::MaybeUninit;

/// How many bytes of an exception's message are kept.
const MESSAGE_CAP: usize = 1024;

const RETURNED: c_int = 0;
const THREW_STD: c_int = 1;

unsafe extern "C" {
    fn handoff_xla_guarded_call(
        f: *const c_void,
        args: *mut c_void,
        out: *mut *mut sys::PJRT_Error,
        buf: *mut c_char,
        cap: usize,
        len: *mut usize,
    ) -> c_int;

    fn handoff_xla_guarded_call_void(
        f: *const c_void,
        args: *mut c_void,
        buf: *mut c_char,
        cap: usize,
        len: *mut usize,
    ) -> c_int;
}

/// Calls `f(args)` inside the guard: the returned error (owned by the caller, null
/// for none), or [`XlaError::PluginException`] when a C++ exception escaped `f`.
///
/// # Safety
/// As calling `f(args)` directly: `f` is a PJRT function taking `A`, and `args` is
/// filled as its header requires.
#[inline]
pub(super) unsafe fn call<A>(
    name: &'static str,
    f: sys::Function<A>,
    args: &mut A,
) -> Result<*mut sys::PJRT_Error, XlaError> {
    let mut out: *mut sys::PJRT_Error = std::ptr::null_mut();
    let mut buf = MaybeUninit::<[u8; MESSAGE_CAP]>::uninit();
    let mut len = 0usize;
    // SAFETY: the guard calls `f` with `args` through a pointer of type
    // `PJRT_Error* (*)(void*)`: `f` is `extern "C" fn(*mut A) -> *mut PJRT_Error`, and a
    // pointer to `A` is passed as a pointer to void the same way on every C ABI handoff
    // runs on. The guard writes `out` only when `f` returns, and at most `MESSAGE_CAP`
    // bytes of `buf` (NUL-terminated) and `len` only when it caught an exception. It
    // never unwinds (`noexcept`); the rest is the caller's contract.
    let status = unsafe {
        handoff_xla_guarded_call(
            f as *const c_void,
            args as *mut A as *mut c_void,
            &mut out,
            buf.as_mut_ptr() as *mut c_char,
            MESSAGE_CAP,
            &mut len,
        )
    };
    if status == RETURNED {
        return Ok(out);
    }
    // SAFETY: on an exception the guard wrote `len` (< MESSAGE_CAP) bytes of `buf`.
    Err(unsafe { thrown(name, status, &buf, len) })
}

/// [`call`] for the functions returning nothing (`PJRT_Error_Destroy`,
/// `PJRT_Error_Message`).
///
/// # Safety
/// As calling `f(args)` directly.
#[inline]
pub(super) unsafe fn call_void<A>(
    name: &'static str,
    f: unsafe extern "C" fn(*mut A),
    args: &mut A,
) -> Result<(), XlaError> {
    let mut buf = MaybeUninit::<[u8; MESSAGE_CAP]>::uninit();
    let mut len = 0usize;
    // SAFETY: as in `call`, for a function returning `void`.
    let status = unsafe {
        handoff_xla_guarded_call_void(
            f as *const c_void,
            args as *mut A as *mut c_void,
            buf.as_mut_ptr() as *mut c_char,
            MESSAGE_CAP,
            &mut len,
        )
    };
    if status == RETURNED {
        return Ok(());
    }
    // SAFETY: as in `call`.
    Err(unsafe { thrown(name, status, &buf, len) })
}

/// The error of a call that threw.
///
/// # Safety
/// The first `len` bytes of `buf` must be initialized, `len < MESSAGE_CAP`.
#[cold]
#[inline(never)]
unsafe fn thrown(
    call: &'static str,
    status: c_int,
    buf: &MaybeUninit<[u8; MESSAGE_CAP]>,
    len: usize,
) -> XlaError {
    let len = len.min(MESSAGE_CAP - 1);
    // SAFETY: forwarded from the caller.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, len) };
    let what = String::from_utf8_lossy(bytes);
    let exception = match (status, what.is_empty()) {
        (THREW_STD, false) => format!("std::exception: {what}"),
        (THREW_STD, true) => "std::exception with an empty what()".to_owned(),
        (_, false) => format!("an exception of type {what} (not a std::exception)"),
        (_, true) => "an exception of unknown type (not a std::exception)".to_owned(),
    };
    XlaError::PluginException { call, exception }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    struct Throw {
        kind: c_int,
        what: *const c_char,
    }

    unsafe extern "C" {
        /// `csrc/guard.cpp`: throws a `std::runtime_error(what)` (kind 0), an `int`
        /// (1) or a `std::exception` with an empty `what()` (2).
        fn handoff_xla_test_throw(args: *mut Throw) -> *mut sys::PJRT_Error;
    }

    #[test]
    fn an_exception_escaping_the_call_is_a_typed_error() {
        let what = c"plugin went wrong";
        let cases = [
            (0, "std::exception: plugin went wrong"),
            (1, "an exception of type i (not a std::exception)"),
            (2, "std::exception with an empty what()"),
        ];
        for (kind, expected) in cases {
            let mut a = Throw { kind, what: what.as_ptr() };
            // SAFETY: `handoff_xla_test_throw` takes a `Throw`.
            let e = unsafe { call("PJRT_Test_Throw", handoff_xla_test_throw, &mut a) }.unwrap_err();
            match &e {
                XlaError::PluginException { call, exception } => {
                    assert_eq!(*call, "PJRT_Test_Throw");
                    assert_eq!(exception, expected);
                }
                other => panic!("expected PluginException, got {other:?}"),
            }
            assert!(e.to_string().contains("PJRT_Test_Throw"), "{e}");
        }
        // A message longer than the buffer is cut, not overrun.
        let long = std::ffi::CString::new("x".repeat(5000)).unwrap();
        let mut a = Throw { kind: 0, what: long.as_ptr() };
        // SAFETY: as above.
        let e = unsafe { call("PJRT_Test_Throw", handoff_xla_test_throw, &mut a) }.unwrap_err();
        let XlaError::PluginException { exception, .. } = e else { panic!() };
        assert_eq!(exception.len(), "std::exception: ".len() + MESSAGE_CAP - 1);
    }

    #[repr(C)]
    struct Fake {
        answer: usize,
    }

    unsafe extern "C" fn returns(args: *mut Fake) -> *mut sys::PJRT_Error {
        // SAFETY: the test passes a live `Fake`.
        unsafe { (*args).answer = 42 };
        std::ptr::dangling_mut()
    }

    /// The guard's cost: `cargo test -p handoff-xla --release --lib guard_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, run by hand in release"]
    fn guard_cost() {
        let n = 20_000_000u32;
        let f: sys::Function<Fake> = std::hint::black_box(returns);
        let mut a = Fake { answer: 0 };
        for round in 0..3 {
            let t = std::time::Instant::now();
            for _ in 0..n {
                // SAFETY: `returns` takes a `Fake`.
                std::hint::black_box(unsafe { f(std::hint::black_box(&mut a)) });
            }
            let direct = t.elapsed().as_secs_f64() * 1e9 / f64::from(n);
            let t = std::time::Instant::now();
            for _ in 0..n {
                // SAFETY: as above.
                std::hint::black_box(unsafe { call("returns", f, std::hint::black_box(&mut a)) }.unwrap());
            }
            let guarded = t.elapsed().as_secs_f64() * 1e9 / f64::from(n);
            println!("round {round}: direct {direct:.2} ns, guarded {guarded:.2} ns per call");
        }
    }

    #[test]
    fn a_call_that_returns_gives_its_error_pointer_and_writes_its_args() {
        let mut a = Fake { answer: 0 };
        // SAFETY: `returns` takes a `Fake`.
        let out = unsafe { call("returns", returns, &mut a) }.unwrap();
        assert_eq!(out, std::ptr::dangling_mut());
        assert_eq!(a.answer, 42);
        let mut calls = Fake { answer: 0 };
        unsafe extern "C" fn nothing(args: *mut Fake) {
            // SAFETY: as above.
            unsafe { (*args).answer += 1 };
        }
        // SAFETY: `nothing` takes a `Fake`.
        unsafe { call_void("nothing", nothing, &mut calls) }.unwrap();
        assert_eq!(calls.answer, 1);
    }
}
