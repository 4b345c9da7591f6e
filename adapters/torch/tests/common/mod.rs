//! A small host tensor type for the tests: it owns (or views) host memory, counts how
//! many times its memory was given back, and exports and imports like any adapter's.
#![allow(dead_code)]

use handoff_runtime::dtype::DataType;
use handoff_runtime::{Device, Error, Export, Handoff, Import, Result, Stream, StreamOrdered, TensorDesc};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts deleter calls.
#[derive(Clone, Default)]
pub struct Count(Arc<AtomicUsize>);

impl Count {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Owned host bytes whose drop is counted.
pub struct Bytes {
    pub data: Vec<u64>,
    pub dropped: Count,
}

impl Drop for Bytes {
    fn drop(&mut self) {
        self.dropped.0.fetch_add(1, Ordering::SeqCst);
    }
}

enum Owner {
    Own(#[allow(dead_code)] Bytes),
    Viewed(#[allow(dead_code)] Handoff),
}

/// A host tensor: any dtype, any strides, a byte offset, optionally read-only.
pub struct HostTensor {
    ptr: *mut u8,
    pub dtype: DataType,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub byte_offset: u64,
    pub read_only: bool,
    _owner: Owner,
}

// SAFETY: the memory is owned by `_owner` (a Vec or a hand-off), which is Send.
unsafe impl Send for HostTensor {}

impl HostTensor {
    /// `bytes` zeroed bytes (8-aligned) holding a compact tensor of `dtype`.
    pub fn zeros(dtype: DataType, shape: &[i64], dropped: &Count) -> HostTensor {
        let n: i64 = shape.iter().product();
        let bytes = (n as usize * dtype.bits as usize).div_ceil(8);
        let data = vec![0u64; bytes.div_ceil(8).max(1)];
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        let mut owned = Bytes { data, dropped: dropped.clone() };
        let ptr = owned.data.as_mut_ptr() as *mut u8;
        HostTensor {
            ptr,
            dtype,
            shape: shape.to_vec(),
            strides,
            byte_offset: 0,
            read_only: false,
            _owner: Owner::Own(owned),
        }
    }

    /// The address of the first element.
    pub fn first(&self) -> *mut u8 {
        self.ptr.wrapping_add(self.byte_offset as usize)
    }

    /// The bytes of the first `n` elements' span (compact tensors).
    pub fn bytes(&self, n: usize) -> &[u8] {
        // SAFETY: test tensors span at least `n` bytes from their first element.
        unsafe { std::slice::from_raw_parts(self.first(), n) }
    }

    pub fn bytes_mut(&mut self, n: usize) -> &mut [u8] {
        // SAFETY: as `bytes`; the test owns the only writer.
        unsafe { std::slice::from_raw_parts_mut(self.first(), n) }
    }
}

impl StreamOrdered for HostTensor {
    fn device(&self) -> Device {
        Device::Host
    }
    fn stream(&self) -> Option<Stream> {
        None
    }
}

impl Export for HostTensor {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        let mut d = TensorDesc::new(self.ptr.cast(), Device::Host, self.dtype, &self.shape[..])
            .with_strides(&self.strides[..])
            .with_byte_offset(self.byte_offset);
        if self.read_only {
            d = d.read_only();
        }
        Ok(d)
    }
}

impl Import for HostTensor {
    fn from_handoff(h: Handoff) -> Result<HostTensor> {
        if h.device() != Device::Host {
            return Err(Error::Adapter { adapter: "host-test", message: format!("{} memory", h.device()) });
        }
        Ok(HostTensor {
            ptr: h.data() as *mut u8,
            dtype: h.dtype(),
            shape: h.shape().to_vec(),
            strides: h.strides().to_vec(),
            byte_offset: h.byte_offset(),
            read_only: h.is_read_only(),
            _owner: Owner::Viewed(h),
        })
    }
}
