//! An XLA kernel called on PyTorch tensors in one call, and the generic entry points
//! between tch, XLA and a derived type.
//!
//! CPU (CI, the CPU PJRT plugin of `HANDOFF_PJRT_PLUGIN`): results checked against
//! PyTorch, zero copies, the `("cpu",)` and `("cpu", "cuda")` `jax.export` artifacts.
//! GPU (the H200, through the GPU bundle; skipped with a reason elsewhere): the
//! `("cpu", "cuda")` artifact on PyTorch CUDA tensors of a side stream, with no host
//! sync behind 50 ms of queued work, and a control that drops the wait and reads stale
//! data. The programs are embedded, so the binary runs from any directory.

mod common;

use common::cpu_client;
use handoff::storage::{Storage, Typed};
use handoff::{DlpackExchange, Stream, stats, transfer, transfer_into};
use handoff_examples::model;
use handoff_torch::{CurrentStream, TorchTensor};
use handoff_xla::{Buffer, CallOptions, Client, ClientOptions, CompileOptions, Kernel, Source, XlaError};
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};

const LN_GELU_CPU: &[u8] = include_bytes!("../../adapters/xla/programs/ln_gelu_f32_8x16_cpu.jaxexport");
const LN_GELU_CPU_CUDA: &[u8] =
    include_bytes!("../../adapters/xla/programs/ln_gelu_f32_8x16_cpu_cuda.jaxexport");
const RESIDUAL_CPU_CUDA: &[u8] =
    include_bytes!("../../adapters/xla/programs/residual_f32_8x16_cpu_cuda.jaxexport");

fn kernel(client: &Client, bytes: &[u8]) -> Kernel {
    let source = Source::from_bytes(bytes.to_vec(), None).unwrap();
    Kernel::compile(client, source, &CompileOptions::default()).unwrap()
}

fn close(a: &Tensor, b: &Tensor) -> bool {
    let (rtol, atol) = model::Dtype::F32.step_tolerance();
    model::allclose(a, b, rtol, atol).unwrap()
}

#[test]
fn kernel_call_on_tch_tensors_cpu() {
    let Some(client) = cpu_client() else { return };
    let h = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
    for bytes in [LN_GELU_CPU, LN_GELU_CPU_CUDA] {
        let k = kernel(&client, bytes);
        let (y, d) = stats::measure(|| k.call1::<_, _, Tensor, _>(&h));
        let y = y.unwrap();
        assert!(close(&y, &model::ln_gelu_torch(&h).unwrap()));
        assert_eq!((d.exports, d.copies), (2, 0), "h to XLA and y back, both zero-copy");
        // `h` is still the caller's; the kernel's view of it is gone once released.
        assert_eq!(h.size(), [8, 16]);
    }
}

/// A host view XLA cannot read in place (4 bytes past a 64-byte boundary): refused,
/// naming the input, unless the call allows the copy (then counted).
#[test]
fn kernel_call_on_a_misaligned_tch_view_cpu() {
    let Some(client) = cpu_client() else { return };
    let k = kernel(&client, LN_GELU_CPU);
    let flat = Tensor::randn([1 + 8 * 16], (Kind::Float, Device::Cpu));
    let view = flat.narrow(0, 1, 8 * 16).view([8, 16]);
    let e = k.call1::<_, _, Tensor, _>(&view).unwrap_err();
    assert!(matches!(e, XlaError::InputMismatch { index: 0, what: "data address", .. }), "{e:?}");
    assert!(e.to_string().contains("allow_copy"), "{e}");
    let (y, d) =
        stats::measure(|| k.call_with::<_, _, [Tensor; 1], _>(&CallOptions::default().allow_copy(), [&view]));
    let [y] = y.unwrap();
    assert_eq!(d.copies, 1);
    assert!(close(&y, &model::ln_gelu_torch(&view).unwrap()));
}

#[test]
fn kernel_call_with_several_tch_inputs_and_outputs_cpu() {
    let Some(client) = cpu_client() else { return };
    let k = kernel(&client, RESIDUAL_CPU_CUDA);
    let x = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([16, 16], (Kind::Float, Device::Cpu)) / 4.0;
    let [out, h]: [Tensor; 2] = k.call([&x, &w]).unwrap();
    let h_ref = x.matmul(&w);
    assert!(close(&h, &h_ref));
    assert!(close(&out, &(&x + model::ln_gelu_torch(&h_ref).unwrap())));
    // Mixed inputs (a tch tensor and an XLA buffer) and mixed outputs.
    let wx: Buffer = transfer_into(&w, &client).unwrap();
    let (out2, h2): (Tensor, Buffer) = k.call((&x, &wx)).unwrap();
    assert!(close(&out2, &out));
    assert!(close(&transfer_into::<Tensor, _, _>(h2, &CurrentStream).unwrap(), &h_ref));
    // A wrong shape names the argument, before anything runs.
    let e = k.call::<_, _, [Tensor; 2], _>([&w, &w]).unwrap_err();
    assert!(e.to_string().contains("input 0") && e.to_string().contains("f32[8, 16]"), "{e}");
}

