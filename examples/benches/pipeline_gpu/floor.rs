//! The floor of each measured path: the bare framework calls a perfect adapter could
//! not avoid, timed in the same loop as handoff's own path (alternating, so both see
//! the same machine), so that each figure is printed as handoff / floor / handoff's
//! own share.
//!
//! - torch -> XLA: PyTorch's current stream, the shim's describe and `recordStream`
//!   on XLA's ready stream, `cuEventRecord` + `cuStreamWaitEvent` (PyTorch's stream ->
//!   XLA's), `PJRT_Client_CreateViewOfDeviceBuffer` with that stream;
//! - XLA -> torch: PyTorch's current stream, the stream extension's
//!   `wait_until_buffer_ready_on_stream`, `IncreaseExternalReferenceCount`,
//!   `OpaqueDeviceMemoryDataPointer`, the shim's `from_blob`;
//! - releasing both: `PJRT_Buffer_Destroy` of the view; dropping the tensor,
//!   `cuEventRecord` on PyTorch's stream (what a deferred release must record) and
//!   `DecreaseExternalReferenceCount`;
//! - the kernel call: torch -> XLA, `PJRT_LoadedExecutable_Execute` (no completion
//!   event), destroying the input view, XLA -> torch;
//! - the execution alone: `PJRT_LoadedExecutable_Execute` on a view, against
//!   handoff's `Executable::execute`.

use cudarc::driver::sys;
use handoff::{Device, Export};
use handoff_examples::model::{self, Pipeline, PipelineError};
use handoff_torch::bare_calls as torch_bare;
use handoff_xla::CallOptions;
use handoff_xla::bare_calls as xla_bare;
use std::time::{Duration, Instant};
use tch::Tensor;

/// One path: handoff's median and the floor's, in µs.
pub struct Row {
    pub key: &'static str,
    pub name: &'static str,
    pub handoff: f64,
    pub floor: f64,
    /// The median of each sample's own difference (handoff's half minus the floor's,
    /// timed back to back in the same turn): the share with the noise both halves
    /// see in common (an execution's ±2 µs) taken out.
    pub paired: f64,
}

/// The median of `a[i] - b[i]`, µs, over samples timed in the same turns.
fn paired_median_us(a: &[Duration], b: &[Duration]) -> f64 {
    let mut d: Vec<f64> =
        a.iter().zip(b).map(|(a, b)| a.as_secs_f64() * 1e6 - b.as_secs_f64() * 1e6).collect();
    if d.is_empty() {
        return f64::NAN;
    }
    d.sort_by(f64::total_cmp);
    let mid = d.len() / 2;
    if d.len().is_multiple_of(2) { (d[mid - 1] + d[mid]) / 2.0 } else { d[mid] }
}

/// A shim call's refusal, as the adapter reports it (the message names the call).
fn shim(e: handoff_torch::TorchError) -> PipelineError {
    handoff::Error::from(e).into()
}

fn failed(what: &str, e: impl std::fmt::Display) -> PipelineError {
    PipelineError::NoCuda(format!("floor: {what}: {e}"))
}

/// A CUDA event of the current (primary) context, for the raw record + wait pair.
fn event() -> Result<sys::CUevent, PipelineError> {
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: a valid out pointer; PyTorch made the primary context current.
    let r = unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(failed("cuEventCreate", format!("{r:?}")));
    }
    Ok(e)
}

/// Runs `a` and `b`, `a` first when `a_first`, and returns both results in that
/// order whichever ran first.
fn in_turns<A, B>(
    a_first: bool,
    a: &dyn Fn() -> Result<A, PipelineError>,
    b: &dyn Fn() -> Result<B, PipelineError>,
) -> Result<(A, B), PipelineError> {
    if a_first {
        let ra = a()?;
        Ok((ra, b()?))
    } else {
        let rb = b()?;
        Ok((a()?, rb))
    }
}

/// Runs `f`, dropping what it returns after the clock stopped: its time.
fn timed_once<R, E>(f: impl FnOnce() -> Result<R, E>) -> Result<Duration, E> {
    let t = Instant::now();
    let r = f()?;
    let d = t.elapsed();
    drop(r);
    Ok(d)
}

/// Times `f`, adding the elapsed time to `into`.
fn timed<R>(into: &mut Vec<Duration>, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    into.push(t.elapsed());
    r
}

/// XLA's ready stream of `p`'s kernel, as the bare calls name it.
fn ready_raw(p: &Pipeline) -> Result<u64, PipelineError> {
    handoff::cuda::raw_stream(p.xla_kernel().ready_stream())
        .map(|(_, raw)| raw)
        .ok_or_else(|| failed("ready stream", "not CUDA"))
}

/// What describe gives a perfect adapter for tensors of `h`'s layout, read once here
/// (dtype, shape, strides), and the ready stream they are handed to.
struct Layout {
    ready_raw: u64,
    dtype: handoff::dtype::DataType,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

impl Layout {
    fn of(p: &Pipeline, h: &Tensor) -> Result<Layout, PipelineError> {
        let probe = handoff_torch::export(h, p.xla_kernel().ready_stream())?;
        let (dtype, shape, strides) = (probe.dtype(), probe.shape().to_vec(), probe.strides().to_vec());
        Ok(Layout { ready_raw: ready_raw(p)?, dtype, shape, strides })
    }
}

/// The bare framework calls of a kernel call on one tensor `h` (the floor's call),
/// with what they need found once: its layout, the streams, an event for the raw
/// record + wait pair.
pub struct Bare<'a> {
    p: &'a Pipeline,
    h: &'a Tensor,
    layout: Layout,
    torch_raw: u64,
    ev_order: sys::CUevent,
}

