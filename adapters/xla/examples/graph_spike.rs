//! Spike: one PJRT execution captured into a CUDA graph begun on a stream of the
//! caller's (as a PyTorch stream would be), replayed many times, the values checked.
//! GPU only (`--features cuda`, JAX's CUDA plugin); prints `SKIPPED: reason` elsewhere.
//!
//! The step, captured on stream `S` in relaxed mode (PJRT's and handoff's own threads
//! make CUDA calls of their own while the capture runs):
//! 1. the input, a device buffer written on `S`, is handed to XLA: handoff orders XLA's
//!    ready stream after `S` (an event recorded on `S`, waited on by the ready stream:
//!    the fork, which joins that stream to the capture), and PJRT views it with that
//!    stream, so its compute stream waits there too;
//! 2. the program runs (`Kernel::call`, the output an XLA buffer);
//! 3. the output is made ready on `S` (the stream extension's wait on the buffer's
//!    definition event: the join).
//!
//! Then: the graph replayed `--replays` times with a new input written before each
//! (outside the graph, into the same buffer), the output read back every so often and
//! compared with the same math on the host; the host time of a replay beside an eager
//! call. Every step prints what it did or the exact error, so that one run on the GPU
//! machine says where the capture stands. The output buffer (its address is in the
//! graph) and the input stay alive as long as the graph.
//!
//! `XLA_FLAGS=--xla_gpu_enable_command_buffer=` is set before the plugin loads (PJRT's
//! own command buffers would nest a capture in ours) unless `--keep-command-buffers`.
//!
//! ```text
//! graph_spike [--replays 1000] [--keep-command-buffers] [--eager-during] [--mode relaxed|thread_local|global]
//! ```

#[cfg(feature = "cuda")]
mod spike {
    use cudarc::driver::sys::CUstreamCaptureMode;
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
    use handoff_runtime::dtype::DataType;
    use handoff_runtime::{Device, Export, Handoff, Ready, Release, Stream, TensorDesc, stats};
    use handoff_xla::{Buffer, Client, ClientOptions, CompileOptions, Kernel, Plugin, Program};
    use std::sync::Arc;
    use std::time::Instant;

    const N: usize = 1024;

    fn gelu_scale(x: f32) -> f32 {
        let inner = 0.797_884_6 * (x + 0.044715 * x * x * x);
        x * 0.5 * (1.0 + inner.tanh()) * 1.1 + 0.5
    }

    /// The handoff stream of a cudarc stream, keeping it alive.
    fn hstream(s: &Arc<CudaStream>) -> Stream {
        // SAFETY: a stream of the primary context, kept alive by the owner attached.
        unsafe { handoff_runtime::cuda::stream(0, s.cu_stream() as u64) }.unwrap().with_owner(s.clone())
    }

    /// `x` as a hand-off on `s` (the caller keeps `x` alive: the keep-alive is nothing).
    fn handoff_of(x: &CudaSlice<f32>, s: &Arc<CudaStream>) -> handoff_runtime::Result<Handoff> {
        let ptr = {
            let (p, _guard) = x.device_ptr(s);
            p
        };
        Handoff::with_keep_alive(
            (),
            move |_| Ok(TensorDesc::new(ptr as *mut _, Device::Cuda(0), DataType::F32, &[N as i64][..])),
            &hstream(s),
            Ready::Elided,
            Release::AfterConsumer,
        )
    }

    /// One step: `x` through the kernel, the output made ready on `s`; the output buffer
    /// (kept by the caller) and the device address of its data.
    fn step(
        client: &Client,
        kernel: &Kernel,
        x: &CudaSlice<f32>,
        s: &Arc<CudaStream>,
    ) -> Result<(Buffer, u64), String> {
        let input = client
            .import(handoff_of(x, s).map_err(|e| format!("hand-off of the input: {e}"))?)
            .map_err(|e| format!("XLA's view of the input (PJRT_Client_CreateViewOfDeviceBuffer): {e}"))?;
        let [y]: [Buffer; 1] = kernel
            .call([&input])
            .map_err(|e| format!("Kernel::call (PJRT_LoadedExecutable_Execute): {e}"))?;
        let out = y
            .clone()
            .export(&hstream(s))
            .map_err(|e| format!("the output made ready on S (wait_until_buffer_ready_on_stream): {e}"))?;
        let address = out.data_ptr() as u64;
        drop(out);
        // The join of XLA's ready stream, which the input's hand-off forked into S's
        // capture (its wait on S): S waits on what it did since.
        let ready = client
            .device(0)
            .and_then(|d| client.ready_stream(&d))
            .map_err(|e| format!("XLA's ready stream: {e}"))?;
        ready
            .record()
            .and_then(|e| hstream(s).wait(&e))
            .map_err(|e| format!("the join of XLA's ready stream into S: {e}"))?;
        Ok((y, address))
    }

