//! `handoff.ordered(obj)`: a wrapper whose `__dlpack__` hands the producer's tensor
//! to the consumer with a stream-ordered release.

use crate::cai;
use crate::capsule::{self, Adopted, Taken};
use crate::errors;
use crate::mock::MockConsumer;
use crate::streams::{self, Consumer, Requested};
use crate::torch_api::Torch;
use dlpark::Managed;
use dlpark::python::producer::DlpackExchangeProducer;
use handoff_runtime::cuda::DlpackStream;
use handoff_runtime::ffi::DLManagedTensorVersioned;
use handoff_runtime::ffi::{DLDevice, DLDeviceType};
use handoff_runtime::{Access, Device, Handoff};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyTuple};
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where the wrapped object's tensor comes from.
enum Source {
    /// An object with `__dlpack__`; its `__dlpack_device__`, asked once.
    Dlpack {
        /// The producer's `__dlpack__`, bound once here rather than looked up again
        /// on each export (a hand-off's host cost).
        dlpack: Py<PyAny>,
        /// The device, decoded.
        device: DLDevice,
        /// The producer's own `__dlpack_device__` result, returned as it is.
        device_obj: Py<PyAny>,
    },
    /// An object with only `__cuda_array_interface__`; its device, found from its
    /// pointer on first use (that needs the driver).
    Cai {
        /// The CUDA device ordinal of the memory.
        ordinal: OnceLock<u32>,
    },
}

/// What a consumer asked `__dlpack__` for (decoded), or the C exchange API's request.
#[derive(Clone, Copy)]
struct Request<'a, 'py> {
    /// The `stream` argument as given, passed on to the producer.
    stream: Option<&'a Bound<'py, PyAny>>,
    requested: Requested,
    max_version: Option<&'a Bound<'py, PyAny>>,
    dl_device: Option<&'a Bound<'py, PyAny>>,
    copy: Option<&'a Bound<'py, PyAny>>,
    /// The device the tensor is to be on.
    target: DLDevice,
}

/// What `handoff.ordered(obj)` returns: an object that speaks `__dlpack__` /
/// `__dlpack_device__` for `obj`, releasing `obj`'s tensor in stream order.
#[pyclass(frozen, module = "handoff", name = "Ordered")]
pub struct Ordered {
    obj: Py<PyAny>,
    source: Source,
    access: Access,
    /// Tests only (`_mock_ordered`, the `test-hooks` feature): a simulated consumer
    /// stream instead of the one asked for.
    mock: Option<MockConsumer>,
    /// The address of the first element last handed to a consumer (0: none yet), which
    /// `handoff.to_jax` compares with the JAX array's to count a copy JAX made.
    handed_out: AtomicUsize,
}