impl Drop for Bare<'_> {
    fn drop(&mut self) {
        // SAFETY: created in `new`, used by no one else; CUDA frees it once its last
        // record completes.
        unsafe { sys::cuEventDestroy_v2(self.ev_order) };
    }
}

impl<'a> Bare<'a> {
    /// For `h`, handed to `p`'s kernel and back to PyTorch's current stream.
    pub fn new(p: &'a Pipeline, h: &'a Tensor) -> Result<Bare<'a>, PipelineError> {
        let torch_raw = handoff_torch::cuda::current_raw_stream(0)?;
        Ok(Bare { p, h, layout: Layout::of(p, h)?, torch_raw, ev_order: event()? })
    }

    /// PyTorch's side of torch -> XLA ([`bare_export`]): `h`'s data pointer.
    fn torch_export(&self) -> Result<*mut std::ffi::c_void, PipelineError> {
        bare_export(self.h, self.ev_order, self.layout.ready_raw)
    }

    /// The view of `ptr` (`h`'s memory) on XLA's ready stream.
    fn view(&self, ptr: *mut std::ffi::c_void) -> Result<xla_bare::RawBuffer, PipelineError> {
        let (kernel, l) = (self.p.xla_kernel(), &self.layout);
        // SAFETY: `h` is live and of this layout while the caller's view is.
        Ok(unsafe { xla_bare::view(self.p.client(), kernel.device(), ptr, l.dtype, &l.shape, l.ready_raw) }?)
    }

    /// XLA's side of XLA -> torch, to PyTorch's stream: the buffer's data pointer.
    fn xla_export(&self, b: &xla_bare::RawBuffer) -> Result<*mut std::ffi::c_void, PipelineError> {
        Ok(xla_bare::export(self.p.client(), b, self.torch_raw)?)
    }

    /// PyTorch's side of XLA -> torch: PyTorch's stream and `from_blob` of `ptr`, of
    /// `h`'s layout.
    fn torch_view(&self, ptr: *mut std::ffi::c_void) -> Result<Tensor, PipelineError> {
        let _ts = handoff_torch::cuda::current_raw_stream(0)?;
        let l = &self.layout;
        // SAFETY: a buffer's memory, of `h`'s layout, referenced until its release.
        unsafe { torch_bare::from_blob(ptr, &l.shape, &l.strides, l.dtype, Device::Cuda(0)) }.map_err(shim)
    }

    /// The floor's kernel call on `h`: its time, up to the output tensor (then
    /// dropped, and the output's reference given back).
    pub fn call(&self) -> Result<Duration, PipelineError> {
        let t0 = Instant::now();
        let v = self.view(self.torch_export()?)?;
        let outs = xla_bare::execute(self.p.xla_kernel().executable(), &[&v])?;
        drop(v);
        let t = self.torch_view(self.xla_export(&outs[0])?)?;
        let d = t0.elapsed();
        drop(t);
        xla_bare::release(&outs[0])?;
        drop(outs);
        Ok(d)
    }
}

/// A path [`repeat`] repeats: the kernel call, the torch export to XLA's ready
/// stream, or the whole hand-off torch -> XLA (export and view), each handoff's or
/// the floor's bare calls.
#[derive(Debug, Clone, Copy)]
pub enum Looped {
    Call,
    Floor,
    Export,
    ExportFloor,
    ToXla,
    ToXlaFloor,
}

impl Looped {
    pub const ALL: [Looped; 6] =
        [Looped::Call, Looped::Floor, Looped::Export, Looped::ExportFloor, Looped::ToXla, Looped::ToXlaFloor];

    /// The name `--loop` takes.
    pub fn name(self) -> &'static str {
        match self {
            Looped::Call => "call",
            Looped::Floor => "floor",
            Looped::Export => "export",
            Looped::ExportFloor => "export-floor",
            Looped::ToXla => "to-xla",
            Looped::ToXlaFloor => "to-xla-floor",
        }
    }
}

/// Repeats `which` on `h` for `secs` seconds, PJRT's queue kept short as in
/// [`measure`]: a loop for a sampling profiler to run around, one process per path.
pub fn repeat(p: &Pipeline, h: &Tensor, which: Looped, secs: f64) -> Result<LoopTimes, PipelineError> {
    let bare = Bare::new(p, h)?;
    let ready = p.xla_kernel().ready_stream();
    let client = p.client();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut calls = Vec::new();
    while Instant::now() < end {
        calls.push(match which {
            Looped::Call => timed_once(|| p.kernel(h))?,
            Looped::Floor => bare.call()?,
            Looped::Export => timed_once(|| handoff_torch::export(h, ready))?,
            Looped::ExportFloor => timed_once(|| bare.torch_export())?,
            Looped::ToXla => timed_once(|| -> Result<_, PipelineError> {
                Ok(client.import(handoff_torch::export(h, ready)?)?)
            })?,
            Looped::ToXlaFloor => timed_once(|| bare.view(bare.torch_export()?))?,
        });
        if calls.len().is_multiple_of(8) {
            p.synchronize();
        }
    }
    p.synchronize();
    let wall = start.elapsed().as_secs_f64() * 1e6 / calls.len().max(1) as f64;
    let mean = calls.iter().sum::<Duration>().as_secs_f64() * 1e6 / calls.len().max(1) as f64;
    Ok(LoopTimes { calls: calls.len(), mean, median: model::median_us(&mut calls), wall })
}

