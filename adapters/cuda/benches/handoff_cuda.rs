//! Host cost of a hand-off on a real GPU (a benchmark, not a timed test).
//!
//! Median (and p10/p90) of 10,000 after 1,000 warm-up, in nanoseconds of host time:
//! - `raw pair`: `cuEventRecord` + `cuStreamWaitEvent` through the driver, the floor;
//! - `order`: the runtime's `order(producer, consumer)` (pooled event, record, wait);
//! - `cross-stream`: `CudaTensor::export(consumer)` + `Handoff::import::<CudaTensor>()`;
//! - `same-stream`: the same with the consumer on the producer's stream;
//! - `of which export` / `of which import`: the two halves of each, timed in the same
//!   loop (one clock read between them);
//! - `drop (deferred)`: dropping the imported tensor (records the release event);
//! - `raw pair after cuCtxGetCurrent`: the floor with the context check a caller on
//!   any thread must make; `clock reads alone`: what the two clock reads add to every
//!   figure; `16 at a time`: same-stream hand-offs timed in batches, per hand-off,
//!   without the clock's share;
//! - `one at a time`: the same hand-offs as a program makes them, each tensor made
//!   just before and its view dropped just after (both untimed), where the loops
//!   above keep all 11,000 views alive (fresh memory, cold metadata); beside the
//!   cross-stream one, the raw pair in the same iterations (alternating which goes
//!   first), the floor that ratio is taken against.
//!
//! Prints `SKIPPED: <reason>` and exits 0 without a CUDA device (1 when
//! `HANDOFF_REQUIRE_GPU=1`). Run: `cargo bench -p handoff-cuda`, or the GPU bundle.
//! `--loop same|cross|raw [--loop-secs S]` only repeats that hand-off one at a time
//! (or the raw pair) for a sampling profiler run around the process.

#[path = "../tests/common/mod.rs"]
mod common;

use cudarc::driver::sys;
use handoff_cuda::{CudaTensor, stream_of};
use handoff_runtime::{Export, order, reaper, stats};
use std::time::Instant;

const WARM: usize = 1_000;
const N: usize = 10_000;

struct Summary {
    name: &'static str,
    p10: f64,
    median: f64,
    p90: f64,
}

fn summarize(name: &'static str, ns: Vec<f64>) -> Summary {
    summarize_after(name, ns, WARM)
}

/// The quantiles of `ns` after its first `warm` samples.
fn summarize_after(name: &'static str, mut ns: Vec<f64>, warm: usize) -> Summary {
    let ns = ns.split_off(warm.min(ns.len() - 1));
    let mut s = ns;
    s.sort_by(f64::total_cmp);
    let q = |f: f64| s[((s.len() - 1) as f64 * f) as usize];
    Summary { name, p10: q(0.1), median: q(0.5), p90: q(0.9) }
}

fn time(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_nanos() as f64
}

/// `--loop same|cross|raw [--loop-secs S]`: the path to repeat and for how long.
fn loop_args() -> Option<(String, f64)> {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let which = value("--loop")?.clone();
    let secs = value("--loop-secs").and_then(|s| s.parse().ok()).unwrap_or(4.0);
    Some((which, secs))
}

