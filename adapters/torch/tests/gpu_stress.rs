//! GPU stress: 10,000 hand-offs across PyTorch, XLA (JAX's CUDA PJRT plugin)
//! and cudarc buffers, from 8 threads at once, with random streams, random sizes
//! (allocator churn) and random drop order (producer first, consumer first, both
//! while kernels are still queued). Every value is checked, the run has a deadline
//! (a deadlock fails it), the reaper queue stays bounded, and device memory
//! (cuMemGetInfo) comes back to its value after a warm-up round.
//!
//! Prints `SKIPPED: reason` without a GPU, torch CUDA or the CUDA PJRT plugin, and
//! fails instead under `HANDOFF_REQUIRE_GPU=1` (as the GPU bundle runs it).
#![cfg(feature = "cuda")]

mod gpu_common;

use cudarc::driver::{CudaContext, CudaStream};
use handoff_cuda::{CudaTensor, stream_of};
use handoff_runtime::{Export, Handoff, Stream, reaper};
use handoff_torch::cuda;
use handoff_xla::{Client, ClientOptions, Plugin};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

const THREADS: usize = 8;
const HANDOFFS: usize = 10_000;
const WARMUP_PER_THREAD: usize = 50;
const DEADLINE: Duration = Duration::from_secs(420);
/// Releases queued at any moment, at most (each thread checks its values on the
/// host every hand-off, so the reaper is never far behind).
const MAX_PENDING: usize = 4096;
/// Device memory may stay above its post-warm-up value by this much (caching
/// allocators keep blocks of the largest sizes seen).
const MEMORY_SLACK: usize = 512 << 20;

fn skip(reason: String) -> Option<Setup> {
    if std::env::var("HANDOFF_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("gpu_stress: HANDOFF_REQUIRE_GPU=1 but {reason}");
    }
    println!("SKIPPED: {reason}");
    None
}

struct Setup {
    client: Client,
    ctx: Arc<CudaContext>,
}

fn setup() -> Option<Setup> {
    if !gpu_common::cuda_or_skip() {
        return skip("no usable CUDA for PyTorch and handoff (see the line above)".into());
    }
    let plugin = match std::env::var_os("HANDOFF_PJRT_PLUGIN") {
        Some(p) => Plugin::load(p),
        None => Plugin::cuda(),
    };
    let plugin = match plugin {
        Ok(p) if p.is_gpu() => p,
        Ok(p) => return skip(format!("{} is not a GPU PJRT plugin", p.path().display())),
        Err(e) => return skip(format!("no CUDA PJRT plugin: {e}")),
    };
    // PyTorch shares the GPU: XLA must not take most of it at client creation.
    let client = Client::new(plugin, &ClientOptions::default().preallocate(false)).expect("XLA CUDA client");
    let ctx = CudaContext::new(0).expect("CUDA context");
    Some(Setup { client, ctx })
}

fn used_bytes() -> usize {
    let (free, total) = cudarc::driver::result::mem_get_info().expect("cuMemGetInfo");
    total - free
}

