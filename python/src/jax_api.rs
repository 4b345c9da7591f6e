//! jaxlib's own DLPack entry points, under `jax.dlpack`'s Python layer:
//! `_jax.dlpack_managed_tensor_to_buffer(capsule, device, stream, copy[, dl_device_type])`
//! and `_jax.buffer_to_dlpack_managed_tensor(array, stream=...)`.
//!
//! They are private: found once, when JAX is first needed, and checked by a round trip
//! of a one-element CPU array through both (so a changed signature is found there, not
//! in a user's call); without them [`Jax::get`] says why, and the crossings take the
//! public route. Each JAX device (and, on CUDA, the stream JAX reads external data on)
//! is looked up once.

use handoff_runtime::Stream;
use handoff_runtime::cuda;
use handoff_runtime::ffi::{DLDevice, DLDeviceType};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use std::sync::Mutex;

/// jaxlib's entry points and what `jax.dlpack.from_dlpack` does around them.
pub struct Jax {
    /// `_jax.dlpack_managed_tensor_to_buffer`.
    to_buffer: Py<PyAny>,
    /// Whether it takes the DLPack device type as a fifth argument (jaxlib extension 467).
    takes_device_type: bool,
    /// `_jax.buffer_to_dlpack_managed_tensor`.
    from_buffer: Py<PyAny>,
    /// `_jax.ArrayImpl`, the type of a JAX array.
    array: Py<PyType>,
    /// `jax._src.xla_bridge.get_backend`.
    get_backend: Py<PyAny>,
    /// `jax.dtypes.canonicalize_dtype` and `jax.numpy.asarray`: `jax.dlpack.from_dlpack`
    /// converts a 64-bit array to 32 bits when x64 mode is off.
    canonicalize_dtype: Py<PyAny>,
    asarray: Py<PyAny>,
    /// The devices looked up so far.
    devices: Mutex<Vec<JaxDevice>>,
    /// What was found, for `handoff.routes()`.
    pub found: String,
}

/// A JAX device, as the crossings need it.
pub struct JaxDevice {
    /// The JAX `Device`.
    pub object: Py<PyAny>,
    /// Its DLPack device.
    pub dl: DLDevice,
    /// The stream JAX reads external data on; `None` on the CPU.
    pub ready: Option<Ready>,
    /// A device of one of handoff's capture clients (`handoff._capture`), not JAX's own.
    pub captured: bool,
}

/// A capture client's device for a crossing inside a capture ([`Jax::capture_device`]):
/// the JAX device, its ready stream, and (the first time for the capture) what to keep
/// with the graph.
pub type Leased = (Py<PyAny>, Option<Ready>, Option<Py<PyAny>>);

/// The stream a JAX device reads external data on
/// (`Device.get_stream_for_external_ready_events()`).
#[derive(Clone)]
pub struct Ready {
    /// As handoff orders on it.
    pub stream: Stream,
    /// As jaxlib takes it.
    pub raw: u64,
}

/// The DLPack device of a JAX device object (what a JAX array's `__dlpack_device__`
/// says), `None` for a platform the native route does not take.
fn describe(object: &Bound<'_, PyAny>) -> PyResult<Option<DLDevice>> {
    let py = object.py();
    let platform: String = object.getattr(intern!(py, "platform"))?.extract()?;
    Ok(match platform.as_str() {
        "cpu" => Some(DLDevice::CPU),
        "gpu" | "cuda" => {
            let client = object.getattr(intern!(py, "client"))?;
            let version: String = client.getattr(intern!(py, "platform_version"))?.extract()?;
            let id: i32 = object.getattr(intern!(py, "local_hardware_id"))?.extract()?;
            version.contains("cuda").then_some(DLDevice::cuda(id))
        }
        _ => None,
    })
}

static JAX: PyOnceLock<Result<Jax, String>> = PyOnceLock::new();

