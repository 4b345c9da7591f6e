//! # handoff-torch
//!
//! PyTorch tensors (through [`tch`] 0.24, PyTorch 2.11) handed to and from other
//! frameworks with no copy and no host synchronization.
//!
//! - [`TorchTensor`] wraps a `tch::Tensor` with its stream (PyTorch's current stream
//!   of its device when wrapped, or one the caller names; CPU tensors have none). It
//!   is [`StreamOrdered`], [`Export`] and [`Import`].
//! - [`export`] and [`import`] do the same for plain `tch::Tensor`s, and
//!   [`CurrentStream`] lets generic code (`handoff::transfer`, an XLA kernel call) take
//!   and return `tch::Tensor`s directly, on PyTorch's current stream.
//! - [`cuda`]: PyTorch's CUDA streams (current, pool, switching) and a GPU spin kernel.
//!
//! Export describes the tensor as DLPack from PyTorch's own metadata (every strided
//! layout and every dtype DLPack and PyTorch share); the hand-off keeps a shallow
//! clone of the tensor alive. When the consumer works on another CUDA stream, the
//! caching allocator is told with `recordStream`, so the block is not reused before the
//! consumer's queued work is done (memory not from the caching allocator is kept alive
//! by the reaper instead). Import views the hand-off's memory through `from_blob` with a
//! deleter: when PyTorch drops its last reference, the hand-off is released after the
//! work queued on the import stream (PyTorch's current stream at import, unless one is
//! named) has finished.
//!
//! ```
//! use handoff_runtime::Stream;
//! let x = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([2, 2]).tr();
//! let h = handoff_torch::export(&x, &Stream::host()).unwrap();
//! assert_eq!((h.shape(), h.strides()), (&[2, 2][..], &[1, 2][..]));
//! let y = handoff_torch::import(h).unwrap();
//! assert_eq!(y.data_ptr(), x.data_ptr());
//! assert!(y.equal(&x));
//! ```
//!
//! Call [`init`] (or any function of this crate) before the program's first
//! `tch::Cuda` query: it loads `libtorch_cuda.so`, which Rust's `--as-needed` linking
//! otherwise leaves out, so that PyTorch sees CUDA. The shim also does it when the
//! process starts. Set `HANDOFF_TORCH_NO_CUDA=1` to skip it.
#![warn(missing_docs)]

pub mod cuda;
mod dtype;
mod error;
mod ffi;

pub use error::TorchError;

use handoff_runtime::stats::Counter;
use handoff_runtime::{
    Device, Export, Exportable, Handoff, Import, ImportInto, Importable, MAX_NDIM, Ready, Release, Result,
    Stream, StreamOrdered, TensorDesc, order, reaper, stats,
};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

/// Loads `libtorch_cuda.so` (`RTLD_NOW | RTLD_GLOBAL`) once, so that PyTorch finds
/// CUDA; returns whether it is loaded. On CPU-only installs it is not, and everything
/// but CUDA works.
///
/// ```
/// let cuda_libs = handoff_torch::init();
/// if !cuda_libs { println!("{}", handoff_torch::cuda_load_error().unwrap_or_default()); }
/// ```
pub fn init() -> bool {
    load().is_ok()
}

/// Why `libtorch_cuda.so` could not be loaded (`None` when it is loaded).
pub fn cuda_load_error() -> Option<String> {
    load().err()
}

fn load() -> std::result::Result<(), String> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let mut loaded = 0i32;
            // SAFETY: a valid out pointer; the shim catches every exception.
            let r = ffi::check("dlopen(libtorch_cuda.so)", unsafe { ffi::hf_load_torch_cuda(&mut loaded) });
            match (r, loaded) {
                (_, 1) => Ok(()),
                (Err(e), _) => Err(e.to_string()),
                (Ok(()), _) => Err("libtorch_cuda.so is not loaded".into()),
            }
        })
        .clone()
}

/// Whether the shim was compiled with PyTorch's CUDA stream and allocator support.
pub fn shim_has_cuda() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { ffi::hf_cuda_compiled() != 0 }
}