/// What [`repeat`] measured: the calls made and their host time, µs.
pub struct LoopTimes {
    pub calls: usize,
    pub mean: f64,
    pub median: f64,
    /// The loop's wall time per call (the call, the release of its output, and a
    /// synchronize every eight calls).
    pub wall: f64,
}

/// Measures every path `samples` times; `h` is PyTorch's tensor handed to XLA.
/// Also returns the torch export step by step, timed in the same loop (its company:
/// views, executions, releases), each sample beside the handoff and floor halves, and
/// the kernel call composed by hand, step by step, beside its floor.
pub fn measure<'p>(
    p: &'p Pipeline,
    h: &Tensor,
    samples: usize,
) -> Result<(Vec<Row>, ExportSteps<'p>, CallSteps), PipelineError> {
    let kernel = p.xla_kernel();
    let (client, exe) = (p.client(), kernel.executable());
    let ready = kernel.ready_stream();
    let torch_stream = handoff_torch::current_stream(handoff::Device::Cuda(0))?
        .ok_or_else(|| failed("PyTorch stream", "none"))?;
    let bare = Bare::new(p, h)?;
    // The XLA buffers handed back to PyTorch: one execution's output for handoff, and
    // another for the floor (PJRT's external references of one buffer must not be
    // changed from two threads at once, and handoff changes them on the reaper's).
    let hx = client.import(handoff_torch::export(h, ready)?)?;
    let y = exe.execute(&[&hx])?.remove(0);
    let ev_release = event()?;
    // A view kept for the bare execution.
    let h_ptr = torch_bare::describe(h).map_err(shim)?;
    let view_kept = bare.view(h_ptr)?;
    let y_bare = xla_bare::execute(exe, &[&view_kept])?.remove(0);
    let mut steps = ExportSteps::new(p, h, samples)?;
    p.synchronize();

    let mut d: [Vec<Duration>; 26] = std::array::from_fn(|_| Vec::with_capacity(samples));
    let [
        to_xla_export,
        to_xla_export_f,
        to_xla_import,
        to_xla_import_f,
        to_torch_export,
        to_torch_export_f,
        to_torch_import,
        to_torch_import_f,
        to_xla,
        to_xla_f,
        to_torch,
        to_torch_f,
        release,
        release_f,
        call,
        call_f,
        composed,
        composed_f,
        half,
        half_f,
        direct,
        direct_f,
        named,
        named_f,
        exec,
        exec_f,
    ] = &mut d;
    // The bare steps of each half (PyTorch's side, then XLA's; XLA's, then PyTorch's).
    let bare_torch_export = || bare.torch_export();
    let bare_view = |ptr| bare.view(ptr);
    let bare_xla_export = |b: &xla_bare::RawBuffer| bare.xla_export(b);
    let bare_from_blob = |ptr| bare.torch_view(ptr);
    let bare_release = |view: xla_bare::RawBuffer,
                        t: Tensor,
                        b: &xla_bare::RawBuffer|
     -> Result<(), PipelineError> {
        drop(view);
        drop(t);
        // SAFETY: a live event and PyTorch's stream.
        unsafe { sys::cuEventRecord(ev_release, torch_stream_raw(&torch_stream) as usize as sys::CUstream) };
        Ok(xla_bare::release(b)?)
    };
    // Each path's handoff half and floor half in turns, first one then the other on
    // alternate samples: each sees the same predecessors (the execution before it is
    // still being launched by PJRT's threads, which slows the CUDA calls that follow)
    // as often as the other.
    let handoff_halves = || -> Result<[Duration; 5], PipelineError> {
        let t0 = Instant::now();
        let handoff = handoff_torch::export(h, ready)?;
        let t1 = Instant::now();
        let hx2 = client.import(handoff)?;
        let t2 = Instant::now();
        let handoff = y.clone().export(&torch_stream)?;
        let t3 = Instant::now();
        let yt = handoff_torch::import(handoff)?;
        let t4 = Instant::now();
        drop((hx2, yt));
        let t5 = Instant::now();
        Ok([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4])
    };
    let floor_halves = || -> Result<[Duration; 5], PipelineError> {
        let t0 = Instant::now();
        let ptr = bare_torch_export()?;
        let t1 = Instant::now();
        let v = bare_view(ptr)?;
        let t2 = Instant::now();
        let ptr = bare_xla_export(&y_bare)?;
        let t3 = Instant::now();
        let t = bare_from_blob(ptr)?;
        let t4 = Instant::now();
        bare_release(v, t, &y_bare)?;
        let t5 = Instant::now();
        Ok([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4])
    };
    let handoff_call = || timed_once(|| p.kernel(h));
    // The same calls composed by hand from the public pieces, in one timed region:
    // what the kernel call's own plumbing costs beside them.
    let handoff_composed = || {
        timed_once(|| -> Result<Tensor, PipelineError> {
            let view = client.import(handoff_torch::export(h, ready)?)?;
            let mut outs = exe.execute(&[&view])?;
            drop(view);
            Ok(handoff_torch::import(outs.remove(0).export(&torch_stream)?)?)
        })
    };
    // The kernel call up to its output buffer, then that buffer handed to PyTorch by
    // hand: which half of the call its plumbing costs in.
    let handoff_half = || {
        timed_once(|| -> Result<Tensor, PipelineError> {
            let out: handoff_xla::Buffer = kernel.call1(h)?;
            Ok(handoff_torch::import(out.export(&torch_stream)?)?)
        })
    };
    let floor_call = || bare.call();
    // The kernel call from this crate rather than the pipeline's (where it is
    // compiled), and with PyTorch's stream named for the output instead of taken from
    // the input: whether either changes what the call costs beside the same calls
    // composed by hand.
    let handoff_direct =
        || -> Result<Duration, PipelineError> { Ok(timed_once(|| kernel.call1::<_, _, Tensor, _>(h))?) };
    let named_options = CallOptions::default().output_stream(torch_stream.clone());
    let handoff_named = || -> Result<Duration, PipelineError> {
        Ok(timed_once(|| kernel.call_with::<_, _, [Tensor; 1], _>(&named_options, [h]))?)
    };
    // The kernel call composed by hand from the public pieces, step by step, and its
    // floor the same way: which step of a call costs more than its bare calls, in a
    // call's own company (the output still being launched when it is exported).
    let handoff_call_steps = || -> Result<[Duration; CALL_STEPS], PipelineError> {
        let t0 = Instant::now();
        let handoff = handoff_torch::export(h, ready)?;
        let t1 = Instant::now();
        let view = client.import(handoff)?;
        let t2 = Instant::now();
        let mut outs = exe.execute(&[&view])?;
        let t3 = Instant::now();
        drop(view);
        let t4 = Instant::now();
        let handoff = outs.remove(0).export(&torch_stream)?;
        let t5 = Instant::now();
        let y = handoff_torch::import(handoff)?;
        let t6 = Instant::now();
        drop(y);
        Ok([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5])
    };
    let floor_call_steps = || -> Result<[Duration; CALL_STEPS], PipelineError> {
        let t0 = Instant::now();
        let ptr = bare_torch_export()?;
        let t1 = Instant::now();
        let v = bare_view(ptr)?;
        let t2 = Instant::now();
        let outs = xla_bare::execute(exe, &[&v])?;
        let t3 = Instant::now();
        drop(v);
        let t4 = Instant::now();
        let ptr = bare_xla_export(&outs[0])?;
        let t5 = Instant::now();
        let t = bare_from_blob(ptr)?;
        let t6 = Instant::now();
        drop(t);
        xla_bare::release(&outs[0])?;
        drop(outs);
        Ok([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5])
    };
    let mut call_steps: [[Vec<Duration>; CALL_STEPS]; 2] =
        std::array::from_fn(|_| std::array::from_fn(|_| Vec::with_capacity(samples)));
    // Each composed call's own sum of its steps: the median of a sum is what a call
    // costs; the sum of the steps' medians leaves out how their slow samples add up.
    let mut call_sums: [Vec<Duration>; 2] = std::array::from_fn(|_| Vec::with_capacity(samples));
    let handoff_exec = || -> Result<Duration, PipelineError> { Ok(timed_once(|| exe.execute(&[&hx]))?) };
    let floor_exec =
        || -> Result<Duration, PipelineError> { Ok(timed_once(|| xla_bare::execute(exe, &[&view_kept]))?) };
    for i in 0..samples {
        let handoff_first = i % 2 == 0;
        // The export step by step before both halves on one sample, after them on the
        // next.
        if handoff_first {
            steps.once(h)?;
        }
        let (hh, ff) = in_turns(handoff_first, &handoff_halves, &floor_halves)?;
        if !handoff_first {
            steps.once(h)?;
        }
        for (v, d) in [
            (&mut *to_xla_export, hh[0]),
            (&mut *to_xla_import, hh[1]),
            (&mut *to_torch_export, hh[2]),
            (&mut *to_torch_import, hh[3]),
            (&mut *to_xla, hh[0] + hh[1]),
            (&mut *to_torch, hh[2] + hh[3]),
            (&mut *release, hh[4]),
            (&mut *to_xla_export_f, ff[0]),
            (&mut *to_xla_import_f, ff[1]),
            (&mut *to_torch_export_f, ff[2]),
            (&mut *to_torch_import_f, ff[3]),
            (&mut *to_xla_f, ff[0] + ff[1]),
            (&mut *to_torch_f, ff[2] + ff[3]),
            (&mut *release_f, ff[4]),
        ] {
            v.push(d);
        }
        // The whole kernel call (from the pipeline, from here, with PyTorch's stream
        // named) and the same calls composed by hand (two ways), each beside the
        // floor's call, in the same turns, in an order that rotates every two samples
        // (what runs just before a call changes what it costs); then the execution
        // alone and its floor.
        let mut calls = [
            (&handoff_call as &dyn Fn() -> Result<Duration, PipelineError>, &mut *call, &mut *call_f),
            (&handoff_composed, &mut *composed, &mut *composed_f),
            (&handoff_half, &mut *half, &mut *half_f),
            (&handoff_direct, &mut *direct, &mut *direct_f),
            (&handoff_named, &mut *named, &mut *named_f),
        ];
        calls.rotate_left((i / 2) % 5);
        for (handoff_side, v, vf) in calls {
            let (c, cf) = in_turns(handoff_first, handoff_side, &floor_call)?;
            v.push(c);
            vf.push(cf);
        }
        let (e, ef) = in_turns(handoff_first, &handoff_exec, &floor_exec)?;
        exec.push(e);
        exec_f.push(ef);
        let (cs, csf) = in_turns(handoff_first, &handoff_call_steps, &floor_call_steps)?;
        for ((side, sums), steps) in call_steps.iter_mut().zip(&mut call_sums).zip([cs, csf]) {
            for (v, d) in side.iter_mut().zip(steps) {
                v.push(d);
            }
            sums.push(steps.iter().sum());
        }
        // Keep PJRT's queue of executions short, so that no call waits for room in it.
        if i % 8 == 7 {
            p.synchronize();
        }
    }
    p.synchronize();
    drop(y_bare);
    drop(view_kept);
    drop(hx);
    drop(y);
    // SAFETY: created above, no longer used (the device is idle).
    unsafe { sys::cuEventDestroy_v2(ev_release) };
    let m = |v: &mut Vec<Duration>| model::median_us(v);
    let row = |key, name, handoff: &mut Vec<Duration>, floor: &mut Vec<Duration>| {
        // Paired first: the medians sort the samples.
        let paired = paired_median_us(handoff, floor);
        Row { key, name, handoff: m(handoff), floor: m(floor), paired }
    };
    let rows = vec![
        row("torch_export", "torch -> XLA: torch export", to_xla_export, to_xla_export_f),
        row("xla_view", "torch -> XLA: XLA view", to_xla_import, to_xla_import_f),
        row("torch_to_xla", "hand-off torch -> XLA", to_xla, to_xla_f),
        row("xla_export", "XLA -> torch: XLA export", to_torch_export, to_torch_export_f),
        row("torch_import", "XLA -> torch: torch import", to_torch_import, to_torch_import_f),
        row("xla_to_torch", "hand-off XLA -> torch", to_torch, to_torch_f),
        row("release_both", "releasing both", release, release_f),
        row("kernel_call", "kernel call (hand-offs + execute)", call, call_f),
        row("kernel_call_composed", "  the same calls composed by hand", composed, composed_f),
        row("kernel_call_to_buffer", "  the call to a buffer, then to torch", half, half_f),
        row("kernel_call_direct", "  the call, from the bench's crate", direct, direct_f),
        row("kernel_call_named", "  the call, PyTorch's stream named", named, named_f),
        row("execute", "execute alone", exec, exec_f),
    ];
    let [handoff_steps, floor_steps] = &mut call_steps;
    let [handoff_sums, floor_sums] = &mut call_sums;
    let paired = paired_median_us(handoff_sums, floor_sums);
    let call_steps = CallSteps {
        steps: CALL_STEP_NAMES
            .into_iter()
            .zip(handoff_steps.iter_mut().zip(floor_steps.iter_mut()))
            .map(|(name, (h, f))| (name, m(h), m(f)))
            .collect(),
        whole: (m(handoff_sums), m(floor_sums)),
        paired,
    };
    Ok((rows, steps, call_steps))
}

