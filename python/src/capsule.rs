//! DLPack capsules: taking the producer's (renaming it consumed, as the protocol
//! requires) and making the consumer's, whose deleter drops the [`Handoff`].
//!
//! The consumer's capsule holds a managed tensor of handoff's own (versioned, or
//! legacy for a consumer that did not ask for DLPack 1.x) whose context owns the
//! `Handoff`: its deleter drops the `Handoff`, which releases the producer's tensor
//! after the work queued on the consumer's stream (the runtime's release). The
//! capsule's destructor calls that deleter only if no consumer took the capsule
//! (its name is still `dltensor`/`dltensor_versioned`).

use crate::keep_alive;
use crate::main_thread;
use dlpark::DlpackFlags;
use handoff_runtime::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use handoff_runtime::reaper;
use handoff_runtime::{Access, Handoff, Stream};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

const DLTENSOR: &CStr = c"dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
const USED_DLTENSOR: &CStr = c"used_dltensor";
const USED_DLTENSOR_VERSIONED: &CStr = c"used_dltensor_versioned";

/// A producer's managed tensor, taken out of its capsule: the caller owns it and
/// must call its deleter exactly once (`Handoff::from_raw` does, on every path).
pub enum Taken {
    /// From a `dltensor_versioned` capsule.
    Versioned(*mut DLManagedTensorVersioned),
    /// From a legacy `dltensor` capsule.
    Legacy(*mut DLManagedTensor),
}

/// Takes the managed tensor out of the producer's capsule and renames the capsule
/// `used_dltensor[_versioned]`, so that its destructor leaves the tensor alone.
/// Anything but an unconsumed DLPack capsule is refused, and left untouched.
pub fn take(capsule: &Bound<'_, PyAny>) -> PyResult<Taken> {
    let (versioned, pointer) = unconsumed(capsule)?;
    let used = if versioned { USED_DLTENSOR_VERSIONED } else { USED_DLTENSOR };
    // SAFETY: `capsule` is a capsule; `used` is a static string, as a capsule's name must
    // outlive it. From here on the tensor is ours: its capsule will not delete it.
    if unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), used.as_ptr()) } != 0 {
        return Err(
            PyErr::take(capsule.py()).unwrap_or_else(|| PyBufferError::new_err("cannot rename the capsule"))
        );
    }
    Ok(if versioned {
        Taken::Versioned(MainThreadProxy::wrap(pointer.cast::<DLManagedTensorVersioned>()))
    } else {
        Taken::Legacy(MainThreadProxy::wrap(pointer.cast::<DLManagedTensor>()))
    })
}

/// The managed tensor in an unconsumed DLPack capsule, and whether the capsule is
/// versioned; the capsule is left as it is. Anything else is refused, saying what it is.
fn unconsumed(capsule: &Bound<'_, PyAny>) -> PyResult<(bool, *mut c_void)> {
    let py = capsule.py();
    let raw = capsule.as_ptr();
    // SAFETY: `raw` is a live object, borrowed from `capsule` for this call.
    if unsafe { ffi::PyCapsule_CheckExact(raw) } == 0 {
        let ty = capsule.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        return Err(PyTypeError::new_err(format!(
            "the producer's __dlpack__ returned a {ty}, not a DLPack capsule"
        )));
    }
    // SAFETY: `raw` is a capsule (checked above).
    let name = unsafe { ffi::PyCapsule_GetName(raw) };
    if name.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            PyBufferError::new_err("the producer's capsule has no name: it is not a DLPack capsule")
        }));
    }
    // SAFETY: a capsule's name is a NUL-terminated string that lives as long as the
    // capsule keeps that name; it is read here before the capsule is renamed.
    let name = unsafe { CStr::from_ptr(name) };
    let versioned = if name == DLTENSOR_VERSIONED {
        true
    } else if name == DLTENSOR {
        false
    } else {
        return Err(PyBufferError::new_err(format!(
            "the producer's capsule is named {:?}: expected \"dltensor_versioned\" or \"dltensor\" \
             (a \"used_\" name means a consumer took it already)",
            name.to_string_lossy()
        )));
    };
    // SAFETY: `raw` is a capsule with exactly this name.
    let pointer = unsafe { ffi::PyCapsule_GetPointer(raw, name.as_ptr()) };
    if pointer.is_null() {
        return Err(
            PyErr::take(py).unwrap_or_else(|| PyBufferError::new_err("the producer's capsule is empty"))
        );
    }
    Ok((versioned, pointer))
}

