//! A tensor on the mock device.

use super::{BufferId, Mock, World};
use crate::device::Device;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handoff::{Export, Handoff, Import};
use crate::stream::Stream;
use crate::stream_ordered::StreamOrdered;
use crate::tensor_desc::TensorDesc;
use std::sync::Arc;

/// Releases a buffer when the last owner goes, in order on the stream it was
/// allocated on, as stream-ordered allocators do: work enqueued there before the
/// release is done before the memory is reused; work on other streams is not.
struct BufferOwner {
    world: Arc<World>,
    buffer: BufferId,
    stream: u64,
}

impl Drop for BufferOwner {
    fn drop(&mut self) {
        self.world.sim().release(self.buffer.0, Some(self.stream));
    }
}

enum Owner {
    /// Memory this tensor allocated.
    Own(#[allow(dead_code)] Arc<BufferOwner>),
    /// Memory of another producer, held through its hand-off.
    Imported(#[allow(dead_code)] Handoff),
}

/// A tensor on a mock device, written in order on its stream. It exports and imports
/// like every adapter's tensor; imports view the producer's buffer without a copy.
pub struct MockTensor {
    buffer: BufferId,
    stream: Stream,
    /// Where the memory goes back: the allocation stream, or for an import the
    /// consumer stream its hand-off releases after.
    release: Stream,
    device: u32,
    dtype: DataType,
    shape: Vec<i64>,
    data: *mut u8,
    _owner: Owner,
}

// SAFETY: `data` points into storage owned by the world (kept alive by `_owner`),
// accessed only under the world's lock or by DLPack consumers through a hand-off.
unsafe impl Send for MockTensor {}

impl MockTensor {
    pub(super) fn new_f32(
        mock: &Mock,
        stream: &Stream,
        name: &str,
        shape: &[i64],
        values: &[f32],
    ) -> MockTensor {
        let Device::Mock(device) = stream.device() else {
            panic!("{stream:?} is not a mock stream");
        };
        let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
        let buffer = BufferId(mock.world.sim().alloc(device, name, n * 4, Some(stream.raw())));
        let bytes: Vec<u8> = values.iter().take(n).flat_map(|v| v.to_ne_bytes()).collect();
        mock.write_bytes(buffer, &bytes);
        let data = mock.world.sim().storage_ptr(buffer.0);
        MockTensor {
            buffer,
            stream: stream.clone(),
            release: stream.clone(),
            device,
            dtype: DataType::F32,
            shape: shape.to_vec(),
            data,
            _owner: Owner::Own(Arc::new(BufferOwner {
                world: mock.world.clone(),
                buffer,
                stream: stream.raw(),
            })),
        }
    }

    /// The buffer, for kernels to declare.
    pub fn buffer(&self) -> BufferId {
        self.buffer
    }

    /// The stream its work is ordered on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Orders its work on another stream from now on (the caller orders the switch).
    /// Its memory still goes back on the stream it was allocated on.
    pub fn set_stream(&mut self, stream: Stream) {
        self.stream = stream;
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The element count.
    pub fn num_elements(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// The address of its first element.
    pub fn data_ptr(&self) -> *mut u8 {
        self.data
    }
}

impl StreamOrdered for MockTensor {
    fn device(&self) -> Device {
        Device::Mock(self.device)
    }
    fn stream(&self) -> Option<Stream> {
        Some(self.stream.clone())
    }
    fn release_stream(&self) -> Option<Stream> {
        Some(self.release.clone())
    }
    fn held_release_stream(&self) -> Option<&Stream> {
        Some(&self.release)
    }
}

impl Export for MockTensor {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        Ok(TensorDesc::new(self.data.cast(), Device::Mock(self.device), self.dtype, &self.shape[..]))
    }
}

impl Import for MockTensor {
    fn from_handoff(handoff: Handoff) -> Result<MockTensor> {
        let refuse = |message: String| Err(Error::Adapter { adapter: "mock", message });
        let Device::Mock(device) = handoff.device() else {
            return refuse(format!("a mock tensor views mock memory, not {}", handoff.device()));
        };
        if !handoff.is_contiguous() {
            return refuse(format!(
                "strides {:?} are not compact; the mock views compact tensors only",
                handoff.strides()
            ));
        }
        let stream = handoff.consumer_stream().clone();
        let Some(world) = mock_world(&stream) else {
            return refuse(format!("consumer stream {stream:?} is not a mock stream"));
        };
        let data = handoff.data_ptr();
        let Some(buffer) = world.sim().find_buffer(device, data as usize) else {
            return refuse(format!("{data:p} is not live memory of mock:{device}"));
        };
        Ok(MockTensor {
            buffer: BufferId(buffer),
            release: stream.clone(),
            stream,
            device,
            dtype: handoff.dtype(),
            shape: handoff.shape().to_vec(),
            data,
            _owner: Owner::Imported(handoff),
        })
    }
}

fn mock_world(stream: &Stream) -> Option<Arc<World>> {
    let any: &dyn std::any::Any = stream.backend();
    any.downcast_ref::<super::MockBackend>().map(|b| b.world.clone())
}
