//! One CUDA graph for a step that mixes PyTorch's work with other libraries' (an XLA
//! program through handoff-xla's `Kernel::call`, a cudarc kernel), captured once and
//! replayed as one launch, which removes the host work of every launch in the step.
//!
//! The capture goes through PyTorch's own `at::cuda::CUDAGraph`, so what PyTorch
//! allocates during the step comes from the graph's private memory pool, as under
//! `torch.cuda.graph`. Hand-offs inside the capture keep their order as graph edges;
//! what they release is kept with the graph (see `handoff_runtime::graph`), and an XLA
//! execution's own streams and host callbacks are settled when its outputs come back
//! to PyTorch (handoff-xla).
//!
//! A graph replays the same work on the same memory, so [`Graph`] owns everything the
//! replays touch:
//! - its **inputs**: tensors whose contents [`Graph::set_input`] replaces before a
//!   replay (a copy, checked: same shape, dtype and device);
//! - its **outputs**: what the step returned, read after a replay;
//! - the **step** itself, with everything it moved in (weights, an XLA kernel, whose
//!   executable the graph runs): the step is `'static`, so nothing it uses can be
//!   dropped while the graph lives.
//!
//! Dropping a graph releases what it kept once the driver says the graph is gone (its
//! launches done), on a thread of handoff's; a program that exits right after can wait
//! for that with `handoff_runtime::graph::wait_released`.
//!
//! XLA's scratch memory: XLA gives an execution's scratch back to its allocator once the
//! execution is enqueued, and every replay writes it again. With
//! `handoff_xla::capture_clients` on, the step's kernels run on a PJRT client the graph
//! holds alone, so nothing made outside the graph can sit in that memory (the capture is
//! announced to them: `handoff_runtime::graph::announce`). Off (the default, as in the
//! Python package), an XLA output made outside the graph after the capture and still
//! alive at a replay can sit in that memory: read it, or copy it, before the next replay
//! (docs/RELIABILITY.md, CUDA graphs).
//!
//! Before the capture the step runs eagerly ([`CaptureOptions::warmup`] times, once by
//! default), so that lazy initialisation (cuBLAS workspaces, XLA's compilation and
//! autotuning) happens outside the graph. The capture runs on a side stream of
//! PyTorch's, ordered after the current one; a replay runs on PyTorch's current stream.
//!
//! ```no_run
//! # fn main() -> handoff_runtime::Result<()> {
//! use handoff_torch::graph::{CaptureOptions, Graph};
//! use tch::{Device, Kind, Tensor};
//! let w = Tensor::randn([256, 256], (Kind::Float, Device::Cuda(0)));
//! let x = Tensor::zeros([256, 256], (Kind::Float, Device::Cuda(0)));
//! let mut graph = Graph::capture(0, vec![x], &CaptureOptions::default(), move |inputs| {
//!     Ok(vec![inputs[0].matmul(&w).relu()])
//! })?;
//! graph.set_input(0, &Tensor::ones([256, 256], (Kind::Float, Device::Cuda(0))))?;
//! graph.replay()?;
//! let y = &graph.outputs()[0];
//! # let _ = y; Ok(()) }
//! ```

use crate::error::TorchError;
use crate::ffi;
use std::ffi::c_void;
use std::ptr::NonNull;
use tch::Tensor;

/// How a stream capture treats CUDA calls that are not allowed while capturing
/// (`cudaStreamCaptureMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// Refused on any thread while any capture runs. PJRT's own threads make such
    /// calls, so a step with an XLA execution fails in this mode.
    Global,
    /// Refused on the capturing thread only: a host sync in the step fails the
    /// capture; other threads (PJRT's, handoff's) go on.
    #[default]
    ThreadLocal,
    /// Never refused (CUDA still fails what cannot be captured).
    Relaxed,
}

/// Options of [`Graph::capture`].
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    mode: CaptureMode,
    warmup: usize,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions { mode: CaptureMode::default(), warmup: 1 }
    }
}

impl CaptureOptions {
    /// The capture mode (default: [`CaptureMode::ThreadLocal`]).
    pub fn mode(mut self, mode: CaptureMode) -> Self {
        self.mode = mode;
        self
    }

    /// How many times the step runs eagerly before the capture (default 1).
    pub fn warmup(mut self, runs: usize) -> Self {
        self.warmup = runs;
        self
    }
}

