//! CUDA graph captures ([`crate::graph`]): whether a stream captures, and memory kept
//! with the graph being captured as a CUDA user object, whose destructor the driver
//! runs once the graph and its executable graphs are destroyed and their launches done.

use super::backend::{CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, CudaBackend, LEGACY, describe};
use super::driver::{backend_error, check, count_calls};
use crate::error::{Error, Result};
use crate::graph::Kept;
use crate::stream::RawStream;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

impl CudaBackend {
    /// The graph `stream` is capturing and the capture's id (unique in the process), if
    /// it is: `cuStreamGetCaptureInfo`, which never blocks. The legacy default stream
    /// never captures (CUDA forbids it).
    pub(crate) fn capture_graph(&self, stream: RawStream) -> Result<Option<(sys::CUgraph, u64)>> {
        if stream == LEGACY || stream == CU_STREAM_LEGACY {
            return Ok(None);
        }
        // A stream handle names its context; only the per-thread default stream is
        // taken from the current one.
        let _ctx = if stream == CU_STREAM_PER_THREAD { Some(self.enter()?) } else { None };
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let mut id: sys::cuuint64_t = 0;
        count_calls(1);
        // SAFETY: `stream` is a stream of this device's primary context, borrowed from
        // its owner; the out-pointers are valid, the null ones are allowed.
        check(unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream as usize as sys::CUstream,
                &mut status,
                &mut id,
                &mut graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        })
        .map_err(|e| {
            backend_error("cuStreamGetCaptureInfo", e, format_args!("stream {}", self.describe(stream)))
        })?;
        match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(None),
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(Some((graph, id))),
            _ => Err(Error::Backend {
                backend: "cuda",
                call: "cuStreamGetCaptureInfo",
                message: format!(
                    "the capture on stream {} was invalidated by an earlier error",
                    self.describe(stream)
                ),
            }),
        }
    }

    /// Keeps `release` with the graph `stream` captures (see [`crate::graph`]).
    pub(crate) fn keep(&self, stream: RawStream, release: Kept) -> std::result::Result<(), (Error, Kept)> {
        let graph = match self.capture_graph(stream) {
            Ok(Some((graph, _))) => graph,
            Ok(None) => {
                let e = Error::Backend {
                    backend: "cuda",
                    call: "cuStreamGetCaptureInfo",
                    message: format!("stream {} is not capturing", self.describe(stream)),
                };
                return Err((e, release));
            }
            Err(e) => return Err((e, release)),
        };
        keep_with(graph, release)
    }

    fn describe(&self, stream: RawStream) -> String {
        describe(self.ordinal(), stream)
    }
}

/// Attaches `release` to `graph` (a graph under capture, or built) as a user object
/// the graph owns: run once the graph, and every executable graph made from it, are
/// destroyed and their launches done.
pub(crate) fn keep_with(graph: sys::CUgraph, release: Kept) -> std::result::Result<(), (Error, Kept)> {
    let data = Box::into_raw(Box::new(release));
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    count_calls(1);
    // SAFETY: `data` is a live box, owned by the object from now on (its destructor
    // takes it back); CUDA requires the no-destructor-sync flag.
    let created = check(unsafe {
        sys::cuUserObjectCreate(
            &mut object,
            data.cast(),
            Some(graph_released),
            1,
            sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
        )
    });
    if let Err(e) = created {
        // SAFETY: the object was not made, so `data` is still ours alone.
        let release = *unsafe { Box::from_raw(data) };
        return Err((backend_error("cuUserObjectCreate", e, format_args!("graph {graph:p}")), release));
    }
    count_calls(1);
    // SAFETY: `graph` is a live graph and `object` the user object just made; the one
    // reference is moved to the graph.
    let retained = check(unsafe {
        sys::cuGraphRetainUserObject(
            graph,
            object,
            1,
            sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32,
        )
    });
    retained.map_err(|e| {
        // The object (and `data`, which it owns) is never released: a release that
        // cannot be tied to the graph is not done, as a replay may use its memory.
        let nothing: Kept = Box::new(|| {});
        (backend_error("cuGraphRetainUserObject", e, format_args!("graph {graph:p}")), nothing)
    })
}

/// The user object's destructor. CUDA runs it on a thread of its own, where no CUDA
/// call may be made, so it only passes the release to handoff's thread that does it.
unsafe extern "C" fn graph_released(data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `data` is the box `keep_with` gave the user object, given back once.
        let release = *unsafe { Box::from_raw(data.cast::<Kept>()) };
        releaser().send(release).ok();
    }));
}

/// The thread that does what graphs kept, once they are gone.
fn releaser() -> &'static Sender<Kept> {
    static RELEASER: OnceLock<Sender<Kept>> = OnceLock::new();
    RELEASER.get_or_init(|| {
        let (send, receive) = channel::<Kept>();
        std::thread::Builder::new()
            .name("handoff-graph-release".into())
            .spawn(move || {
                relax_capture_mode();
                for release in receive {
                    if catch_unwind(AssertUnwindSafe(release)).is_err() {
                        eprintln!("handoff: a release kept with a graph panicked");
                    }
                }
            })
            .expect("handoff: cannot start the graph release thread");
        send
    })
}

/// Makes the calling thread's CUDA calls never interfere with another thread's graph
/// capture (`cuThreadExchangeStreamCaptureMode`, relaxed): for handoff's own threads,
/// whose event queries CUDA would otherwise refuse, invalidating the capture, while any
/// thread captures in global mode (`torch.cuda.graph`'s default). Their queries are of
/// events recorded outside any capture (a release on a capturing stream is kept with
/// its graph, never queued behind an event), which a capture does not depend on. Only
/// once the process has loaded the driver (it never loads it itself); whether it did.
pub(crate) fn relax_capture_mode() -> bool {
    if !super::driver::loaded() {
        return false;
    }
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    count_calls(1);
    // SAFETY: `mode` is a valid in/out pointer; the call sets this thread's mode only.
    let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    true
}

/// Runs `f` with the calling thread's capture mode relaxed
/// (`cuThreadExchangeStreamCaptureMode`), then puts the thread's mode back: calls that
/// a capture in global or thread-local mode refuses (a memory allocation, what a
/// library does while it starts) are allowed in `f`, as PyTorch's caching allocator
/// allows its own `cudaMalloc` inside a capture. `f`'s calls must not depend on work
/// being captured. Without the driver loaded, just `f()`.
///
/// ```
/// let two = handoff_runtime::cuda::with_capture_mode_relaxed(|| 1 + 1);
/// assert_eq!(two, 2);
/// ```
pub fn with_capture_mode_relaxed<T>(f: impl FnOnce() -> T) -> T {
    if !super::driver::loaded() {
        return f();
    }
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    count_calls(1);
    // SAFETY: `mode` is a valid in/out pointer; the call sets this thread's mode only.
    let relaxed = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) } == sys::CUresult::CUDA_SUCCESS;
    let result = f();
    if relaxed {
        count_calls(1);
        // SAFETY: as above; `mode` is the thread's mode from before.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    result
}
