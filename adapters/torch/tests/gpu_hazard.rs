//! GPU: the hazard that corrupts data in Python today. Both owners of the memory are
//! dropped while a kernel that reads it is still queued (behind 50 ms of work), and
//! same-size allocations are made and overwritten right after: with handoff, 20 of 20
//! trials read the right values, in both directions. A control does the same with a
//! raw, unordered view and must see the corruption, which proves the scenario catches it.
#![cfg(feature = "cuda")]

mod gpu_common;

use gpu_common::{F32_CUDA, Foreign, N, TRIALS, raw_view, side_stream, sync, wrong};
use handoff_runtime::{Export, reaper};
use handoff_torch::cuda;
use tch::Tensor;

/// Same-size allocations on the current stream, overwritten at once: the churn that
/// reuses a block freed too early.
fn churn() -> Vec<Tensor> {
    (0..8)
        .map(|_| {
            let mut g = Tensor::empty([N], F32_CUDA);
            let _ = g.fill_(-7.0);
            g
        })
        .collect()
}

/// PyTorch is the producer, a raw consumer reads on another stream.
/// `ordered`: through a hand-off (else the control: a raw pointer, no ordering).
fn torch_producer_dropped_early(ordered: bool, trials: usize) -> usize {
    let (consumer, consumer_raw) = side_stream();
    let busy = gpu_common::cycles_for(50.0);
    let mut good = 0;
    for trial in 0..trials {
        let v = 3.0 + trial as f64;
        let x = Tensor::full([N], v, F32_CUDA); // PyTorch's current stream
        let h = if ordered { Some(handoff_torch::export(&x, &consumer).unwrap()) } else { None };
        let out = {
            let _on_consumer = cuda::use_raw_stream(0, consumer_raw).unwrap();
            if !ordered {
                // The control orders the read after x's fill itself (a host sync) but
                // does nothing about the lifetime.
                sync();
            }
            cuda::sleep(0, busy).unwrap();
            let view = match &h {
                Some(h) => raw_view(h),
                // SAFETY: x is alive here; after it is dropped the view is the bug under test.
                None => unsafe {
                    Tensor::from_blob(x.data_ptr() as *const u8, &[N], &[1], F32_CUDA.0, F32_CUDA.1)
                },
            };
            &view * 1.0 // queued behind 50 ms on the consumer stream
        };
        drop(h); // the consumer lets go
        drop(x); // PyTorch lets go
        let garbage = churn(); // on PyTorch's stream, which is idle
        sync();
        let bad = wrong(&out, v);
        println!(
            "torch producer ({}) trial {trial}: {bad} wrong values",
            if ordered { "handoff" } else { "control" }
        );
        if bad == 0 {
            good += 1;
        }
        drop(garbage);
    }
    reaper::flush();
    good
}

/// A foreign producer (memory freed the moment its hand-off lets go) and PyTorch
/// reading it on its current stream. `ordered`: through `handoff_torch::import`
/// (else the control: a raw view of the pointer).
fn foreign_producer_dropped_early(ordered: bool, trials: usize) -> usize {
    let (producer, producer_raw) = side_stream();
    let torch = handoff_torch::current_stream(handoff_runtime::Device::Cuda(0)).unwrap().unwrap();
    let busy = gpu_common::cycles_for(50.0);
    let mut good = 0;
    for trial in 0..trials {
        let v = 11.0 + trial as f64;
        let x = {
            let _on_producer = cuda::use_raw_stream(0, producer_raw).unwrap();
            Tensor::full([N], v, F32_CUDA)
        };
        let foreign = Foreign { tensor: x, stream: producer.clone() };
        let out = if ordered {
            cuda::sleep(0, busy).unwrap(); // PyTorch's stream is busy for 50 ms
            let y = handoff_torch::import(foreign.export(&torch).unwrap()).unwrap();
            let out = &y * 1.0;
            drop(y); // PyTorch lets go: the foreign owner goes once the read is done
            out
        } else {
            sync(); // the control orders the fill itself, but not the lifetime
            cuda::sleep(0, busy).unwrap(); // PyTorch's stream is busy for 50 ms
            // SAFETY: the memory is alive here; freeing it below is the bug under test.
            let view = unsafe {
                Tensor::from_blob(foreign.tensor.data_ptr() as *const u8, &[N], &[1], F32_CUDA.0, F32_CUDA.1)
            };
            let out = &view * 1.0;
            drop(view);
            drop(foreign); // the foreign owner frees its memory
            out
        };
        let garbage = {
            let _on_producer = cuda::use_raw_stream(0, producer_raw).unwrap();
            churn() // the producer's stream is idle: it overwrites a reused block at once
        };
        sync();
        let bad = wrong(&out, v);
        println!(
            "foreign producer ({}) trial {trial}: {bad} wrong values",
            if ordered { "handoff" } else { "control" }
        );
        if bad == 0 {
            good += 1;
        }
        drop(garbage);
    }
    reaper::flush();
    good
}

#[test]
fn gpu_hazard_torch_producer_dropped_early() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    let control = torch_producer_dropped_early(false, 5);
    println!("control (torch producer dropped early, unordered raw view): {control}/5 right");
    assert!(
        control < 5,
        "the control was never corrupted ({control}/5 right): the scenario cannot catch the hazard"
    );
    let good = torch_producer_dropped_early(true, TRIALS);
    println!("hazard: torch producer dropped early, through handoff: {good}/{TRIALS} right");
    assert_eq!(good, TRIALS, "{good}/{TRIALS} uncorrupted with handoff");
}

#[test]
fn gpu_hazard_foreign_producer_dropped_early() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    let control = foreign_producer_dropped_early(false, 5);
    println!("control (foreign producer dropped early, unordered raw view): {control}/5 right");
    assert!(
        control < 5,
        "the control was never corrupted ({control}/5 right): the scenario cannot catch the hazard"
    );
    let good = foreign_producer_dropped_early(true, TRIALS);
    println!("hazard: foreign producer dropped early, through handoff: {good}/{TRIALS} right");
    assert_eq!(good, TRIALS, "{good}/{TRIALS} uncorrupted with handoff");
}
