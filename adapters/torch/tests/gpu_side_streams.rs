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
    use handoff_runtime::{Handoff, Release, TensorDesc, dtype::DataType, stats};
    let Some(_gpu) = gpu_common::gpu() else { return };
    let torch = handoff_torch::current_stream(handoff_runtime::Device::Cuda(0)).unwrap().unwrap();
    let (producer, producer_raw) = gpu_common::side_stream();
    let x = {
        let _on_producer = cuda::use_raw_stream(0, producer_raw).unwrap();
        tch::Tensor::ones([1024], gpu_common::F32_CUDA)
    };
    let expected = &x * 2.0;
    // A hand-off that releases after its consumer's work (as XLA's outputs do), made
    // ready on PyTorch's stream, where the import works.
    let ready = handoff_runtime::order(Some(&producer), &torch).unwrap();
    let h = Handoff::with_keep_alive(
        x,
        |x| Ok(TensorDesc::new(x.data_ptr(), handoff_runtime::Device::Cuda(0), DataType::F32, x.size())),
        &torch,
        ready,
        Release::AfterConsumer,
    )
    .unwrap();
    let y = handoff_torch::import(h).unwrap();
    let out = &y * 2.0;
    // Its release waits behind PyTorch's stream once: the import adds no second event
    // behind the same stream.
    let (_, d) = stats::measure(|| {
        drop(y);
        handoff_runtime::reaper::flush();
    });
    assert_eq!((d.releases_deferred, d.events_recorded), (1, 1), "{d}");
    assert!(out.equal(&expected));
}