/// Reads and checks everything an export needs; refuses what DLPack cannot describe.
fn describe_tensor(tensor: &tch::Tensor) -> std::result::Result<TensorDesc<'static>, TorchError> {
    let mut facts = ffi::Facts::default();
    let (mut shape, mut strides) = ([0i64; MAX_NDIM as usize], [0i64; MAX_NDIM as usize]);
    // SAFETY: `as_ptr` is a live `at::Tensor*` for as long as `tensor`; the buffers
    // hold `cap` values each; the shim catches every exception.
    ffi::check("describe", unsafe {
        ffi::hf_describe(
            tensor.as_ptr() as *const c_void,
            &mut facts,
            shape.as_mut_ptr(),
            strides.as_mut_ptr(),
            MAX_NDIM,
        )
    })?;
    if facts.defined == 0 {
        return Err(TorchError::Undefined);
    }
    if facts.layout != 0 {
        return Err(TorchError::NotStrided { layout: ffi::name(&facts.layout_name) });
    }
    let Some(dtype) = dtype::to_dlpack(facts.scalar_type) else {
        return Err(TorchError::UnsupportedDtype {
            dtype: ffi::name(&facts.dtype_name),
            hint: dtype::hint(facts.scalar_type),
        });
    };
    let device = match (facts.device_type, u32::try_from(facts.device_index)) {
        (0, _) => Device::Host,
        (1, Ok(i)) => Device::Cuda(i),
        _ => return Err(TorchError::UnsupportedDevice { device: ffi::name(&facts.device_name) }),
    };
    if facts.ndim > MAX_NDIM || facts.ndim < 0 {
        return Err(TorchError::TooManyDims { ndim: facts.ndim, max: MAX_NDIM });
    }
    let ndim = facts.ndim as usize;
    let (shape, strides) = (shape[..ndim].to_vec(), strides[..ndim].to_vec());
    if facts.requires_grad != 0 {
        return Err(TorchError::RequiresGrad { shape });
    }
    if facts.is_conj != 0 {
        return Err(TorchError::Conjugate);
    }
    if facts.is_neg != 0 {
        return Err(TorchError::Negative);
    }
    Ok(TensorDesc::new(facts.data, device, dtype, shape).with_strides(strides))
}

/// Checks that `tensor` can be exported, returning why not.
///
/// ```
/// use handoff_torch::{check, TorchError};
/// let x = tch::Tensor::ones([2], (tch::Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
/// assert!(matches!(check(&x), Err(TorchError::RequiresGrad { .. })));
/// assert!(check(&x.detach()).is_ok());
/// ```
pub fn check(tensor: &tch::Tensor) -> std::result::Result<(), TorchError> {
    describe_tensor(tensor).map(drop)
}

/// PyTorch's current stream of `device`: `None` for the host (CPU tensors are
/// host-ordered), the current CUDA stream of a CUDA device.
///
/// ```
/// assert!(handoff_torch::current_stream(handoff_runtime::Device::Host).unwrap().is_none());
/// ```
pub fn current_stream(device: Device) -> Result<Option<Stream>> {
    match device {
        Device::Host => Ok(None),
        #[cfg(feature = "cuda")]
        Device::Cuda(i) => cuda::current_stream(i).map(Some),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(TorchError::CudaFeatureOff { device }.into()),
        other => Err(TorchError::ImportDevice { device: other }.into()),
    }
}

/// A `tch::Tensor` with the stream its pending work is on: what handoff exports and
/// imports for PyTorch.
///
/// ```
/// use handoff_runtime::{Export, Stream, StreamOrdered};
/// use handoff_torch::TorchTensor;
/// let t = TorchTensor::new(tch::Tensor::arange(6, (tch::Kind::Int64, tch::Device::Cpu))).unwrap();
/// assert!(t.stream().is_none()); // CPU: host-ordered
/// let h = t.export(&Stream::host()).unwrap();
/// let back: TorchTensor = h.import().unwrap();
/// assert_eq!(back.tensor().size(), [6]);
/// ```
pub struct TorchTensor {
    tensor: tch::Tensor,
    device: Device,
    stream: Option<Stream>,
    /// The description read when wrapping, for an export that follows at once (so
    /// the tensor is described once per export); taken by the first `describe`.
    described: std::cell::Cell<Option<TensorDesc<'static>>>,
    /// Consumers must not write: it came from a `READ_ONLY` hand-off, and its
    /// exports say so too.
    read_only: bool,
}

