//! JAX work inside a PyTorch CUDA graph capture (`torch.cuda.graph`): the capture
//! settled when a JAX array crosses to a capturing stream, and the nodes of the host
//! callbacks taken out removed before the graph is instantiated.

use crate::errors;
use handoff_runtime::Stream;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Inside a CUDA graph capture on PyTorch's stream (`torch.cuda.graph`), once JAX's
/// array is ready on `consumer`: JAX's work, forked into the capture by the crossings,
/// joins it, and the host callbacks JAX's CUDA plugin enqueued are taken out of the
/// graph, to run once when it is gone (`handoff_runtime::cuda::settle_capture`); the
/// array, which every replay writes, is kept with the graph, and so is `also` (taken:
/// kept once). The first time in the process that the array is not on a capture client
/// of handoff's (it came from JAX's own client, not from a crossing inside the capture),
/// a [`CaptureWarning`](errors::CaptureWarning). Nothing otherwise.
pub(crate) fn settle_for_graph(
    consumer: &Stream,
    a: &Bound<'_, PyAny>,
    also: &mut Option<Py<PyAny>>,
) -> PyResult<()> {
    if consumer.is_host() || !consumer.is_capturing().map_err(errors::to_py)? {
        return Ok(());
    }
    let jax_code = |code: usize| {
        handoff_runtime::cuda::code_library(code).is_some_and(|p| p.to_string_lossy().contains("jax"))
    };
    handoff_runtime::cuda::settle_capture(consumer, jax_code).map_err(errors::to_py)?;
    let kept = (a.clone().unbind(), also.take());
    handoff_runtime::graph::keep(consumer, kept).map_err(errors::to_py)?;
    let py = a.py();
    match crate::jax_api::Jax::if_imported(py)? {
        Some(Ok(jax)) if jax.on_capture_client(a)? => Ok(()),
        _ => warn_of_scratch_reuse(py),
    }
}

/// Once per process, at the first work of JAX's own client settled into a capture: a
/// [`CaptureWarning`](errors::CaptureWarning). XLA gives a captured execution's scratch
/// memory back to its allocator as soon as the execution is enqueued, in the order of
/// XLA's own stream; every replay writes that memory again, on PyTorch's stream, and
/// XLA's allocator gives it to the next arrays it makes. With capture clients on
/// (`handoff.capture_clients`), work on arrays that crossed inside the capture runs on
/// the capture's own client, whose memory nothing else allocates, and does not warn;
/// work on JAX's own client does (docs/RELIABILITY.md, CUDA graphs). The warning says
/// what to keep apart.
fn warn_of_scratch_reuse(py: Python<'_>) -> PyResult<()> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        return Ok(());
    }
    PyErr::warn(
        py,
        &py.get_type::<errors::CaptureWarning>(),
        c"JAX work on arrays of JAX's own client was captured into a CUDA graph (arrays JAX \
          made itself, not handed over by handoff inside the capture). XLA reuses a captured \
          execution's scratch memory for the arrays it makes next, and every replay writes \
          that memory again: a JAX array made after this capture and still alive at a \
          replay, or a tensor handed over from one, can be overwritten. Finish with such \
          results before replaying, or switch capture clients on \
          (handoff.capture_clients(enabled=True)): work on arrays handed over inside a \
          capture then runs on a client of the graph's own.",
        1,
    )
}

/// Removes from a captured PyTorch graph the host nodes whose callbacks handoff took
/// out during the capture (JAX's, which must run once, not at every replay: they do
/// nothing now, and each would cost every replay a trip through the driver's callback
/// thread). For a `torch.cuda.CUDAGraph(keep_graph=True)` whose capture ended, before
/// its `instantiate()`. Returns how many it removed.
///
/// ```python
/// g = torch.cuda.CUDAGraph(keep_graph=True)
/// with torch.cuda.graph(g):
///     y = layer(x)
/// handoff.prune_graph(g)
/// g.instantiate()
/// ```
#[pyfunction]
pub(crate) fn prune_graph(graph: &Bound<'_, PyAny>) -> PyResult<usize> {
    let raw: usize = graph.call_method0(pyo3::intern!(graph.py(), "raw_cuda_graph"))?.extract()?;
    // SAFETY: PyTorch's cudaGraph_t of a capture that ended (it raises otherwise); an
    // executable graph made from it already is a copy, which pruning leaves as it is.
    unsafe { handoff_runtime::cuda::prune_taken_out(raw as *mut std::ffi::c_void) }.map_err(errors::to_py)
}
