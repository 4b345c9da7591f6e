//! PyTorch's DLPack C exchange API (`torch.Tensor.__dlpack_c_exchange_api__`, DLPack
//! 1.3, PyTorch >= 2.10): a tensor's managed tensor and its device's current stream,
//! read without a Python call, and a tensor built from a managed tensor without
//! `torch.from_dlpack`. The API is "no sync": the ordering is handoff's (`crossing`).
//!
//! The table is found once, on `torch.Tensor`, when PyTorch is first needed; its
//! version and every function handoff calls are checked then. Without it (an older
//! PyTorch, another DLPack major version) [`Torch::get`] says why, and the crossings
//! take the public route.

use handoff_runtime::ffi::{
    DLDataTypeCode, DLDevice, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader,
};
use handoff_runtime::{Access, Stream, cuda};
use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use std::ffi::c_void;
use std::ptr::NonNull;

/// PyTorch's C exchange API and the tensor types it is used for.
pub struct Torch {
    api: NonNull<DLPackExchangeAPI>,
    /// `torch.Tensor` and `torch.nn.Parameter`: the types whose `__dlpack__` is
    /// PyTorch's own (a subclass may override it, or `__torch_function__`).
    tensor: Py<PyType>,
    parameter: Py<PyType>,
    /// What was found, for `handoff.routes()`.
    pub found: String,
}

// SAFETY: the table is a static of PyTorch's, alive and unchanged for the process's
// life (the DLPack spec); the types are Python objects, used with the GIL.
unsafe impl Send for Torch {}
// SAFETY: as above: nothing here is written after `find`.
unsafe impl Sync for Torch {}

static TORCH: PyOnceLock<Result<Torch, String>> = PyOnceLock::new();