/// One thread's streams: a PyTorch pool stream (current on the thread), a cudarc
/// stream, and XLA's stream for external ready events.
struct Streams {
    torch_raw: u64,
    torch: Stream,
    cuda: Arc<CudaStream>,
    cuda_s: Stream,
    xla: Stream,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fw {
    Torch,
    Cuda,
    Xla,
}

/// A produced value, kept by its producer until dropped.
#[allow(clippy::large_enum_variant)] // test values, a handful alive at once
enum Produced {
    Torch(Tensor),
    Cuda(CudaTensor<f32>),
    Xla(handoff_xla::Buffer),
}

/// A consumer's view.
#[allow(clippy::large_enum_variant)] // as above
enum Consumed {
    Torch(Tensor),
    Cuda(CudaTensor<f32>),
    Xla(handoff_xla::Buffer),
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Queues `cycles` of GPU spin on a raw stream (PyTorch's sleep kernel, made
/// current there for the call).
fn spin_on(raw: u64, cycles: i64, torch_raw: u64) {
    let guard = cuda::use_raw_stream(0, raw).unwrap();
    cuda::sleep(0, cycles).unwrap();
    drop(guard);
    debug_assert_eq!(cuda::current_raw_stream(0).unwrap(), torch_raw);
}

fn raw_of(s: &Stream) -> u64 {
    handoff_runtime::cuda::raw_stream(s).expect("a CUDA stream").1
}

struct Outcome {
    checked: usize,
    wrong: usize,
    max_pending: usize,
    by_pair: [[usize; 3]; 3],
}

fn produce(fw: Fw, st: &Streams, client: &Client, n: usize, v: f32, spin: Option<i64>) -> Produced {
    match fw {
        Fw::Torch => {
            if let Some(c) = spin {
                cuda::sleep(0, c).unwrap(); // the fill is queued behind it
            }
            Produced::Torch(Tensor::full([n as i64], v as f64, gpu_common::F32_CUDA))
        }
        Fw::Cuda => {
            if let Some(c) = spin {
                spin_on(st.cuda.cu_stream() as u64, c, st.torch_raw);
            }
            let slice = st.cuda.clone_htod(&vec![v; n]).unwrap();
            Produced::Cuda(CudaTensor::new(slice, &[n as i64]).unwrap())
        }
        Fw::Xla => {
            let d = client.device_by_ordinal(0).unwrap();
            Produced::Xla(client.buffer_from_host(&d, &vec![v; n], &[n as i64]).unwrap())
        }
    }
}

fn consumer_stream(fw: Fw, st: &Streams) -> Stream {
    match fw {
        Fw::Torch => st.torch.clone(),
        Fw::Cuda => st.cuda_s.clone(),
        Fw::Xla => st.xla.clone(),
    }
}

fn export(p: &Produced, consumer: &Stream) -> Handoff {
    match p {
        Produced::Torch(t) => handoff_torch::export(t, consumer).unwrap(),
        // A CudaTensor exports by value: a second view of the same slice is not
        // possible, so the test moves it (its drop is then the hand-off's).
        Produced::Cuda(_) => unreachable!("moved"),
        Produced::Xla(b) => b.clone().export(consumer).unwrap(),
    }
}

fn import(fw: Fw, h: Handoff, st: &Streams, client: &Client) -> Consumed {
    match fw {
        Fw::Torch => Consumed::Torch(
            handoff_torch::import_with(h, &handoff_torch::ImportOptions::new().stream(st.torch.clone()))
                .unwrap(),
        ),
        Fw::Cuda => Consumed::Cuda(h.import::<CudaTensor<f32>>().unwrap()),
        Fw::Xla => Consumed::Xla(client.import(h).unwrap()),
    }
}

/// How many elements differ from `v` (reads on the host; this is the check, and it
/// synchronizes the consumer's stream, which is fine here).
fn wrong(c: &Consumed, st: &Streams, v: f32) -> usize {
    match c {
        Consumed::Torch(t) => t.ne(v as f64).sum(Kind::Int64).int64_value(&[]) as usize,
        Consumed::Cuda(t) => {
            let host = st.cuda.clone_dtoh(t.slice()).unwrap();
            st.cuda.synchronize().unwrap();
            host.iter().filter(|&&x| x != v).count()
        }
        Consumed::Xla(b) => b.to_vec::<f32>().unwrap().iter().filter(|&&x| x != v).count(),
    }
}

fn worker(tid: usize, iters: usize, s: &Setup, pending_hw: &AtomicUsize) -> Outcome {
    s.ctx.bind_to_thread().unwrap();
    let torch_raw = cuda::stream_from_pool(0, false).unwrap();
    let _current = cuda::use_raw_stream(0, torch_raw).unwrap();
    let cuda_stream = s.ctx.new_stream().unwrap();
    let xla = s.client.ready_stream(&s.client.device_by_ordinal(0).unwrap()).unwrap();
    let st = Streams {
        torch_raw,
        torch: gpu_common::cuda_stream(torch_raw),
        cuda_s: stream_of(&cuda_stream).unwrap(),
        cuda: cuda_stream,
        xla,
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((tid as u64 + 1) * 0x1000_0001));
    let fws = [Fw::Torch, Fw::Cuda, Fw::Xla];
    let mut out = Outcome { checked: 0, wrong: 0, max_pending: 0, by_pair: [[0; 3]; 3] };
    for i in 0..iters {
        let (pi, ci) = (rng.below(3) as usize, rng.below(3) as usize);
        let (pf, cf) = (fws[pi], fws[ci]);
        // Allocator churn: sizes from 1 element to 1 MiB, powers of two and odd ones.
        let n = if rng.below(2) == 0 { 1 << rng.below(19) } else { 1 + rng.below(1 << 18) as usize };
        let v = (tid * 100_000 + i) as f32;
        let spin = (rng.below(4) == 0).then(|| 1_000 + rng.below(200_000) as i64);
        let consumer = consumer_stream(cf, &st);
        let produced = produce(pf, &st, &s.client, n, v, spin);
        let (h, producer_left) = match produced {
            Produced::Cuda(t) => {
                use handoff_runtime::Export;
                (t.export(&consumer).unwrap(), None)
            }
            p => {
                let h = export(&p, &consumer);
                (h, Some(p))
            }
        };
        let order = rng.below(3);
        // 0: producer first; 1: consumer first; 2: both, with kernels queued.
        let producer_left = if order == 0 { None } else { producer_left };
        let c = import(cf, h, &st, &s.client);
        let bad = wrong(&c, &st, v);
        out.checked += 1;
        out.wrong += usize::from(bad > 0);
        out.by_pair[pi][ci] += 1;
        if bad > 0 {
            eprintln!(
                "thread {tid} hand-off {i}: {pf:?} -> {cf:?}, {n} elements: {bad} wrong (expected {v})"
            );
        }
        if order == 2 {
            // Both go while work is queued on the consumer and the producer streams.
            spin_on(raw_of(&consumer), 50_000, st.torch_raw);
            spin_on(st.torch_raw, 50_000, st.torch_raw);
            drop(c);
            drop(producer_left);
        } else {
            drop(c);
            drop(producer_left);
        }
        let p = reaper::pending();
        out.max_pending = out.max_pending.max(p);
        pending_hw.fetch_max(p, Ordering::Relaxed);
        assert!(p <= MAX_PENDING, "reaper queue grew to {p}");
    }
    tch::Cuda::synchronize(0);
    out
}

fn run(s: &Arc<Setup>, per_thread: usize) -> Vec<Outcome> {
    let hw = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    for tid in 0..THREADS {
        let (s, hw, tx) = (s.clone(), hw.clone(), tx.clone());
        std::thread::spawn(move || {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker(tid, per_thread, &s, &hw)));
            let _ = tx.send(r);
        });
    }
    drop(tx);
    let end = Instant::now() + DEADLINE;
    let mut outs = Vec::new();
    for _ in 0..THREADS {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(o)) => outs.push(o),
            Ok(Err(p)) => std::panic::resume_unwind(p),
            Err(_) => panic!(
                "gpu_stress: {} of {THREADS} threads not done after {DEADLINE:?}: deadlock",
                THREADS - outs.len()
            ),
        }
    }
    outs
}