/// The address of the first element, when `capsule` is an unconsumed DLPack capsule
/// of host memory whose data is not aligned for its dtype (a NumPy view at an odd
/// offset) and that passes every other rule of validation. Such a tensor is handed to
/// the consumer unchanged, to copy or refuse as it would without handoff: the host
/// needs no ordering, and handoff's own importers, which read typed memory, are not
/// involved. Anything else is `None`, and taken in (or refused) as usual.
pub fn passed_on(capsule: &Bound<'_, PyAny>, access: Access) -> Option<usize> {
    let (versioned, pointer) = unconsumed(capsule).ok()?;
    // SAFETY: the producer's live managed tensor of the ABI its capsule's name says
    // (its version checked before the rest of its layout is read).
    let (t, version, flags) = unsafe {
        if versioned {
            let m = &*pointer.cast::<DLManagedTensorVersioned>();
            if m.version.major != 1 {
                return None;
            }
            (&m.dl_tensor, Some(m.version), m.flags)
        } else {
            (&(*pointer.cast::<DLManagedTensor>()).dl_tensor, None, DlpackFlags::empty())
        }
    };
    let address = misaligned_host(t)?;
    // SAFETY: the producer's tensor, whose shape and strides arrays hold `ndim` values
    // (the contract every importer relies on; validation bounds every other read).
    unsafe { handoff_runtime::check_passed_on(t, version, flags, access) }.ok()?;
    Some(address)
}

/// The address of `t`'s first element, when it is host memory not aligned for its
/// dtype (see [`passed_on`]).
pub fn misaligned_host(t: &DLTensor) -> Option<usize> {
    let start = (t.data as usize).wrapping_add(t.byte_offset as usize);
    let align = handoff_runtime::dtype::alignment(t.dtype);
    let host = t.device.device_type == handoff_runtime::ffi::DLDeviceType::CPU;
    (host && !start.is_multiple_of(align)).then_some(start)
}

/// Takes in an owned managed tensor (PyTorch's C exchange API's: `Exported::adopt`) as
/// [`adopt`] takes what [`take`] gives: its deleter runs on the main thread.
///
/// # Safety
/// `managed` is an owned managed tensor that nothing else uses or deletes.
pub unsafe fn adopt_owned(
    managed: *mut DLManagedTensorVersioned,
    consumer: &Stream,
    access: Access,
) -> handoff_runtime::Result<Adopted> {
    let taken = Taken::Versioned(MainThreadProxy::wrap(managed));
    // SAFETY: an owned managed tensor, unused (the caller's contract), behind its proxy.
    unsafe { adopt(taken, consumer, access) }
}

/// A tensor on its way to a consumer: the hand-off, and the strides the consumer is to
/// see. A producer's tensor keeps the producer's own strides (handoff writes compact
/// strides canonically for its own importers, size-1 and size-0 dimensions' strides
/// rewritten; a foreign consumer sees exactly what the producer exported).
pub struct Adopted {
    /// The tensor in flight.
    pub handoff: Handoff,
    /// The producer's strides array (validated with the tensor; alive until the
    /// producer's deleter runs, which the hand-off does after the consumer let go), or
    /// null for the hand-off's own.
    strides: *mut i64,
}

// SAFETY: the strides array belongs to the producer's tensor, which the hand-off owns
// (it is `Send`) and frees only after this value is gone.
unsafe impl Send for Adopted {}

impl Adopted {
    /// A hand-off handoff described itself (`__cuda_array_interface__`): its own strides.
    pub fn own(handoff: Handoff) -> Adopted {
        Adopted { handoff, strides: ptr::null_mut() }
    }

