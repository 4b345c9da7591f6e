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
    /// The graph `stream` is capturing, if it is: `cuStreamGetCaptureInfo`, which
    /// never blocks. The legacy default stream never captures (CUDA forbids it).
    pub(crate) fn capture_graph(&self, stream: RawStream) -> Result<Option<sys::CUgraph>> {
        if stream == LEGACY || stream == CU_STREAM_LEGACY {
            return Ok(None);
        }
        // A stream handle names its context; only the per-thread default stream is
        // taken from the current one.
        let _ctx = if stream == CU_STREAM_PER_THREAD { Some(self.enter()?) } else { None };
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        count_calls(1);
        // SAFETY: `stream` is a stream of this device's primary context, borrowed from
        // its owner; the out-pointers are valid, the null ones are allowed.
        check(unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream as usize as sys::CUstream,
                &mut status,
                std::ptr::null_mut(),
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
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(Some(graph)),
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
            Ok(Some(graph)) => graph,
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

/// What [`settle_capture`] did to the graph being captured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Leaves of the graph (work no stream of the capture waited on) the stream was
    /// made to depend on.
    pub joined: usize,
    /// Host callbacks taken out of the graph, to run once when it is gone.
    pub callbacks: usize,
}

/// A host node's function once its callback was taken out: does nothing.
unsafe extern "C" fn taken_out(_: *mut c_void) {}

/// The data of a host node whose callback was taken out: what marks it (a static has
/// one address; a function's may differ from one use to another).
static TAKEN_OUT: u8 = 0;

fn taken_out_mark() -> *mut c_void {
    std::ptr::from_ref(&TAKEN_OUT).cast_mut().cast()
}

/// A host callback taken out of a graph, run once when the graph is gone.
struct Callback {
    function: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
}

// SAFETY: the callback was enqueued to run on a CUDA driver thread, so its data is
// meant to be used from a thread other than the one that made it.
unsafe impl Send for Callback {}

impl Callback {
    fn run(self) {
        // SAFETY: the callback, taken out of the graph unrun, runs this once, as it
        // would have when the stream reached it.
        unsafe { (self.function)(self.data) }
    }
}

/// For a library that runs work of its own inside the capture `stream` belongs to, on
/// streams of its own that it forks into the capture (PJRT does: its streams wait on
/// the caller's, and it enqueues host callbacks): makes the capture end cleanly and
/// its graph replayable.
///
/// - `stream` is made to depend on every leaf of the graph it does not depend on yet
///   (work no capturing stream waited on, which `cuStreamEndCapture` refuses as
///   unjoined work).
/// - Every host callback whose function `is_foreign` claims (given its address) is
///   taken out: its node does nothing from now on, and the callback is kept with the
///   graph and run once when the graph is gone. Captured, it would run at every
///   replay; a library's host callbacks release what their work held, once.
///
/// Nothing when `stream` is not capturing. Never blocks.
///
/// ```
/// use handoff_runtime::cuda;
/// if cuda::is_available() {
///     let legacy = cuda::legacy_stream(0).unwrap(); // never captures
///     assert_eq!(cuda::settle_capture(&legacy, |_| true).unwrap(), cuda::Settled::default());
/// }
/// ```
pub fn settle_capture(stream: &crate::Stream, is_foreign: impl Fn(usize) -> bool) -> Result<Settled> {
    let Some((ordinal, raw)) = super::raw_stream(stream) else {
        return Ok(Settled::default());
    };
    let backend = super::backend::backend(ordinal)?;
    let _ctx = backend.enter()?;
    let cu = raw as usize as sys::CUstream;
    let failed = |call: &'static str, e| {
        backend_error(call, e, format_args!("capture of stream {}", describe(ordinal, raw)))
    };
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let (mut graph, mut deps, mut n_deps): (sys::CUgraph, *const sys::CUgraphNode, usize) =
        (std::ptr::null_mut(), std::ptr::null(), 0);
    count_calls(1);
    // SAFETY: a stream of the device's primary context; valid out-pointers.
    check(unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            cu,
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            &mut deps,
            std::ptr::null_mut(),
            &mut n_deps,
        )
    })
    .map_err(|e| failed("cuStreamGetCaptureInfo", e))?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || graph.is_null() {
        return Ok(Settled::default());
    }
    let depends: Vec<sys::CUgraphNode> = if n_deps == 0 {
        Vec::new()
    } else {
        // SAFETY: the driver's array of `n_deps` nodes, valid until the next capture call on `cu`.
        unsafe { std::slice::from_raw_parts(deps, n_deps) }.to_vec()
    };
    let mut settled = Settled::default();
    let mut leaves = Vec::new();
    for node in nodes(graph).map_err(|e| failed("cuGraphGetNodes", e))? {
        if node_kind(node).map_err(|e| failed("cuGraphNodeGetType", e))?
            == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST
        {
            let params = host_params(node).map_err(|e| failed("cuGraphHostNodeGetParams", e))?;
            if take_out_callback(graph, node, params, &is_foreign)
                .map_err(|e| failed("cuGraphHostNodeSetParams", e))?
            {
                settled.callbacks += 1;
            }
        }
        let dependents = edge_count(node, false).map_err(|e| failed("cuGraphNodeGetDependentNodes", e))?;
        if dependents == 0 && !depends.contains(&node) {
            leaves.push(node);
        }
    }
    if !leaves.is_empty() {
        count_calls(1);
        // SAFETY: `leaves` are nodes of the graph `cu` captures; added to its dependencies.
        check(unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(
                cu,
                leaves.as_mut_ptr(),
                std::ptr::null(),
                leaves.len(),
                sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES as u32,
            )
        })
        .map_err(|e| failed("cuStreamUpdateCaptureDependencies", e))?;
        settled.joined = leaves.len();
    }
    Ok(settled)
}

