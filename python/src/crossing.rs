//! `handoff.to_jax` and `handoff.to_torch`: each crossing takes the fastest route the
//! installed frameworks offer, with the same guarantees on every route.
//!
//! - **native**: a torch tensor goes to JAX through PyTorch's C exchange API
//!   ([`crate::torch_api`]) and jaxlib's `dlpack_managed_tensor_to_buffer`; a JAX array
//!   comes to PyTorch through jaxlib's `buffer_to_dlpack_managed_tensor` and PyTorch's
//!   C exchange API. No Python `__dlpack__`, `from_dlpack` or stream query runs.
//! - **public**: `jax.dlpack.from_dlpack(handoff.ordered(x))` and
//!   `torch.from_dlpack(handoff.ordered(x))`, for every other producer, for a case the
//!   native route leaves to the producer (a torch tensor that requires grad: PyTorch's
//!   own error), where an entry point is missing or differs, or when forced
//!   (`HANDOFF_ROUTE=public`, or, in a build with the `test-hooks` feature only,
//!   `_set_route("public")`).
//!
//! Both do what `handoff.ordered` does: the producer's data is made ready on the
//! consumer's stream by a GPU wait (PyTorch's current stream → JAX's ready stream, or
//! JAX's buffer → PyTorch's current stream), the producer's memory is given back only
//! after the work queued on the consumer's stream before the release, the producer's
//! tensor is validated and its deleter runs once, on the main thread. The results are
//! the same, dtype for dtype (`tests/test_routes.py` compares them): a 64-bit tensor
//! becomes a 32-bit JAX array when x64 mode is off, as `jax.dlpack.from_dlpack` does.

