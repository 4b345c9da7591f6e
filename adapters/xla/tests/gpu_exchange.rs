//! GPU tests (H200, JAX's CUDA plugin; build with `--features cuda`). Each prints
//! `SKIPPED: reason` and passes when there is no CUDA plugin or device.
#![cfg(feature = "cuda")]

mod common;

use common::*;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use handoff_runtime::dtype::DataType;
use handoff_runtime::{Device, Export, Handoff, Ready, Release, Stream, TensorDesc, reaper, stats};
use handoff_xla::{Client, ClientOptions, Plugin};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `spin_fill(ptr, n, value, ns)`: each thread spins `ns` nanoseconds on the global
/// timer, then writes `value` to `ptr[i]`. `copy(src, dst, n, ns)`: spins, then copies.
const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry spin_fill(.param .u64 p, .param .u32 n, .param .f32 v, .param .u64 ns) {
  .reg .pred %q; .reg .b32 %r<5>; .reg .b64 %d<8>; .reg .f32 %f;
  ld.param.u64 %d1, [p]; ld.param.u32 %r1, [n]; ld.param.f32 %f, [v]; ld.param.u64 %d2, [ns];
  mov.u64 %d3, %globaltimer;
SPIN:
  mov.u64 %d4, %globaltimer; sub.u64 %d5, %d4, %d3; setp.lt.u64 %q, %d5, %d2; @%q bra SPIN;
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.u32 %r2, %r2, %r3, %r4;
  setp.ge.u32 %q, %r2, %r1; @%q bra DONE;
  mul.wide.u32 %d6, %r2, 4; add.u64 %d7, %d1, %d6; st.global.f32 [%d7], %f;
DONE:
  ret;
}
.visible .entry copy(.param .u64 s, .param .u64 t, .param .u32 n, .param .u64 ns) {
  .reg .pred %q; .reg .b32 %r<5>; .reg .b64 %d<10>; .reg .f32 %f;
  ld.param.u64 %d1, [s]; ld.param.u64 %d8, [t]; ld.param.u32 %r1, [n]; ld.param.u64 %d2, [ns];
  mov.u64 %d3, %globaltimer;
SPIN:
  mov.u64 %d4, %globaltimer; sub.u64 %d5, %d4, %d3; setp.lt.u64 %q, %d5, %d2; @%q bra SPIN;
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.u32 %r2, %r2, %r3, %r4;
  setp.ge.u32 %q, %r2, %r1; @%q bra DONE;
  mul.wide.u32 %d6, %r2, 4; add.u64 %d7, %d1, %d6; ld.global.f32 %f, [%d7];
  add.u64 %d9, %d8, %d6; st.global.f32 [%d9], %f;
DONE:
  ret;
}
"#;

const N: usize = 1024;
const SPIN_NS: u64 = 50_000_000;

struct Gpu {
    client: Client,
    ctx: Arc<CudaContext>,
    spin_fill: cudarc::driver::CudaFunction,
    copy: cudarc::driver::CudaFunction,
}

fn gpu() -> Option<Gpu> {
    if !handoff_runtime::cuda::is_available() {
        println!("SKIPPED: no CUDA driver or device");
        return None;
    }
    let plugin = match std::env::var_os("HANDOFF_PJRT_CUDA_PLUGIN") {
        Some(p) => Plugin::load(p),
        None => Plugin::cuda(),
    };
    let plugin = match plugin {
        Ok(p) if p.is_gpu() => p,
        Ok(p) => {
            println!("SKIPPED: {} is not a GPU plugin", p.path().display());
            return None;
        }
        Err(e) => {
            println!("SKIPPED: {e}");
            return None;
        }
    };
    let client = Client::new(plugin, &ClientOptions::default()).expect("CUDA client");
    let ctx = CudaContext::new(0).expect("CUDA context");
    let module = ctx.load_module(Ptx::from_src(PTX)).expect("PTX module");
    let spin_fill = module.load_function("spin_fill").unwrap();
    let copy = module.load_function("copy").unwrap();
    Some(Gpu { client, ctx, spin_fill, copy })
}