fn main() {
    let Some(g) = common::gpu("bench") else {
        return;
    };
    let (p, c) = (g.ctx.new_stream().unwrap(), g.ctx.new_stream().unwrap());
    let (ps, cs) = (stream_of(&p).unwrap(), stream_of(&c).unwrap());
    if let Some((which, secs)) = loop_args() {
        let e = common::event();
        let consumer = if which == "same" { &ps } else { &cs };
        let end = Instant::now() + std::time::Duration::from_secs_f64(secs);
        let mut ns = Vec::new();
        while Instant::now() < end {
            // Made just before and dropped just after (untimed), as one at a time below.
            let x = CudaTensor::new(p.alloc_zeros::<f32>(256).unwrap(), &[16, 16]).unwrap();
            let t0 = Instant::now();
            let y = if which == "raw" {
                // SAFETY: a live event and streams of the current (primary) context.
                unsafe {
                    sys::cuEventRecord(e, p.cu_stream());
                    sys::cuStreamWaitEvent(c.cu_stream(), e, 0);
                }
                None
            } else {
                Some(x.export(consumer).unwrap().import::<CudaTensor<f32>>().unwrap())
            };
            ns.push(t0.elapsed().as_nanos() as f64);
            drop(y);
            if ns.len() % 4096 == 0 {
                p.synchronize().unwrap();
            }
        }
        reaper::flush();
        let s = summarize_after("loop", ns, 0);
        println!("loop {which}: median {:.0} ns (p10 {:.0}, p90 {:.0})", s.median, s.p10, s.p90);
        return;
    }
    let total = WARM + N;
    let mut results = Vec::new();

    // The floor: one raw record + wait pair.
    let e = common::event();
    let mut raw = Vec::with_capacity(total);
    for _ in 0..total {
        raw.push(time(|| {
            // SAFETY: a live event and streams of the current (primary) context.
            unsafe {
                sys::cuEventRecord(e, p.cu_stream());
                sys::cuStreamWaitEvent(c.cu_stream(), e, 0);
            }
        }));
    }
    results.push(summarize("raw cuEventRecord + cuStreamWaitEvent", raw));

    // The same pair after a context check, as a caller that may run on any thread
    // (with another context, or none, current) must make: what `order()` makes.
    let mut checked = Vec::with_capacity(total);
    for _ in 0..total {
        checked.push(time(|| {
            let mut current: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: a valid out pointer; then as above.
            unsafe {
                sys::cuCtxGetCurrent(&mut current);
                sys::cuEventRecord(e, p.cu_stream());
                sys::cuStreamWaitEvent(c.cu_stream(), e, 0);
            }
            std::hint::black_box(current);
        }));
    }
    results.push(summarize("raw pair after cuCtxGetCurrent", checked));

    // What the clock itself adds to each figure: two reads with nothing between.
    let mut clock = Vec::with_capacity(total);
    for _ in 0..total {
        clock.push(time(|| {}));
    }
    results.push(summarize("clock reads alone (in every figure)", clock));

    let mut ord = Vec::with_capacity(total);
    for _ in 0..total {
        ord.push(time(|| {
            order(Some(&ps), &cs).unwrap();
        }));
    }
    results.push(summarize("runtime order() (pooled event, record, wait)", ord));

    let before = stats::stats();
    for (name, consumer) in [("cross-stream export + import", &cs), ("same-stream export + import", &ps)] {
        let tensors: Vec<CudaTensor<f32>> = (0..total)
            .map(|_| CudaTensor::new(p.alloc_zeros::<f32>(256).unwrap(), &[16, 16]).unwrap())
            .collect();
        p.synchronize().unwrap();
        let mut times = Vec::with_capacity(total);
        let (mut exports, mut imports) = (Vec::with_capacity(total), Vec::with_capacity(total));
        let mut held = Vec::with_capacity(total);
        for x in tensors {
            // One clock read between the halves: the two parts add up to the whole.
            let t0 = Instant::now();
            let h = x.export(consumer).unwrap();
            let t1 = Instant::now();
            let y = h.import::<CudaTensor<f32>>().unwrap();
            let t2 = Instant::now();
            times.push((t2 - t0).as_nanos() as f64);
            exports.push((t1 - t0).as_nanos() as f64);
            imports.push((t2 - t1).as_nanos() as f64);
            held.push(Some(y));
        }
        results.push(summarize(name, times));
        let same = std::ptr::eq(consumer, &ps);
        results.push(summarize(
            if same { "  of which export (same-stream)" } else { "  of which export (cross-stream)" },
            exports,
        ));
        results.push(summarize(
            if same { "  of which import (same-stream)" } else { "  of which import (cross-stream)" },
            imports,
        ));
        if std::ptr::eq(consumer, &cs) {
            let mut drops = Vec::with_capacity(total);
            for y in held {
                drops.push(time(|| drop(y)));
            }
            results.push(summarize("drop of a cross-stream import (deferred release)", drops));
        } else {
            drop(held);
        }
        reaper::flush();
    }
    // The same hand-offs one at a time, as a program makes them: each tensor made just
    // before (untimed), handed off, and the view dropped just after (untimed), so the
    // allocator reuses what the last one freed and the tensor's metadata is warm. The
    // loops above keep every view alive (11,000 at once), which adds fresh memory and
    // cold metadata to each hand-off. Beside each, in the same iteration, the raw
    // pair on the same streams, first one then the other on alternate iterations: a
    // record right after new work on the stream costs more than one on an idle
    // stream, and both see that equally.
    for (name, raw_name, consumer, raw_consumer) in [
        (
            "cross-stream, one at a time (made, handed off, dropped)",
            "raw pair, one at a time (beside it)",
            &cs,
            &c,
        ),
        ("same-stream, one at a time (made, handed off, dropped)", "", &ps, &p),
    ] {
        let (mut times, mut raws) = (Vec::with_capacity(total), Vec::with_capacity(total));
        for i in 0..total {
            let x = CudaTensor::new(p.alloc_zeros::<f32>(256).unwrap(), &[16, 16]).unwrap();
            let handoff = |x: CudaTensor<f32>| {
                let t0 = Instant::now();
                let y = x.export(consumer).unwrap().import::<CudaTensor<f32>>().unwrap();
                (t0.elapsed().as_nanos() as f64, y)
            };
            let raw_pair = || {
                time(|| {
                    // SAFETY: a live event and streams of the current (primary) context.
                    unsafe {
                        sys::cuEventRecord(e, p.cu_stream());
                        sys::cuStreamWaitEvent(raw_consumer.cu_stream(), e, 0);
                    }
                })
            };
            let (t, y, r) = if i % 2 == 0 {
                let r = raw_pair();
                let (t, y) = handoff(x);
                (t, y, r)
            } else {
                let (t, y) = handoff(x);
                (t, y, raw_pair())
            };
            times.push(t);
            raws.push(r);
            drop(y);
        }
        results.push(summarize(name, times));
        if !raw_name.is_empty() {
            results.push(summarize(raw_name, raws));
        }
        reaper::flush();
    }
    // Same-stream hand-offs timed BATCH at a time (tensors made before, views dropped
    // after, both untimed): the cost per hand-off without the clock's.
    const BATCH: usize = 16;
    let mut batched = Vec::with_capacity(total / BATCH);
    for _ in 0..total / BATCH {
        let xs: Vec<CudaTensor<f32>> = (0..BATCH)
            .map(|_| CudaTensor::new(p.alloc_zeros::<f32>(256).unwrap(), &[16, 16]).unwrap())
            .collect();
        let mut ys = Vec::with_capacity(BATCH);
        let t0 = Instant::now();
        for x in xs {
            ys.push(x.export(&ps).unwrap().import::<CudaTensor<f32>>().unwrap());
        }
        batched.push(t0.elapsed().as_nanos() as f64 / BATCH as f64);
        drop(ys);
    }
    results.push(summarize_after(
        "same-stream, 16 at a time (per hand-off, no clock)",
        batched,
        WARM / BATCH,
    ));
    let d = stats::stats().since(&before);

    println!("\nhandoff-cuda host cost, median of {N} after {WARM} warm-up (ns):");
    println!("{:<52} {:>9} {:>9} {:>9}", "", "p10", "median", "p90");
    for r in &results {
        println!("{:<52} {:>9.0} {:>9.0} {:>9.0}", r.name, r.p10, r.median, r.p90);
    }
    let median =
        |prefix: &str| results.iter().find(|r| r.name.starts_with(prefix)).map_or(f64::NAN, |r| r.median);
    let (raw, cross, same) = (median("raw"), median("cross-stream export"), median("same-stream export"));
    let (cross1, same1, raw1) =
        (median("cross-stream, one"), median("same-stream, one"), median("raw pair, one at a time"));
    println!(
        "cross-stream / raw pair: {:.2}x held, {:.2}x one at a time beside its own raw pair (target <= 1.5x)",
        cross / raw,
        cross1 / raw1
    );
    println!(
        "same-stream: {same:.0} ns held, {same1:.0} ns one at a time, {:.0} ns per hand-off 16 at a time \
         (target <= 200 ns); the clock's two reads {:.0} ns",
        median("same-stream, 16"),
        median("clock")
    );
    println!("counters over the four hand-off loops: {d}");
    for r in &results {
        println!("BENCH {}\t{:.0}\t{:.0}\t{:.0}", r.name, r.p10, r.median, r.p90);
    }
    assert!(d.host_syncs <= 4, "only the four reaper::flush() calls may sync: {d}");
    p.synchronize().unwrap();
    c.synchronize().unwrap();
}