/// A captured step: one CUDA graph with the inputs, outputs and step it replays
/// (see the [module docs](self)).
pub struct Graph {
    /// The `at::cuda::CUDAGraph` (the shim's), destroyed first when the graph drops.
    raw: NonNull<c_void>,
    ordinal: u32,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    /// The step, with what it moved in: used by every replay.
    _step: Option<Box<Step>>,
    /// What the graph holds, in words.
    description: String,
}

/// Set to a file path, [`Graph::capture`] writes each captured graph there in Graphviz
/// form (the last capture's wins), to see what a step recorded.
pub const DOT_ENV: &str = "HANDOFF_GRAPH_DOT";

type Step = dyn FnMut(&[Tensor]) -> handoff_runtime::Result<Vec<Tensor>>;

impl Graph {
    /// Captures `step` on CUDA device `ordinal`, given `inputs`, into one graph.
    ///
    /// `step` runs `options.warmup` times eagerly, then once under the capture; what it
    /// returns the last time are the graph's outputs. Errors name what failed: the
    /// step (its own error, or CUDA's refusal of a call inside the capture, such as a
    /// host sync), the end of the capture (work of a stream that was never joined), or
    /// PyTorch's graph itself.
    pub fn capture<F>(
        ordinal: u32,
        inputs: Vec<Tensor>,
        options: &CaptureOptions,
        step: F,
    ) -> handoff_runtime::Result<Graph>
    where
        F: FnMut(&[Tensor]) -> handoff_runtime::Result<Vec<Tensor>> + 'static,
    {
        crate::init();
        let mut step: Box<Step> = Box::new(step);
        let side = crate::cuda::stream_from_pool(ordinal, false)?;
        let current = crate::cuda::current_raw_stream(ordinal)?;
        // The capture's stream starts after the work that wrote the inputs.
        order_after(ordinal, side, current)?;
        let _on_side = crate::cuda::use_raw_stream(ordinal, side)?;
        for _ in 0..options.warmup {
            step(&inputs)
                .map_err(|e| graph_error("the step, run eagerly before the capture", e.to_string()))?;
        }
        let raw = new_graph()?;
        let mut graph =
            Graph { raw, ordinal, inputs, outputs: Vec::new(), _step: None, description: String::new() };
        let mode = match options.mode {
            CaptureMode::Global => 0,
            CaptureMode::ThreadLocal => 1,
            CaptureMode::Relaxed => 2,
        };
        // SAFETY: a live CUDAGraph; the shim catches every exception.
        ffi::check("CUDAGraph::capture_begin", unsafe {
            ffi::hf_graph_capture_begin(raw.as_ptr(), index(ordinal), mode)
        })?;
        // Announced: a kernel called in the step can give the capture memory of its own
        // (handoff-xla's capture clients).
        let outputs = match capture_stream(ordinal, side) {
            Ok(stream) => handoff_runtime::graph::announce(&stream, || step(&graph.inputs)),
            Err(e) => Err(e),
        };
        // Work forked into the capture and not joined yet (an XLA program whose outputs
        // did not come back to PyTorch) joins the capture's stream.
        let settled =
            capture_stream(ordinal, side).and_then(|s| handoff_runtime::cuda::settle_capture(&s, |_| false));
        let mut cuda_graph = std::ptr::null_mut();
        // SAFETY: a live CUDAGraph that is capturing; the shim catches every exception.
        let ended = ffi::check("CUDAGraph::capture_end", unsafe {
            ffi::hf_graph_capture_end(raw.as_ptr(), &mut cuda_graph)
        });
        let outputs =
            outputs.map_err(|e| graph_error("the step, under the capture", capture_hint(e.to_string())))?;
        settled?;
        ended.map_err(|e| graph_error("the end of the capture", capture_hint(e.to_string())))?;
        // SAFETY: the graph PyTorch just captured, not instantiated yet.
        let pruned = unsafe { handoff_runtime::cuda::prune_taken_out(cuda_graph) }?;
        let dot = std::env::var_os(DOT_ENV).map(std::path::PathBuf::from);
        // SAFETY: as above.
        let nodes = unsafe { handoff_runtime::cuda::describe_graph(cuda_graph, dot.as_deref()) }?;
        graph.description = format!("{nodes} ({pruned} host callbacks of other libraries taken out)");
        // SAFETY: a live CUDAGraph whose capture ended; the shim catches every exception.
        ffi::check("CUDAGraph::instantiate", unsafe { ffi::hf_graph_instantiate(raw.as_ptr()) })?;
        graph.outputs = outputs;
        graph._step = Some(step);
        Ok(graph)
    }