/// The steps of a kernel call composed by hand.
const CALL_STEPS: usize = 6;
const CALL_STEP_NAMES: [&str; CALL_STEPS] =
    ["torch export", "XLA view", "execute", "drop the view", "XLA export of the output", "torch import"];

/// The composed kernel call, handoff's and the floor's, µs.
pub struct CallSteps {
    /// Each step: name, handoff's median and the floor's.
    pub steps: Vec<(&'static str, f64, f64)>,
    /// The median of each call's sum of its steps, handoff's and the floor's.
    pub whole: (f64, f64),
    /// The median of each call's own difference (handoff's sum minus the floor's).
    pub paired: f64,
}

fn torch_stream_raw(s: &handoff::Stream) -> u64 {
    handoff::cuda::raw_stream(s).map_or(0, |(_, raw)| raw)
}

/// The torch export to XLA's ready stream, step by step, as `handoff_torch::export`
/// takes it: each step timed on its own.
pub struct ExportSteps<'a> {
    ready: &'a handoff::Stream,
    layout: Layout,
    /// The bench's own event, for the raw pair timed beside `order`.
    event: sys::CUevent,
    d: [Vec<Duration>; 9],
}

impl Drop for ExportSteps<'_> {
    fn drop(&mut self) {
        // SAFETY: created in `new`, used by no one else; CUDA frees it once its last
        // record completes.
        unsafe { sys::cuEventDestroy_v2(self.event) };
    }
}

