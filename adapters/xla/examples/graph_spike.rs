//! Spike: one PJRT execution captured into a CUDA graph begun on a stream of the
//! caller's (as a PyTorch stream would be), replayed many times, the values checked.
//! GPU only (`--features cuda`, JAX's CUDA plugin); prints `SKIPPED: reason` elsewhere.
//!
//! The step, captured on stream `S` (relaxed mode by default: PJRT's and handoff's own
//! threads make CUDA calls of their own while the capture runs):
//! 1. the input, a device buffer written on `S`, is handed to XLA: handoff orders XLA's
//!    ready stream after `S` (the fork, which joins that stream to the capture), and
//!    PJRT views it with that stream, so its compute stream waits there too;
//! 2. the program runs (`Kernel::call`, the output an XLA buffer);
//! 3. the output is made ready on `S`; `S` capturing, handoff settles the capture
//!    (`handoff_xla`'s capture module): `S` waits on XLA's ready stream and on every
//!    leaf of the graph, and PJRT's host callbacks are taken out, to run once when the
//!    graph is gone. Releases on `S` are kept with the graph (`stats().releases_with_graph`).
//!
//! Then: the graph replayed `--replays` times with a new input written before each
//! (outside the graph, into the same buffer), the output read back every so often and
//! compared with the same math on the host; the host time of a replay beside an eager
//! call; eager steps while the graph lives (`--eager-during`) and after it is gone.
//! Every step prints what it did or the exact error, so one run on the GPU machine
//! says where the capture stands.
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
    /// unjoined work). Writes the graph in DOT to `$SPIKE_DOT` when set.
    fn inspect_capture(raw: u64) {
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
                    let file = if info.dli_fname.is_null() {
                        "?".into()
                    } else {
                        // SAFETY: dladdr's NUL-terminated file name.
                        unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()
                    };
                    format!("host fn {sym} in {file}")
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
    }

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
        inspect_capture(s.cu_stream() as u64);
        let graph = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        let ((y_buffer, out_address), graph) = match (captured, graph) {
            (Ok(c), Ok(Some(g))) => {
                println!(
                    "spike: captured (status during capture {status:?}); {}",
                    stats::stats().since(&before)
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
            (Ok(_), Ok(None)) => {
                println!("RESULT: the capture ended with no graph (status during capture {status:?})");
                return 1;
            }
            (Ok(_), Err(e)) => {
                println!(
                    "RESULT: cuStreamEndCapture/cuGraphInstantiate failed: {e:?} (status during capture {status:?})"
                );
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
            if let Err(e) = graph.launch() {
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
        // The graph's end: what it kept (the output, the input's view, PJRT's callbacks)
        // is released once the driver says the graph is gone; then eager steps check
        // that PJRT still works.
        drop(graph);
        drop(y_buffer);
        s.synchronize().expect("sync");
        std::thread::sleep(std::time::Duration::from_millis(200));
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
