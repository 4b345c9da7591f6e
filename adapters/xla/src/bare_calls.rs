//! The bare PJRT calls of a hand-off and of a kernel call, with nothing of handoff
//! around them: what a perfect adapter could not avoid. The host-cost benchmark
//! (`examples/benches/pipeline_gpu.rs`) times them beside handoff's own paths and
//! prints handoff's share above them. Only with the `bench-internals` feature: not part of
//! the API (hidden, unstable).

use crate::client::{Client, XlaDevice};
use crate::dtype;
use crate::error::{Result, XlaError};
use crate::executable::Executable;
use crate::result;
use crate::result::executable::{RawList, all_positions};
use crate::sys;
use handoff_runtime::dtype::DataType;
use std::ffi::c_void;

pub use crate::buffer::RawBuffer;

/// `on_delete_callback` of a bare view: the benchmark owns the memory.
unsafe extern "C" fn nothing_to_release(_data: *mut c_void, _arg: *mut c_void) {}

/// The stream extension's `get_stream_for_external_ready_events` (handoff asks it once
/// per device and caches it; a bare caller asks per hand-off or caches it too).
pub fn ready_stream(client: &Client, device: &XlaDevice) -> Result<u64> {
    let ext = stream_extension(client)?;
    // SAFETY: this plugin's extension and a live device of the client.
    let raw = unsafe {
        result::stream::get_stream_for_external_ready_events(client.inner.api(), ext, device.raw())?
    };
    Ok(raw as u64)
}

/// `PJRT_Client_CreateViewOfDeviceBuffer` of `data` with `stream`, as the import of a
/// hand-off makes it.
///
/// # Safety
/// `data` must be memory of `device` holding a compact row-major array of `shape` and
/// `dtype`, valid (and written before work on `stream`) until the view is dropped.
pub unsafe fn view(
    client: &Client,
    device: &XlaDevice,
    data: *mut c_void,
    dtype: DataType,
    shape: &[i64],
    stream: u64,
) -> Result<RawBuffer> {
    let t = dtype::to_pjrt(dtype)
        .ok_or_else(|| XlaError::invalid("dtype", handoff_runtime::dtype::name(dtype), "no PJRT type"))?;
    let api = client.inner.api();
    // SAFETY: forwarded from the caller; the callback does nothing.
    let raw = unsafe {
        result::client::create_view_of_device_buffer(
            api,
            client.inner.raw,
            device.raw(),
            data,
            t,
            shape,
            stream as isize,
            nothing_to_release,
            std::ptr::null_mut(),
        )?
    };
    Ok(RawBuffer { api, raw })
}

/// `PJRT_LoadedExecutable_Execute` of `exe` on `inputs`, none donated, without a
/// completion event: the outputs as bare buffers.
pub fn execute(exe: &Executable, inputs: &[&RawBuffer]) -> Result<Vec<RawBuffer>> {
    let api = exe.client.api();
    let raw = RawList::of(inputs.iter().map(|b| b.raw));
    let keep = all_positions(inputs.len());
    let device = exe.device.map_or(std::ptr::null_mut(), |i| exe.client.devices[i].raw);
    // SAFETY: a live executable, live inputs (borrowed for the call) and device.
    let outs = unsafe {
        result::executable::execute(api, exe.raw(), raw.as_slice(), exe.outputs().len(), device, &keep)?
    };
    Ok(outs.as_slice().iter().filter(|b| !b.is_null()).map(|&raw| RawBuffer { api, raw }).collect())
}

/// What exporting a PJRT buffer to a CUDA stream takes: an external reference, its
/// device pointer, and the stream extension's wait for its definition on `consumer`.
/// Returns the pointer; [`release`] gives the reference back.
pub fn export(client: &Client, buffer: &RawBuffer, consumer: u64) -> Result<*mut c_void> {
    let ext = stream_extension(client)?;
    let api = buffer.api;
    // SAFETY: a live buffer of this client; `consumer` a stream of its device.
    unsafe {
        result::stream::wait_until_buffer_ready_on_stream(api, ext, buffer.raw, consumer as isize)?;
        result::buffer::increase_external_reference_count(api, buffer.raw)?;
        result::buffer::opaque_device_memory_data_pointer(api, buffer.raw)
    }
}

/// The buffer's memory (`PJRT_Buffer_OpaqueDeviceMemoryDataPointer`): what a consumer
/// of an output on a plugin without a stream extension (CPU) reads, with no wait.
pub fn data_pointer(buffer: &RawBuffer) -> Result<*mut c_void> {
    // SAFETY: a live buffer.
    unsafe { result::buffer::opaque_device_memory_data_pointer(buffer.api, buffer.raw) }
}

/// Gives back the external reference [`export`] took.
pub fn release(buffer: &RawBuffer) -> Result<()> {
    // SAFETY: matches one `export` of this live buffer.
    unsafe { result::buffer::decrease_external_reference_count(buffer.api, buffer.raw) }
}

fn stream_extension(client: &Client) -> Result<&'static sys::PJRT_Stream_Extension> {
    client.plugin().stream_extension().ok_or_else(|| {
        XlaError::invalid("plugin", client.platform(), "it has no stream extension (a CUDA plugin has)")
    })
}