    /// The consumer's `DLTensor`: the hand-off's, with the producer's strides.
    fn dl_tensor(&self) -> DLTensor {
        // SAFETY: the hand-off owns its managed tensor; its fields (and the shape and
        // strides they point to) live as long as the hand-off.
        let mut t = unsafe { (*self.handoff.as_raw()).dl_tensor };
        if !self.strides.is_null() {
            t.strides = self.strides;
        }
        t
    }
}

/// Takes the producer's tensor in for a consumer on `consumer`: validated (its deleter
/// runs once on every path), released after the consumer's queued work.
///
/// # Safety
/// `taken` is what [`take`] gave, not used since.
pub unsafe fn adopt(taken: Taken, consumer: &Stream, access: Access) -> handoff_runtime::Result<Adopted> {
    // SAFETY: the proxy is ours (the caller's contract); its tensor is the producer's,
    // unread so far but for this copy of its `DLTensor`, whose strides pointer is kept
    // for after validation (`from_raw*` reads the same array).
    let (strides, handoff) = unsafe {
        match taken {
            Taken::Versioned(p) => ((*p).dl_tensor.strides, Handoff::from_raw(p, consumer, access)),
            Taken::Legacy(p) => ((*p).dl_tensor.strides, Handoff::from_raw_legacy(p, consumer, access)),
        }
    };
    Ok(Adopted { handoff: handoff?, strides })
}

/// A managed tensor of the DLPack ABI (versioned or legacy), as the proxy needs it.
trait ManagedAbi: Sized {
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
    fn proxy_of(&self, ctx: *mut c_void, deleter: unsafe extern "C" fn(*mut Self)) -> Self;
    fn set_ctx(&mut self, ctx: *mut c_void);
}

impl ManagedAbi for DLManagedTensorVersioned {
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
    fn proxy_of(&self, ctx: *mut c_void, deleter: unsafe extern "C" fn(*mut Self)) -> Self {
        DLManagedTensorVersioned {
            version: self.version,
            manager_ctx: ctx,
            deleter: Some(deleter),
            flags: self.flags,
            dl_tensor: self.dl_tensor,
        }
    }
    fn set_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
}

impl ManagedAbi for DLManagedTensor {
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
    fn proxy_of(&self, ctx: *mut c_void, deleter: unsafe extern "C" fn(*mut Self)) -> Self {
        DLManagedTensor { dl_tensor: self.dl_tensor, manager_ctx: ctx, deleter: Some(deleter) }
    }
    fn set_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
}

/// A stand-in for a producer's managed tensor whose deleter calls the producer's own
/// on the interpreter's main thread, with the GIL (see [`crate::main_thread`]: the
/// runtime may release on its reaper thread, and a producer's deleter may race the
/// producer's own calls anywhere else).
#[repr(C)]
struct MainThreadProxy<M> {
    /// What the runtime sees: the producer's tensor described again (its shape and
    /// strides arrays stay the producer's, alive until its deleter runs).
    managed: M,
    /// The producer's managed tensor.
    original: *mut M,
}

/// A producer's managed tensor on its way to its deleter.
struct Original<M>(*mut M);

// SAFETY: the producer's tensor is owned by this value alone (its proxy was freed) and
// is only given to its own deleter, once, on the main thread.
unsafe impl<M> Send for Original<M> {}

impl<M: ManagedAbi + 'static> MainThreadProxy<M> {
    /// Wraps `original` (owned by the caller, non-null); the result is owned the same way.
    fn wrap(original: *mut M) -> *mut M {
        // SAFETY: `original` is the producer's live managed tensor (non-null, checked
        // by the capsule).
        let managed = unsafe { (*original).proxy_of(ptr::null_mut(), Self::delete) };
        let proxy = Box::into_raw(Box::new(MainThreadProxy { managed, original }));
        // SAFETY: `proxy` is a fresh allocation; its context is itself.
        unsafe { (*proxy).managed.set_ctx(proxy.cast()) };
        // `managed` is the first field of a repr(C) struct: the same address.
        proxy.cast::<M>()
    }

    /// The proxy's deleter: frees the proxy and hands the producer's tensor to its
    /// deleter on the main thread.
    unsafe extern "C" fn delete(managed: *mut M) {
        let r = catch_unwind(AssertUnwindSafe(|| {
            if managed.is_null() {
                return;
            }
            // SAFETY: `managed` is the first field of a `MainThreadProxy` made by
            // `wrap` (repr(C)), and DLPack calls a deleter once.
            let proxy = unsafe { Box::from_raw(managed.cast::<MainThreadProxy<M>>()) };
            let original = Original(proxy.original);
            main_thread::run_on_main(Box::new(move || {
                // The whole `Original` (which is Send) moves in, not its pointer field.
                let original = original;
                // SAFETY: the producer's tensor, still owned here.
                if let Some(deleter) = unsafe { (*original.0).deleter() } {
                    // SAFETY: the producer's deleter on its own tensor, once.
                    unsafe { deleter(original.0) };
                }
            }));
        }));
        if r.is_err() {
            report_panic("a producer's deleter");
        }
    }
}

