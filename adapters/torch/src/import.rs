//! Viewing a hand-off as a `tch::Tensor` (`from_blob` with a deleter): no copy, and
//! the producer's memory released after the work queued on PyTorch's stream.

use crate::error::TorchError;
use crate::{current_stream, dtype, ffi, init};
use handoff_runtime::{Device, Handoff, Ready, Release, Result, Stream, order, reaper};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// How [`import_with`] views a hand-off.
///
/// ```
/// let options = handoff_torch::ImportOptions::new().read_only_ok();
/// ```
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    stream: Option<Stream>,
    read_only_ok: bool,
}

impl ImportOptions {
    /// PyTorch's current stream of the memory's device, no read-only hand-offs.
    pub fn new() -> ImportOptions {
        ImportOptions::default()
    }

    /// The stream PyTorch will use the tensor on (instead of the current one): the data is
    /// made ready there, and the hand-off released after the work queued there.
    pub fn stream(mut self, stream: Stream) -> ImportOptions {
        self.stream = Some(stream);
        self
    }

    /// Accepts `READ_ONLY` hand-offs; the caller promises not to write through the tensor.
    pub fn read_only_ok(mut self) -> ImportOptions {
        self.read_only_ok = true;
        self
    }
}

/// Views a hand-off as a `tch::Tensor`, with no copy, on PyTorch's current stream.
/// Dropping the last PyTorch reference releases the producer's memory after the work
/// queued on that stream is done.
///
/// ```
/// let x = tch::Tensor::from_slice(&[1i32, 2, 3]);
/// let y = handoff_torch::import(handoff_torch::export(&x, &handoff_runtime::Stream::host()).unwrap()).unwrap();
/// let _ = y.get(0).fill_(7);
/// assert_eq!(x.int64_value(&[0]), 7);
/// ```
pub fn import(handoff: Handoff) -> Result<tch::Tensor> {
    import_with(handoff, &ImportOptions::new())
}

/// [`import`] with options (the stream, read-only hand-offs). A plain tensor cannot
/// carry `READ_ONLY`: exported again it is writable; use [`TorchTensor::import_with`](crate::TorchTensor::import_with)
/// to keep the flag.
pub fn import_with(handoff: Handoff, options: &ImportOptions) -> Result<tch::Tensor> {
    handoff_runtime::stats::count_import();
    let (tensor, _) = view(handoff, options)?;
    Ok(tensor)
}

/// What the import's storage owns when PyTorch's work needs a wait of its own: the
/// hand-off, released once the work queued on `release` (PyTorch's stream, not the
/// hand-off's consumer stream, or a hand-off released at once) is done.
struct ImportOwner {
    handoff: Handoff,
    release: Stream,
}

/// The storage deleter of imported tensors whose owner is an [`ImportOwner`]; called
/// once by PyTorch, on any thread.
unsafe extern "C" fn release_import(ctx: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `ctx` is the `Box<ImportOwner>` leaked in `view`, given to exactly one
        // DataPtr (or to this function once on failure).
        let owner = unsafe { Box::from_raw(ctx as *mut ImportOwner) };
        let ImportOwner { handoff, release } = *owner;
        // The hand-off goes once PyTorch's work is done, whatever the producer asked for.
        reaper::release_after(Some(&release), handoff);
    }));
}

/// The storage deleter of imported tensors that own their hand-off directly (no
/// second wait): releases it as dropping it would. Called once by PyTorch, on any thread.
unsafe extern "C" fn release_handoff(ctx: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `ctx` is the hand-off `view` gave up with `into_raw`, given to exactly
        // one DataPtr (or to this function once on failure).
        unsafe { Handoff::release_raw(ctx.cast()) }
    }));
}

pub(crate) fn view(handoff: Handoff, options: &ImportOptions) -> Result<(tch::Tensor, Option<Stream>)> {
    init();
    let device = handoff.device();
    let (device_type, device_index) = match device {
        Device::Host => (0, -1),
        Device::Cuda(i) => (1, i32::try_from(i).unwrap_or(i32::MAX)),
        other => return Err(TorchError::ImportDevice { device: other }.into()),
    };
    let dtype = handoff.dtype();
    let Some(scalar_type) = dtype::from_dlpack(dtype) else {
        return Err(TorchError::ImportDtype { dtype: handoff_runtime::dtype::name(dtype) }.into());
    };
    if let Some((axis, &stride)) = handoff.strides().iter().enumerate().find(|(_, s)| **s < 0) {
        return Err(TorchError::NegativeStride { axis, stride }.into());
    }
    if handoff.is_read_only() && !options.read_only_ok {
        return Err(TorchError::ReadOnly.into());
    }
    let stream = match &options.stream {
        Some(s) if s.is_host() => None,
        Some(s) if s.device() != device => {
            return Err(TorchError::StreamDevice { stream: format!("{s:?}"), device }.into());
        }
        Some(s) => Some(s.clone()),
        None => current_stream(device)?,
    };
    // The producer made the data ready on the hand-off's consumer stream; PyTorch
    // works on `stream`.
    if let Some(s) = &stream
        && s != handoff.consumer_stream()
    {
        let _: Ready = order(Some(handoff.consumer_stream()), s)?;
    }
    let data = handoff.data_ptr() as *mut c_void;
    // The shape and strides live in the hand-off's DLPack tensor, on the heap: moving
    // the hand-off into `owner` does not move them, and the shim copies them before it
    // could release the owner.
    let (shape, strides) = (handoff.shape().as_ptr(), handoff.strides().as_ptr());
    let ndim = handoff.shape().len() as i32;
    // When PyTorch works on the hand-off's own consumer stream and the hand-off
    // releases after that stream's work anyway (or there is no stream), the storage
    // owns the hand-off itself; otherwise a box that also says where PyTorch works.
    let second_wait = stream
        .as_ref()
        .filter(|s| *s != handoff.consumer_stream() || handoff.release() == Release::Immediately);
    let (owner, deleter): (*mut c_void, unsafe extern "C" fn(*mut c_void)) = match second_wait {
        None => (handoff.into_raw().cast(), release_handoff),
        Some(s) => {
            let owner = Box::new(ImportOwner { release: s.clone(), handoff });
            (Box::into_raw(owner).cast(), release_import)
        }
    };
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `data` is the validated first-element address of memory the hand-off
    // (moved into `owner`) keeps alive; shape and strides point to `ndim` values each,
    // alive while `owner` is (the shim reads them before it could release it); `owner`
    // is consumed by the shim on every path (owned by the storage, or released by
    // `deleter`, its own).
    let r = unsafe {
        ffi::hf_from_blob(
            data,
            ndim,
            shape,
            strides,
            scalar_type,
            device_type,
            device_index,
            owner,
            deleter,
            &mut out,
        )
    };
    ffi::check("from_blob", r)?;
    // SAFETY: on success `out` is a heap `at::Tensor*` the shim gave up, as tch expects.
    let tensor = unsafe { tch::Tensor::from_ptr(out as *mut torch_sys::C_tensor) };
    Ok((tensor, stream))
}