impl Torch {
    /// PyTorch's API, or why it cannot be used; `None` while PyTorch is not imported
    /// (and `import` is false: a crossing from a torch tensor needs no import).
    pub fn get(py: Python<'_>, import: bool) -> PyResult<Option<&'static Result<Torch, String>>> {
        if let Some(found) = TORCH.get(py) {
            return Ok(Some(found));
        }
        let module = if import {
            py.import(intern!(py, "torch"))?.into_any()
        } else {
            let modules = py.import(intern!(py, "sys"))?.getattr(intern!(py, "modules"))?;
            match modules.cast::<PyDict>()?.get_item(intern!(py, "torch"))? {
                Some(m) => m,
                None => return Ok(None),
            }
        };
        Ok(Some(TORCH.get_or_init(py, || Torch::find(&module))))
    }

    /// Reads and checks the table on `torch.Tensor`.
    fn find(torch: &Bound<'_, PyAny>) -> Result<Torch, String> {
        let py = torch.py();
        let version = torch
            .getattr(intern!(py, "__version__"))
            .and_then(|v| v.extract::<String>())
            .unwrap_or_else(|_| "?".into());
        let types = || -> PyResult<(Bound<'_, PyType>, Bound<'_, PyType>)> {
            let tensor = torch.getattr(intern!(py, "Tensor"))?.cast_into::<PyType>()?;
            let nn = torch.getattr(intern!(py, "nn"))?;
            let parameter = nn.getattr(intern!(py, "Parameter"))?.cast_into::<PyType>()?;
            Ok((tensor, parameter))
        };
        let (tensor, parameter) = types().map_err(|e| format!("torch {version}: {e}"))?;
        let Some(capsule) = tensor.getattr_opt(intern!(py, "__dlpack_c_exchange_api__")).ok().flatten()
        else {
            return Err(format!(
                "torch {version} has no torch.Tensor.__dlpack_c_exchange_api__ (PyTorch 2.10 and later have it)"
            ));
        };
        // SAFETY: `capsule` is a live object; GetPointer checks that it is a capsule of
        // this name and returns null (with an error set, cleared below) otherwise.
        let table = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
        if table.is_null() {
            let _ = PyErr::take(py);
            return Err(format!(
                "torch {version}: __dlpack_c_exchange_api__ is not a \"dlpack_exchange_api\" capsule"
            ));
        }
        // SAFETY: a DLPack exchange API table, static in PyTorch (the spec's contract
        // for this capsule), each starting with its header.
        let api = unsafe { compatible(table.cast()) }.ok_or_else(|| {
            format!("torch {version}: its DLPack exchange API has no table of DLPack major version 1")
        })?;
        // SAFETY: as above; the fields handoff calls are checked here, once.
        let t = unsafe { api.as_ref() };
        let missing = [
            ("managed_tensor_from_py_object_no_sync", t.managed_tensor_from_py_object_no_sync.is_none()),
            ("managed_tensor_to_py_object_no_sync", t.managed_tensor_to_py_object_no_sync.is_none()),
            ("current_work_stream", t.current_work_stream.is_none()),
        ];
        if let Some((name, _)) = missing.iter().find(|(_, m)| *m) {
            return Err(format!("torch {version}: its DLPack exchange API has no {name}"));
        }
        let v = t.header.version;
        Ok(Torch {
            api,
            tensor: tensor.unbind(),
            parameter: parameter.unbind(),
            found: format!("torch {version}: C exchange API (DLPack {}.{})", v.major, v.minor),
        })
    }

    fn api(&self) -> &DLPackExchangeAPI {
        // SAFETY: static in PyTorch (see `Send`).
        unsafe { self.api.as_ref() }
    }

    /// Whether `obj` is a tensor whose `__dlpack__` is PyTorch's own: exactly a
    /// `torch.Tensor` or a `torch.nn.Parameter`.
    pub fn is_tensor(&self, obj: &Bound<'_, PyAny>) -> bool {
        let ty = obj.get_type();
        ty.is(&self.tensor) || ty.is(&self.parameter)
    }

    /// `obj`'s managed tensor, read without calling Python, where PyTorch's own
    /// `__dlpack__` would export it as it is; `None` where that would refuse (a tensor
    /// that requires grad, unless `detached`: the caller exports `obj.detach()`; the
    /// conjugate bit) or the API fails (a sparse tensor): the public route then raises
    /// PyTorch's own error. Nothing is ordered: the data is ready on the stream
    /// [`Self::current_stream`] gives.
    pub fn export(&self, obj: &Bound<'_, PyAny>, detached: bool) -> PyResult<Option<Exported>> {
        let py = obj.py();
        if !detached && obj.getattr(intern!(py, "requires_grad"))?.is_truthy()? {
            return Ok(None);
        }
        let from_py = self.api().managed_tensor_from_py_object_no_sync.expect("checked in find");
        let mut out = std::ptr::null_mut();
        // SAFETY: `obj` is a live torch tensor (`is_tensor`), the type the table was
        // found on; the GIL is held. On success `out` is an owned managed tensor.
        let rc = unsafe { from_py(obj.as_ptr().cast(), &mut out) };
        let Some(managed) = NonNull::new(out).filter(|_| rc == 0) else {
            let _ = PyErr::take(py);
            return Ok(None);
        };
        let exported = Exported(managed);
        if exported.version_major() != 1 {
            return Ok(None);
        }
        if exported.dtype_code() == DLDataTypeCode::COMPLEX
            && obj.call_method0(intern!(py, "is_conj"))?.is_truthy()?
        {
            return Ok(None);
        }
        Ok(Some(exported))
    }

    /// PyTorch's current stream of `device` (`torch.cuda.current_stream(device)`'s
    /// `cuda_stream`: `0` for the legacy default stream), `0` for the CPU.
    pub fn current_stream(&self, py: Python<'_>, device: DLDevice) -> PyResult<u64> {
        let current = self.api().current_work_stream.expect("checked in find");
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: a plain query; the GIL is held (a failure sets a Python error).
        let rc = unsafe { current(device.device_type, device.device_id, &mut out) };
        if rc != 0 {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                PyRuntimeError::new_err("PyTorch's current_work_stream failed without an error")
            }));
        }
        Ok(out as u64)
    }

    /// PyTorch's current stream of the CUDA device `device`, as a [`Stream`] handoff
    /// orders on, and its raw handle.
    pub fn current_cuda_stream(&self, py: Python<'_>, device: DLDevice) -> PyResult<(Stream, u64)> {
        let raw = self.current_stream(py, device)?;
        let ordinal = u32::try_from(device.device_id).unwrap_or(u32::MAX);
        // SAFETY: PyTorch's current stream of that device, on its primary context (the
        // one PyTorch, XLA and handoff share); PyTorch keeps its streams for the
        // process's life (pool streams are never destroyed, and a user's
        // `torch.cuda.Stream` is alive while it is current).
        let stream = unsafe { cuda::stream(ordinal, raw) }.map_err(crate::errors::to_py)?;
        Ok((stream, raw))
    }

    /// A torch tensor viewing `managed`, which PyTorch takes over (its deleter runs when
    /// the tensor's memory is freed; on a failure PyTorch has taken it too, as the
    /// DLPack exchange API says).
    ///
    /// # Safety
    /// `managed` is a valid, owned versioned managed tensor on a device PyTorch supports.
    pub unsafe fn import<'py>(
        &self,
        py: Python<'py>,
        managed: *mut DLManagedTensorVersioned,
    ) -> PyResult<Bound<'py, PyAny>> {
        let to_py = self.api().managed_tensor_to_py_object_no_sync.expect("checked in find");
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: forwarded from the caller; the GIL is held.
        let rc = unsafe { to_py(managed, &mut out) };
        if rc != 0 || out.is_null() {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                PyRuntimeError::new_err(
                    "PyTorch's managed_tensor_to_py_object_no_sync failed without an error",
                )
            }));
        }
        // SAFETY: a new reference to the tensor PyTorch made.
        Ok(unsafe { Bound::from_owned_ptr(py, out.cast()) })
    }
}