/// The consumer's versioned managed tensor and the hand-off it views.
#[repr(C)]
struct VersionedExport {
    managed: DLManagedTensorVersioned,
    handoff: Handoff,
}

/// The consumer's legacy managed tensor and the hand-off it views.
#[repr(C)]
struct LegacyExport {
    managed: DLManagedTensor,
    handoff: Handoff,
}

/// Wraps `handoff` in a new capsule for the consumer: `dltensor_versioned` when
/// `versioned`, else a legacy `dltensor` (refused with `BufferError` for a read-only
/// tensor, which the legacy ABI cannot mark read-only; the hand-off is released).
pub fn export(py: Python<'_>, adopted: Adopted, versioned: bool) -> PyResult<Bound<'_, PyAny>> {
    if versioned {
        let managed = into_managed(adopted);
        return new_capsule(py, managed.cast(), DLTENSOR_VERSIONED, destroy_versioned_capsule, || {
            // SAFETY: the capsule was not made: the managed tensor is still ours.
            unsafe { delete_versioned(managed) }
        });
    }
    if adopted.handoff.is_read_only() {
        release(adopted.handoff);
        return Err(PyBufferError::new_err(
            "the tensor is read-only and a legacy (pre-1.0) DLPack capsule cannot say so: \
             ask with max_version=(1, 0) for a versioned capsule, which carries READ_ONLY",
        ));
    }
    let dl_tensor = adopted.dl_tensor();
    let export = Box::into_raw(Box::new(LegacyExport {
        managed: DLManagedTensor { dl_tensor, manager_ctx: ptr::null_mut(), deleter: Some(delete_legacy) },
        handoff: adopted.handoff,
    }));
    // SAFETY: `export` was just allocated; its context is itself.
    unsafe { (*export).managed.manager_ctx = export.cast() };
    let managed: *mut DLManagedTensor = export.cast();
    new_capsule(py, managed.cast(), DLTENSOR, destroy_legacy_capsule, || {
        // SAFETY: the capsule was not made: the managed tensor is still ours.
        unsafe { delete_legacy(managed) }
    })
}

/// `handoff` as a versioned managed tensor of handoff's own, for a consumer that takes
/// one without a capsule (PyTorch's C exchange API): its deleter releases the hand-off
/// as a capsule's would. The caller owns the result.
pub fn into_managed(adopted: Adopted) -> *mut DLManagedTensorVersioned {
    let dl_tensor = adopted.dl_tensor();
    let handoff = adopted.handoff;
    // SAFETY: the hand-off owns its managed tensor, alive as long as the hand-off,
    // which the export below owns.
    let src = unsafe { &*handoff.as_raw() };
    let (version, flags) = (src.version, src.flags);
    let export = Box::into_raw(Box::new(VersionedExport {
        managed: DLManagedTensorVersioned {
            version,
            manager_ctx: ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags,
            dl_tensor,
        },
        handoff,
    }));
    // SAFETY: `export` was just allocated; its context is itself.
    unsafe { (*export).managed.manager_ctx = export.cast() };
    // `managed` is the first field of a `repr(C)` struct: the pointers agree.
    export.cast()
}

fn new_capsule<'py>(
    py: Python<'py>,
    pointer: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
    on_error: impl FnOnce(),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: a non-null pointer and a static name; the destructor follows the
    // DLPack rule (below). The GIL is held (`py`).
    let capsule = unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), Some(destructor)) };
    if capsule.is_null() {
        on_error();
        return Err(PyErr::take(py).unwrap_or_else(|| PyBufferError::new_err("cannot create a capsule")));
    }
    // SAFETY: a new reference, just created.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// Drops a hand-off whose consumer is done with it. After interpreter shutdown has
