//! Shared helpers of handoff's integration tests: foreign DLPack tensors built by
//! hand, with a deleter that counts its calls.

use handoff::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor, DlpackFlags,
};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many times a foreign tensor's deleter ran.
#[derive(Clone, Default)]
pub struct DeleterCount(Arc<AtomicUsize>);

impl DeleterCount {
    /// The count.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A foreign DLPack tensor described field by field, so tests can make any field bad.
#[derive(Clone, Debug)]
pub struct Foreign {
    /// Backing bytes (the data pointer points into them unless `data` overrides it).
    pub bytes: Vec<u64>,
    /// Overrides the data pointer (`Some(0)` for null).
    pub data: Option<usize>,
    pub device: DLDevice,
    pub dtype: DLDataType,
    pub ndim: Option<i32>,
    pub shape: Vec<i64>,
    /// `None` writes a null strides pointer.
    pub strides: Option<Vec<i64>>,
    pub null_shape: bool,
    pub byte_offset: u64,
    pub flags: u64,
    pub version: DLPackVersion,
}

struct Ctx {
    count: DeleterCount,
    _bytes: Vec<u64>,
    _shape: Vec<i64>,
    _strides: Option<Vec<i64>>,
}

impl Foreign {
    /// A good compact f32 host tensor of `shape`, filled with 0, 1, 2, ...
    pub fn f32(shape: &[i64]) -> Foreign {
        let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
        let mut bytes = vec![0u64; n.div_ceil(2).max(1)];
        let floats: &mut [f32] = bytemuck_f32(&mut bytes);
        for (i, f) in floats.iter_mut().take(n).enumerate() {
            *f = i as f32;
        }
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        Foreign {
            bytes,
            data: None,
            device: DLDevice::CPU,
            dtype: DLDataType::F32,
            ndim: None,
            shape: shape.to_vec(),
            strides: Some(strides),
            null_shape: false,
            byte_offset: 0,
            flags: 0,
            version: DLPackVersion::CURRENT,
        }
    }

    fn parts(mut self) -> (DLTensor, Box<Ctx>, DeleterCount) {
        let count = DeleterCount::default();
        let data = match self.data {
            Some(addr) => addr as *mut c_void,
            None => self.bytes.as_mut_ptr() as *mut c_void,
        };
        let shape_ptr = if self.null_shape { std::ptr::null_mut() } else { self.shape.as_mut_ptr() };
        let strides_ptr = self.strides.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        let tensor = DLTensor {
            data,
            device: self.device,
            ndim: self.ndim.unwrap_or(self.shape.len() as i32),
            dtype: self.dtype,
            shape: shape_ptr,
            strides: strides_ptr,
            byte_offset: self.byte_offset,
        };
        let ctx = Box::new(Ctx {
            count: count.clone(),
            _bytes: self.bytes,
            _shape: self.shape,
            _strides: self.strides,
        });
        (tensor, ctx, count)
    }

    /// A `DLManagedTensorVersioned` owned by the caller, and its deleter count.
    pub fn versioned(self) -> (*mut DLManagedTensorVersioned, DeleterCount) {
        let (version, flags) = (self.version, self.flags);
        let (tensor, ctx, count) = self.parts();
        let m = Box::new(DLManagedTensorVersioned {
            version,
            manager_ctx: Box::into_raw(ctx) as *mut c_void,
            deleter: Some(delete_versioned),
            flags: DlpackFlags::from_bits_retain(flags),
            dl_tensor: tensor,
        });
        (Box::into_raw(m), count)
    }

    /// A legacy `DLManagedTensor` owned by the caller, and its deleter count.
    pub fn legacy(self) -> (*mut DLManagedTensor, DeleterCount) {
        let (tensor, ctx, count) = self.parts();
        let m = Box::new(DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: Box::into_raw(ctx) as *mut c_void,
            deleter: Some(delete_legacy),
        });
        (Box::into_raw(m), count)
    }
}

fn bytemuck_f32(words: &mut [u64]) -> &mut [f32] {
    // SAFETY: u64 storage is 8-aligned and any bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut f32, words.len() * 2) }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: `m` and its context were made by `Foreign::versioned` with Box.
    unsafe {
        let m = Box::from_raw(m);
        let ctx = Box::from_raw(m.manager_ctx as *mut Ctx);
        ctx.count.0.fetch_add(1, Ordering::SeqCst);
    }
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    // SAFETY: `m` and its context were made by `Foreign::legacy` with Box.
    unsafe {
        let m = Box::from_raw(m);
        let ctx = Box::from_raw(m.manager_ctx as *mut Ctx);
        ctx.count.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Polls `cond` for up to five seconds of real time.
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    cond()
}