    /// Whether `raw` is capturing, in words (for the spike's report).
    fn capturing(raw: u64) -> String {
        let mut status = cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `raw` is a live stream of the primary context; `status` is a valid out-pointer.
        let r = unsafe { cudarc::driver::sys::cuStreamIsCapturing(raw as _, &mut status) };
        format!("{status:?} ({r:?})")
    }

    /// The graph S is capturing, as far as it goes: every node's type (a kernel's name, a
    /// host node's function), and the leaves S does not depend on (what EndCapture calls
    /// unjoined work). With `join`, S is made to depend on those leaves too. Writes the
    /// graph in DOT to `$SPIKE_DOT` when set.
    fn inspect_capture(raw: u64, join: bool) {
        use cudarc::driver::sys as cu;
        let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut id, mut graph, mut deps, mut edges, mut ndeps) =
            (0u64, std::ptr::null_mut(), std::ptr::null(), std::ptr::null(), 0usize);
        // SAFETY: `raw` is a live stream; every out-pointer is valid.
        let r = unsafe {
            cu::cuStreamGetCaptureInfo_v3(
                raw as _,
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut edges,
                &mut ndeps,
            )
        };
        println!("spike: capture info {r:?}: status {status:?}, id {id}, {ndeps} dependencies of S");
        if graph.is_null() {
            return;
        }
        let s_deps: Vec<cu::CUgraphNode> = if ndeps == 0 {
            Vec::new()
        } else {
            // SAFETY: `deps` holds `ndeps` nodes, valid until the next capture call on S.
            unsafe { std::slice::from_raw_parts(deps, ndeps) }.to_vec()
        };
        if let Some(path) = std::env::var_os("SPIKE_DOT") {
            let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).unwrap();
            // SAFETY: `graph` is the capturing graph; `c` a NUL-terminated path.
            let r = unsafe { cu::cuGraphDebugDotPrint(graph, c.as_ptr(), 1 | 2 | 4 | 8 | 0x400 | 0x800) };
            println!("spike: DOT of the capture: {r:?}");
        }
        let mut n = 0usize;
        // SAFETY: counting the nodes of a live graph.
        unsafe { cu::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) };
        let mut nodes = vec![std::ptr::null_mut(); n];
        // SAFETY: `nodes` has room for `n`.
        unsafe { cu::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) };
        let mut leaves = Vec::new();
        for (i, &node) in nodes.iter().enumerate() {
            let mut ty = cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            let mut out = 0usize;
            // SAFETY: `node` is a node of the graph; out-pointers valid.
            unsafe {
                cu::cuGraphNodeGetType(node, &mut ty);
                cu::cuGraphNodeGetDependentNodes_v2(
                    node,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut out,
                );
            }
            let what = match ty {
                cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => {
                    // SAFETY: a plain C struct, all zeroes valid.
                    let mut p: cu::CUDA_KERNEL_NODE_PARAMS_v2 = unsafe { std::mem::zeroed() };
                    let mut name = std::ptr::null();
                    // SAFETY: a kernel node; `p` and `name` valid out-pointers.
                    unsafe {
                        cu::cuGraphKernelNodeGetParams_v2(node, &mut p);
                        cu::cuFuncGetName(&mut name, p.func);
                    }
                    if name.is_null() {
                        "kernel".to_string()
                    } else {
                        // SAFETY: the driver's NUL-terminated name.
                        format!("kernel {}", unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy())
                    }
                }
                cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST => {
                    // SAFETY: plain C structs, all zeroes valid.
                    let mut p: cu::CUDA_HOST_NODE_PARAMS = unsafe { std::mem::zeroed() };
                    // SAFETY: as above.
                    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
                    // SAFETY: a host node; `p`, `info` valid out-pointers.
                    unsafe {
                        cu::cuGraphHostNodeGetParams(node, &mut p);
                        libc::dladdr(p.fn_.map_or(std::ptr::null(), |f| f as *const libc::c_void), &mut info);
                    }
                    let sym = if info.dli_sname.is_null() {
                        "?".into()
                    } else {
                        // SAFETY: dladdr's NUL-terminated symbol name.
                        unsafe { std::ffi::CStr::from_ptr(info.dli_sname) }.to_string_lossy().into_owned()
                    };
                    format!("host fn {sym}")
                }
                t => format!("{t:?}"),
            };
            let in_s = s_deps.contains(&node);
            println!(
                "spike: node {i}: {what}; {out} dependents{}",
                if in_s { "; S depends on it" } else { "" }
            );
            if out == 0 && !in_s {
                leaves.push(node);
            }
        }
        println!("spike: {} leaves S does not depend on", leaves.len());
        if join && !leaves.is_empty() {
            // SAFETY: `leaves` are nodes of S's capture graph.
            let r = unsafe {
                cu::cuStreamUpdateCaptureDependencies_v2(
                    raw as _,
                    leaves.as_mut_ptr(),
                    std::ptr::null(),
                    leaves.len(),
                    cu::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES as u32,
                )
            };
            println!("spike: S made to depend on them: {r:?}");
        }
    }

    /// Ends S's capture: S is made to depend on every leaf of the captured graph (PJRT's
    /// work on its own streams, forked into the capture and not joined), PJRT's host
    /// callbacks are taken out (a replay would run each again, and each frees its data
    /// when it runs) with their edges bridged, and the graph is instantiated. Returns the
    /// executable graph and the callbacks, in the order they were captured.
    fn end_capture(raw: u64) -> Result<(cudarc::driver::sys::CUgraphExec, Vec<Callback>), String> {
        use cudarc::driver::sys as cu;
        inspect_capture(raw, true);
        let mut graph = std::ptr::null_mut();
        // SAFETY: `raw` is capturing; `graph` a valid out-pointer.
        unsafe { cu::cuStreamEndCapture(raw as _, &mut graph) }
            .result()
            .map_err(|e| format!("cuStreamEndCapture failed: {e:?}"))?;
        let mut n = 0usize;
        // SAFETY: a live graph; counting then listing its nodes.
        unsafe { cu::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) };
        let mut nodes = vec![std::ptr::null_mut(); n];
        // SAFETY: a live graph; listing its nodes into room for `n`.
        unsafe { cu::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) };
        let list = |node, deps: bool| -> Vec<cu::CUgraphNode> {
            let mut k = 0usize;
            // SAFETY: a node of the live graph; `out` null or room for `k`.
            let get = |out: *mut cu::CUgraphNode, k: &mut usize| unsafe {
                if deps {
                    cu::cuGraphNodeGetDependencies_v2(node, out, std::ptr::null_mut(), k)
                } else {
                    cu::cuGraphNodeGetDependentNodes_v2(node, out, std::ptr::null_mut(), k)
                }
            };
            get(std::ptr::null_mut(), &mut k);
            let mut v = vec![std::ptr::null_mut(); k];
            get(v.as_mut_ptr(), &mut k);
            v
        };
        let mut callbacks = Vec::new();
        for node in nodes {
            let mut ty = cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: a node of the live graph.
            unsafe { cu::cuGraphNodeGetType(node, &mut ty) };
            if ty != cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST {
                continue;
            }
            // SAFETY: a plain C struct, all zeroes valid.
            let mut p: cu::CUDA_HOST_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: a host node; `p` a valid out-pointer.
            unsafe { cu::cuGraphHostNodeGetParams(node, &mut p) };
            let (before, after) = (list(node, true), list(node, false));
            for &b in &before {
                for &a in &after {
                    // SAFETY: two nodes of the graph; one edge.
                    unsafe { cu::cuGraphAddDependencies_v2(graph, &b, &a, std::ptr::null(), 1) }
                        .result()
                        .map_err(|e| format!("bridging a host node: {e:?}"))?;
                }
            }
            // SAFETY: the node is removed; its edges were bridged.
            unsafe { cu::cuGraphDestroyNode(node) }
                .result()
                .map_err(|e| format!("cuGraphDestroyNode: {e:?}"))?;
            if let Some(f) = p.fn_ {
                callbacks.push((f, p.userData));
            }
        }
        let mut exec = std::ptr::null_mut();
        // SAFETY: a live graph; `exec` a valid out-pointer.
        unsafe { cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }
            .result()
            .map_err(|e| format!("cuGraphInstantiate failed: {e:?}"))?;
        // SAFETY: the executable graph holds what it needs; the graph is not used again.
        unsafe { cu::cuGraphDestroy(graph) };
        Ok((exec, callbacks))
    }

    type HostFn = unsafe extern "C" fn(*mut std::ffi::c_void);
    /// A host callback taken out of the graph: its function and data.
    type Callback = (HostFn, *mut std::ffi::c_void);

    pub fn main() -> i32 {
        let args: Vec<String> = std::env::args().collect();
        let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
        let replays: usize = flag("--replays").and_then(|v| v.parse().ok()).unwrap_or(1000);
        let mode = match flag("--mode").as_deref() {
            None | Some("relaxed") => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            Some("thread_local") => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            Some("global") => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            Some(m) => {
                eprintln!("--mode {m}: relaxed, thread_local or global");
                return 2;
            }
        };
        if !args.iter().any(|a| a == "--keep-command-buffers") {
            // SAFETY: no other thread runs yet (the plugin is not loaded).
            unsafe { std::env::set_var("XLA_FLAGS", "--xla_gpu_enable_command_buffer=") };
        }
        if !handoff_runtime::cuda::is_available() {
            println!("SKIPPED: no CUDA driver or device");
            return 0;
        }
        let plugin =
            match std::env::var_os("HANDOFF_PJRT_CUDA_PLUGIN").map_or_else(Plugin::cuda, Plugin::load) {
                Ok(p) if p.is_gpu() => p,
                Ok(p) => {
                    println!("SKIPPED: {} is not a GPU plugin", p.path().display());
                    return 0;
                }
                Err(e) => {
                    println!("SKIPPED: {e}");
                    return 0;
                }
            };
        println!(
            "spike: XLA_FLAGS={:?}, capture mode {mode:?}, {replays} replays",
            std::env::var("XLA_FLAGS").ok()
        );
        let client = Client::new(plugin, &ClientOptions::default()).expect("CUDA client");
        let program = Program::text(include_str!("../programs/gelu_scale_f32_1024.mlir"));
        let kernel = Kernel::compile(&client, program, &CompileOptions::default()).expect("compile");
        let ctx = CudaContext::new(0).expect("CUDA context");
        // No per-slice events: `device_ptr` inside the capture would make S wait on the
        // input's write event, recorded outside it (CUDA_ERROR_STREAM_CAPTURE_ISOLATION).
        // SAFETY: every use of the slices below is on the one stream S.
        unsafe { ctx.disable_event_tracking() };
        let s = ctx.new_stream().expect("stream S");
        let input =
            |i: usize| -> Vec<f32> { (0..N).map(|j| ((j + 7 * i) % 97) as f32 / 24.0 - 2.0).collect() };
        let mut x: CudaSlice<f32> = s.clone_htod(&input(0)).expect("input");

        // Eager, twice: compiles, autotunes and grows PJRT's allocator outside the capture.
        for _ in 0..2 {
            if let Err(e) = step(&client, &kernel, &x, &s) {
                println!("RESULT: the eager step failed: {e}");
                return 1;
            }
        }
        s.synchronize().expect("sync");
        let eager_us = {
            let t = Instant::now();
            for _ in 0..100 {
                let _ = step(&client, &kernel, &x, &s);
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / 100.0;
            s.synchronize().expect("sync");
            us
        };

        // The capture.
        let before = stats::stats();
        if let Err(e) = s.begin_capture(mode) {
            println!("RESULT: cuStreamBeginCapture failed: {e:?}");
            return 1;
        }
        let captured = step(&client, &kernel, &x, &s);
        let status = s.capture_status();
        if let Ok(ready) = client.device(0).and_then(|d| client.ready_stream(&d)) {
            println!("spike: in the capture, XLA's ready stream is {}", capturing(ready.raw()));
        }
        let ended = end_capture(s.cu_stream() as u64);
        let ((y_buffer, out_address), (graph, callbacks)) = match (captured, ended) {
            (Ok(c), Ok(g)) => {
                println!(
                    "spike: captured (status during capture {status:?}); {}; {} host callbacks taken out of the graph",
                    stats::stats().since(&before),
                    g.1.len()
                );
                (c, g)
            }
            (Err(e), g) => {
                println!(
                    "RESULT: the step failed while capturing: {e}; capture status {status:?}; end of capture: {:?}",
                    g.err()
                );
                return 1;
            }
            (Ok(_), Err(e)) => {
                println!("RESULT: {e} (status during capture {status:?})");
                return 1;
            }
        };
        // Replays: a new input before each, outside the graph; the output read back.
        let eager_during = args.iter().any(|a| a == "--eager-during");
        let mut right = 0;
        let mut checked = 0;
        let mut replay_us = Vec::new();
        for i in 1..=replays {
            let host = input(i);
            s.memcpy_htod(&host, &mut x).expect("new input");
            let t = Instant::now();
            // SAFETY: `graph` is a live executable graph; S a live stream.
            let r = unsafe { cudarc::driver::sys::cuGraphLaunch(graph, s.cu_stream() as _) };
            if let Err(e) = r.result() {
                println!("RESULT: replay {i}: cuGraphLaunch failed: {e:?}");
                return 1;
            }
            replay_us.push(t.elapsed().as_secs_f64() * 1e6);
            if eager_during
                && i % 100 == 0
                && let Err(e) = step(&client, &kernel, &x, &s)
            {
                println!("RESULT: an eager step while the graph lives failed: {e}");
                return 1;
            }
            if i % 50 == 0 || i == replays {
                let mut got = vec![0f32; N];
                // SAFETY: `out_address` is the output buffer's data (N f32), alive with `y_buffer`.
                let r = unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(&mut got, out_address, s.cu_stream())
                };
                r.expect("read the output");
                s.synchronize().expect("sync");
                checked += 1;
                let ok = got
                    .iter()
                    .zip(&host)
                    .all(|(g, &v)| (g - gelu_scale(v)).abs() <= 1e-5 * (1.0 + gelu_scale(v).abs()));
                if ok {
                    right += 1;
                } else if checked - right <= 3 {
                    println!(
                        "spike: replay {i}: wrong output (first: {} for {})",
                        got[0],
                        gelu_scale(host[0])
                    );
                }
            }
        }
        replay_us.sort_by(f64::total_cmp);
        println!(
            "RESULT: capture works: {right}/{checked} checked replays right of {replays}; host time per replay \
             {:.1} us (median), eager step {eager_us:.1} us; the output buffer {:?} kept alive for the graph",
            replay_us[replay_us.len() / 2],
            y_buffer.shape()
        );
        // The graph's end: PJRT's callbacks run once, on S after the last replay (what they
        // release lived as long as the graph), then an eager step checks PJRT still works.
        for (f, data) in callbacks {
            // SAFETY: each callback was PJRT's, taken out of the graph unrun; it runs once.
            let r = unsafe { cudarc::driver::sys::cuLaunchHostFunc(s.cu_stream() as _, Some(f), data) };
            println!("spike: PJRT's callback launched on S: {r:?}");
        }
        // SAFETY: the graph is not used after this.
        unsafe { cudarc::driver::sys::cuGraphExecDestroy(graph) };
        drop(y_buffer);
        s.synchronize().expect("sync");
        let after = (0..3).all(|_| step(&client, &kernel, &x, &s).is_ok());
        s.synchronize().expect("sync");
        println!("spike: eager steps after the graph's end: {}", if after { "ok" } else { "FAILED" });
        if right == checked && after { 0 } else { 1 }
    }
}

fn main() {
    #[cfg(feature = "cuda")]
    std::process::exit(spike::main());
    #[cfg(not(feature = "cuda"))]
    println!("SKIPPED: built without the `cuda` feature");
}
