//! GPU tests: stream-ordered exchange on a real device, proved never to
//! block the host. Each prints `SKIPPED: <reason>` and returns when no CUDA device is
//! present (and fails instead under `HANDOFF_REQUIRE_GPU=1`, as the GPU bundle runs
//! them). Run with `--test-threads=1 --nocapture` to see the figures.

mod common;

use common::{Gpu, done, event, eventually, gpu, ptr, read, record};
use cudarc::driver::{CudaStream, sys};
use handoff_cuda::{CudaTensor, stream_of};
use handoff_runtime::{Export, Handoff, Ready, Release, Stream, StreamOrdered, cuda, reaper, stats};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

const N: u32 = 4096;
const SPIN_NS: u64 = 50_000_000;

fn raw(s: &Arc<CudaStream>) -> sys::CUstream {
    s.cu_stream()
}

/// A fresh producer tensor holding zeros, with its fill complete.
fn zeros(g: &Gpu, stream: &Arc<CudaStream>) -> CudaTensor<u32> {
    let s = stream.alloc_zeros::<u32>(N as usize).unwrap();
    stream.synchronize().unwrap();
    let _ = g;
    CudaTensor::new(s, &[N as i64]).unwrap()
}

struct Exchange {
    stale: usize,
    host_us: Vec<f64>,
}

/// The producer spins ~50 ms then writes `rep + 1`; the consumer copies the data on
/// its own stream right after the hand-off. With `wait`, the hand-off is the real
/// one; without it, the same hand-off is built with ordering deliberately left out.
fn exchange(g: &Gpu, wait: bool) -> Exchange {
    let (p, c) = (g.ctx.new_stream().unwrap(), g.ctx.new_stream().unwrap());
    let consumer = stream_of(&c).unwrap();
    let pending = event();
    let mut out = Exchange { stale: 0, host_us: Vec::new() };
    for rep in 0..20u32 {
        let value = 1000 + rep;
        let x = zeros(g, &p);
        let dst = c.alloc_zeros::<u32>(N as usize).unwrap();
        c.synchronize().unwrap();
        g.kernels.spin_fill(raw(&p), x.device_ptr(), N, value, SPIN_NS);
        record(pending, raw(&p));

        let t0 = Instant::now();
        let (y, delta) = stats::measure(|| -> handoff_runtime::Result<CudaTensor<u32>> {
            let h = if wait {
                x.export(&consumer)?
            } else {
                Handoff::with_keep_alive(
                    x,
                    |x| x.describe(),
                    &consumer,
                    Ready::Elided,
                    Release::AfterConsumer,
                )?
            };
            h.import()
        });
        let host = t0.elapsed();
        let y = y.unwrap();
        let still_running = !done(pending);
        g.kernels.copy(raw(&c), ptr(&dst), y.device_ptr(), N);
        drop(y);

        let got = read(&c, &dst);
        p.synchronize().unwrap();
        let fresh = got.iter().all(|&v| v == value);
        out.stale += usize::from(!fresh);
        out.host_us.push(host.as_secs_f64() * 1e6);
        println!(
            "  rep {rep:2} wait={wait}: host call {:8.1} us, producer still running after it: {still_running}, \
             consumer saw {} (expected {value}), {delta}",
            host.as_secs_f64() * 1e6,
            if fresh { "the final write".to_string() } else { format!("stale data (first {})", got[0]) },
        );
        assert!(
            still_running,
            "the producer's 50 ms kernel had finished when the hand-off returned: the test proves nothing"
        );
        assert_eq!(delta.host_syncs, 0);
        if wait {
            assert_eq!((delta.events_recorded, delta.waits_enqueued), (1, 1));
        } else {
            assert_eq!((delta.events_recorded, delta.waits_enqueued), (0, 0));
        }
    }
    reaper::flush();
    out
}

#[test]
fn no_host_sync_and_the_consumer_sees_the_final_write() {
    let Some(g) = gpu("no_host_sync") else { return };
    let r = exchange(&g, true);
    let max = r.host_us.iter().cloned().fold(0.0, f64::max);
    println!(
        "no-host-sync: 20 hand-offs behind 50 ms of producer work: max host call {max:.1} us, stale {}",
        r.stale
    );
    assert_eq!(r.stale, 0, "the consumer must see the producer's final write every time");
    assert!(max < 1000.0, "a hand-off took {max:.1} us of host time (limit 1 ms): something blocked");
}