/// Wraps `obj` (anything with `__dlpack__` and `__dlpack_device__`, or with only
/// `__cuda_array_interface__`) so that a consumer's `from_dlpack` releases its memory
/// only after the consumer's queued work is done.
///
/// `writable=True` imports for writing: a read-only tensor (and one whose strides
/// overlap) is refused.
#[pyfunction]
#[pyo3(signature = (obj, *, writable = false))]
pub fn ordered(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Ordered> {
    Ordered::new(obj, writable, None)
}

impl Ordered {
    /// The wrapper of `obj` (of the object `obj` wraps, when it is an `Ordered`).
    pub fn new(obj: &Bound<'_, PyAny>, writable: bool, mock: Option<MockConsumer>) -> PyResult<Ordered> {
        let py = obj.py();
        if let Ok(inner) = obj.cast::<Ordered>() {
            return Ordered::new(inner.get().obj.bind(py), writable, mock);
        }
        let access = if writable { Access::Write } else { Access::Read };
        let source = if let Some(dlpack) = obj.getattr_opt(intern!(py, "__dlpack__"))? {
            let device_fn = obj.getattr(intern!(py, "__dlpack_device__"))?;
            for (name, f) in [("__dlpack__", &dlpack), ("__dlpack_device__", &device_fn)] {
                if !f.is_callable() {
                    return Err(PyTypeError::new_err(format!(
                        "{name} of a {} is not callable: it is a {}",
                        type_name(obj),
                        type_name(f)
                    )));
                }
            }
            let device_obj = device_fn.call0()?;
            let device = streams::parse_device(&device_obj, "__dlpack_device__()")?;
            Source::Dlpack { dlpack: dlpack.unbind(), device, device_obj: device_obj.unbind() }
        } else if obj.hasattr(intern!(py, "__cuda_array_interface__"))? {
            Source::Cai { ordinal: OnceLock::new() }
        } else {
            return Err(PyTypeError::new_err(format!(
                "handoff.ordered takes an object with __dlpack__ and __dlpack_device__ (or \
                 __cuda_array_interface__); a {} has neither",
                type_name(obj)
            )));
        };
        Ok(Ordered { obj: obj.clone().unbind(), source, access, mock, handed_out: AtomicUsize::new(0) })
    }

    /// The address of the first element last handed to a consumer, if any.
    pub fn handed_out(&self) -> Option<usize> {
        Some(self.handed_out.load(Ordering::Relaxed)).filter(|&a| a != 0)
    }

    /// The device of the wrapped tensor.
    fn device(&self, py: Python<'_>) -> PyResult<DLDevice> {
        match &self.source {
            Source::Dlpack { device, .. } => Ok(*device),
            Source::Cai { ordinal } => Ok(DLDevice::cuda(self.cai_ordinal(py, ordinal)? as i32)),
        }
    }

    fn cai_ordinal(&self, py: Python<'_>, ordinal: &OnceLock<u32>) -> PyResult<u32> {
        if let Some(o) = ordinal.get() {
            return Ok(*o);
        }
        let o = cai::device_ordinal(self.obj.bind(py))?;
        Ok(*ordinal.get_or_init(|| o))
    }

    /// The consumer's stream: the one asked for, or the simulated one of a test.
    fn consumer(&self, device: DLDevice, requested: Requested) -> PyResult<Consumer> {
        match &self.mock {
            Some(m) => Ok(Consumer { stream: m.stream().clone(), no_sync: requested.no_sync() }),
            None => streams::resolve(device, requested),
        }
    }

    /// The producer's tensor for the consumer that asks with `request`: through
    /// PyTorch's C exchange API for a plain torch tensor, else from the producer's
    /// `__dlpack__` (or `__cuda_array_interface__`), taken in, checked, ordered; or the
    /// producer's capsule unchanged, for misaligned host memory (see
    /// [`capsule::passed_on`]).
    fn take<'py>(&self, py: Python<'py>, request: &Request<'_, 'py>) -> PyResult<Produced<'py>> {
        let Request { stream, requested, max_version, dl_device, copy, target } = *request;
        let (adopted, versioned) = match &self.source {
            Source::Dlpack { dlpack, .. } => {
                // Resolved before the producer is asked, on the consumer's thread (stream
                // 2 is this thread's per-thread default stream).
                let consumer = self.consumer(target, requested)?;
                match self.via_torch_api(py, &consumer, requested, dl_device, copy)? {
                    Some(handoff) => (handoff, true),
                    None => {
                        let dlpack = dlpack.bind(py);
                        match self.ask_producer(
                            py,
                            dlpack,
                            stream,
                            &consumer,
                            max_version,
                            dl_device,
                            copy,
                        )? {
                            Produced::Taken(adopted, versioned) => {
                                // A capture on the consumer's stream takes in the
                                // producer's work (JAX's), as `to_torch` does.
                                if self.mock.is_none() {
                                    crate::capture::settle_for_graph(
                                        &consumer.stream,
                                        self.obj.bind(py),
                                        &mut None,
                                    )?;
                                }
                                (adopted, versioned)
                            }
                            unchanged => return Ok(unchanged),
                        }
                    }
                }
            }
            Source::Cai { ordinal } => {
                if let Some(c) = copy
                    && c.is_truthy()?
                {
                    return Err(PyBufferError::new_err(
                        "copy=True: handoff.ordered never copies a __cuda_array_interface__ object",
                    ));
                }
                let ordinal = self.cai_ordinal(py, ordinal)?;
                if target != DLDevice::cuda(ordinal as i32) {
                    return Err(PyBufferError::new_err(format!(
                        "dl_device ({}, {}): the memory is on CUDA device {ordinal} and handoff does not copy",
                        target.device_type.0, target.device_id
                    )));
                }
                let consumer = self.consumer(target, requested)?;
                let handoff = cai::handoff(self.obj.bind(py), ordinal, &consumer, self.access)?;
                (Adopted::own(handoff), true)
            }
        };
        check_device(&adopted.handoff, target, "__dlpack_device__ or dl_device")?;
        if adopted.handoff.is_copied() && copy.is_some_and(|c| c.extract::<bool>().is_ok_and(|c| !c)) {
            return Err(PyBufferError::new_err(
                "copy=False, but the producer's tensor is a copy (its flags have IS_COPIED): \
                 the producer did not honor copy=False",
            ));
        }
        if let Some(m) = &self.mock {
            m.consumer_work();
        }
        self.handed_out.store(adopted.handoff.data_ptr() as usize, Ordering::Relaxed);
        Ok(Produced::Taken(adopted, versioned))
    }

    /// A plain torch tensor's export, as its own `__dlpack__(stream=...)` would make it,
    /// through PyTorch's C exchange API (no Python call, see [`crate::torch_api`]): the
    /// data made ready on the consumer's stream by a GPU wait behind PyTorch's current
    /// stream. `None` where PyTorch's `__dlpack__` is left to answer: another producer, a
    /// request it refuses or treats its own way (`dl_device`, `copy`, stream `2`, a
    /// stream for a CPU tensor), a tensor it refuses.
    fn via_torch_api(
        &self,
        py: Python<'_>,
        consumer: &Consumer,
        requested: Requested,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Adopted>> {
        if self.mock.is_some() || dl_device.is_some() || copy.is_some() {
            return Ok(None);
        }
        let Some(Ok(torch)) = Torch::get(py, false)? else { return Ok(None) };
        let obj = self.obj.bind(py);
        if !torch.is_tensor(obj) {
            return Ok(None);
        }
        let cuda = match self.source {
            Source::Dlpack { device, .. } => device.device_type == DLDeviceType::CUDA,
            Source::Cai { .. } => return Ok(None),
        };
        let plain = match requested {
            Requested::Value(DlpackStream::PerThread) => false,
            _ if cuda => true,
            Requested::Default | Requested::Value(DlpackStream::NoSync) => true,
            Requested::Value(_) => false,
        };
        if !plain {
            return Ok(None);
        }
        let Some(exported) = torch.export(obj, false)? else { return Ok(None) };
        if exported.misaligned_host() {
            return Ok(None); // passed on unchanged, from `__dlpack__`
        }
        if cuda && !consumer.no_sync {
            let (producer, _) = torch.current_cuda_stream(py, exported.device())?;
            handoff_runtime::order(Some(&producer), &consumer.stream).map_err(errors::to_py)?;
        }
        let adopted = exported.adopt(&consumer.stream, self.access);
        adopted.map(Some).map_err(errors::to_py)
    }

    /// Asks the producer's `__dlpack__` with the consumer's arguments and takes its
    /// tensor in; also whether its capsule was versioned.
    #[allow(clippy::too_many_arguments)]
    fn ask_producer<'py>(
        &self,
        py: Python<'py>,
        dlpack: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
        consumer: &Consumer,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Produced<'py>> {
        let kwargs = PyDict::new(py);
        kwargs.set_item(intern!(py, "stream"), stream)?;
        if let Some(v) = max_version {
            kwargs.set_item(intern!(py, "max_version"), v)?;
        }
        if let Some(d) = dl_device {
            kwargs.set_item(intern!(py, "dl_device"), d)?;
        }
        if let Some(c) = copy {
            kwargs.set_item(intern!(py, "copy"), c)?;
        }
        let produced = match dlpack.call((), Some(&kwargs)) {
            Ok(c) => c,
            // A producer older than DLPack 1.0 takes no max_version: ask again without,
            // as the protocol recommends (only when nothing else new was asked for).
            Err(e)
                if e.is_instance_of::<PyTypeError>(py)
                    && max_version.is_some()
                    && dl_device.is_none()
                    && copy.is_none() =>
            {
                kwargs.del_item(intern!(py, "max_version"))?;
                dlpack.call((), Some(&kwargs))?
            }
            Err(e) => return Err(e),
        };
        if let Some(address) = capsule::passed_on(&produced, self.access) {
            self.handed_out.store(address, Ordering::Relaxed);
            return Ok(Produced::Unchanged(produced));
        }
        let taken = capsule::take(&produced)?;
        let versioned = matches!(taken, Taken::Versioned(_));
        // SAFETY: `take` gave us the producer's unconsumed managed tensor.
        let adopted = unsafe { capsule::adopt(taken, &consumer.stream, self.access) };
        Ok(Produced::Taken(adopted.map_err(errors::to_py)?, versioned))
    }
}