/// The nodes of `graph`.
fn nodes(graph: sys::CUgraph) -> std::result::Result<Vec<sys::CUgraphNode>, cudarc::driver::DriverError> {
    let mut n = 0usize;
    count_calls(1);
    // SAFETY: a live graph; counting only (a null array).
    check(unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) })?;
    if n == 0 {
        return Ok(Vec::new()); // as in `edges`: no list call for a count of zero
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    count_calls(1);
    // SAFETY: room for `n` nodes.
    check(unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) })?;
    nodes.truncate(n);
    Ok(nodes)
}

/// Takes the callback of host node `node` (`params`) out of `graph` when `is_foreign` claims it
/// (and it was not taken already): the node does nothing from now on; the callback is
/// kept with the graph. Whether it took it.
fn take_out_callback(
    graph: sys::CUgraph,
    node: sys::CUgraphNode,
    params: sys::CUDA_HOST_NODE_PARAMS,
    is_foreign: &impl Fn(usize) -> bool,
) -> std::result::Result<bool, cudarc::driver::DriverError> {
    let Some(function) = params.fn_ else { return Ok(false) };
    if params.userData == taken_out_mark() || !is_foreign(function as usize) {
        return Ok(false);
    }
    let nothing = sys::CUDA_HOST_NODE_PARAMS { fn_: Some(taken_out), userData: taken_out_mark() };
    count_calls(1);
    // SAFETY: a host node of the live graph, given a function that does nothing.
    check(unsafe { sys::cuGraphHostNodeSetParams(node, &nothing) })?;
    let callback = Callback { function, data: params.userData };
    if let Err((e, _)) = keep_with(graph, crate::graph::counted(Box::new(move || callback.run()))) {
        // The callback is neither run nor kept: what it would release stays held.
        eprintln!(
            "handoff: a host callback taken out of a graph cannot be kept with it ({e}); it will not run"
        );
    }
    Ok(true)
}

/// Removes from `graph` the host nodes whose callbacks [`settle_capture`] took out
/// (they do nothing, and a host node costs every replay a trip through the driver's
/// callback thread), keeping the order they carried: each node before one of them
/// comes before each node after it. Returns how many it removed. Call it between the
/// end of the capture and the instantiation.
///
/// # Safety
/// `graph` is a live `CUgraph` (a `cudaGraph_t`) that nothing captures into or
/// instantiates meanwhile.
pub unsafe fn prune_taken_out(graph: *mut c_void) -> Result<usize> {
    let graph = graph as sys::CUgraph;
    let failed = |call: &'static str, e| backend_error(call, e, format_args!("graph {graph:p}"));
    let mut removed = 0;
    for node in nodes(graph).map_err(|e| failed("cuGraphGetNodes", e))? {
        if node_kind(node).map_err(|e| failed("cuGraphNodeGetType", e))?
            != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST
        {
            continue;
        }
        let params = host_params(node).map_err(|e| failed("cuGraphHostNodeGetParams", e))?;
        if params.userData != taken_out_mark() {
            continue;
        }
        let before = edges(node, true).map_err(|e| failed("cuGraphNodeGetDependencies", e))?;
        let after = edges(node, false).map_err(|e| failed("cuGraphNodeGetDependentNodes", e))?;
        for b in &before {
            let already = edges(*b, false).map_err(|e| failed("cuGraphNodeGetDependentNodes", e))?;
            // An edge that exists already cannot be added again (CUDA refuses it).
            for a in after.iter().filter(|a| !already.contains(a)) {
                count_calls(1);
                // SAFETY: two nodes of the live graph; one edge between them.
                check(unsafe { sys::cuGraphAddDependencies_v2(graph, b, a, std::ptr::null(), 1) })
                    .map_err(|e| failed("cuGraphAddDependencies", e))?;
            }
        }
        count_calls(1);
        // SAFETY: a node of the live graph, its order kept by the edges just added.
        check(unsafe { sys::cuGraphDestroyNode(node) }).map_err(|e| failed("cuGraphDestroyNode", e))?;
        removed += 1;
    }
    Ok(removed)
}

/// The kind of `node`, a node of a live graph.
fn node_kind(
    node: sys::CUgraphNode,
) -> std::result::Result<sys::CUgraphNodeType, cudarc::driver::DriverError> {
    let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    count_calls(1);
    // SAFETY: a node of a live graph; a valid out-pointer.
    check(unsafe { sys::cuGraphNodeGetType(node, &mut kind) })?;
    Ok(kind)
}