impl<'a> ExportSteps<'a> {
    /// The export's steps in the order taken, then (not part of the export, outside
    /// its sum) the raw record + wait pair on the same two streams and a bare
    /// `cuCtxGetCurrent`, timed right after `order` in the same company: what
    /// `order` costs beyond the driver calls it cannot avoid.
    const NAMES: [&'static str; 9] = [
        "shallow clone",
        "describe",
        "current stream",
        "order",
        "recordStream",
        "DLPack hand-off",
        "release",
        "raw pair beside order",
        "cuCtxGetCurrent beside order",
    ];

    /// For tensors of `h`'s layout, handed to `p`'s kernel's ready stream.
    pub fn new(p: &'a Pipeline, h: &Tensor, samples: usize) -> Result<ExportSteps<'a>, PipelineError> {
        let d = std::array::from_fn(|_| Vec::with_capacity(samples));
        Ok(ExportSteps {
            ready: p.xla_kernel().ready_stream(),
            layout: Layout::of(p, h)?,
            event: event()?,
            d,
        })
    }

    /// Exports `h` once, step by step, and releases it.
    pub fn once(&mut self, h: &Tensor) -> Result<(), PipelineError> {
        use handoff::{Device, Handoff, Ready, Release, TensorDesc};
        let [clone, describe, stream, order, record, wrap, release, pair, ctx] = &mut self.d;
        let c = timed(clone, || h.shallow_clone());
        timed(describe, || handoff_torch::check(&c)).map_err(shim)?;
        let torch_stream = timed(stream, || handoff_torch::current_stream(Device::Cuda(0)))?;
        timed(order, || handoff::order(torch_stream.as_ref(), self.ready))?;
        let torch_raw = torch_stream.as_ref().map_or(0, torch_stream_raw);
        timed(pair, || {
            // SAFETY: a live event and two streams of the primary context.
            unsafe {
                sys::cuEventRecord(self.event, torch_raw as usize as sys::CUstream);
                sys::cuStreamWaitEvent(self.layout.ready_raw as usize as sys::CUstream, self.event, 0);
            }
        });
        timed(ctx, || {
            let mut current: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: a valid out pointer.
            unsafe { sys::cuCtxGetCurrent(&mut current) };
            std::hint::black_box(current);
        });
        timed(record, || torch_bare::record_stream(&c, 0, self.layout.ready_raw)).map_err(shim)?;
        let ptr = torch_bare::describe(&c).map_err(shim)?;
        let (dtype, shape, strides) = (self.layout.dtype, &self.layout.shape, &self.layout.strides);
        let handoff = timed(wrap, || {
            Handoff::with_keep_alive(
                c,
                |_| {
                    Ok(TensorDesc::new(ptr, Device::Cuda(0), dtype, shape.clone())
                        .with_strides(strides.clone()))
                },
                self.ready,
                Ready::Waited,
                Release::Immediately,
            )
        })?;
        timed(release, || drop(handoff));
        Ok(())
    }

    /// Each step's median, µs, in the order taken.
    pub fn medians(mut self) -> Vec<(&'static str, f64)> {
        Self::NAMES.into_iter().zip(self.d.iter_mut()).map(|(n, v)| (n, model::median_us(v))).collect()
    }
}

/// The bare calls of a torch export to XLA's ready stream (`ready_raw`): PyTorch's
/// current stream, the shim's describe and `recordStream`, and the raw record + wait
/// pair on `event` (none when PyTorch's stream is the ready stream). Returns the data
/// pointer.
fn bare_export(
    h: &Tensor,
    event: sys::CUevent,
    ready_raw: u64,
) -> Result<*mut std::ffi::c_void, PipelineError> {
    let ts = handoff_torch::cuda::current_raw_stream(0)?;
    let ptr = torch_bare::describe(h).map_err(shim)?;
    torch_bare::record_stream(h, 0, ready_raw).map_err(shim)?;
    // On one stream there is nothing to order.
    if ts != ready_raw {
        // SAFETY: a live event and two streams of the primary context.
        unsafe {
            sys::cuEventRecord(event, ts as usize as sys::CUstream);
            sys::cuStreamWaitEvent(ready_raw as usize as sys::CUstream, event, 0);
        }
    }
    Ok(ptr)
}

/// The torch export of `h` to XLA's ready stream away from the floor loop's company,
/// export after export (medians of `samples`, µs): each step in the order taken, then
/// the whole export and its floor (the bare calls), each timed in the same loop.
pub fn torch_export_steps(
    p: &Pipeline,
    h: &Tensor,
    samples: usize,
) -> Result<Vec<(&'static str, f64)>, PipelineError> {
    let mut steps = ExportSteps::new(p, h, samples)?;
    let ready = p.xla_kernel().ready_stream();
    let ready_raw = steps.layout.ready_raw;
    let ev = event()?;
    let (mut whole, mut bare) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for i in 0..samples {
        steps.once(h)?;
        whole.push(timed_once(|| handoff_torch::export(h, ready))?);
        bare.push(timed_once(|| bare_export(h, ev, ready_raw))?);
        if i % 1024 == 1023 {
            p.synchronize();
        }
    }
    p.synchronize();
    // SAFETY: an event created above, no longer used (the device is idle).
    unsafe { sys::cuEventDestroy_v2(ev) };
    let mut out = steps.medians();
    out.push(("whole export", model::median_us(&mut whole)));
    out.push(("its floor", model::median_us(&mut bare)));
    Ok(out)
}

/// What runs on a second thread while [`torch_export_in_company`] measures: which
/// kind of neighbour slows the export's CUDA and PyTorch calls.
#[derive(Debug, Clone, Copy)]
pub enum Neighbour {
    /// Nothing.
    None,
    /// A thread that spins on the CPU and calls nothing.
    Spinning,
    /// A thread that queries a CUDA event, then sleeps 5 µs (what the reaper's
    /// sweeps do while releases are pending; Linux's timer slack makes the sleep
    /// ~55 µs).
    QueryingAndSleeping,
    /// A thread that queries a CUDA event in a loop, without a pause.
    QueryingNonStop,
    /// A thread that defers a release into the reaper every ~50 µs (a pipeline step's
    /// release), so that the reaper records, sweeps and releases as in the pipeline.
    Releasing,
}

impl Neighbour {
    pub const ALL: [Neighbour; 5] = [
        Neighbour::None,
        Neighbour::Spinning,
        Neighbour::QueryingAndSleeping,
        Neighbour::QueryingNonStop,
        Neighbour::Releasing,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Neighbour::None => "alone",
            Neighbour::Spinning => "spinning",
            Neighbour::QueryingAndSleeping => "querying_sleeping",
            Neighbour::QueryingNonStop => "querying_nonstop",
            Neighbour::Releasing => "releasing",
        }
    }