#[test]
fn transfer_moves_tch_tensors_into_xla_and_back_cpu() {
    let Some(client) = cpu_client() else { return };
    let t = Tensor::arange(12, (Kind::Float, Device::Cpu)).reshape([3, 4]);
    let (b, d) = stats::measure(|| transfer_into::<Buffer, _, _>(&t, &client));
    let b = b.unwrap();
    assert_eq!((d.exports, d.imports, d.copies), (1, 1, 0));
    assert_eq!(b.device_pointer().unwrap(), t.data_ptr(), "a view of the tensor's memory");
    assert_eq!(b.to_vec::<f32>().unwrap(), (0..12).map(|v| v as f32).collect::<Vec<_>>());
    // Back: the same memory, as a plain tch tensor and as a TorchTensor.
    let back: Tensor = transfer(b.clone(), &Stream::host()).unwrap();
    assert_eq!(back.data_ptr(), t.data_ptr());
    assert!(back.equal(&t));
    let wrapped: TorchTensor = transfer_into(&b, &CurrentStream).unwrap();
    assert!(wrapped.equal(&t));
}

/// Host memory aligned to XLA's 64 bytes: a derived type's own storage.
struct Aligned64 {
    ptr: *mut f32,
    len: usize,
}

impl Aligned64 {
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1) * 4, 64).unwrap()
    }

    fn from_slice(v: &[f32]) -> Aligned64 {
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc(Self::layout(v.len())) } as *mut f32;
        assert!(!ptr.is_null());
        // SAFETY: room for `v.len()` floats, no overlap.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), ptr, v.len()) };
        Aligned64 { ptr, len: v.len() }
    }
}

impl Drop for Aligned64 {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `from_slice`.
        unsafe { std::alloc::dealloc(self.ptr as *mut u8, Self::layout(self.len)) };
    }
}

// SAFETY: owned heap memory.
unsafe impl Send for Aligned64 {}

// SAFETY: `len` floats of host memory at a fixed heap address, owned until drop.
unsafe impl Storage for Aligned64 {
    fn data_ptr(&self) -> *mut std::ffi::c_void {
        self.ptr as *mut _
    }
    fn byte_len(&self) -> usize {
        self.len * 4
    }
}

impl Typed for Aligned64 {
    type Elem = f32;
}

#[derive(DlpackExchange)]
struct Frame {
    #[dlpack(data)]
    pixels: Aligned64,
    #[dlpack(shape)]
    shape: [usize; 2],
}

#[test]
fn a_derived_type_goes_into_xla_and_through_a_kernel_cpu() {
    let Some(client) = cpu_client() else { return };
    let values: Vec<f32> = (0..128).map(|i| (i % 13) as f32 / 3.0 - 2.0).collect();
    let frame = Frame { pixels: Aligned64::from_slice(&values), shape: [8, 16] };
    let ptr = frame.pixels.ptr as *mut std::ffi::c_void;
    let (b, d) = stats::measure(|| transfer_into::<Buffer, _, _>(frame, &client));
    let b = b.unwrap();
    assert_eq!((d.copies, b.device_pointer().unwrap()), (0, ptr));
    assert_eq!(b.to_vec::<f32>().unwrap(), values);
    // Straight into a kernel, out as a tch tensor.
    let k = kernel(&client, LN_GELU_CPU);
    let frame = Frame { pixels: Aligned64::from_slice(&values), shape: [8, 16] };
    let y: Tensor = k.call1(frame).unwrap();
    let expect = model::ln_gelu_torch(&Tensor::from_slice(&values).reshape([8, 16])).unwrap();
    assert!(close(&y, &expect));
}

// ----------------------------------------------------------------- GPU

/// The CUDA client, or `None` after printing why not (failing when
/// `HANDOFF_REQUIRE_GPU=1`, as the GPU bundle sets).
fn gpu_client() -> Option<Client> {
    let why = model::cuda_unavailable()
        .or_else(|| model::plugin(model::Backend::Cuda).err().map(|e| e.to_string()));
    if let Some(why) = why {
        assert!(
            std::env::var_os("HANDOFF_REQUIRE_GPU").is_none_or(|v| v != "1"),
            "a GPU is required (HANDOFF_REQUIRE_GPU=1) but: {why}"
        );
        println!("SKIPPED: {why}");
        return None;
    }
    let plugin = model::plugin(model::Backend::Cuda).unwrap();
    Some(Client::new(plugin, &ClientOptions::default().preallocate(false)).unwrap())
}

