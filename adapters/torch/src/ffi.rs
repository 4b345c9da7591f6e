//! The C ABI of the shim (csrc/shim.h) and the conversion of its messages to errors.

use crate::error::TorchError;
use std::ffi::{CStr, c_char, c_void};

pub(crate) type Deleter = unsafe extern "C" fn(ctx: *mut c_void);

/// `hf_facts` of shim.h.
#[repr(C)]
pub(crate) struct TensorFacts {
    pub defined: i32,
    pub layout: i32,
    pub scalar_type: i32,
    pub device_type: i32,
    pub device_index: i32,
    pub is_conj: i32,
    pub is_neg: i32,
    pub requires_grad: i32,
    pub ndim: i32,
    pub itemsize: i32,
    pub has_stream: i32,
    pub data: *mut c_void,
    pub stream: u64,
    pub layout_name: [c_char; 32],
    pub device_name: [c_char; 32],
    pub dtype_name: [c_char; 32],
}

impl Default for TensorFacts {
    fn default() -> TensorFacts {
        TensorFacts {
            defined: 0,
            layout: 0,
            scalar_type: 0,
            device_type: 0,
            device_index: 0,
            is_conj: 0,
            is_neg: 0,
            requires_grad: 0,
            ndim: 0,
            itemsize: 0,
            has_stream: 0,
            data: std::ptr::null_mut(),
            stream: 0,
            layout_name: [0; 32],
            device_name: [0; 32],
            dtype_name: [0; 32],
        }
    }
}

/// `HF_DESCRIBE_NAMES` of shim.h: the names of layout, dtype and device.
pub(crate) const DESCRIBE_NAMES: i32 = 1;
/// `HF_DESCRIBE_STREAM` of shim.h: PyTorch's current stream of a CUDA tensor's device.
pub(crate) const DESCRIBE_STREAM: i32 = 2;

pub(crate) fn name(buf: &[c_char; 32]) -> String {
    // SAFETY: the shim always NUL-terminates within the 32 bytes (and zeroes them first).
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

unsafe extern "C" {
    fn hf_free_message(message: *mut c_char);
    pub(crate) fn hf_describe(
        tensor: *const c_void,
        out: *mut TensorFacts,
        sizes: *mut i64,
        strides: *mut i64,
        cap: i32,
        what: i32,
    ) -> *mut c_char;
    pub(crate) fn hf_from_blob(
        data: *mut c_void,
        ndim: i32,
        sizes: *const i64,
        strides: *const i64,
        scalar_type: i32,
        device_type: i32,
        device_index: i32,
        ctx: *mut c_void,
        deleter: Deleter,
        out_tensor: *mut *mut c_void,
    ) -> *mut c_char;
    pub(crate) fn hf_cuda_compiled() -> i32;
    pub(crate) fn hf_load_torch_cuda(loaded: *mut i32) -> *mut c_char;
    pub(crate) fn hf_cuda_current_stream(device: i32, out: *mut u64) -> *mut c_char;
    pub(crate) fn hf_cuda_set_current_stream(device: i32, raw: u64) -> *mut c_char;
    pub(crate) fn hf_cuda_stream_from_pool(device: i32, high_priority: i32, out: *mut u64) -> *mut c_char;
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn hf_cuda_record_stream(
        tensor: *const c_void,
        device: i32,
        raw: u64,
        recorded: *mut i32,
    ) -> *mut c_char;
    pub(crate) fn hf_cuda_sleep(device: i32, cycles: i64) -> *mut c_char;
    pub(crate) fn hf_graph_new(out: *mut *mut c_void) -> *mut c_char;
    pub(crate) fn hf_graph_capture_begin(graph: *mut c_void, device: i32, mode: i32) -> *mut c_char;
    pub(crate) fn hf_graph_capture_end(graph: *mut c_void, raw_graph: *mut *mut c_void) -> *mut c_char;
    pub(crate) fn hf_graph_instantiate(graph: *mut c_void) -> *mut c_char;
    pub(crate) fn hf_graph_replay(graph: *mut c_void) -> *mut c_char;
    pub(crate) fn hf_graph_free(graph: *mut c_void) -> *mut c_char;
}

/// Turns a shim return value into a `Result`, freeing the message.
pub(crate) fn check(call: &'static str, message: *mut c_char) -> Result<(), TorchError> {
    if message.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated string the shim malloc'd for us.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    // SAFETY: it came from the shim's malloc and is freed once, here.
    unsafe { hf_free_message(message) };
    Err(TorchError::Shim { call, message: text })
}
