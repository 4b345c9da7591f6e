//! Thin `Result` wrappers of the raw calls, one PJRT call each: each fills its
//! argument struct (with the size that struct declares), calls the function the
//! struct's slot names and turns a `PJRT_Error` into [`XlaError::Pjrt`] with its message
//! and code, destroying the error exactly once.
//!
//! Every call goes through the C++ guard (`guard`, `csrc/guard.cpp`): a C++ exception
//! escaping the plugin becomes [`XlaError::PluginException`] instead of unwinding into
//! Rust frames, which would abort the process.
//!
//! One module per section of `pjrt_c_api.h`: the wrapper of `PJRT_Buffer_ReadyEvent`
//! is `result::buffer::ready_event`, and so on. Here: [`Api`] (a plugin's table) and
//! the call itself.
//!
//! These functions take and return raw handles; ownership is the caller's (the safe
//! types, `Client`, `Buffer`, `Executable`, `PjrtEvent`, destroy each handle exactly once).
//! Anything that combines several calls lives with the safe type that needs it.

use crate::error::{ErrorCode, Result, XlaError};
use crate::sys::{self, Args, ExtensionArgs};
use std::ffi::c_char;

/// A loaded plugin's function table.
#[derive(Clone, Copy)]
pub(crate) struct Api {
    raw: &'static sys::PJRT_Api,
}

// SAFETY: the table is immutable and lives as long as the process (plugins are
// never unloaded); PJRT functions are thread-safe.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

/// An argument struct, zeroed, with `struct_size` set to the size it declares and
/// the given fields filled in.
macro_rules! args {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }) => {{
        // SAFETY: every argument struct is plain C data for which all-zero bytes
        // (null pointers, zero counts, `None` callbacks) is a valid value.
        #[allow(unused_unsafe)]
        let mut a: $crate::sys::$ty = unsafe { std::mem::zeroed() };
        a.struct_size = <$crate::sys::$ty as $crate::sys::Struct>::SIZE;
        $(a.$field = $value;)*
        a
    }};
}

pub(crate) mod buffer;
pub(crate) mod client;
pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod executable;
mod guard;
pub(crate) mod plugin;
pub(crate) mod stream;

/// A string the plugin owns, copied out.
///
/// # Safety
/// `ptr` must be null or point to `len` readable bytes.
pub(crate) unsafe fn string(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: the caller passes a pointer and length the plugin returned together.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// `len` values at `ptr` (the plugin's), copied out; null or 0 gives none.
///
/// # Safety
/// `ptr` must be null or point to `len` readable values.
unsafe fn copied<T: Copy>(ptr: *const T, len: usize) -> Vec<T> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
}

impl Api {
    /// Wraps a table returned by `GetPjrtApi`.
    ///
    /// # Safety
    /// `raw` must be a valid `PJRT_Api` that lives for the rest of the process.
    pub(crate) unsafe fn new(raw: &'static sys::PJRT_Api) -> Api {
        Api { raw }
    }

    /// The function of `A`'s slot, if the plugin's table has it.
    fn function<A: Args>(&self) -> Result<sys::Function<A>> {
        let end = sys::API_TABLE_OFFSET + (A::SLOT + 1) * 8;
        let missing = || {
            XlaError::invalid(
                format!("PJRT_Api.{}", A::NAME),
                "absent",
                "this plugin's function table does not have it",
            )
        };
        if self.raw.struct_size < end {
            return Err(missing());
        }
        // SAFETY: the slot lies within the plugin's `struct_size` bytes of table, so it
        // is a (possibly null) function pointer, and `A` is that slot's argument struct
        // (`sys::Args`).
        let f: Option<sys::Function<A>> = unsafe {
            let base = self.raw as *const sys::PJRT_Api as *const u8;
            std::ptr::read(base.add(sys::API_TABLE_OFFSET + A::SLOT * 8) as *const Option<sys::Function<A>>)
        };
        f.ok_or_else(missing)
    }

    /// Calls the function of `A`'s slot with `args`, turning an error into
    /// [`XlaError::Pjrt`].
    ///
    /// # Safety
    /// `args` must be filled as the header requires (live handles, valid pointers).
    unsafe fn call<A: Args>(&self, args: &mut A) -> Result<()> {
        let f = self.function::<A>()?;
        // SAFETY: the slot's function with its own argument struct; the rest is
        // forwarded from the caller.
        let err = unsafe { guard::call(A::NAME, f, args)? };
        // SAFETY: `err` was returned by this plugin and is owned by us.
        unsafe { self.check(A::NAME, err) }
    }

    /// Calls the function of `ext` that takes `A`, turning an error into
    /// [`XlaError::Pjrt`].
    ///
    /// # Safety
    /// `ext` must be this plugin's extension; `args` must be filled as its header
    /// requires.
    unsafe fn call_extension<A: ExtensionArgs>(&self, ext: &A::Extension, args: &mut A) -> Result<()> {
        let f = A::function(ext)
            .ok_or(XlaError::MissingExtension { extension: A::FIELD, needed_for: A::NAME })?;
        // SAFETY: the extension's function with its own argument struct; the rest is
        // forwarded from the caller.
        let err = unsafe { guard::call(A::NAME, f, args)? };
        // SAFETY: `err` was returned by this plugin and is owned by us.
        unsafe { self.check(A::NAME, err) }
    }

    /// Converts an owned error (null for none) to a `Result`, destroying it.
    ///
    /// # Safety
    /// `err` must be null or an error of this plugin that nothing else will destroy.
    unsafe fn check(&self, call: &'static str, err: *mut sys::PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut m = args!(PJRT_Error_Message_Args { error: err });
        let message = match self.raw.error_message {
            // SAFETY: `err` is a live error; the message lives as long as it.
            Some(f) => match unsafe { guard::call_void("PJRT_Error_Message", f, &mut m) } {
                // SAFETY: the plugin returned the pointer and length together.
                Ok(()) => unsafe { string(m.message, m.message_size) },
                Err(e) => format!("(PJRT_Error_Message failed: {e})"),
            },
            None => "(the plugin has no PJRT_Error_Message)".into(),
        };
        let mut c = args!(PJRT_Error_GetCode_Args { error: err });
        let code = match self.function::<sys::PJRT_Error_GetCode_Args>() {
            // SAFETY: the GetCode slot with its argument struct and a live error.
            Ok(f) => match unsafe { guard::call(sys::PJRT_Error_GetCode_Args::NAME, f, &mut c) } {
                Ok(e2) => {
                    // SAFETY: a failure to read the code returns another error, ours
                    // to destroy (null is none).
                    unsafe { self.destroy_error(e2) };
                    if e2.is_null() { c.code } else { 2 }
                }
                Err(_) => 2,
            },
            Err(_) => 2,
        };
        // SAFETY: destroyed once, after its message was copied.
        unsafe { self.destroy_error(err) };
        Err(XlaError::Pjrt { call, code: ErrorCode(code), message })
    }

    /// Destroys an error (null is allowed).
    ///
    /// # Safety
    /// `err` must be null or an owned error of this plugin, not used afterwards.
    unsafe fn destroy_error(&self, err: *mut sys::PJRT_Error) {
        if err.is_null() {
            return;
        }
        if let Some(f) = self.raw.error_destroy {
            let mut a = args!(PJRT_Error_Destroy_Args { error: err });
            // SAFETY: forwarded from the caller. An exception there leaks the error
            // (nothing else can be done with it); it is reported on stderr.
            if let Err(e) = unsafe { guard::call_void("PJRT_Error_Destroy", f, &mut a) } {
                eprintln!("handoff-xla: {e}");
            }
        }
    }
}