fn cfg() -> LaunchConfig {
    LaunchConfig { grid_dim: ((N as u32).div_ceil(256), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

fn hstream(s: &Arc<CudaStream>) -> Stream {
    handoff_cuda_stream(s)
}

/// The handoff stream of a cudarc stream, keeping it alive.
fn handoff_cuda_stream(s: &Arc<CudaStream>) -> Stream {
    // SAFETY: (test) a stream of the primary context, kept alive by the owner attached.
    unsafe { handoff_runtime::cuda::stream(0, s.cu_stream() as u64) }.unwrap().with_owner(s.clone())
}

/// A CUDA slice written by a kernel still queued for `SPIN_NS`, as a hand-off on `stream`.
fn spin_filled(g: &Gpu, stream: &Arc<CudaStream>, value: f32) -> Handoff {
    let mut slice: CudaSlice<f32> = stream.alloc_zeros(N).unwrap();
    let (n, ns) = (N as u32, SPIN_NS);
    // SAFETY: (test) the kernel's parameters match its PTX signature.
    unsafe { stream.launch_builder(&g.spin_fill).arg(&mut slice).arg(&n).arg(&value).arg(&ns).launch(cfg()) }
        .unwrap();
    let ptr = {
        use cudarc::driver::DevicePtr;
        let (p, _guard) = slice.device_ptr(stream);
        p
    };
    Handoff::with_keep_alive(
        slice,
        move |_| Ok(TensorDesc::new(ptr as *mut _, Device::Cuda(0), DataType::F32, &[N as i64][..])),
        &hstream(stream),
        Ready::Elided,
        Release::AfterConsumer,
    )
    .unwrap()
}

#[test]
fn gpu_functional() {
    let Some(g) = gpu() else { return };
    let c = &g.client;
    assert_eq!(c.plugin().api_version(), (0, 115));
    assert!(c.plugin().extensions().iter().any(|e| e == "Stream"));
    let d = c.device(0).unwrap();
    assert_eq!(d.handoff_device(), Device::Cuda(0));
    let xs: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
    let x = c.buffer_from_host(&d, &xs, &[4, 8]).unwrap();
    let want: Vec<f32> = xs.iter().map(|&v| gelu_scale(v)).collect();
    for p in ["gelu_scale_f32_4x8.mlir", "gelu_scale_f32_4x8_cuda.mlirbc"] {
        let y = c.compile(&program(p)).unwrap().execute(&[&x]).unwrap();
        close(&y[0].to_vec::<f32>().unwrap(), &want, 1e-5);
    }
    let bad = c.buffer_from_host(&d, &[0f32; 16], &[16]).unwrap();
    assert!(c.compile(&program("gelu_scale_f32_4x8.mlir")).unwrap().execute(&[&bad]).is_err());
    // An exported output reads back through a consumer stream.
    let s = g.ctx.new_stream().unwrap();
    let y = c.compile(&program("gelu_scale_f32_1024.mlir")).unwrap();
    let xin = c.buffer_from_host(&d, &vec![0.5f32; N], &[N as i64]).unwrap();
    let out = y.execute(&[&xin]).unwrap().remove(0);
    let h = out.clone().export(&hstream(&s)).unwrap();
    assert_eq!(h.data_ptr() as *mut std::ffi::c_void, out.device_pointer().unwrap());
    assert_eq!(h.ready(), Ready::Waited);
}

#[test]
fn gpu_import_no_host_sync() {
    let Some(g) = gpu() else { return };
    let c = &g.client;
    let exe = c.compile(&program("gelu_scale_f32_1024.mlir")).unwrap();
    let ready = c.ready_stream(&c.device(0).unwrap()).unwrap();
    let producer = g.ctx.new_stream().unwrap();
    // Warm-up: CUDA loads a kernel lazily at its first launch, and loading one while
    // another kernel runs blocks the host until it ends. Launch everything once first.
    let warm = c.buffer_from_host(&c.device(0).unwrap(), &vec![0.5f32; N], &[N as i64]).unwrap();
    exe.execute(&[&warm]).unwrap().remove(0).to_vec::<f32>().unwrap();
    for i in 0..20 {
        let value = i as f32 * 0.1 - 1.0;
        let h = spin_filled(&g, &producer, value);
        let t = Instant::now();
        let (out, s) = stats::measure(|| {
            let x = c.import(h).unwrap();
            exe.execute(&[&x]).unwrap().remove(0)
        });
        let host = t.elapsed();
        assert_eq!(s.host_syncs, 0, "{s}");
        println!("no-host-sync: xla import + execute, trial {i}: host {host:?}");
        // A fifth of the 50 ms queued: far from a real wait and from scheduler noise.
        assert!(host < Duration::from_millis(10), "trial {i}: import + execute took {host:?} on the host");
        assert!(!out.is_ready().unwrap(), "the output waits for the producer's 50 ms kernel");
        let y = out.to_vec::<f32>().unwrap();
        close(&y, &vec![gelu_scale(value); N], 1e-5);
        let _ = &ready;
    }
}

#[test]
fn gpu_export_no_host_sync() {
    let Some(g) = gpu() else { return };
    let c = &g.client;
    let exe = c.compile(&program("gelu_scale_f32_1024.mlir")).unwrap();
    let producer = g.ctx.new_stream().unwrap();
    let consumer = g.ctx.new_stream().unwrap();
    for i in 0..20 {
        let value = 1.0 - i as f32 * 0.05;
        let x = c.import(spin_filled(&g, &producer, value)).unwrap();
        let out = exe.execute(&[&x]).unwrap().remove(0); // pending ~50 ms
        let mut dst: CudaSlice<f32> = consumer.alloc_zeros(N).unwrap();
        let t = Instant::now();
        let (h, s) = stats::measure(|| out.clone().export(&hstream(&consumer)).unwrap());
        let host = t.elapsed();
        assert_eq!(s.host_syncs, 0, "{s}");
        assert!(
            host < Duration::from_millis(10),
            "export took {host:?} on the host (bound: a fifth of 50 ms)"
        );
        let (src, n, ns) = (h.data_ptr() as u64, N as u32, 0u64);
        // SAFETY: (test) the kernel's parameters match its PTX signature; `src` is
        // kept alive by `h` until the consumer's work is done.
        unsafe { consumer.launch_builder(&g.copy).arg(&src).arg(&mut dst).arg(&n).arg(&ns).launch(cfg()) }
            .unwrap();
        drop(h);
        let got = consumer.clone_dtoh(&dst).unwrap();
        close(&got, &vec![gelu_scale(value); N], 1e-5);
    }
}

#[test]
fn gpu_lifetime_under_churn() {
    let Some(g) = gpu() else { return };
    let c = &g.client;
    let d = c.device(0).unwrap();
    let exe = c.compile(&program("gelu_scale_f32_1024.mlir")).unwrap();
    let producer = g.ctx.new_stream().unwrap();
    let consumer = g.ctx.new_stream().unwrap();
    for i in 0..20 {
        // Import direction: both owners of the producer's memory let go while XLA's
        // execution is still queued behind the 50 ms kernel; then churn the allocator.
        let value = 0.25 + i as f32 * 0.01;
        let x = c.import(spin_filled(&g, &producer, value)).unwrap();
        let out = exe.execute(&[&x]).unwrap().remove(0);
        drop(x);
        for _ in 0..8 {
            let mut junk: CudaSlice<f32> = producer.alloc_zeros(N).unwrap();
            let (n, v, ns) = (N as u32, f32::NAN, 0u64);
            // SAFETY: (test) as above.
            unsafe {
                producer.launch_builder(&g.spin_fill).arg(&mut junk).arg(&n).arg(&v).arg(&ns).launch(cfg())
            }
            .unwrap();
        }
        close(&out.to_vec::<f32>().unwrap(), &vec![gelu_scale(value); N], 1e-5);

        // Export direction: the consumer's kernel (spinning 50 ms first) reads the XLA
        // output after the XLA buffer and the hand-off are dropped and XLA reallocates.
        let xin = c.buffer_from_host(&d, &vec![value; N], &[N as i64]).unwrap();
        let y = exe.execute(&[&xin]).unwrap().remove(0);
        let h = y.clone().export(&hstream(&consumer)).unwrap();
        let mut dst: CudaSlice<f32> = consumer.alloc_zeros(N).unwrap();
        let (src, n, ns) = (h.data_ptr() as u64, N as u32, SPIN_NS);
        // SAFETY: (test) as above.
        unsafe { consumer.launch_builder(&g.copy).arg(&src).arg(&mut dst).arg(&n).arg(&ns).launch(cfg()) }
            .unwrap();
        drop(h);
        drop(y);
        for k in 0..8 {
            let junk = c.buffer_from_host(&d, &vec![k as f32 * 1000.0; N], &[N as i64]).unwrap();
            drop(exe.execute(&[&junk]).unwrap());
        }
        close(&consumer.clone_dtoh(&dst).unwrap(), &vec![gelu_scale(value); N], 1e-5);
    }
    reaper::flush();
}