use crate::capsule;
use crate::errors;
use crate::jax_api::{Jax, Ready};
use crate::ordered::{Ordered, check_device};
use crate::torch_api::Torch;
use handoff_runtime::ffi::{DLDataTypeCode, DLDeviceType};
use handoff_runtime::{Access, Handoff, Stream};
use pyo3::exceptions::{PyModuleNotFoundError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set when the public route is forced (`HANDOFF_ROUTE=public`; `_set_route` with the
/// `test-hooks` feature).
static PUBLIC_ONLY: AtomicBool = AtomicBool::new(false);

/// Reads `HANDOFF_ROUTE` (`auto`, the default, or `public`) at import.
pub fn init() -> PyResult<()> {
    match std::env::var("HANDOFF_ROUTE").as_deref() {
        Err(_) | Ok("" | "auto") => Ok(()),
        Ok("public") => {
            PUBLIC_ONLY.store(true, Ordering::Relaxed);
            Ok(())
        }
        Ok(other) => Err(PyValueError::new_err(format!(
            "HANDOFF_ROUTE={other:?}: expected \"auto\" (the fastest route) or \"public\""
        ))),
    }
}

/// Tests and benchmarks (the `test-hooks` feature, not in the wheel users install):
/// `"public"` forces the public route of every crossing in this process, `"auto"` takes
/// the fastest again.
#[cfg(feature = "test-hooks")]
#[pyfunction(name = "_set_route")]
pub fn set_route(route: &str) -> PyResult<()> {
    let public = match route {
        "auto" => false,
        "public" => true,
        _ => return Err(PyValueError::new_err(format!("route {route:?}: expected \"auto\" or \"public\""))),
    };
    PUBLIC_ONLY.store(public, Ordering::Relaxed);
    Ok(())
}

/// The route each crossing takes in this process, and why: `{"torch_to_jax":
/// "native" | "public", "jax_to_torch": ..., "reasons": {"torch": ..., "jax": ...,
/// "forced": ...}}`. Imports PyTorch and JAX; one that is not installed is reported as
/// such (`"not installed (...)"`), and the route is then the public one.
#[pyfunction]
pub fn routes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let (torch_ok, torch) =
        described(py, Torch::get(py, true).map(|t| t.expect("imported")), |t| t.found.clone())?;
    let (jax_ok, jax) = described(py, Jax::get(py), |j| j.found.clone())?;
    let forced = PUBLIC_ONLY.load(Ordering::Relaxed);
    let route = if torch_ok && jax_ok && !forced { "native" } else { "public" };
    let reasons = PyDict::new(py);
    reasons.set_item("torch", torch)?;
    reasons.set_item("jax", jax)?;
    reasons.set_item(
        "forced",
        match forced {
            false => "no",
            true if cfg!(feature = "test-hooks") => {
                "the public route is forced (HANDOFF_ROUTE=public or _set_route)"
            }
            true => "the public route is forced (HANDOFF_ROUTE=public)",
        },
    )?;
    let d = PyDict::new(py);
    d.set_item("torch_to_jax", route)?;
    d.set_item("jax_to_torch", route)?;
    d.set_item("reasons", reasons)?;
    Ok(d)
}

/// Whether a framework's native entry points can be used, and why (what was found, what
/// is missing, or that the framework is not installed).
fn described<T>(
    py: Python<'_>,
    got: PyResult<&Result<T, String>>,
    found: impl Fn(&T) -> String,
) -> PyResult<(bool, String)> {
    match got {
        Ok(Ok(t)) => Ok((true, found(t))),
        Ok(Err(why)) => Ok((false, why.clone())),
        Err(e) if e.is_instance_of::<PyModuleNotFoundError>(py) => {
            Ok((false, format!("not installed ({})", e.value(py))))
        }
        Err(e) => Err(e),
    }
}

/// The public route: the frameworks' `from_dlpack` (looked up once) of `handoff.ordered(x)`.
struct Public;

static JAX_FROM_DLPACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static TORCH_FROM_DLPACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

impl Public {
    /// `jax.dlpack.from_dlpack(handoff.ordered(x))`, with the copy JAX makes of memory it
    /// cannot view counted.
    fn to_jax<'py>(x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = x.py();
        let f = JAX_FROM_DLPACK.import(py, "jax.dlpack", "from_dlpack")?;
        let ordered = Bound::new(py, Ordered::new(x, false, None)?)?;
        let array = f.call1((&ordered,))?;
        if let Some(source) = ordered.get().handed_out() {
            count_jax_copy(&array, source)?;
        }
        Ok(array)
    }

    /// `torch.from_dlpack(handoff.ordered(x, writable=...))`.
    fn to_torch<'py>(x: &Bound<'py, PyAny>, access: Access) -> PyResult<Bound<'py, PyAny>> {
        let py = x.py();
        let f = TORCH_FROM_DLPACK.import(py, "torch", "from_dlpack")?;
        f.call1((Ordered::new(x, access == Access::Write, None)?,))
    }
}

/// The native route's frameworks, when it can be taken.
fn native_to_jax(py: Python<'_>) -> PyResult<Option<(&'static Torch, &'static Jax)>> {
    if PUBLIC_ONLY.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let Some(Ok(torch)) = Torch::get(py, false)? else { return Ok(None) };
    let Ok(jax) = Jax::get(py)? else { return Ok(None) };
    Ok(Some((torch, jax)))
}

fn native_to_torch(py: Python<'_>) -> PyResult<Option<(&'static Torch, &'static Jax)>> {
    if PUBLIC_ONLY.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let Some(Ok(jax)) = Jax::if_imported(py)? else { return Ok(None) };
    let Some(Ok(torch)) = Torch::get(py, true)? else { return Ok(None) };
    Ok(Some((torch, jax)))
}

/// `jax.dlpack.from_dlpack(handoff.ordered(x))`, by the fastest route: a JAX array
/// viewing `x`'s memory (no copy where JAX can view it), ready on the stream JAX reads
/// external data on through a GPU wait, whose release waits for the work queued there.
/// A torch tensor crosses natively (see `handoff.routes()`); anything with
/// `__dlpack__` or `__cuda_array_interface__` crosses through `handoff.ordered`.
///
/// ```python
/// x = handoff.to_jax(torch.ones(3, device="cuda"))
/// ```
#[pyfunction]
pub fn to_jax<'py>(x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    native_to_jax(py)
        .and_then(|native| cross_to_jax(native, x, false, &mut OrderOnce::default()))
        .map_err(|e| errors::with_missing_package(py, e, "handoff.to_jax"))
}