/// What a consumer of an [`Ordered`] gets.
enum Produced<'py> {
    /// The producer's tensor, taken in and ordered, and whether a versioned capsule
    /// may carry it (the producer gave a versioned tensor).
    Taken(Adopted, bool),
    /// The producer's own capsule, unchanged: host memory not aligned for its dtype,
    /// which the consumer copies or refuses as it would without handoff (host memory
    /// needs no ordering).
    Unchanged(Bound<'py, PyAny>),
}

// SAFETY: no borrowed-view callback (`HAS_DLTENSOR_VIEW` is false); the managed tensors
// are handoff's own (`capsule::into_managed`), whose deleter releases the producer's
// tensor in stream order, once; `current_work_stream` gives a stream that lives as long
// as the process (PyTorch's current stream, or the legacy default stream).
unsafe impl DlpackExchangeProducer for Ordered {
    /// The wrapped tensor, made ready on the stream [`Self::current_work_stream`] reports
    /// for its device (by the producer, or a GPU wait), released after the work queued
    /// there: what `__dlpack__(stream=<that stream>, max_version=(1, 3))` gives.
    fn managed_tensor_no_sync(&self, py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        let target = self.device(py)?;
        let (requested, stream) = if target.device_type == DLDeviceType::CUDA {
            let raw = work_stream(py, target)? as u64;
            let value = DlpackStream::from_raw(raw);
            (Requested::Value(value), Some(value.value().into_pyobject(py)?.into_any()))
        } else {
            (Requested::Default, None)
        };
        let version = PyTuple::new(py, [1u32, 3])?.into_any();
        let request = Request {
            stream: stream.as_ref(),
            requested,
            max_version: Some(&version),
            dl_device: None,
            copy: None,
            target,
        };
        let adopted = match self.take(py, &request)? {
            Produced::Taken(adopted, _) => adopted,
            Produced::Unchanged(_) => {
                return Err(PyBufferError::new_err(
                    "the producer's host memory is not aligned for its dtype: a consumer of the C \
                     exchange API reads it in place, so handoff.ordered does not pass it on there",
                ));
            }
        };
        // SAFETY: handoff's own managed tensor, owned here from now on.
        unsafe { Managed::from_raw(capsule::into_managed(adopted)) }
            .map_err(|e| PyBufferError::new_err(e.to_string()))
    }