    /// Runs on its own thread until `stop`.
    fn run(self, stop: &std::sync::atomic::AtomicBool, stream: &handoff::Stream) {
        use std::sync::atomic::Ordering;
        if matches!(self, Neighbour::None) {
            return;
        }
        let Ok(event) = event() else { return };
        let raw_stream = torch_stream_raw(stream) as usize as sys::CUstream;
        // SAFETY: a live event and stream of the primary context.
        unsafe { sys::cuEventRecord(event, raw_stream) };
        while !stop.load(Ordering::Relaxed) {
            match self {
                Neighbour::None => break,
                Neighbour::Spinning => std::hint::spin_loop(),
                Neighbour::QueryingAndSleeping | Neighbour::QueryingNonStop => {
                    // SAFETY: a live event.
                    unsafe { sys::cuEventQuery(event) };
                    if matches!(self, Neighbour::QueryingAndSleeping) {
                        std::thread::sleep(Duration::from_micros(5));
                    }
                }
                Neighbour::Releasing => {
                    handoff::reaper::release_after(Some(stream), vec![0u8; 64]);
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        handoff::reaper::flush();
        // SAFETY: created above; the reaper's flush left no work of ours behind it.
        unsafe { sys::cuEventDestroy_v2(event) };
    }
}

/// The whole torch export of `h` to XLA's ready stream and its floor (the bare
/// calls), medians of `samples` in µs, timed while `neighbour` runs on a thread of its
/// own (on a PyTorch side stream, so that its work never orders the export's).
pub fn torch_export_in_company(
    p: &Pipeline,
    h: &Tensor,
    samples: usize,
    neighbour: Neighbour,
) -> Result<(f64, f64), PipelineError> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let ready = p.xla_kernel().ready_stream();
    let ready_raw = ready_raw(p)?;
    let side = handoff_torch::cuda::stream_from_pool(0, false)?;
    // SAFETY: one of PyTorch's pool streams, which live as long as the process.
    let side = unsafe { handoff::cuda::stream(0, side) }?;
    let ev = event()?;
    let stop = AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        let neighbour_thread = scope.spawn(|| neighbour.run(&stop, &side));
        std::thread::sleep(Duration::from_millis(5));
        let (mut whole, mut bare) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
        let mut measured = || -> Result<(), PipelineError> {
            for i in 0..samples {
                let (w, b) = in_turns(
                    i % 2 == 0,
                    &|| timed_once(|| handoff_torch::export(h, ready)).map_err(PipelineError::from),
                    &|| timed_once(|| bare_export(h, ev, ready_raw)),
                )?;
                whole.push(w);
                bare.push(b);
                if i % 1024 == 1023 {
                    p.synchronize();
                }
            }
            Ok(())
        };
        let r = measured();
        stop.store(true, Ordering::Relaxed);
        let _ = neighbour_thread.join();
        r.map(|()| (model::median_us(&mut whole), model::median_us(&mut bare)))
    });
    p.synchronize();
    // SAFETY: an event created above, no longer used (the device is idle).
    unsafe { sys::cuEventDestroy_v2(ev) };
    result
}