/// `[to_jax(t.detach()) for t in tensors]` for `handoff.torch_function`, each made
/// dense and, on CUDA, 16-byte aligned where it is not (a copy, counted): the tensors of
/// one call (on one device) cross in one call, ordered by one GPU wait.
#[pyfunction(name = "_to_jax_many")]
pub fn to_jax_many<'py>(py: Python<'py>, tensors: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let native = native_to_jax(py)?;
    let mut order = OrderOnce::default();
    let out = PyList::empty(py);
    for t in tensors.try_iter()? {
        out.append(cross_to_jax(native, &t?, true, &mut order)?)?;
    }
    Ok(out)
}

/// One crossing to JAX, of `x.detach()` made ready for XLA (see [`needs_copy_for_xla`])
/// when `detached`.
fn cross_to_jax<'py>(
    native: Option<(&'static Torch, &'static Jax)>,
    x: &Bound<'py, PyAny>,
    detached: bool,
    order: &mut OrderOnce,
) -> PyResult<Bound<'py, PyAny>> {
    match native {
        Some((torch, jax)) if torch.is_tensor(x) => ToJax { torch, jax, detached }.one(x, order),
        _ if detached && needs_copy_for_xla(x)? => Public::to_jax(&copy_for_xla(x)?),
        _ if detached => Public::to_jax(&x.call_method0(intern!(x.py(), "detach"))?),
        _ => Public::to_jax(x),
    }
}

/// Whether `torch_function` must copy the tensor `t` before XLA reads it: it is not
/// dense (row-major), or it is on CUDA at an address that is not 16-byte aligned (XLA's
/// CUDA executables refuse such a buffer when they run, for f32 and bf16 alike: a view
/// at an offset into a flat parameter buffer).
fn needs_copy_for_xla(t: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = t.py();
    if !t.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
        return Ok(true);
    }
    if !t.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
        return Ok(false);
    }
    let address: u64 = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
    Ok(!address.is_multiple_of(16))
}

/// A dense copy of `t.detach()` in fresh memory (PyTorch's allocator aligns it),
/// counted in `handoff.stats()` (`copies`, `bytes_copied`).
fn copy_for_xla<'py>(t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = t.py();
    let detached = t.call_method0(intern!(py, "detach"))?;
    let dense = if detached.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
        detached.call_method0(intern!(py, "clone"))?
    } else {
        detached.call_method0(intern!(py, "contiguous"))?
    };
    let numel: u64 = dense.call_method0(intern!(py, "numel"))?.extract()?;
    let size: u64 = dense.call_method0(intern!(py, "element_size"))?.extract()?;
    handoff_runtime::stats::count_copy(numel * size);
    Ok(dense)
}

/// `torch.from_dlpack(handoff.ordered(x, writable=writable))`, by the fastest route: a
/// torch tensor viewing `x`'s memory (no copy), ready on PyTorch's current stream
/// through a GPU wait, whose release waits for the work PyTorch queued on that stream.
/// A JAX array crosses natively (see `handoff.routes()`); anything with `__dlpack__`
/// or `__cuda_array_interface__` crosses through `handoff.ordered`.
///
/// ```python
/// t = handoff.to_torch(jax.numpy.ones(3))
/// ```
#[pyfunction]
#[pyo3(signature = (x, *, writable = false))]
pub fn to_torch<'py>(x: &Bound<'py, PyAny>, writable: bool) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let access = if writable { Access::Write } else { Access::Read };
    native_to_torch(py)
        .and_then(|native| cross_to_torch(native, x, access, &mut None))
        .map_err(|e| errors::with_missing_package(py, e, "handoff.to_torch"))
}

/// `[to_torch(a) for a in arrays]`, in one call (`handoff.torch_function`). Inside a
/// CUDA graph capture, `keep` (what the arrays' computation left behind for later:
/// a VJP's residuals) is kept with the graph too, as the arrays are, since every replay
/// writes it again.
#[pyfunction(name = "_to_torch_many")]
#[pyo3(signature = (arrays, keep = None))]
pub fn to_torch_many<'py>(
    py: Python<'py>,
    arrays: &Bound<'py, PyAny>,
    mut keep: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let native = native_to_torch(py)?;
    let out = PyList::empty(py);
    for a in arrays.try_iter()? {
        out.append(cross_to_torch(native, &a?, Access::Read, &mut keep)?)?;
    }
    Ok(out)
}

