//! Shared by the GPU tests and the benchmark: the device check that skips (loudly)
//! without CUDA, hand-written PTX kernels loaded with `cuModuleLoadData` (no NVRTC
//! needed on the GPU machine), and raw launches.
#![allow(dead_code)]

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

/// GPU tests share one device and the process-wide counters: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The device fixture of a GPU test.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub kernels: Kernels,
    _serial: MutexGuard<'static, ()>,
}

/// `Some(gpu)` when a CUDA device is present; otherwise prints `SKIPPED: <reason>`
/// and returns `None` — unless `HANDOFF_REQUIRE_GPU=1` (set by the GPU bundle's
/// run.sh), where a missing device fails the test instead.
pub fn gpu(test: &str) -> Option<Gpu> {
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let reason = match handoff_runtime::cuda::device_count() {
        Ok(0) => "the CUDA driver reports no device".to_string(),
        Ok(_) => {
            let ctx = handoff_cuda::context(0).expect("handoff_cuda::context(0)");
            let kernels = Kernels::load(&ctx);
            return Some(Gpu { ctx, kernels, _serial: serial });
        }
        Err(e) => e.to_string(),
    };
    if std::env::var("HANDOFF_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("{test}: HANDOFF_REQUIRE_GPU=1 but no CUDA device: {reason}");
    }
    println!("SKIPPED: {test}: {reason}");
    None
}

/// Two kernels in PTX (ISA 7.0, sm_70+, JIT-compiled by the driver):
/// - `spin_fill(u32* buf, u32 n, u32 value, u64 ns)`: every thread spins on
///   `%globaltimer` for `ns` nanoseconds, then writes `value` to its element;
/// - `copy_u32(u32* dst, const u32* src, u32 n)`.
pub const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin_fill(
    .param .u64 buf,
    .param .u32 n,
    .param .u32 value,
    .param .u64 ns
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [buf];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [value];
    ld.param.u64 %rd2, [ns];
    mov.u64 %rd3, %globaltimer;
SPIN:
    mov.u64 %rd4, %globaltimer;
    sub.u64 %rd5, %rd4, %rd3;
    setp.lt.u64 %p1, %rd5, %rd2;
    @%p1 bra SPIN;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.u32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p2, %r6, %r1;
    @%p2 bra DONE;
    cvta.to.global.u64 %rd6, %rd1;
    mul.wide.u32 %rd7, %r6, 4;
    add.u64 %rd8, %rd6, %rd7;
    st.global.u32 [%rd8], %r2;
DONE:
    ret;
}

.visible .entry copy_u32(
    .param .u64 dst,
    .param .u64 src,
    .param .u32 n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u32 %r1, [n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.u32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r6, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r6, 4;
    add.u64 %rd6, %rd4, %rd5;
    ld.global.u32 %r2, [%rd6];
    add.u64 %rd7, %rd3, %rd5;
    st.global.u32 [%rd7], %r2;
DONE:
    ret;
}
"#;

pub struct Kernels {
    spin_fill: sys::CUfunction,
    copy: sys::CUfunction,
}

fn ok(r: sys::CUresult, what: &str) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

impl Kernels {
    fn load(ctx: &Arc<CudaContext>) -> Kernels {
        ctx.bind_to_thread().unwrap();
        let src = std::ffi::CString::new(PTX).unwrap();
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image; the module is never unloaded.
        ok(unsafe { sys::cuModuleLoadData(&mut module, src.as_ptr().cast()) }, "cuModuleLoadData");
        let get = |name: &std::ffi::CStr| {
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: `module` is loaded; `name` is NUL-terminated.
            ok(unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) }, "cuModuleGetFunction");
            f
        };
        Kernels { spin_fill: get(c"spin_fill"), copy: get(c"copy_u32") }
    }

    /// Enqueues `spin_fill` on `stream`: spin `ns`, then `buf[0..n] = value`.
    pub fn spin_fill(&self, stream: sys::CUstream, buf: u64, n: u32, value: u32, ns: u64) {
        let (mut a, mut b, mut c, mut d) = (buf, n, value, ns);
        let mut params: [*mut c_void; 4] = [
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u32).cast(),
            (&mut c as *mut u32).cast(),
            (&mut d as *mut u64).cast(),
        ];
        launch(self.spin_fill, n, stream, &mut params);
    }

    /// Enqueues `dst[0..n] = src[0..n]` on `stream`.
    pub fn copy(&self, stream: sys::CUstream, dst: u64, src: u64, n: u32) {
        let (mut a, mut b, mut c) = (dst, src, n);
        let mut params: [*mut c_void; 3] =
            [(&mut a as *mut u64).cast(), (&mut b as *mut u64).cast(), (&mut c as *mut u32).cast()];
        launch(self.copy, n, stream, &mut params);
    }
}

fn launch(f: sys::CUfunction, n: u32, stream: sys::CUstream, params: &mut [*mut c_void]) {
    let block = 256u32;
    let grid = n.div_ceil(block).max(1);
    // SAFETY: the parameters match the kernel's signature and outlive the call
    // (the driver copies them at launch).
    let r = unsafe {
        sys::cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut())
    };
    ok(r, "cuLaunchKernel");
}

/// The raw device pointer of a slice (the test context has no event tracking, so
/// this makes no CUDA call).
pub fn ptr<T>(slice: &CudaSlice<T>) -> u64 {
    let (p, _record) = slice.device_ptr(slice.stream());
    p
}

/// Reads a slice back after synchronizing its stream (test set-up and checks only).
pub fn read(stream: &Arc<CudaStream>, slice: &CudaSlice<u32>) -> Vec<u32> {
    let v = stream.clone_dtoh(slice).unwrap();
    stream.synchronize().unwrap();
    v
}

/// A raw event (timing disabled) for test checks.
pub fn event() -> sys::CUevent {
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: valid out pointer; the test's context is current.
    ok(
        unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
        "cuEventCreate",
    );
    e
}

/// Whether `e` has completed (never blocks).
pub fn done(e: sys::CUevent) -> bool {
    // SAFETY: a live event.
    match unsafe { sys::cuEventQuery(e) } {
        sys::CUresult::CUDA_SUCCESS => true,
        sys::CUresult::CUDA_ERROR_NOT_READY => false,
        r => panic!("cuEventQuery: {r:?}"),
    }
}

pub fn record(e: sys::CUevent, stream: sys::CUstream) {
    // SAFETY: a live event and stream of the current context.
    ok(unsafe { sys::cuEventRecord(e, stream) }, "cuEventRecord");
}

/// Waits (polling, never `cuEventSynchronize`) until `f` holds or `ms` pass.
pub fn eventually(ms: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    f()
}
