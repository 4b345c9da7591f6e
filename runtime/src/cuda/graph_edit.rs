//! Reading and editing a graph under capture or captured ([`crate::graph`]): a
//! library's work joined to the capture and its host callbacks taken out
//! ([`settle_capture`]), their no-op nodes removed ([`prune_taken_out`]), what a graph
//! holds ([`describe_graph`]) and which library a callback's code belongs to
//! ([`code_library`]).

use super::backend::describe;
use super::driver::{backend_error, check, count_calls};
use super::graph::keep_with;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::c_void;

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
pub fn settle_capture(stream: &crate::stream::Stream, is_foreign: impl Fn(usize) -> bool) -> Result<Settled> {
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
    if let Err((e, _)) = keep_with(graph, crate::stream::counted(Box::new(move || callback.run()))) {
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
