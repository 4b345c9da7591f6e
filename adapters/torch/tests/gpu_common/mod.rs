//! Helpers of the GPU tests: skipping without CUDA, a calibrated GPU spin, checks.
#![allow(dead_code)]

use handoff_runtime::{Export, Handoff, Ready, Release, Result, Stream, StreamOrdered, TensorDesc};
use handoff_torch::cuda;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};

/// Elements of the test tensors (16 MiB of f32: one caching-allocator block).
pub const N: i64 = 1 << 22;
pub const TRIALS: usize = 20;

/// The GPU, one test at a time (they time and synchronize the whole device), or
/// `None` after printing `SKIPPED: reason` when CUDA cannot be used.
pub fn gpu() -> Option<MutexGuard<'static, ()>> {
    static GPU: Mutex<()> = Mutex::new(());
    if !cuda_or_skip() {
        return None;
    }
    Some(GPU.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Whether the GPU tests can run; prints `SKIPPED: reason` when not.
pub fn cuda_or_skip() -> bool {
    if !handoff_torch::shim_has_cuda() {
        println!("SKIPPED: the shim was built without the CUDA headers");
        return false;
    }
    if !handoff_torch::init() {
        println!(
            "SKIPPED: libtorch_cuda.so does not load: {}",
            handoff_torch::cuda_load_error().unwrap_or_default()
        );
        return false;
    }
    if !tch::Cuda::is_available() {
        println!("SKIPPED: PyTorch sees no CUDA device");
        return false;
    }
    if !handoff_runtime::cuda::is_available() {
        println!("SKIPPED: handoff's CUDA backend cannot use the driver");
        return false;
    }
    true
}

pub fn sync() {
    tch::Cuda::synchronize(0);
}

/// GPU clock cycles that `cuda::sleep` needs to keep a stream busy for `ms`.
pub fn cycles_for(ms: f64) -> i64 {
    cuda::sleep(0, 1000).unwrap(); // loads the kernel
    sync();
    let probe = 20_000_000i64;
    let t = Instant::now();
    cuda::sleep(0, probe).unwrap();
    sync();
    let per_ms = probe as f64 / (t.elapsed().as_secs_f64() * 1e3);
    (per_ms * ms) as i64
}

/// A PyTorch stream (from its pool: never destroyed) as a handoff stream.
pub fn cuda_stream(raw: u64) -> Stream {
    // SAFETY: (test) the tests pass PyTorch's pool streams and the legacy stream.
    unsafe { handoff_runtime::cuda::stream(0, raw) }.unwrap()
}

/// A side stream from PyTorch's pool, as a handoff stream and raw handle.
pub fn side_stream() -> (Stream, u64) {
    let raw = cuda::stream_from_pool(0, false).unwrap();
    (cuda_stream(raw), raw)
}

pub const F32_CUDA: (Kind, Device) = (Kind::Float, Device::Cuda(0));

/// How many elements of `t` differ from `v` (after a sync).
pub fn wrong(t: &Tensor, v: f64) -> i64 {
    t.ne(v).sum(Kind::Int64).int64_value(&[])
}

/// A non-owning view of a hand-off's memory: a raw consumer, as C code using the
/// DLPack pointer would be (nothing keeps the memory alive but the hand-off).
pub fn raw_view(h: &Handoff) -> Tensor {
    // SAFETY: the hand-off describes N live f32 on cuda:0; the view is dropped before it.
    unsafe { Tensor::from_blob(h.data_ptr(), h.shape(), h.strides(), Kind::Float, Device::Cuda(0)) }
}

/// The host-time bound of the no-host-sync proofs: a fifth of the 50 ms of GPU work
/// queued before each trial, far from both a real wait (50 ms) and scheduler noise
/// (a descheduled thread costs a few ms at worst).
pub const FAST: Duration = Duration::from_millis(10);

/// Asserts an exchange returned quickly although `busy` (50 ms) of work was queued.
pub fn assert_fast(what: &str, took: Duration) {
    assert!(took < FAST, "{what} took {took:?}: it waited for the GPU (bound {FAST:?})");
}

/// A "foreign" producer: CUDA memory on a stream of its own, that exports with
/// `Release::Immediately` (it trusts the consumer to give the memory back in stream
/// order) and frees its memory the moment the hand-off lets go of it.
pub struct Foreign {
    pub tensor: Tensor,
    pub stream: Stream,
}

impl StreamOrdered for Foreign {
    fn device(&self) -> handoff_runtime::Device {
        handoff_runtime::Device::Cuda(0)
    }
    fn stream(&self) -> Option<Stream> {
        Some(self.stream.clone())
    }
}

impl Export for Foreign {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        Ok(TensorDesc::new(
            self.tensor.data_ptr(),
            handoff_runtime::Device::Cuda(0),
            handoff_runtime::dtype::DataType::F32,
            self.tensor.size(),
        ))
    }
    fn export(self, consumer: &Stream) -> Result<Handoff> {
        let ready = self.ready_on(consumer)?;
        assert_eq!(ready, Ready::Waited);
        Handoff::with_keep_alive(self, |f| f.describe(), consumer, ready, Release::Immediately)
    }
}