/// The function and data of `node`, a host node of a live graph.
fn host_params(
    node: sys::CUgraphNode,
) -> std::result::Result<sys::CUDA_HOST_NODE_PARAMS, cudarc::driver::DriverError> {
    // SAFETY: a plain C struct, for which all zeroes is valid.
    let mut params: sys::CUDA_HOST_NODE_PARAMS = unsafe { std::mem::zeroed() };
    count_calls(1);
    // SAFETY: a host node of a live graph; a valid out-pointer.
    check(unsafe { sys::cuGraphHostNodeGetParams(node, &mut params) })?;
    Ok(params)
}

/// How many nodes `node` depends on (`before`) or depend on it: one driver call.
fn edge_count(
    node: sys::CUgraphNode,
    before: bool,
) -> std::result::Result<usize, cudarc::driver::DriverError> {
    let mut n = 0usize;
    // SAFETY: `node` is of a live graph, as for every node given here; null arrays
    // ask for the count only.
    unsafe { edge_list(node, before, std::ptr::null_mut(), std::ptr::null_mut(), &mut n) }?;
    Ok(n)
}

/// The nodes `node` depends on (`before`) or that depend on it. The edges' data is
/// read too (CUDA refuses a list without it when an edge has any) and not returned.
/// Only the counting call when there are none: CUDA refuses the list call with arrays
/// given and a count of zero (`CUDA_ERROR_INVALID_VALUE`, seen on an H100).
fn edges(
    node: sys::CUgraphNode,
    before: bool,
) -> std::result::Result<Vec<sys::CUgraphNode>, cudarc::driver::DriverError> {
    let mut n = edge_count(node, before)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: a plain C struct, for which all zeroes is valid.
    let mut data = vec![unsafe { std::mem::zeroed::<sys::CUgraphEdgeData>() }; n];
    // SAFETY: `node` is of a live graph; both arrays have room for `n`.
    unsafe { edge_list(node, before, nodes.as_mut_ptr(), data.as_mut_ptr(), &mut n) }?;
    nodes.truncate(n);
    Ok(nodes)
}

/// `cuGraphNodeGetDependencies` (`before`) or `cuGraphNodeGetDependentNodes` on `node`.
///
/// # Safety
/// `node` is a node of a live graph; `out` and `data` are both null (counting) or
/// have room for `*n`.
unsafe fn edge_list(
    node: sys::CUgraphNode,
    before: bool,
    out: *mut sys::CUgraphNode,
    data: *mut sys::CUgraphEdgeData,
    n: &mut usize,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    count_calls(1);
    // SAFETY: as the caller promised.
    check(unsafe {
        if before {
            sys::cuGraphNodeGetDependencies_v2(node, out, data, n)
        } else {
            sys::cuGraphNodeGetDependentNodes_v2(node, out, data, n)
        }
    })
}

/// What `graph` holds, in words: its node count by kind (`5 nodes: 3 kernel, 2
/// memset`). With `dot`, the graph is also written there in Graphviz form
/// (`cuGraphDebugDotPrint`, verbose), to see what a capture recorded.
///
/// # Safety
/// `graph` is a live `CUgraph` (a `cudaGraph_t`) that nothing captures into meanwhile.
pub unsafe fn describe_graph(graph: *mut c_void, dot: Option<&std::path::Path>) -> Result<String> {
    let graph = graph as sys::CUgraph;
    let failed = |call: &'static str, e| backend_error(call, e, format_args!("graph {graph:p}"));
    if let Some(path) = dot {
        let path =
            std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| Error::Backend {
                backend: "cuda",
                call: "cuGraphDebugDotPrint",
                message: format!("{} has a NUL byte", path.display()),
            })?;
        count_calls(1);
        // SAFETY: a live graph; a NUL-terminated path; 1 is CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE.
        check(unsafe { sys::cuGraphDebugDotPrint(graph, path.as_ptr(), 1) })
            .map_err(|e| failed("cuGraphDebugDotPrint", e))?;
    }
    let nodes = nodes(graph).map_err(|e| failed("cuGraphGetNodes", e))?;
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for &node in &nodes {
        let kind = node_kind(node).map_err(|e| failed("cuGraphNodeGetType", e))?;
        let name = format!("{kind:?}").trim_start_matches("CU_GRAPH_NODE_TYPE_").to_lowercase();
        match kinds.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => kinds.push((name, 1)),
        }
    }
    let list: Vec<String> = kinds.iter().map(|(n, c)| format!("{c} {n}")).collect();
    Ok(format!("{} nodes: {}", nodes.len(), list.join(", ")))
}

/// The file of the loaded library (or program) that holds code at `address`, as the
/// dynamic loader knows it (`dladdr`): to tell which library a host callback found in
/// a captured graph belongs to, for [`settle_capture`]'s `is_foreign`.
pub fn code_library(address: usize) -> Option<std::path::PathBuf> {
    // SAFETY: a plain C struct, for which all zeroes is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only reads the loader's tables; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(address as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: the loader's NUL-terminated file name, valid while the library is loaded.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(std::path::PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(
        name.to_bytes(),
    )))
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