/// The first table of DLPack major version 1 in the chain from `header` (bounded: a
/// chain is a few tables at most).
///
/// # Safety
/// `header` is null or the header of a live exchange API table whose `prev_api`
/// chain holds full tables.
unsafe fn compatible(mut header: *mut DLPackExchangeAPIHeader) -> Option<NonNull<DLPackExchangeAPI>> {
    for _ in 0..16 {
        let h = NonNull::new(header)?;
        // SAFETY: a live header (the caller's contract).
        let h = unsafe { h.as_ref() };
        if h.version.major == 1 {
            return NonNull::new(header.cast());
        }
        header = h.prev_api;
    }
    None
}

/// A managed tensor PyTorch exported, owned here: its deleter runs when this drops,
/// unless [`Exported::into_raw`] gave it away.
pub struct Exported(NonNull<DLManagedTensorVersioned>);

impl Exported {
    fn get(&self) -> &DLManagedTensorVersioned {
        // SAFETY: owned, alive until the deleter runs (in `drop`).
        unsafe { self.0.as_ref() }
    }

    fn version_major(&self) -> u32 {
        self.get().version.major
    }

    fn dtype_code(&self) -> DLDataTypeCode {
        self.get().dl_tensor.dtype.code
    }

    /// The tensor's device (as PyTorch wrote it; validation checks it again).
    pub fn device(&self) -> DLDevice {
        self.get().dl_tensor.device
    }

    /// Host memory not aligned for its dtype (`torch.from_numpy` of a view at an odd
    /// offset), which handoff passes on unchanged (see [`crate::capsule::passed_on`]).
    pub fn misaligned_host(&self) -> bool {
        crate::capsule::misaligned_host(&self.get().dl_tensor).is_some()
    }

    /// Hands the tensor to a consumer on `consumer` (its deleter then runs on the main
    /// thread, as every producer's does).
    pub fn adopt(
        self,
        consumer: &Stream,
        access: Access,
    ) -> handoff_runtime::Result<crate::capsule::Adopted> {
        // SAFETY: PyTorch's tensor, owned here and given away whole.
        unsafe { crate::capsule::adopt_owned(self.into_raw(), consumer, access) }
    }

    /// Gives up ownership: the caller calls the deleter.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        if let Some(deleter) = self.get().deleter {
            // SAFETY: PyTorch's deleter on its own tensor, once (ownership ends here).
            unsafe { deleter(self.0.as_ptr()) };
        }
    }
}
