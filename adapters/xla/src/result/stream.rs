//! Thin wrappers of the Stream extension's functions.

use super::Api;
use crate::error::Result;
use crate::sys;

/// `get_stream_for_external_ready_events` of the stream extension.
///
/// # Safety
/// `ext` must be this plugin's stream extension; `device` must be live.
pub(crate) unsafe fn get_stream_for_external_ready_events(
    api: Api,
    ext: &sys::PJRT_Stream_Extension,
    device: *mut sys::PJRT_Device,
) -> Result<isize> {
    let mut a = args!(PJRT_Get_Stream_For_External_Ready_Events_Args { device: device });
    // SAFETY: forwarded from the caller.
    unsafe { api.call_extension(ext, &mut a)? };
    Ok(a.stream)
}

/// `wait_until_buffer_ready_on_stream` of the stream extension: enqueues a wait
/// on `stream` for the buffer's definition event. Does not block the host.
///
/// # Safety
/// `ext` must be this plugin's stream extension; `buffer` must be live and
/// `stream` a stream of its device.
pub(crate) unsafe fn wait_until_buffer_ready_on_stream(
    api: Api,
    ext: &sys::PJRT_Stream_Extension,
    buffer: *mut sys::PJRT_Buffer,
    stream: isize,
) -> Result<()> {
    let mut a = args!(PJRT_Wait_Until_Buffer_Ready_On_Stream_Args { stream: stream, buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call_extension(ext, &mut a) }
}