#[test]
fn control_without_the_wait_reads_stale_data() {
    let Some(g) = gpu("control") else { return };
    let r = exchange(&g, false);
    println!("control (wait left out): stale in {} of 20", r.stale);
    assert!(
        r.stale >= 1,
        "without the wait the consumer never raced the producer: the test cannot detect a race"
    );
}

#[test]
fn same_stream_hand_off_makes_no_cuda_call() {
    let Some(g) = gpu("elision") else { return };
    let s = g.ctx.new_stream().unwrap();
    let x = zeros(&g, &s);
    let stream = stream_of(&s).unwrap();
    let calls = cuda::driver_calls();
    let (y, delta) = stats::measure(|| x.export(&stream).and_then(|h| h.import::<CudaTensor<u32>>()));
    let calls = cuda::driver_calls() - calls;
    let y = y.unwrap();
    println!("elision: same-stream hand-off: {delta}; backend driver calls {calls}");
    assert_eq!(calls, 0, "no CUDA driver call on a same-stream hand-off");
    assert_eq!(
        (
            delta.events_recorded,
            delta.waits_enqueued,
            delta.host_syncs,
            delta.events_created,
            delta.waits_elided
        ),
        (0, 0, 0, 0, 1)
    );
    assert_eq!(y.stream(), &stream);
    let before = cuda::driver_calls();
    let ((), delta) = stats::measure(|| drop(y));
    assert_eq!(cuda::driver_calls(), before, "the release on the same stream needs no event");
    assert_eq!((delta.releases_immediate, delta.releases_deferred, delta.events_recorded), (1, 0, 0));
}

#[test]
fn pool_creates_no_events_after_warm_up() {
    let Some(g) = gpu("pool") else { return };
    let (p, c) = (g.ctx.new_stream().unwrap(), g.ctx.new_stream().unwrap());
    let (ps, cs) = (stream_of(&p).unwrap(), stream_of(&c).unwrap());
    let alloc = |n: usize| -> Vec<CudaTensor<u32>> {
        (0..n).map(|_| CudaTensor::new(p.alloc_zeros::<u32>(16).unwrap(), &[16]).unwrap()).collect()
    };
    // Warm-up: 300 imports alive at once, so the pool holds 300 events once they are back.
    let held: Vec<CudaTensor<u32>> =
        alloc(300).into_iter().map(|x| x.export(&cs).unwrap().import().unwrap()).collect();
    // Keep the consumer stream busy so that none of the 300 releases completes before
    // all are queued: the pool then holds more events than the loop below needs.
    let scratch = c.alloc_zeros::<u32>(1).unwrap();
    g.kernels.spin_fill(c.cu_stream(), ptr(&scratch), 1, 0, 20_000_000);
    drop(held);
    assert!(eventually(5000, || reaper::pending() == 0), "the reaper did not drain the warm-up");
    let pool = || ps.backend().event_pool().created();
    let (created, free) = (pool(), ps.backend().event_pool().free());
    let global = stats::stats();
    let mut done_count = 0;
    for _ in 0..100 {
        let batch: Vec<CudaTensor<u32>> =
            alloc(100).into_iter().map(|x| x.export(&cs).unwrap().import().unwrap()).collect();
        drop(batch);
        done_count += 100;
        assert!(eventually(5000, || reaper::pending() == 0), "the reaper did not drain");
    }
    let d = stats::stats().since(&global);
    println!(
        "pool: {done_count} cross-stream hand-offs after warm-up: events created {} (pool had {created}, {free} free), \
         recorded {}, waits {}, deferred releases {}",
        pool() - created,
        d.events_recorded,
        d.waits_enqueued,
        d.releases_deferred
    );
    assert_eq!(done_count, 10_000);
    assert_eq!(pool() - created, 0, "the pool created events in steady state");
    assert_eq!(d.events_created, 0);
    assert_eq!(d.waits_enqueued, 10_000);
    assert_eq!(d.events_recorded, 20_000, "one record per export and one per deferred release");
    assert_eq!(d.host_syncs, 0);
    p.synchronize().unwrap();
    c.synchronize().unwrap();
}