    /// What the graph holds: its nodes by kind (`7 nodes: 5 kernel, 2 empty`), and how
    /// many host callbacks of other libraries (PJRT's) were taken out of it.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The CUDA device the graph runs on.
    pub fn device(&self) -> u32 {
        self.ordinal
    }

    /// The inputs the graph reads (see [`set_input`](Self::set_input)).
    pub fn inputs(&self) -> &[Tensor] {
        &self.inputs
    }

    /// The outputs the graph writes, current after a replay's work is done on the
    /// stream it ran on.
    pub fn outputs(&self) -> &[Tensor] {
        &self.outputs
    }

    /// Copies `value` into input `index` on PyTorch's current stream, for the next
    /// replay. Refused unless `value` has the input's shape, dtype and device: the graph
    /// was captured for those.
    pub fn set_input(&mut self, index: usize, value: &Tensor) -> handoff_runtime::Result<()> {
        let Some(input) = self.inputs.get_mut(index) else {
            return Err(graph_error(
                &format!("input {index}"),
                format!("the graph has {} inputs", self.inputs.len()),
            ));
        };
        let (want, got) =
            ((input.size(), input.kind(), input.device()), (value.size(), value.kind(), value.device()));
        if want != got {
            return Err(graph_error(
                &format!("input {index}"),
                format!(
                    "shape {:?}, dtype {:?} on {:?} given; the graph was captured for shape {:?}, dtype {:?} on {:?} \
                     (capture another graph for another shape)",
                    got.0, got.1, got.2, want.0, want.1, want.2
                ),
            ));
        }
        input.copy_(value);
        Ok(())
    }

    /// Replays the step: one graph launch on PyTorch's current stream of the graph's
    /// device. The host does not wait.
    pub fn replay(&self) -> handoff_runtime::Result<()> {
        // SAFETY: a live, instantiated CUDAGraph; the shim catches every exception.
        ffi::check("CUDAGraph::replay", unsafe { ffi::hf_graph_replay(self.raw.as_ptr()) })?;
        Ok(())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: the CUDAGraph, destroyed once; what its replays use is kept by the
        // fields dropped after it, and by the driver until its launches are done.
        if let Err(e) = ffi::check("CUDAGraph::~CUDAGraph", unsafe { ffi::hf_graph_free(self.raw.as_ptr()) })
        {
            eprintln!("handoff-torch: destroying a CUDA graph failed ({e})");
        }
    }
}

fn index(ordinal: u32) -> i32 {
    i32::try_from(ordinal).unwrap_or(i32::MAX)
}

fn graph_error(what: &str, message: String) -> handoff_runtime::Error {
    TorchError::Graph { what: what.to_string(), message }.into()
}

/// CUDA's message, with what usually causes it.
fn capture_hint(message: String) -> String {
    if message.contains("capture") || message.contains("CAPTURE") {
        format!(
            "{message} (inside a capture nothing may wait on the device - a host sync, reading a tensor's value, \
             .item() - and every stream forked into the capture must be joined back)"
        )
    } else {
        message
    }
}

fn new_graph() -> handoff_runtime::Result<NonNull<c_void>> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the shim catches every exception.
    ffi::check("CUDAGraph::CUDAGraph", unsafe { ffi::hf_graph_new(&mut raw) })?;
    NonNull::new(raw).ok_or_else(|| graph_error("PyTorch's graph", "the shim made no graph".into()))
}

/// Makes `stream` wait for the work enqueued on `after` so far (no host wait).
fn order_after(ordinal: u32, stream: u64, after: u64) -> handoff_runtime::Result<()> {
    let (s, a) = (capture_stream(ordinal, stream)?, capture_stream(ordinal, after)?);
    s.wait(&a.record()?)
}

/// A handoff stream of one of PyTorch's streams (which live as long as the process).
fn capture_stream(ordinal: u32, raw: u64) -> handoff_runtime::Result<handoff_runtime::Stream> {
    // SAFETY: PyTorch's pool and default streams live as long as the process.
    unsafe { handoff_runtime::cuda::stream(ordinal, raw) }
}