const TRIALS: usize = 10;
const QUEUED_MS: f64 = 50.0;

fn cycles_for(ms: f64) -> i64 {
    handoff_torch::cuda::sleep(0, 1000).unwrap();
    tch::Cuda::synchronize(0);
    let probe = 20_000_000i64;
    let t = Instant::now();
    handoff_torch::cuda::sleep(0, probe).unwrap();
    tch::Cuda::synchronize(0);
    (probe as f64 / (t.elapsed().as_secs_f64() * 1e3) * ms) as i64
}

/// One trial on PyTorch's current stream (a side stream from its pool): `h` is
/// zeros, then 50 ms of GPU work, then `h` gets its values, all queued; the kernel is
/// called at once. With `lie`, the input claims to be written on XLA's own ready
/// stream, so the wait is elided: the control, which must read the zeros.
fn trial(k: &Kernel, src: &Tensor, cycles: i64, lie: bool) -> (bool, Duration, u64, bool) {
    let h = Tensor::zeros([8, 16], (Kind::Float, Device::Cuda(0)));
    tch::Cuda::synchronize(0);
    handoff_torch::cuda::sleep(0, cycles).unwrap();
    h.shallow_clone().copy_(src);
    let t = Instant::now();
    let (y, d) = stats::measure(|| {
        if lie {
            let claimed = TorchTensor::with_stream(h.shallow_clone(), k.ready_stream().clone()).unwrap();
            k.call1::<_, _, Tensor, _>(claimed)
        } else {
            k.call1::<_, _, Tensor, _>(&h)
        }
    });
    let took = t.elapsed();
    let y = y.unwrap();
    let current = handoff_torch::current_stream(handoff::Device::Cuda(0)).unwrap().unwrap();
    let busy = !current.record().unwrap().query().unwrap();
    tch::Cuda::synchronize(0);
    let right = close(&y, &model::ln_gelu_torch(src).unwrap());
    (right, took, d.host_syncs + d.copies, busy)
}

/// What `TRIALS` honest trials (`trial` without `lie`) came to.
struct Tally {
    /// Results equal to PyTorch's.
    right: usize,
    /// Calls that returned within `limit`.
    fast: usize,
    /// Calls with no host sync and no copy.
    clean: usize,
    /// Calls after which the GPU was still busy.
    busy: usize,
    /// Trials in which at least one wait was elided.
    elided: usize,
    slowest: Duration,
}

fn tally(k: &Kernel, cycles: i64, limit: Duration) -> Tally {
    let mut t = Tally { right: 0, fast: 0, clean: 0, busy: 0, elided: 0, slowest: Duration::ZERO };
    for _ in 0..TRIALS {
        let src = Tensor::randn([8, 16], (Kind::Float, Device::Cuda(0)));
        let ((ok, took, syncs_and_copies, still_busy), d) = stats::measure(|| trial(k, &src, cycles, false));
        t.right += usize::from(ok);
        t.fast += usize::from(took < limit);
        t.clean += usize::from(syncs_and_copies == 0);
        t.busy += usize::from(still_busy);
        t.elided += usize::from(d.waits_elided >= 1);
        t.slowest = t.slowest.max(took);
    }
    t
}

#[test]
fn gpu_kernel_call_orders_on_the_gpu_and_never_waits() {
    let Some(client) = gpu_client() else { return };
    let side = handoff_torch::cuda::stream_from_pool(0, false).unwrap();
    let _current = handoff_torch::cuda::use_raw_stream(0, side).unwrap();
    let cycles = cycles_for(QUEUED_MS);
    let limit = Duration::from_secs_f64(QUEUED_MS / 5.0 / 1e3);
    for (name, bytes) in [("ln_gelu (cpu, cuda)", LN_GELU_CPU_CUDA)] {
        let k = kernel(&client, bytes);
        assert!(
            matches!(k.ready_stream().device(), handoff::Device::Cuda(0)),
            "XLA's ready stream is a CUDA stream"
        );
        // Warm up (first execution loads the kernel).
        let src = Tensor::randn([8, 16], (Kind::Float, Device::Cuda(0)));
        let _ = trial(&k, &src, 1000, false);
        let Tally { right, fast, clean, busy, slowest, .. } = tally(&k, cycles, limit);
        let mut stale = 0;
        for _ in 0..TRIALS {
            let src = Tensor::randn([8, 16], (Kind::Float, Device::Cuda(0)));
            stale += usize::from(!trial(&k, &src, cycles, true).0);
        }
        println!(
            "kernel call {name}: right {right}/{TRIALS}, returned within {limit:?} {fast}/{TRIALS} (slowest {slowest:?}), \
             0 host syncs and copies {clean}/{TRIALS}, GPU still busy after {busy}/{TRIALS}; \
             control (wait elided): stale {stale}/{TRIALS}"
        );
        assert_eq!((right, fast, clean, busy), (TRIALS, TRIALS, TRIALS, TRIALS));
        assert!(stale >= TRIALS - 1, "the control must read stale data: {stale}/{TRIALS}");
    }
}