/// One crossing to PyTorch; `keep` is taken by the first crossing made inside a graph
/// capture and kept with that graph.
fn cross_to_torch<'py>(
    native: Option<(&'static Torch, &'static Jax)>,
    x: &Bound<'py, PyAny>,
    access: Access,
    keep: &mut Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some((torch, jax)) = native
        && jax.is_array(x)
        && let Some(t) = jax_to_torch(torch, jax, x, access, keep)?
    {
        return Ok(t);
    }
    Public::to_torch(x, access).map_err(|e| errors::with_capture_hint(x.py(), e))
}

/// Orders PyTorch's stream before JAX's once per call of several crossings: one wait
/// covers every tensor written on the producer's stream so far. Whether that stream
/// captures a graph is asked once per call too.
#[derive(Default)]
struct OrderOnce {
    done: Option<(Stream, Stream)>,
    capture: Option<(Stream, Option<u64>)>,
}

impl OrderOnce {
    /// The id of the CUDA graph capture `producer` is part of, if any
    /// (`handoff_runtime::cuda::capture_id`), asked once per call and stream.
    fn capture_id(&mut self, producer: &Stream) -> PyResult<Option<u64>> {
        if let Some((stream, id)) = &self.capture
            && stream == producer
        {
            return Ok(*id);
        }
        let id = handoff_runtime::cuda::capture_id(producer).map_err(errors::to_py)?;
        self.capture = Some((producer.clone(), id));
        Ok(id)
    }

    fn order(&mut self, producer: &Stream, consumer: &Stream) -> PyResult<()> {
        if self.done.as_ref().is_some_and(|(p, c)| p == producer && c == consumer) {
            return Ok(());
        }
        handoff_runtime::order(Some(producer), consumer).map_err(errors::to_py)?;
        self.done = Some((producer.clone(), consumer.clone()));
        Ok(())
    }
}

/// The native route from PyTorch to JAX.
struct ToJax {
    torch: &'static Torch,
    jax: &'static Jax,
    /// Export the tensor as `t.detach()` would be, made ready for XLA (`torch_function`).
    detached: bool,
}

impl ToJax {
    fn one<'py>(&self, t: &Bound<'py, PyAny>, order: &mut OrderOnce) -> PyResult<Bound<'py, PyAny>> {
        let py = t.py();
        // What is exported is held as long as JAX holds the view: never a tensor with a
        // history, which would keep its whole autograd graph alive (and, in a CUDA graph
        // capture, a stale AccumulateGrad node that PyTorch's backward then refuses).
        let own = if !self.detached {
            None
        } else if needs_copy_for_xla(t)? {
            Some(copy_for_xla(t)?)
        } else if !t.getattr(intern!(py, "grad_fn"))?.is_none() {
            Some(t.call_method0(intern!(py, "detach"))?)
        } else {
            None
        };
        let t = own.as_ref().unwrap_or(t);
        let Some(exported) = self.torch.export(t, self.detached)? else {
            return Public::to_jax(t); // PyTorch's own error, or a tensor it exports its own way
        };
        if exported.misaligned_host() {
            // JAX copies it, as from its own `from_dlpack` (and counted there).
            drop(exported);
            let detached = if self.detached { &t.call_method0(intern!(py, "detach"))? } else { t };
            return Public::to_jax(detached);
        }
        let dl = exported.device();
        let producer = match dl.device_type {
            DLDeviceType::CUDA => Some(self.torch.current_cuda_stream(py, dl)?.0),
            _ => None,
        };
        // Inside a CUDA graph capture, onto the capture's own client (see
        // `handoff._capture`): the memory its replays write is that client's alone.
        let capture = match &producer {
            Some(p) => order.capture_id(p)?,
            None => None,
        };
        let leased = match capture {
            Some(id) => self.jax.capture_device(py, dl, id)?,
            None => None,
        };
        let (device, ready) = match leased {
            Some((device, ready, token)) => {
                if let (Some(token), Some(p)) = (token, &producer) {
                    let token = crate::keep_alive::PyKeepAlive::new(token);
                    handoff_runtime::graph::keep(p, token).map_err(errors::to_py)?;
                }
                (device, ready)
            }
            None => match self.jax.device(py, dl)? {
                Some(found) => found,
                None => {
                    drop(exported);
                    return Public::to_jax(t);
                }
            },
        };
        let consumer = match (&ready, &producer) {
            (Some(Ready { stream, .. }), Some(producer)) => {
                order.order(producer, stream)?;
                stream.clone()
            }
            _ => Stream::host(),
        };
        let adopted = exported.adopt(&consumer, Access::Read).map_err(errors::to_py)?;
        let wide = wide_dtype(&adopted.handoff);
        let source = adopted.handoff.data_ptr() as usize;
        // JAX takes legacy capsules only (as its `from_dlpack` asks for).
        let capsule = capsule::export(py, adopted, false)?;
        let array = self.jax.call_to_buffer(
            py,
            &capsule,
            device.bind(py),
            ready.as_ref().map(|r| r.raw),
            dl.device_type,
        )?;
        let array = if wide { self.jax.canonical(array)? } else { array };
        if ready.is_none() {
            count_jax_copy(&array, source)?;
        }
        Ok(array)
    }
}