#[test]
fn gpu_stress_ten_thousand_handoffs_from_eight_threads() {
    let Some(s) = setup() else { return };
    let s = Arc::new(s);
    s.ctx.bind_to_thread().unwrap();
    // Warm-up: streams, event pools, the caching allocators and XLA's pools fill up.
    run(&s, WARMUP_PER_THREAD);
    reaper::flush();
    tch::Cuda::synchronize(0);
    let before = used_bytes();
    let t0 = Instant::now();
    let outs = run(&s, HANDOFFS / THREADS);
    let took = t0.elapsed();
    reaper::flush();
    tch::Cuda::synchronize(0);
    let after = used_bytes();
    let checked: usize = outs.iter().map(|o| o.checked).sum();
    let wrong: usize = outs.iter().map(|o| o.wrong).sum();
    let max_pending = outs.iter().map(|o| o.max_pending).max().unwrap_or(0);
    let mut pairs = [[0usize; 3]; 3];
    for o in &outs {
        for (p, row) in o.by_pair.iter().enumerate() {
            for (c, n) in row.iter().enumerate() {
                pairs[p][c] += n;
            }
        }
    }
    println!(
        "stress: {checked} hand-offs from {THREADS} threads in {:.1} s, wrong {wrong}, max reaper queue {max_pending}, \
         pairs [torch, cuda, xla] x [torch, cuda, xla] {pairs:?}, device memory used {} MiB before, {} MiB after, \
         pending after flush {}",
        took.as_secs_f64(),
        before >> 20,
        after >> 20,
        reaper::pending()
    );
    assert_eq!(checked, HANDOFFS);
    assert_eq!(wrong, 0, "corrupted hand-offs");
    assert_eq!(reaper::pending(), 0);
    assert!(pairs.iter().flatten().all(|&n| n > 0), "every pair exercised: {pairs:?}");
    assert!(
        after <= before + MEMORY_SLACK,
        "device memory did not come back: {} MiB before, {} MiB after",
        before >> 20,
        after >> 20
    );
}