/// A keep-alive that notes, when it is dropped, whether the consumer's kernel had
/// completed (0 = not dropped yet, 1 = dropped after, 2 = dropped too early).
struct Probe {
    tensor: CudaTensor<u32>,
    /// A `CUevent` (as an integer, so that the probe is `Send`).
    after_consumer_kernel: usize,
    ctx: Arc<cudarc::driver::CudaContext>,
    state: Arc<AtomicU8>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.ctx.bind_to_thread().unwrap();
        let ok = done(self.after_consumer_kernel as sys::CUevent);
        self.state.store(if ok { 1 } else { 2 }, Ordering::SeqCst);
    }
}

#[test]
fn release_waits_for_the_consumers_queued_kernel_without_blocking_the_drop() {
    let Some(g) = gpu("release") else { return };
    let (p, c) = (g.ctx.new_stream().unwrap(), g.ctx.new_stream().unwrap());
    let consumer = stream_of(&c).unwrap();
    reaper::flush();

    // 1. Through CudaTensor's own export, watched with the reaper's counters.
    let x = zeros(&g, &p);
    let y: CudaTensor<u32> = x.export(&consumer).unwrap().import().unwrap();
    let scratch = c.alloc_zeros::<u32>(N as usize).unwrap();
    g.kernels.spin_fill(raw(&c), ptr(&scratch), N, 7, SPIN_NS);
    g.kernels.copy(raw(&c), ptr(&scratch), y.device_ptr(), N);
    let kernel_done = event();
    record(kernel_done, raw(&c));
    let (pending0, released0) = (reaper::pending(), reaper::released());
    let t0 = Instant::now();
    let ((), delta) = stats::measure(|| drop(y));
    let drop_us = t0.elapsed().as_secs_f64() * 1e6;
    assert_eq!((delta.host_syncs, delta.releases_deferred), (0, 1), "{delta}");
    assert_eq!(reaper::pending(), pending0 + 1, "the producer's memory is queued behind the consumer");
    std::thread::sleep(Duration::from_millis(20));
    let early = reaper::released() != released0;
    let kernel_was_running = !done(kernel_done);
    assert!(kernel_was_running, "the consumer kernel finished within 20 ms: the test proves nothing");
    assert!(!early, "the producer's memory was released while the consumer's kernel was still queued");
    assert!(eventually(5000, || reaper::released() > released0), "never released");
    assert!(done(kernel_done), "released before the consumer's kernel completed");
    println!(
        "release (CudaTensor): drop took {drop_us:.1} us; not released while the kernel ran; released after it"
    );
    assert!(drop_us < 1000.0, "dropping the consumer took {drop_us:.1} us: it must not wait");

    // 2. With a keep-alive that checks, at the moment it is dropped, that the
    //    consumer's kernel has completed.
    let x = zeros(&g, &p);
    let state = Arc::new(AtomicU8::new(0));
    let after = event();
    x.ready_on(&consumer).unwrap();
    let probe =
        Probe { tensor: x, after_consumer_kernel: after as usize, ctx: g.ctx.clone(), state: state.clone() };
    let h = Handoff::with_keep_alive(
        probe,
        |p| p.tensor.describe(),
        &consumer,
        Ready::Waited,
        Release::AfterConsumer,
    )
    .unwrap();
    let y: CudaTensor<u32> = h.import().unwrap();
    g.kernels.spin_fill(raw(&c), ptr(&scratch), N, 8, SPIN_NS);
    g.kernels.copy(raw(&c), ptr(&scratch), y.device_ptr(), N);
    record(after, raw(&c));
    let t0 = Instant::now();
    drop(y);
    let drop_us = t0.elapsed().as_secs_f64() * 1e6;
    assert_eq!(state.load(Ordering::SeqCst), 0, "released during the drop");
    assert!(eventually(5000, || state.load(Ordering::SeqCst) != 0), "never released");
    println!("release (probe): drop took {drop_us:.1} us; state at release {}", state.load(Ordering::SeqCst));
    assert_eq!(
        state.load(Ordering::SeqCst),
        1,
        "the keep-alive was dropped before the consumer's kernel completed"
    );
    assert!(drop_us < 1000.0, "dropping the consumer took {drop_us:.1} us: it must not wait");
    c.synchronize().unwrap();
}