/// Where [`pipeline_ms`]'s step gives the XLA output back.
#[derive(Debug, Clone, Copy)]
pub enum OutputRelease {
    /// At once, on the stepping thread, after recording an event on PyTorch's stream
    /// (the bare calls of a deferred release, without the deferral).
    Inline,
    /// Through handoff's reaper, as handoff's own step does: an event on PyTorch's
    /// stream, then the release on the reaper's thread once it completed.
    Reaper,
    /// At once, as `Inline`, with PyTorch's `h` dropped on another thread (as a
    /// keep-alive PJRT lets go on its own thread is).
    InlineInputDroppedElsewhere,
}

/// An execution's outputs, whose first one was exported: its external reference
/// given back, then every buffer destroyed, when dropped.
struct Output(Vec<xla_bare::RawBuffer>);

// SAFETY: PJRT buffers may be released and destroyed on any thread (handoff's reaper
// releases its own there).
unsafe impl Send for Output {}

impl Drop for Output {
    fn drop(&mut self) {
        if let Err(e) = xla_bare::release(&self.0[0]) {
            eprintln!("floor: giving back an external reference failed: {e}");
        }
    }
}

/// The pipeline's step made of the bare framework calls instead of handoff's kernel
/// call: PyTorch's matmul, the bare torch -> XLA calls (PyTorch's stream, describe,
/// `recordStream`, the raw record + wait pair unless PyTorch works on XLA's ready
/// stream), the view, `PJRT_LoadedExecutable_Execute`, the bare XLA -> torch calls
/// (`wait_until_buffer_ready_on_stream`, the external reference, `from_blob`),
/// PyTorch's add, and the bare releases (the view, the tensor, an event on PyTorch's
/// stream, the external reference, the output buffer: at once or through the reaper,
/// as `release` says). The same GPU work and the same
/// cross-framework dependencies as the handoff step: the step's floor. Median ms per
/// step over `reps` runs of `iters` steps, timed as the handoff step is, and the
/// median host µs of the output's release.
pub fn pipeline_ms(
    p: &Pipeline,
    x0: &Tensor,
    iters: usize,
    reps: usize,
    release: OutputRelease,
) -> Result<(f64, f64), PipelineError> {
    let kernel = p.xla_kernel();
    let (client, device, exe) = (p.client(), kernel.device(), kernel.executable());
    let Layout { ready_raw, dtype, shape, strides } = Layout::of(p, x0)?;
    let (ev_order, ev_release) = (event()?, event()?);
    let torch_stream = handoff_torch::current_stream(handoff::Device::Cuda(0))?
        .ok_or_else(|| failed("PyTorch stream", "none"))?;
    let releases = std::cell::RefCell::new(Vec::with_capacity(iters * reps + 3));
    // A thread that drops what it is sent.
    let elsewhere = matches!(release, OutputRelease::InlineInputDroppedElsewhere).then(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Tensor>();
        (tx, std::thread::spawn(move || rx.into_iter().for_each(drop)))
    });
    let step = |x: &Tensor| -> Result<Tensor, PipelineError> {
        let h = p.matmul(x)?;
        let ptr = bare_export(&h, ev_order, ready_raw)?;
        // SAFETY: `h` is a live CUDA tensor of this layout (the matmul keeps `x`'s),
        // kept until the view is dropped below; `recordStream` covers XLA's use.
        let view = unsafe { xla_bare::view(client, device, ptr, dtype, &shape, ready_raw) }?;
        let outs = xla_bare::execute(exe, &[&view])?;
        drop(view);
        let torch_raw = handoff_torch::cuda::current_raw_stream(0)?;
        let y_ptr = xla_bare::export(client, &outs[0], torch_raw)?;
        // SAFETY: the output buffer's memory, of `h`'s layout, referenced until released below.
        let y = unsafe { torch_bare::from_blob(y_ptr, &shape, &strides, dtype, Device::Cuda(0)) }
            .map_err(shim)?;
        let out = x.f_add(&y)?;
        drop(y);
        match &elsewhere {
            Some((tx, _)) => tx.send(h).map_err(|e| failed("dropping elsewhere", e))?,
            None => drop(h),
        }
        let t = Instant::now();
        match release {
            OutputRelease::Inline | OutputRelease::InlineInputDroppedElsewhere => {
                // SAFETY: a live event and PyTorch's stream.
                unsafe { sys::cuEventRecord(ev_release, torch_raw as usize as sys::CUstream) };
                xla_bare::release(&outs[0])?;
                drop(outs);
            }
            OutputRelease::Reaper => handoff::reaper::release_after(Some(&torch_stream), Output(outs)),
        }
        releases.borrow_mut().push(t.elapsed());
        Ok(out)
    };
    // Timed as handoff's step is.
    let ms = super::timed(p, x0, iters, reps, step)?;
    // SAFETY: events created above, no longer used (the device is idle).
    unsafe {
        sys::cuEventDestroy_v2(ev_order);
        sys::cuEventDestroy_v2(ev_release);
    }
    if let Some((tx, thread)) = elsewhere {
        drop(tx);
        thread.join().map_err(|_| failed("dropping elsewhere", "the thread panicked"))?;
    }
    let release_us = model::median_us(&mut releases.borrow_mut());
    Ok((ms, release_us))
}

