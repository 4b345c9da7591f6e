//! GPU: with 50 ms of work queued on PyTorch's current (default) stream, exchanges
//! with a consumer on another stream return in under 1 ms, without a host sync, and
//! the consumer sees fresh values in 20 of 20 trials, both directions.
#![cfg(feature = "cuda")]

mod gpu_common;

#[test]
fn gpu_torch_to_other_stream_without_host_sync() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    assert_eq!(handoff_torch::cuda::current_raw_stream(0).unwrap(), 0, "PyTorch's default stream");
    gpu_common::torch_to_other_stream("default stream -> side stream");
}

#[test]
fn gpu_other_stream_to_torch_without_host_sync() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    gpu_common::other_stream_to_torch("side stream -> default stream");
}

#[test]
fn gpu_cuda_is_available_in_this_binary() {
    let Some(_gpu) = gpu_common::gpu() else { return };
    // The point of the dlopen: rust-lld's --as-needed drops libtorch_cuda otherwise.
    assert!(tch::Cuda::is_available());
    assert!(tch::Cuda::device_count() >= 1);
    let x = tch::Tensor::ones([4], (tch::Kind::Float, tch::Device::Cuda(0)));
    let h = handoff_torch::export(
        &x,
        &handoff_torch::current_stream(handoff_runtime::Device::Cuda(0)).unwrap().unwrap(),
    )
    .unwrap();
    assert_eq!(h.device(), handoff_runtime::Device::Cuda(0));
    assert_eq!(h.ready(), handoff_runtime::Ready::Elided, "same stream: nothing to wait for");
}