/// PyTorch (on its current stream, busy for 50 ms) -> a consumer on another stream:
/// the export returns at once, the consumer sees fresh values after the final sync.
pub fn torch_to_other_stream(label: &str) {
    let torch = handoff_torch::current_stream(handoff_runtime::Device::Cuda(0)).unwrap().unwrap();
    let (consumer, consumer_raw) = side_stream();
    assert_ne!(torch, consumer);
    let busy = cycles_for(50.0);
    // Warm-up: the event pool and the backend are made once, outside the timing.
    drop(handoff_torch::export(&Tensor::zeros([N], F32_CUDA), &consumer).unwrap());
    sync();
    let (mut good, mut slowest) = (0, Duration::ZERO);
    for trial in 0..TRIALS {
        let v = 1000.0 + trial as f64;
        let start = Instant::now();
        let mut x = Tensor::empty([N], F32_CUDA);
        cuda::sleep(0, busy).unwrap();
        let _ = x.fill_(v); // queued behind 50 ms
        let t = Instant::now();
        let (h, delta) = handoff_runtime::stats::measure(|| handoff_torch::export(&x, &consumer).unwrap());
        let took = t.elapsed();
        slowest = slowest.max(took);
        assert_fast(&format!("{label} trial {trial}: export"), took);
        assert_eq!(delta.host_syncs, 0, "{label}: export synced the host");
        assert_eq!(h.ready(), Ready::Waited);
        let out = {
            let _on_consumer = cuda::use_raw_stream(0, consumer_raw).unwrap();
            let view =
                handoff_torch::import_with(h, &handoff_torch::ImportOptions::new().stream(consumer.clone()))
                    .unwrap();
            &view * 1.0
        };
        assert!(start.elapsed() < Duration::from_millis(20), "{label}: the host waited before the sync");
        sync();
        assert!(start.elapsed() >= Duration::from_millis(40), "{label}: the 50 ms of work did not run");
        let bad = wrong(&out, v);
        println!("{label} trial {trial}: export {took:?}, {bad} wrong values");
        if bad == 0 {
            good += 1;
        }
    }
    println!("no-host-sync: {label}: {good}/{TRIALS} fresh, slowest exchange {slowest:?}, 0 host syncs");
    assert_eq!(good, TRIALS, "{label}: {good}/{TRIALS} trials saw fresh values");
}

/// A producer on a raw CUDA stream (busy for 50 ms) -> PyTorch on its current stream:
/// export and import return at once, PyTorch sees fresh values after the final sync.
pub fn other_stream_to_torch(label: &str) {
    let torch = handoff_torch::current_stream(handoff_runtime::Device::Cuda(0)).unwrap().unwrap();
    let (producer, producer_raw) = side_stream();
    assert_ne!(torch, producer);
    let busy = cycles_for(50.0);
    // Warm-up: CUDA loads a kernel lazily at its first launch, and loading one while
    // another kernel runs blocks the host until it ends. Launch each kernel once first.
    {
        let _on_producer = cuda::use_raw_stream(0, producer_raw).unwrap();
        let mut x = Tensor::empty([N], F32_CUDA);
        let _ = x.fill_(1.0);
        let _ = &x * 1.0;
    }
    let _ = &Tensor::empty([N], F32_CUDA).fill_(1.0) * 1.0;
    sync();
    let (mut good, mut slowest) = (0, Duration::ZERO);
    for trial in 0..TRIALS {
        let v = -500.0 - trial as f64;
        let start = Instant::now();
        let x = {
            let _on_producer = cuda::use_raw_stream(0, producer_raw).unwrap();
            let mut x = Tensor::empty([N], F32_CUDA);
            cuda::sleep(0, busy).unwrap();
            let _ = x.fill_(v);
            x
        };
        let t = Instant::now();
        let (y, delta) = handoff_runtime::stats::measure(|| {
            let h = handoff_torch::export_from(&x, &producer, &torch).unwrap();
            assert_eq!(h.ready(), Ready::Waited);
            handoff_torch::import(h).unwrap()
        });
        let took = t.elapsed();
        slowest = slowest.max(took);
        assert_fast(&format!("{label} trial {trial}: export + import"), took);
        assert_eq!(delta.host_syncs, 0, "{label}: the exchange synced the host");
        assert_eq!(y.data_ptr(), x.data_ptr());
        let out = &y * 1.0; // on PyTorch's current stream
        assert!(start.elapsed() < Duration::from_millis(20), "{label}: the host waited before the sync");
        sync();
        assert!(start.elapsed() >= Duration::from_millis(40), "{label}: the 50 ms of work did not run");
        let bad = wrong(&out, v);
        println!("{label} trial {trial}: exchange {took:?}, {bad} wrong values");
        if bad == 0 {
            good += 1;
        }
    }
    println!("no-host-sync: {label}: {good}/{TRIALS} fresh, slowest exchange {slowest:?}, 0 host syncs");
    assert_eq!(good, TRIALS, "{label}: {good}/{TRIALS} trials saw fresh values");
}