impl TorchTensor {
    /// Wraps `tensor`, whose pending work is on PyTorch's current stream of its device
    /// (read now). Fails for tensors that cannot be exported ([`check`]).
    pub fn new(tensor: tch::Tensor) -> Result<TorchTensor> {
        let mut t = TorchTensor::for_export(tensor)?;
        t.described = Default::default();
        Ok(t)
    }

    /// [`new`](Self::new), keeping the description for the export that follows
    /// immediately (no other code runs on the tensor in between).
    fn for_export(tensor: tch::Tensor) -> Result<TorchTensor> {
        init();
        let described = describe_tensor(&tensor)?;
        let device = described.device;
        let stream = current_stream(device)?;
        Ok(TorchTensor { tensor, device, stream, described: Some(described).into(), read_only: false })
    }

    /// Wraps `tensor`, whose pending work is on `stream` (a stream of its device).
    pub fn with_stream(tensor: tch::Tensor, stream: Stream) -> Result<TorchTensor> {
        init();
        let device = describe_tensor(&tensor)?.device;
        if stream.device() != device && !stream.is_host() {
            return Err(TorchError::StreamDevice { stream: format!("{stream:?}"), device }.into());
        }
        let stream = if stream.is_host() { None } else { Some(stream) };
        Ok(TorchTensor { tensor, device, stream, described: Default::default(), read_only: false })
    }

    /// Views a hand-off with options, keeping its `READ_ONLY` flag (with
    /// [`ImportOptions::read_only_ok`]): a read-only tensor exports as read-only again.
    /// A plain `tch::Tensor` ([`import_with`]) cannot carry the flag.
    ///
    /// ```
    /// use handoff_runtime::{Device, Export, Handoff, Ready, Release, Stream, TensorDesc, dtype::DataType};
    /// use handoff_torch::{ImportOptions, TorchTensor};
    /// let data = vec![1.0f32, 2.0];
    /// let h = Handoff::with_keep_alive(data, |d| {
    ///     Ok(TensorDesc::new(d.as_ptr() as *mut _, Device::Host, DataType::F32, &[2][..]).read_only())
    /// }, &Stream::host(), Ready::Elided, Release::AfterConsumer).unwrap();
    /// let t = TorchTensor::import_with(h, &ImportOptions::new().read_only_ok()).unwrap();
    /// assert!(t.is_read_only());
    /// assert!(t.export(&Stream::host()).unwrap().is_read_only());
    /// ```
    pub fn import_with(handoff: Handoff, options: &ImportOptions) -> Result<TorchTensor> {
        stats::count(Counter::Imports, 1);
        let (device, read_only) = (handoff.device(), handoff.is_read_only());
        let (tensor, stream) = view(handoff, options)?;
        Ok(TorchTensor { tensor, device, stream, described: Default::default(), read_only })
    }

    /// Whether consumers must not write (it came from a `READ_ONLY` hand-off).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The tensor.
    pub fn tensor(&self) -> &tch::Tensor {
        &self.tensor
    }

    /// The tensor, unwrapped.
    pub fn into_tensor(self) -> tch::Tensor {
        self.tensor
    }
}

impl std::ops::Deref for TorchTensor {
    type Target = tch::Tensor;
    fn deref(&self) -> &tch::Tensor {
        &self.tensor
    }
}

impl std::fmt::Debug for TorchTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchTensor")
            .field("device", &self.device)
            .field("stream", &self.stream)
            .field("size", &self.tensor.size())
            .finish()
    }
}

impl StreamOrdered for TorchTensor {
    fn device(&self) -> Device {
        self.device
    }
    fn stream(&self) -> Option<Stream> {
        self.stream.clone()
    }
}

impl Export for TorchTensor {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        let mut desc = match self.described.take() {
            Some(d) => d,
            None => describe_tensor(&self.tensor)?,
        };
        desc.read_only = self.read_only;
        Ok(desc)
    }

    /// Makes the tensor ready on `consumer`; when that is another CUDA stream, tells the
    /// caching allocator (`recordStream`) so that the block outlives the consumer's
    /// queued work, or else leaves the release to the reaper.
    fn export(self, consumer: &Stream) -> Result<Handoff> {
        // `new` checked the tensor; `describe` (in `with_keep_alive`) reads it again
        // and refuses it if it changed since (unless it was wrapped for this export).
        let ready = self.ready_on(consumer)?;
        // Even on the tensor's own stream: its block may have been allocated on
        // another stream, where the caching allocator would reuse it at once.
        let release = release_for(&self, consumer)?;
        Handoff::with_keep_alive(self, |t| t.describe(), consumer, ready, release)
    }
}