/// Counts (in `handoff.stats()`: `copies`, `bytes_copied`) the copy JAX made when its
/// array does not view the memory at `source`: JAX copies host memory that is not
/// 64-byte aligned (and converts 64-bit types when x64 mode is off), inside jaxlib
/// where handoff cannot see it. On CUDA jaxlib always views.
fn count_jax_copy(array: &Bound<'_, PyAny>, source: usize) -> PyResult<()> {
    let py = array.py();
    let bytes: u64 = array.getattr(intern!(py, "nbytes"))?.extract()?;
    if bytes == 0 {
        return Ok(()); // nothing read, nothing copied
    }
    let at: usize = array.call_method0(intern!(py, "unsafe_buffer_pointer"))?.extract()?;
    if at != source {
        handoff_runtime::stats::count_copy(bytes);
    }
    Ok(())
}

/// A 64-bit element type, which JAX converts to 32 bits when x64 mode is off.
fn wide_dtype(handoff: &Handoff) -> bool {
    let dtype = handoff.dtype();
    dtype.bits == 64 && dtype.code != DLDataTypeCode::COMPLEX || dtype.bits == 128
}

/// The native route from JAX to PyTorch; `None` where it leaves `a` to the public
/// route (an array over several devices, pinned host memory, another platform).
fn jax_to_torch<'py>(
    torch: &Torch,
    jax: &Jax,
    a: &Bound<'py, PyAny>,
    access: Access,
    keep: &mut Option<Py<PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = a.py();
    let Some((dl, _)) = jax.device_of(a)? else { return Ok(None) };
    let (consumer, stream) = if dl.device_type == DLDeviceType::CUDA {
        let (stream, raw) = torch.current_cuda_stream(py, dl)?;
        // As `torch.from_dlpack` names PyTorch's current stream to the producer.
        (stream, Some(if raw == 0 { 1 } else { raw }))
    } else {
        (Stream::host(), None)
    };
    let Ok(capsule) = jax.call_from_buffer(a, stream) else {
        return Ok(None); // a deleted array: the public route raises JAX's own error
    };
    crate::capture::settle_for_graph(&consumer, a, keep)?;
    let taken = capsule::take(&capsule)?;
    // SAFETY: `take` gave us the producer's unconsumed managed tensor.
    let adopted = unsafe { capsule::adopt(taken, &consumer, access) }.map_err(errors::to_py)?;
    check_device(&adopted.handoff, dl, "the JAX array's sharding")?;
    // SAFETY: handoff's own managed tensor, validated, on a device PyTorch supports
    // (CPU or CUDA); PyTorch takes it over.
    unsafe { torch.import(py, capsule::into_managed(adopted)) }.map(Some)
}