impl Jax {
    /// jaxlib's entry points (JAX is imported), or why they cannot be used; a Python
    /// error when JAX itself does not import.
    pub fn get(py: Python<'_>) -> PyResult<&'static Result<Jax, String>> {
        if let Some(found) = JAX.get(py) {
            return Ok(found);
        }
        py.import(intern!(py, "jax"))?;
        Ok(JAX.get_or_init(py, || Jax::find(py).unwrap_or_else(|e| Err(e.to_string()))))
    }

    /// As [`Jax::get`], `None` while JAX is not imported (a crossing from a JAX array
    /// needs no import).
    pub fn if_imported(py: Python<'_>) -> PyResult<Option<&'static Result<Jax, String>>> {
        if let Some(found) = JAX.get(py) {
            return Ok(Some(found));
        }
        let modules = py.import(intern!(py, "sys"))?.getattr(intern!(py, "modules"))?;
        if modules.cast::<PyDict>()?.contains(intern!(py, "jax"))? {
            Jax::get(py).map(Some)
        } else {
            Ok(None)
        }
    }

    fn find(py: Python<'_>) -> PyResult<Result<Jax, String>> {
        let version: String = py.import("jax")?.getattr("__version__")?.extract()?;
        let lib = py.import("jax._src.lib")?;
        let jaxlib = lib.getattr("_jax")?;
        let extension: i64 = lib.getattr("jaxlib_extension_version")?.extract()?;
        let names = ["dlpack_managed_tensor_to_buffer", "buffer_to_dlpack_managed_tensor", "ArrayImpl"];
        if let Some(missing) = names.iter().find(|n| !jaxlib.hasattr(**n).unwrap_or(false)) {
            return Ok(Err(format!("jax {version}: jaxlib has no _jax.{missing}")));
        }
        let jax = Jax {
            to_buffer: jaxlib.getattr(names[0])?.unbind(),
            takes_device_type: extension >= 467,
            from_buffer: jaxlib.getattr(names[1])?.unbind(),
            array: jaxlib.getattr(names[2])?.cast_into::<PyType>()?.unbind(),
            get_backend: py.import("jax._src.xla_bridge")?.getattr("get_backend")?.unbind(),
            canonicalize_dtype: py.import("jax.dtypes")?.getattr("canonicalize_dtype")?.unbind(),
            asarray: py.import("jax.numpy")?.getattr("asarray")?.unbind(),
            devices: Mutex::new(Vec::new()),
            found: format!(
                "jax {version} (jaxlib extension {extension}): _jax.dlpack_managed_tensor_to_buffer, \
                 _jax.buffer_to_dlpack_managed_tensor"
            ),
        };
        if let Err(e) = jax.round_trip(py) {
            return Ok(Err(format!("jax {version}: jaxlib's DLPack entry points failed a round trip: {e}")));
        }
        Ok(Ok(jax))
    }

    /// A one-element array through both entry points and back, with the arguments the
    /// crossings pass, and the attribute [`Self::device_of`] reads. On the CPU where JAX
    /// has it (`JAX_PLATFORMS` may leave it out), else on the default device, where
    /// jaxlib waits for the one element on the host, once.
    fn round_trip(&self, py: Python<'_>) -> PyResult<()> {
        let jax = py.import("jax")?;
        let device = match jax.call_method1("devices", ("cpu",)) {
            Ok(cpus) => cpus.get_item(0)?,
            Err(_) => jax.call_method0("devices")?.get_item(0)?,
        };
        let device_type = describe(&device)?.map_or(DLDeviceType::CPU, |d| d.device_type);
        let ones = py.import("numpy")?.call_method1("ones", (1,))?;
        let one = jax.call_method1("device_put", (ones, &device))?;
        let capsule = self.call_from_buffer(&one, None)?;
        let back = self.call_to_buffer(py, &capsule, &device, None, device_type)?;
        let same = back.call_method1("__eq__", (&one,))?.call_method0("all")?.is_truthy()?;
        let found = one.getattr("sharding")?.getattr("_device")?;
        if !same || !found.is(&device) || !back.get_type().is(self.array.bind(py)) {
            return Err(pyo3::exceptions::PyValueError::new_err("the array came back different"));
        }
        Ok(())
    }

    /// Whether `obj` is a JAX array (`_jax.ArrayImpl`).
    pub fn is_array(&self, obj: &Bound<'_, PyAny>) -> bool {
        obj.get_type().is(self.array.bind(obj.py()))
    }

    /// The JAX device for a DLPack device, with its ready stream on CUDA (`None` for a
    /// device the native route does not take: the public route handles or refuses it).
    pub fn device(&self, py: Python<'_>, dl: DLDevice) -> PyResult<Option<(Py<PyAny>, Option<Ready>)>> {
        let key = match dl.device_type {
            DLDeviceType::CPU => DLDevice::CPU,
            DLDeviceType::CUDA => dl,
            _ => return Ok(None),
        };
        if let Some((object, _, ready)) = self.cached(py, |d| d.dl == key && !d.captured) {
            return Ok(Some((object, ready)));
        }
        let platform = if key.device_type == DLDeviceType::CPU { "cpu" } else { "cuda" };
        let object = self
            .get_backend
            .bind(py)
            .call1((platform,))?
            .call_method1(intern!(py, "device_from_local_hardware_id"), (key.device_id,))?;
        Ok(Some(self.remember(py, object, key, false)?))
    }

    /// The device CUDA work of the capture `capture` (its id) runs on: a device of the
    /// PJRT client of handoff's own that the capture holds (`handoff._capture.lease`,
    /// which makes or reuses one, so nothing outside the graph ever allocates the
    /// memory its replays write), with its ready stream. The first time for a capture,
    /// also what to keep with the graph: dropping it gives the client back. `None` where
    /// capture clients are switched off (`handoff._capture.ENABLED`).
    pub fn capture_device(&self, py: Python<'_>, dl: DLDevice, capture: u64) -> PyResult<Option<Leased>> {
        let lease = py.import(intern!(py, "handoff._capture"))?.getattr(intern!(py, "lease"))?;
        // A new client allocates and starts streams: allowed inside the capture as
        // PyTorch allows its own allocations there.
        let leased =
            handoff_runtime::cuda::with_capture_mode_relaxed(|| lease.call1((dl.device_id, capture)));
        let (object, token): (Bound<'_, PyAny>, Bound<'_, PyAny>) = leased?.extract()?;
        if object.is_none() {
            return Ok(None); // capture clients switched off: JAX's own device
        }
        let token = (!token.is_none()).then(|| token.unbind());
        if let Some((object, _, ready)) = self.cached(py, |d| d.object.bind(py).is(&object)) {
            return Ok(Some((object, ready, token)));
        }
        if describe(&object)? != Some(dl) {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "handoff._capture.lease({}, {capture}) gave {object}, not a device of {dl:?}",
                dl.device_id
            )));
        }
        let (object, ready) = self.remember(py, object, dl, true)?;
        Ok(Some((object, ready, token)))
    }

    /// Whether `array` is a JAX array on a device of one of handoff's capture clients
    /// (made by a crossing inside a capture, or computed from such arrays).
    pub fn on_capture_client(&self, array: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = array.py();
        if !self.is_array(array) {
            return Ok(false);
        }
        let Some(object) = array.getattr(intern!(py, "sharding"))?.getattr_opt(intern!(py, "_device"))?
        else {
            return Ok(false);
        };
        let devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        Ok(devices.iter().any(|d| d.captured && d.object.bind(py).is(&object)))
    }

    /// The DLPack device of the JAX array `array` and, on CUDA, the device's ready
    /// stream, when it is one device's memory of a kind the native route takes (else
    /// `None`: an array sharded over devices, pinned host memory, another platform).
    pub fn device_of(&self, array: &Bound<'_, PyAny>) -> PyResult<Option<(DLDevice, Option<Ready>)>> {
        let py = array.py();
        let sharding = array.getattr(intern!(py, "sharding"))?;
        let Some(object) = sharding.getattr_opt(intern!(py, "_device"))? else {
            return Ok(None);
        };
        let (dl, ready) = match self.cached(py, |d| d.object.bind(py).is(&object)) {
            Some((_, dl, ready)) => (dl, ready),
            None => {
                let Some(dl) = describe(&object)? else { return Ok(None) };
                (dl, self.remember(py, object, dl, false)?.1)
            }
        };
        if dl.device_type == DLDeviceType::CUDA {
            let kind = sharding.getattr(intern!(py, "memory_kind"))?;
            if !kind.is_none() && kind.extract::<String>().is_ok_and(|k| k != "device") {
                return Ok(None);
            }
        }
        Ok(Some((dl, ready)))
    }

    /// The cached device `pick` chooses.
    fn cached(
        &self,
        py: Python<'_>,
        pick: impl Fn(&JaxDevice) -> bool,
    ) -> Option<(Py<PyAny>, DLDevice, Option<Ready>)> {
        let devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        let d = devices.iter().find(|d| pick(d))?;
        Some((d.object.clone_ref(py), d.dl, d.ready.clone()))
    }

    /// Caches a device, with its ready stream on CUDA (`captured`: of a capture
    /// client).
    fn remember(
        &self,
        py: Python<'_>,
        object: Bound<'_, PyAny>,
        dl: DLDevice,
        captured: bool,
    ) -> PyResult<(Py<PyAny>, Option<Ready>)> {
        let ready = if dl.device_type == DLDeviceType::CUDA {
            let raw: u64 =
                object.call_method0(intern!(py, "get_stream_for_external_ready_events"))?.extract()?;
            let ordinal = u32::try_from(dl.device_id).unwrap_or(u32::MAX);
            // SAFETY: a stream of XLA's on the device's primary context (PyTorch, XLA and
            // handoff share it), owned by JAX's client or one of handoff's capture
            // clients, each of which lives as long as the process.
            let stream = unsafe { cuda::stream(ordinal, raw) }.map_err(crate::errors::to_py)?;
            Some(Ready { stream, raw })
        } else {
            None
        };
        let object = object.unbind();
        let entry = JaxDevice { object: object.clone_ref(py), dl, ready: ready.clone(), captured };
        self.devices.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
        Ok((object, ready))
    }

    /// `_jax.dlpack_managed_tensor_to_buffer(capsule, device, stream, None[, type])`: a
    /// JAX array viewing the capsule's tensor, ready on `stream`.
    pub fn call_to_buffer<'py>(
        &self,
        py: Python<'py>,
        capsule: &Bound<'py, PyAny>,
        device: &Bound<'py, PyAny>,
        stream: Option<u64>,
        device_type: DLDeviceType,
    ) -> PyResult<Bound<'py, PyAny>> {
        let f = self.to_buffer.bind(py);
        if self.takes_device_type {
            f.call1((capsule, device, stream, py.None(), device_type.0))
        } else {
            f.call1((capsule, device, stream, py.None()))
        }
    }

    /// `_jax.buffer_to_dlpack_managed_tensor(array, stream=stream)`: a legacy capsule of
    /// the array's buffer, made ready on `stream` by a GPU wait.
    pub fn call_from_buffer<'py>(
        &self,
        array: &Bound<'py, PyAny>,
        stream: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.from_buffer.bind(array.py()).call1((array, stream))
    }

    /// What `jax.dlpack.from_dlpack` returns for `array` made from a 64-bit tensor:
    /// converted to 32 bits when JAX's x64 mode is off (a copy), else `array`.
    pub fn canonical<'py>(&self, array: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = array.py();
        let dtype = array.getattr(intern!(py, "dtype"))?;
        let canonical = self.canonicalize_dtype.bind(py).call1((&dtype,))?;
        if canonical.eq(&dtype)? {
            return Ok(array);
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item(intern!(py, "dtype"), canonical)?;
        self.asarray.bind(py).call((array,), Some(&kwargs))
    }
}