/// begun (the interpreter is finalizing and destroying what is left), the release
/// behind a device stream is done here, on this thread, which holds the GIL a
/// producer's deleter may need: the consumer stream's queued work is waited for (a
/// counted host sync, at process exit only) and the producer's tensor released then.
/// Leaking it instead would leave the producer's own objects (a JAX array's buffer)
/// with an outstanding hold when the interpreter destroys them. A host release
/// happens at once, on this thread, as always.
fn release(handoff: Handoff) {
    if keep_alive::shutting_down() && !handoff.consumer_stream().is_host() {
        // Bounded, as the exit drain is: once one wait ran out (a device that stopped),
        // later releases are left to the reaper's leak rule instead of waiting again.
        static STUCK: AtomicBool = AtomicBool::new(false);
        drop(handoff);
        let drain = || main_thread::deferring(|| reaper::drain(reaper::EXIT_DRAIN_TIMEOUT));
        if !STUCK.load(Ordering::Relaxed) && !drain().is_complete() {
            STUCK.store(true, Ordering::Relaxed);
        }
        // The producers' deleters the drain made due wait in the main-thread queue,
        // whose pending call would not run any more: run them here when this is the
        // main thread, with the GIL, also while the interpreter finalizes (PyO3 no
        // longer attaches then: see `main_thread::with_gil`).
        main_thread::run_queued_exiting();
    } else {
        drop(handoff);
    }
}

fn report_panic(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "handoff: a panic in {what} was caught (the hand-off is kept)");
}

/// The consumer's deleter of a versioned export: releases the hand-off.
unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the deleter of a managed tensor made by `export`: its context is the
        // boxed export, and DLPack calls the deleter once.
        let export = unsafe { Box::from_raw((*managed).manager_ctx.cast::<VersionedExport>()) };
        release(export.handoff);
    }));
    if r.is_err() {
        report_panic("a DLPack deleter");
    }
}

/// The consumer's deleter of a legacy export: releases the hand-off.
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as in `delete_versioned`.
        let export = unsafe { Box::from_raw((*managed).manager_ctx.cast::<LegacyExport>()) };
        release(export.handoff);
    }));
    if r.is_err() {
        report_panic("a DLPack deleter");
    }
}

/// The destructor of a capsule made by [`export`]: deletes the managed tensor only
/// if no consumer took it (the name is still the unconsumed one).
///
/// # Safety
/// `capsule` is a capsule being destroyed; the GIL is held.
unsafe fn destroy_capsule(capsule: *mut ffi::PyObject, name: &CStr, delete: impl FnOnce(*mut c_void)) {
    // SAFETY: `capsule` is a live capsule (being destroyed); neither call sets an
    // error for a capsule with exactly this name, and IsValid sets none otherwise.
    let pointer = unsafe {
        if ffi::PyCapsule_IsValid(capsule, name.as_ptr()) != 1 {
            return; // consumed: renamed "used_..." by the consumer, which owns the tensor
        }
        ffi::PyCapsule_GetPointer(capsule, name.as_ptr())
    };
    if !pointer.is_null() {
        delete(pointer);
    }
}

unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut ffi::PyObject) {
    let r = catch_unwind(|| {
        // SAFETY: called by Python as this capsule's destructor, with the GIL.
        unsafe {
            destroy_capsule(capsule, DLTENSOR_VERSIONED, |p| delete_versioned(p.cast()));
        }
    });
    if r.is_err() {
        report_panic("a capsule destructor");
    }
}

unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut ffi::PyObject) {
    let r = catch_unwind(|| {
        // SAFETY: called by Python as this capsule's destructor, with the GIL.
        unsafe {
            destroy_capsule(capsule, DLTENSOR, |p| delete_legacy(p.cast()));
        }
    });
    if r.is_err() {
        report_panic("a capsule destructor");
    }
}