    fn current_work_stream(py: Python<'_>, device: DLDevice) -> PyResult<*mut c_void> {
        if device.device_type != DLDeviceType::CUDA {
            return Ok(std::ptr::null_mut());
        }
        work_stream(py, device)
    }
}

/// The stream `handoff.ordered` objects report through their C exchange API on a CUDA
/// device: PyTorch's current stream of that device when PyTorch is imported (where a
/// PyTorch program's next kernel runs), else the legacy default stream (`0`).
fn work_stream(py: Python<'_>, device: DLDevice) -> PyResult<*mut c_void> {
    match Torch::get(py, false)? {
        Some(Ok(torch)) => Ok(torch.current_stream(py, device)? as *mut c_void),
        _ => Ok(std::ptr::null_mut()),
    }
}

/// The producer's tensor must be on the device the stream was resolved for (a device
/// handoff does not exchange cannot be: the tensor passed validation).
/// `said` names where `target` came from, for the message.
pub(crate) fn check_device(handoff: &Handoff, target: DLDevice, said: &str) -> PyResult<()> {
    let got = handoff.device();
    let expected = match Device::from_dlpack(target) {
        Ok(expected) if expected == got => return Ok(()),
        Ok(expected) => expected.to_string(),
        Err(_) => format!("({}, {})", target.device_type.0, target.device_id),
    };
    // Dropped: released on the stream resolved for `target`, with no consumer work queued.
    Err(PyBufferError::new_err(format!(
        "the producer's tensor is on {got}, but it said {expected} ({said}): \
         the stream cannot be resolved for the right device"
    )))
}

