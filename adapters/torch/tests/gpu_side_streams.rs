//! GPU: the no-host-sync exchanges with a non-default PyTorch stream current.
#![cfg(feature = "cuda")]

mod gpu_common;

use handoff_torch::cuda;

#[test]
fn gpu_side_stream_current_torch_to_other_stream() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    let side = cuda::stream_from_pool(0, true).unwrap();
    let _current = cuda::use_raw_stream(0, side).unwrap();
    assert_eq!(cuda::current_raw_stream(0).unwrap(), side);
    let torch = handoff_torch::current_stream(handoff_runtime::Device::Cuda(0)).unwrap().unwrap();
    assert_eq!(handoff_runtime::cuda::raw_stream(&torch), Some((0, side)));
    gpu_common::torch_to_other_stream("side stream current -> another stream");
}

#[test]
fn gpu_side_stream_current_other_stream_to_torch() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    let side = cuda::stream_from_pool(0, true).unwrap();
    let _current = cuda::use_raw_stream(0, side).unwrap();
    gpu_common::other_stream_to_torch("another stream -> side stream current");
}

#[test]
fn gpu_side_stream_same_stream_is_elided() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    let side = cuda::stream_from_pool(0, true).unwrap();
    let _current = cuda::use_raw_stream(0, side).unwrap();
    let s = gpu_common::cuda_stream(side);
    let x = tch::Tensor::ones([1024], gpu_common::F32_CUDA);
    let (h, delta) = handoff_runtime::stats::measure(|| handoff_torch::export(&x, &s).unwrap());
    assert_eq!(h.ready(), handoff_runtime::Ready::Elided);
    assert_eq!((delta.events_recorded, delta.waits_enqueued, delta.host_syncs), (0, 0, 0));
    let y = handoff_torch::import(h).unwrap();
    assert_eq!(y.data_ptr(), x.data_ptr());
    gpu_common::sync();
    assert!(y.equal(&x));
}

#[test]
fn gpu_an_import_on_the_consumer_stream_waits_once() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    let torch = handoff_torch::current_stream(handoff_runtime::Device::Cuda(0)).unwrap().unwrap();
    let (producer, producer_raw) = gpu_common::side_stream();
    let x = {
        let _on_producer = cuda::use_raw_stream(0, producer_raw).unwrap();
        tch::Tensor::ones([1024], gpu_common::F32_CUDA)
    };
    // Made ready on PyTorch's stream, where the import works: PyTorch's caching
    // allocator was told of that stream (`recordStream`), so the hand-off goes at
    // once when the view dies, with no event of its own: the import adds no second
    // wait behind the same stream.
    let y = handoff_torch::import(handoff_torch::export_from(&x, &producer, &torch).unwrap()).unwrap();
    let out = &y * 2.0;
    let (_, d) = handoff_runtime::stats::measure(|| drop(y));
    assert_eq!((d.releases_deferred, d.releases_immediate, d.events_recorded), (0, 1, 0), "{d}");
    gpu_common::sync();
    assert!(out.equal(&(&x * 2.0)));
}