/// How a tensor exported to a consumer is released: at once when the caching
/// allocator was told of the consumer's stream (`recordStream`, a no-op when the
/// block was allocated there), else after the consumer's queued work (the reaper).
fn release_for(tensor: &TorchTensor, consumer: &Stream) -> Result<Release> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(ordinal) = tensor.device
        && let Some((c_ordinal, raw)) = handoff_runtime::cuda::raw_stream(consumer)
        && c_ordinal == ordinal
    {
        let mut recorded = 0i32;
        // SAFETY: a live `at::Tensor*` and a live stream of its device; the shim
        // catches every exception.
        ffi::check("recordStream", unsafe {
            ffi::hf_cuda_record_stream(
                tensor.tensor.as_ptr() as *const c_void,
                ordinal as i32,
                raw,
                &mut recorded,
            )
        })?;
        if recorded == 1 {
            return Ok(Release::Immediately);
        }
    }
    let _ = (tensor, consumer);
    Ok(Release::AfterConsumer)
}

/// Hands a PyTorch tensor to a consumer working on `consumer`, without a copy: its
/// pending work is on PyTorch's current stream of its device (CPU tensors: none).
/// The hand-off holds a shallow clone, so `tensor` stays usable.
///
/// ```
/// let x = tch::Tensor::zeros([3, 4], (tch::Kind::BFloat16, tch::Device::Cpu));
/// let h = handoff_torch::export(&x.narrow(1, 1, 2), &handoff_runtime::Stream::host()).unwrap();
/// assert_eq!(h.data_ptr() as usize, x.data_ptr() as usize + 2);
/// ```
pub fn export(tensor: &tch::Tensor, consumer: &Stream) -> Result<Handoff> {
    TorchTensor::for_export(tensor.shallow_clone())?.export(consumer)
}

/// Hands a PyTorch tensor whose pending work is on `producer` to a consumer on `consumer`.
pub fn export_from(tensor: &tch::Tensor, producer: &Stream, consumer: &Stream) -> Result<Handoff> {
    TorchTensor::with_stream(tensor.shallow_clone(), producer.clone())?.export(consumer)
}

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
/// carry `READ_ONLY`: exported again it is writable; use [`TorchTensor::import_with`]
/// to keep the flag.
pub fn import_with(handoff: Handoff, options: &ImportOptions) -> Result<tch::Tensor> {
    stats::count(Counter::Imports, 1);
    let (tensor, _) = view(handoff, options)?;
    Ok(tensor)
}

impl Import for TorchTensor {
    fn from_handoff(handoff: Handoff) -> Result<TorchTensor> {
        let device = handoff.device();
        let (tensor, stream) = view(handoff, &ImportOptions::new())?;
        Ok(TorchTensor { tensor, device, stream, described: Default::default(), read_only: false })
    }
}

/// PyTorch's current stream: the context `tch` tensors import into (with
/// [`transfer_into`](handoff_runtime::transfer_into)), and the marker of this crate's
/// [`Exportable`] and [`Importable`] impls for `tch::Tensor`, which let generic code
/// (`handoff::transfer`, an XLA kernel call) take and return plain `tch::Tensor`s.
///
/// ```
/// use handoff_runtime::{Stream, transfer, transfer_into};
/// use handoff_torch::CurrentStream;
/// let x = tch::Tensor::from_slice(&[1.0f32, 2.0]);
/// let y: tch::Tensor = transfer(&x, &Stream::host()).unwrap(); // a view of x's memory
/// let z: tch::Tensor = transfer_into(&y, &CurrentStream).unwrap();
/// assert_eq!(z.data_ptr(), x.data_ptr());
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CurrentStream;

/// A borrowed tensor exports a shallow clone: the same memory, on PyTorch's current stream.
impl Exportable<CurrentStream> for &tch::Tensor {
    type Value = TorchTensor;

    fn into_exportable(self) -> Result<TorchTensor> {
        TorchTensor::for_export(self.shallow_clone())
    }
}