/// The name of `obj`'s type, for messages.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// Whether the consumer's `max_version` asks for versioned (DLPack >= 1.0) capsules.
fn wants_versioned(max_version: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let Some(v) = max_version else { return Ok(false) };
    let (major, _minor): (i64, i64) = v.extract().map_err(|_| {
        PyTypeError::new_err(format!("max_version must be a (major, minor) pair of ints, not {v}"))
    })?;
    Ok(major >= 1)
}

/// `None` for an absent or `None` argument.
fn given<'a, 'py>(arg: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    arg.filter(|a| !a.is_none())
}

#[pymethods]
impl Ordered {
    /// The garbage collector sees the wrapped object (and its device answer), so a
    /// producer that keeps its own wrapper is collected.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.obj)?;
        if let Source::Dlpack { dlpack, device_obj, .. } = &self.source {
            visit.call(dlpack)?;
            visit.call(device_obj)?;
        }
        Ok(())
    }

    /// The producer's DLPack device, `(device_type, device_id)`.
    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.source {
            Source::Dlpack { device_obj, .. } => Ok(device_obj.bind(py).clone()),
            Source::Cai { ordinal } => {
                let o = self.cai_ordinal(py, ordinal)?;
                Ok(PyTuple::new(py, [2u32, o])?.into_any())
            }
        }
    }

    /// The DLPack export: the producer's tensor, made ready on `stream` by the producer
    /// (or, for `__cuda_array_interface__`, by a GPU wait), in a capsule whose deleter
    /// releases it only after the work queued on `stream` before the release has run.
    ///
    /// `stream`: `None` or `1` the legacy default stream, `2` the per-thread default
    /// stream, `-1` no synchronization, else a `CUstream` handle; `0` and other
    /// negative values raise `ValueError`. A versioned capsule when `max_version` is
    /// `(1, x)` or more and the producer gave one, a legacy capsule otherwise. A
    /// producer's tensor on another device than it (or `dl_device`) said, or copied
    /// (`IS_COPIED`) where `copy=False` was asked, is a `BufferError` (deleted once).
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (max_version, dl_device, copy) = (given(max_version), given(dl_device), given(copy));
        let requested = streams::parse(stream)?;
        let versioned = wants_versioned(max_version)?;
        let target = match dl_device {
            Some(d) => streams::parse_device(d, "dl_device")?,
            None => self.device(py)?,
        };
        let request = Request { stream, requested, max_version, dl_device, copy, target };
        match self.take(py, &request)? {
            Produced::Taken(adopted, producer_versioned) => {
                capsule::export(py, adopted, versioned && producer_versioned)
            }
            Produced::Unchanged(capsule) => Ok(capsule),
        }
    }

    /// Tests only (the `test-hooks` feature): moves the simulated clock of a
    /// `_mock_ordered` wrapper.
    #[cfg(feature = "test-hooks")]
    fn _mock_advance(&self, micros: u64) -> PyResult<()> {
        match &self.mock {
            Some(m) => {
                m.advance(micros);
                Ok(())
            }
            None => Err(pyo3::exceptions::PyValueError::new_err("not a _mock_ordered wrapper")),
        }
    }

    /// The wrapped object.
    #[getter]
    fn obj<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.obj.bind(py).clone()
    }

    /// Whether the consumer's import is writable (`ordered(obj, writable=True)`).
    #[getter]
    fn writable(&self) -> bool {
        self.access == Access::Write
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let inner = self.obj.bind(py).repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into());
        let kind = match self.source {
            Source::Dlpack { .. } => "",
            Source::Cai { .. } => ", via __cuda_array_interface__",
        };
        format!("handoff.ordered({inner}{kind})")
    }
}

/// `ordered(obj)` with a simulated consumer stream (tests only, the `test-hooks`
/// feature; see `mock`).
#[cfg(feature = "test-hooks")]
#[pyfunction(name = "_mock_ordered")]
#[pyo3(signature = (obj, busy_us, *, writable = false))]
pub fn mock_ordered(obj: &Bound<'_, PyAny>, busy_us: u64, writable: bool) -> PyResult<Ordered> {
    Ordered::new(obj, writable, Some(MockConsumer::new(busy_us)))
}