/// On which thread PJRT lets go of a view's keep-alive in a kernel call's pattern
/// (view, execute, drop the view, drop the output): of `n` views of `h`, how many
/// keep-alives were dropped on the thread that made the view, and how many on another.
pub fn view_release_threads(p: &Pipeline, h: &Tensor, n: usize) -> Result<(usize, usize), PipelineError> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Probe {
        inner: handoff::Handoff,
        here: std::thread::ThreadId,
        counts: Arc<[AtomicUsize; 2]>,
    }
    impl Drop for Probe {
        fn drop(&mut self) {
            let elsewhere = std::thread::current().id() != self.here;
            self.counts[usize::from(elsewhere)].fetch_add(1, Ordering::SeqCst);
        }
    }
    let kernel = p.xla_kernel();
    let ready = kernel.ready_stream();
    let counts = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    for _ in 0..n {
        let probe = Probe {
            inner: handoff_torch::export(h, ready)?,
            here: std::thread::current().id(),
            counts: counts.clone(),
        };
        let handoff = handoff::Handoff::with_keep_alive(
            probe,
            |p| Ok(p.inner.desc()),
            ready,
            handoff::Ready::Elided,
            handoff::Release::Immediately,
        )?;
        let view = p.client().import(handoff)?;
        let outs = kernel.executable().execute(&[&view])?;
        drop(view);
        drop(outs);
    }
    p.synchronize();
    let end = Instant::now() + Duration::from_secs(1);
    while counts[0].load(Ordering::SeqCst) + counts[1].load(Ordering::SeqCst) < n && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok((counts[0].load(Ordering::SeqCst), counts[1].load(Ordering::SeqCst)))
}