/// A tensor exports itself, on PyTorch's current stream.
impl Exportable<CurrentStream> for tch::Tensor {
    type Value = TorchTensor;

    fn into_exportable(self) -> Result<TorchTensor> {
        TorchTensor::for_export(self)
    }
}

/// A hand-off imports as a plain tensor, as [`import`] does.
impl Importable<CurrentStream> for tch::Tensor {
    fn import_handoff(handoff: Handoff) -> Result<tch::Tensor> {
        Ok(handoff.import::<TorchTensor>()?.into_tensor())
    }
}

impl ImportInto<CurrentStream> for tch::Tensor {
    fn ready_stream(_: &CurrentStream, device: Device) -> Result<Stream> {
        Ok(current_stream(device)?.unwrap_or_else(Stream::host))
    }

    fn import_into(handoff: Handoff, _: &CurrentStream) -> Result<tch::Tensor> {
        import(handoff)
    }
}

impl ImportInto<CurrentStream> for TorchTensor {
    fn ready_stream(_: &CurrentStream, device: Device) -> Result<Stream> {
        Ok(current_stream(device)?.unwrap_or_else(Stream::host))
    }

    fn import_into(handoff: Handoff, _: &CurrentStream) -> Result<TorchTensor> {
        handoff.import()
    }
}

/// What the import's storage owns: the hand-off, released after `release` when the
/// storage dies.
struct ImportOwner {
    handoff: Handoff,
    release: Option<Stream>,
}

/// The storage deleter of imported tensors; called once by PyTorch, on any thread.
unsafe extern "C" fn release_import(ctx: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `ctx` is the `Box<ImportOwner>` leaked in `view`, given to exactly one
        // DataPtr (or to this function once on failure).
        let owner = unsafe { Box::from_raw(ctx as *mut ImportOwner) };
        let ImportOwner { handoff, release } = *owner;
        reaper::release_after(release.as_ref(), handoff);
    }));
}

fn view(handoff: Handoff, options: &ImportOptions) -> Result<(tch::Tensor, Option<Stream>)> {
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
    let shape = handoff.shape().to_vec();
    let strides = handoff.strides().to_vec();
    let ndim = shape.len() as i32;
    let owner = Box::into_raw(Box::new(ImportOwner { handoff, release: stream.clone() }));
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `data` is the validated first-element address of memory the hand-off
    // (moved into `owner`) keeps alive; shape and strides hold `ndim` values; `owner`
    // is consumed by the shim on every path (owned by the storage, or released).
    let r = unsafe {
        ffi::hf_from_blob(
            data,
            ndim,
            shape.as_ptr(),
            strides.as_ptr(),
            scalar_type,
            device_type,
            device_index,
            owner as *mut c_void,
            release_import,
            &mut out,
        )
    };
    ffi::check("from_blob", r)?;
    // SAFETY: on success `out` is a heap `at::Tensor*` the shim gave up, as tch expects.
    let tensor = unsafe { tch::Tensor::from_ptr(out as *mut torch_sys::C_tensor) };
    Ok((tensor, stream))
}

fn probe() -> Vec<handoff_runtime::registry::Probe> {
    use handoff_runtime::registry::Probe;
    let mut lines = vec![Probe::found("libtorch", format!("tch {} (PyTorch 2.11) linked", "0.24.0"))];
    lines.push(match cuda_load_error() {
        None if tch::Cuda::is_available() => {
            Probe::found("libtorch CUDA", format!("{} CUDA device(s)", tch::Cuda::device_count()))
        }
        None => Probe::not_found("libtorch CUDA", "libtorch_cuda.so loaded, but PyTorch sees no CUDA device"),
        Some(why) => Probe::not_found("libtorch CUDA", why),
    });
    lines
}

handoff_runtime::registry::submit! {
    handoff_runtime::registry::Adapter::new("torch", env!("CARGO_PKG_VERSION"))
        .about("PyTorch tensors through tch 0.24 (PyTorch 2.11), CPU and CUDA")
        .devices(&[handoff_runtime::registry::DeviceKind::Host, handoff_runtime::registry::DeviceKind::Cuda])
        .dtypes(&dtype::DTYPES)
        .exports::<TorchTensor>()
        .imports::<TorchTensor>()
        .probe(probe)
}
