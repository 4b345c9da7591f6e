//! # handoff-cuda
//!
//! Buffers for people who write their own CUDA with [`cudarc`]: a [`CudaTensor<T>`]
//! is a `CudaSlice<T>` with its stream, shape and strides. It is
//! [`StreamOrdered`](handoff_runtime::StreamOrdered), [`Export`](handoff_runtime::Export)s to a [`Handoff`](handoff_runtime::Handoff) without a copy and [`Import`](handoff_runtime::Import)s
//! from one without a copy, so it can be handed to and from PyTorch, XLA or any other
//! handoff adapter with the ordering kept on the GPU.
//!
//! - **Export** moves the tensor into the hand-off (it is the keep-alive): the
//!   producer's memory is freed (by cudarc, stream-ordered, on its own stream) only
//!   after the consumer's queued work is done. No CUDA call on the same stream; one
//!   `cuEventRecord` + one `cuStreamWaitEvent` across streams.
//! - **Import** keeps the hand-off itself (validated once, when it was made: its
//!   shape, strides and flags are read from it, nothing is copied or checked again)
//!   and makes the cudarc slice over its memory on first use, a slice that never
//!   frees it: the hand-off (and so the foreign owner) is kept until the view is
//!   dropped, and then released in stream order by the runtime's reaper.
//! - **No hidden syncs.** cudarc's per-slice event tracking records and waits events
//!   on every access and its `new_stream` synchronizes the context once. Imported
//!   views live in a cudarc context with tracking disabled ([`context`]), so building
//!   and dropping them makes no CUDA call; exported slices are described from a
//!   pointer taken once when the tensor is made.
//!
//! ```no_run
//! use handoff_cuda::{CudaTensor, context, stream_of};
//! use handoff_runtime::{Export, stats};
//!
//! let ctx = context(0)?; // cudarc context on the primary context, no event tracking
//! let (producer, consumer) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
//! let x = CudaTensor::new(producer.clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap(), &[2, 2])?;
//! // ... launch kernels writing x on `producer` ...
//! let (y, delta) = stats::measure(|| -> handoff_runtime::Result<CudaTensor<f32>> {
//!     x.export(&stream_of(&consumer)?)?.import()
//! });
//! let y = y?;
//! assert_eq!((delta.events_recorded, delta.waits_enqueued, delta.host_syncs), (1, 1, 0));
//! // ... launch kernels reading y.slice() on `consumer`; dropping y releases x's
//! // memory only once they are done.
//! # Ok::<(), handoff_runtime::Error>(())
//! ```
#![warn(missing_docs)]

mod context;
mod tensor;

pub use context::{context, stream_of};
pub use tensor::CudaTensor;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{check_layout, compact_strides};
    use handoff_runtime::{Error, cuda};

    #[test]
    fn layouts_are_checked_against_the_slice() {
        assert_eq!(compact_strides(&[2, 3, 4]).unwrap(), vec![12, 4, 1]);
        assert_eq!(compact_strides(&[]).unwrap(), Vec::<i64>::new());
        assert_eq!(compact_strides(&[0, 3]).unwrap(), vec![3, 1]);
        check_layout(&[2, 3], &[3, 1], 6).unwrap();
        check_layout(&[2, 3], &[1, 2], 6).unwrap();
        check_layout(&[0, 3], &[100, 100], 0).unwrap();
        check_layout(&[], &[], 1).unwrap();
        for (shape, strides, len, needle) in [
            (&[2i64, 3][..], &[3i64, 1][..], 5usize, "reaches element 5"),
            (&[2, 3], &[1], 6, "strides has 1"),
            (&[-1], &[1], 6, "shape[0] is -1"),
            (&[2], &[-1], 6, "strides[0] is -1"),
        ] {
            match check_layout(shape, strides, len) {
                Err(Error::Adapter { message, .. }) => assert!(message.contains(needle), "{message}"),
                other => panic!("{shape:?} {strides:?}: {other:?}"),
            }
        }
        assert!(matches!(compact_strides(&[2, -3]), Err(Error::Adapter { .. })));
    }

    #[test]
    fn without_cuda_the_context_is_cuda_unavailable() {
        if cuda::is_available() {
            println!("SKIPPED: a CUDA device is present; the no-CUDA path is tested on machines without one");
            return;
        }
        assert!(matches!(context(0), Err(Error::CudaUnavailable { .. })));
    }
}

fn probe() -> Vec<handoff_runtime::registry::Probe> {
    use handoff_runtime::registry::Probe;
    vec![match handoff_runtime::cuda::device_count() {
        Ok(n) => {
            Probe::found("CUDA devices", format!("{} loaded, {n} device(s)", handoff_runtime::cuda::LIBRARY))
        }
        Err(e) => Probe::not_found("CUDA devices", e.to_string()),
    }]
}

// The registry takes one Rust type per direction: f32 buffers, the common case.
// Other element types exchange through `CudaTensor<T>`'s `Export`/`Import` directly.
handoff_runtime::registry::submit! {
    handoff_runtime::registry::Adapter::new("cuda", env!("CARGO_PKG_VERSION"))
        .about("cudarc CudaSlice<f32> buffers with their stream, shape and strides")
        .devices(&[handoff_runtime::registry::DeviceKind::Cuda])
        .dtypes(&[handoff_runtime::dtype::DataType::F32])
        .exports::<CudaTensor<f32>>()
        .imports::<CudaTensor<f32>>()
        .probe(probe)
}
