//! Thin wrappers of `PJRT_Buffer_*` functions.

use super::{Api, copied};
use crate::error::Result;
use crate::sys;
use std::ffi::{c_int, c_void};

/// `PJRT_Buffer_Destroy`.
///
/// # Safety
/// `buffer` must be owned and not used afterwards.
pub(crate) unsafe fn destroy(api: Api, buffer: *mut sys::PJRT_Buffer) -> Result<()> {
    let mut a = args!(PJRT_Buffer_Destroy_Args { buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a) }
}

/// `PJRT_Buffer_IncreaseExternalReferenceCount`.
///
/// # Safety
/// `buffer` must be live.
pub(crate) unsafe fn increase_external_reference_count(
    api: Api,
    buffer: *mut sys::PJRT_Buffer,
) -> Result<()> {
    let mut a = args!(PJRT_Buffer_IncreaseExternalReferenceCount_Args { buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a) }
}

/// `PJRT_Buffer_DecreaseExternalReferenceCount`.
///
/// # Safety
/// `buffer` must be live, and the decrease must match an earlier increase.
pub(crate) unsafe fn decrease_external_reference_count(
    api: Api,
    buffer: *mut sys::PJRT_Buffer,
) -> Result<()> {
    let mut a = args!(PJRT_Buffer_DecreaseExternalReferenceCount_Args { buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a) }
}

/// `PJRT_Buffer_ElementType`.
///
/// # Safety
/// `buffer` must be live.
pub(crate) unsafe fn element_type(api: Api, buffer: *mut sys::PJRT_Buffer) -> Result<c_int> {
    let mut a = args!(PJRT_Buffer_ElementType_Args { buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.type_)
}

/// `PJRT_Buffer_Dimensions`, copied out.
///
/// # Safety
/// `buffer` must be live.
pub(crate) unsafe fn dimensions(api: Api, buffer: *mut sys::PJRT_Buffer) -> Result<Vec<i64>> {
    let mut a = args!(PJRT_Buffer_Dimensions_Args { buffer: buffer });
    // SAFETY: forwarded from the caller; the dims live as long as the buffer.
    unsafe {
        api.call(&mut a)?;
        Ok(copied(a.dims, a.num_dims))
    }
}

/// `PJRT_Buffer_OnDeviceSizeInBytes`.
///
/// # Safety
/// `buffer` must be live.
pub(crate) unsafe fn on_device_size_in_bytes(api: Api, buffer: *mut sys::PJRT_Buffer) -> Result<usize> {
    let mut a = args!(PJRT_Buffer_OnDeviceSizeInBytes_Args { buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.on_device_size_in_bytes)
}

/// `PJRT_Buffer_Device` (it lives as long as the client).
///
/// # Safety
/// `buffer` must be live.
pub(crate) unsafe fn device(api: Api, buffer: *mut sys::PJRT_Buffer) -> Result<*mut sys::PJRT_Device> {
    let mut a = args!(PJRT_Buffer_Device_Args { buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.device)
}

/// `PJRT_Buffer_ToHostBuffer` into `dst`; returns the copy's event.
///
/// # Safety
/// `buffer` must be live; `dst` must stay valid until the event is ready.
pub(crate) unsafe fn to_host_buffer(
    api: Api,
    buffer: *mut sys::PJRT_Buffer,
    dst: &mut [u8],
) -> Result<*mut sys::PJRT_Event> {
    let mut a = args!(PJRT_Buffer_ToHostBuffer_Args {
        src: buffer,
        dst: dst.as_mut_ptr() as *mut c_void,
        dst_size: dst.len()
    });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.event)
}

/// `PJRT_Buffer_ReadyEvent`: an event the caller must destroy.
///
/// # Safety
/// `buffer` must be live.
pub(crate) unsafe fn ready_event(api: Api, buffer: *mut sys::PJRT_Buffer) -> Result<*mut sys::PJRT_Event> {
    let mut a = args!(PJRT_Buffer_ReadyEvent_Args { buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.event)
}

/// `PJRT_Buffer_OpaqueDeviceMemoryDataPointer`.
///
/// # Safety
/// `buffer` must be live.
pub(crate) unsafe fn opaque_device_memory_data_pointer(
    api: Api,
    buffer: *mut sys::PJRT_Buffer,
) -> Result<*mut c_void> {
    let mut a = args!(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args { buffer: buffer });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.device_memory_ptr)
}