#[test]
fn gpu_kernel_call_with_two_inputs_and_outputs() {
    let Some(client) = gpu_client() else { return };
    let k = kernel(&client, RESIDUAL_CPU_CUDA);
    let x = Tensor::randn([8, 16], (Kind::Float, Device::Cuda(0)));
    let w = Tensor::randn([16, 16], (Kind::Float, Device::Cuda(0))) / 4.0;
    let (out, d) = stats::measure(|| k.call::<_, _, [Tensor; 2], _>([&x, &w]));
    let [out, h] = out.unwrap();
    assert_eq!((d.host_syncs, d.copies), (0, 0));
    let h_ref = x.matmul(&w);
    assert!(close(&h, &h_ref));
    assert!(close(&out, &(&x + model::ln_gelu_torch(&h_ref).unwrap())));
    println!("kernel call residual (cpu, cuda) on cuda:0: right, {d}");
}

/// A parameter viewed out of one flat buffer at a 4-byte offset (as fused optimizers
/// lay parameters out): XLA's CUDA executables read 16-byte aligned buffers only, so the
/// call is refused before the program runs, naming the input, its address and the
/// alignment; the same values copied by the caller go through.
#[test]
fn gpu_kernel_call_refuses_a_misaligned_view_before_it_runs() {
    let Some(client) = gpu_client() else { return };
    let k = kernel(&client, LN_GELU_CPU_CUDA);
    let flat = Tensor::randn([1 + 8 * 16], (Kind::Float, Device::Cuda(0)));
    let view = flat.narrow(0, 1, 8 * 16).view([8, 16]);
    assert_eq!(view.data_ptr() as usize % 16, 4);
    let (e, d) = stats::measure(|| k.call1::<_, _, Tensor, _>(&view));
    let e = e.unwrap_err();
    let m = e.to_string();
    assert!(
        matches!(e, XlaError::InputMismatch { index: 0, what: "data address", .. })
            && m.contains("16-byte aligned")
            && m.contains("4 bytes past"),
        "{m}"
    );
    assert_eq!((d.imports, d.host_syncs), (0, 0), "refused before XLA viewed it: {d}");
    let y = k.call1::<_, _, Tensor, _>(&view.copy()).unwrap();
    assert!(close(&y, &model::ln_gelu_torch(&view).unwrap()));
    println!("kernel call on a view at a 4-byte offset: refused before it ran ({m}); its copy right");
}

/// PyTorch on XLA's ready stream (`use_stream`, as the README shows): the runtime sees
/// one stream, so the input's wait is elided, and the result is still right with the
/// input's write queued behind 50 ms of GPU work on that stream, the call returning
/// at once. (What an elided wait reads when the write is on another stream is the
/// control of `gpu_kernel_call_orders_on_the_gpu_and_never_waits`: stale data.)
#[test]
fn gpu_kernel_call_with_pytorch_on_xlas_stream_elides_the_wait_and_stays_right() {
    let Some(client) = gpu_client() else { return };
    let k = kernel(&client, LN_GELU_CPU_CUDA);
    let ready = handoff::cuda::raw_stream(k.ready_stream()).expect("XLA's ready stream is a CUDA stream").1;
    let _on_xla = handoff_torch::cuda::use_stream(k.ready_stream()).unwrap();
    assert_eq!(handoff_torch::cuda::current_raw_stream(0).unwrap(), ready);
    let cycles = cycles_for(QUEUED_MS);
    let limit = Duration::from_secs_f64(QUEUED_MS / 5.0 / 1e3);
    let _ = trial(&k, &Tensor::randn([8, 16], (Kind::Float, Device::Cuda(0))), 1000, false);
    let Tally { right, fast, clean, busy, elided, slowest } = tally(&k, cycles, limit);
    println!(
        "kernel call on XLA's stream: right {right}/{TRIALS}, returned within {limit:?} {fast}/{TRIALS} \
         (slowest {slowest:?}), 0 host syncs and copies {clean}/{TRIALS}, GPU still busy after {busy}/{TRIALS}, \
         input wait elided {elided}/{TRIALS}"
    );
    assert_eq!((right, fast, clean, busy, elided), (TRIALS, TRIALS, TRIALS, TRIALS, TRIALS));
}