#[test]
fn round_trip_keeps_layout_and_data_and_refuses_a_wrong_dtype() {
    let Some(g) = gpu("round_trip") else { return };
    let (p, c) = (g.ctx.new_stream().unwrap(), g.ctx.new_stream().unwrap());
    let (ps, cs) = (stream_of(&p).unwrap(), stream_of(&c).unwrap());
    let data: Vec<u32> = (0..12).collect();
    let x = CudaTensor::new(p.clone_htod(&data).unwrap(), &[3, 4]).unwrap();
    let h = x.export(&cs).unwrap();
    assert_eq!((h.shape(), h.strides(), h.ready()), (&[3i64, 4][..], &[4i64, 1][..], Ready::Waited));
    assert_eq!(h.device(), handoff_runtime::Device::Cuda(0));
    let y: CudaTensor<u32> = h.import().unwrap();
    assert!(y.is_imported());
    assert_eq!((y.shape(), y.stream()), (&[3i64, 4][..], &cs));
    assert_eq!(read(&c, y.slice()), data);
    // And back to the producer stream.
    let z: CudaTensor<u32> = y.export(&ps).unwrap().import().unwrap();
    assert_eq!(read(&p, z.slice()), data);
    drop(z);
    // A strided export describes its strides; a wrong element type is refused.
    let t = CudaTensor::with_strides(p.clone_htod(&data).unwrap(), &[4, 3], &[1, 4]).unwrap();
    let h = t.export(&cs).unwrap();
    assert_eq!(h.strides(), &[1, 4]);
    assert!(!h.is_contiguous());
    assert!(matches!(h.import::<CudaTensor<u32>>(), Err(handoff_runtime::Error::Adapter { .. })));
    let t = CudaTensor::new(p.clone_htod(&data).unwrap(), &[12]).unwrap();
    match t.export(&cs).unwrap().import::<CudaTensor<f32>>() {
        Err(handoff_runtime::Error::Adapter { message, .. }) => assert!(message.contains("u32"), "{message}"),
        other => panic!("{other:?}"),
    }
    reaper::flush();
}

#[test]
fn works_whatever_context_is_current_on_the_calling_thread() {
    let Some(g) = gpu("context") else { return };
    let (p, c) = (g.ctx.new_stream().unwrap(), g.ctx.new_stream().unwrap());
    let (pr, cr) = (p.cu_stream() as usize as u64, c.cu_stream() as usize as u64);
    // A thread with no current context.
    let before = std::thread::spawn(move || {
        let before = cudarc::driver::result::ctx::get_current().unwrap();
        // SAFETY: (test) `p` and `c` outlive this thread, which is joined below.
        let (ps, cs) = unsafe { (cuda::stream(0, pr).unwrap(), cuda::stream(0, cr).unwrap()) };
        handoff_runtime::order(Some(&ps), &cs).unwrap();
        before.is_none()
    })
    .join()
    .unwrap();
    assert!(before, "a fresh thread has no current context");
    // A thread where a non-primary context is current: it stays current afterwards.
    let other = cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
    other.bind_to_thread().unwrap();
    // SAFETY: (test) `p` and `c` outlive `ps` and `cs`.
    let (ps, cs) = unsafe { (cuda::stream(0, pr).unwrap(), cuda::stream(0, cr).unwrap()) };
    assert_eq!(handoff_runtime::order(Some(&ps), &cs).unwrap(), Ready::Waited);
    let now = cudarc::driver::result::ctx::get_current().unwrap();
    assert_eq!(now, Some(other.cu_ctx()), "the caller's current context was not restored");
    assert_ne!(now, Some(g.ctx.cu_ctx()));
    g.ctx.bind_to_thread().unwrap();
    drop(other);
    g.ctx.bind_to_thread().unwrap();
    assert_eq!(cuda::primary_context(0).unwrap(), g.ctx.cu_ctx() as usize as u64);
    // The streams' own helpers agree with the runtime's mapping.
    let legacy: Stream = stream_of(&g.ctx.default_stream()).unwrap();
    assert_eq!(cuda::dlpack_stream_value(&legacy), Some(1));
    let ptds = stream_of(&g.ctx.per_thread_stream()).unwrap();
    assert_eq!(ptds, cuda::per_thread_stream(0).unwrap());
    p.synchronize().unwrap();
    c.synchronize().unwrap();
}
