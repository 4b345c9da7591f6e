//! Thin wrappers of `PJRT_Client_*` functions.

use super::{Api, copied, string};
use crate::error::Result;
use crate::sys;
use std::ffi::{c_int, c_void};

/// `PJRT_Client_Create`.
pub(crate) fn create(api: Api, options: &[sys::PJRT_NamedValue]) -> Result<*mut sys::PJRT_Client> {
    let mut a =
        args!(PJRT_Client_Create_Args { create_options: options.as_ptr(), num_options: options.len() });
    // SAFETY: `options` outlives the call.
    unsafe { api.call(&mut a)? };
    Ok(a.client)
}

/// `PJRT_Client_Destroy`.
///
/// # Safety
/// `client` must be owned and not used afterwards.
pub(crate) unsafe fn destroy(api: Api, client: *mut sys::PJRT_Client) -> Result<()> {
    let mut a = args!(PJRT_Client_Destroy_Args { client: client });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a) }
}

/// `PJRT_Client_PlatformName`, copied out.
///
/// # Safety
/// `client` must be live.
pub(crate) unsafe fn platform_name(api: Api, client: *mut sys::PJRT_Client) -> Result<String> {
    let mut a = args!(PJRT_Client_PlatformName_Args { client: client });
    // SAFETY: forwarded from the caller; the string lives as long as the client.
    unsafe {
        api.call(&mut a)?;
        Ok(string(a.platform_name, a.platform_name_size))
    }
}

/// `PJRT_Client_PlatformVersion`, copied out.
///
/// # Safety
/// `client` must be live.
pub(crate) unsafe fn platform_version(api: Api, client: *mut sys::PJRT_Client) -> Result<String> {
    let mut a = args!(PJRT_Client_PlatformVersion_Args { client: client });
    // SAFETY: forwarded from the caller; the string lives as long as the client.
    unsafe {
        api.call(&mut a)?;
        Ok(string(a.platform_version, a.platform_version_size))
    }
}

/// `PJRT_Client_AddressableDevices`.
///
/// # Safety
/// `client` must be live.
pub(crate) unsafe fn addressable_devices(
    api: Api,
    client: *mut sys::PJRT_Client,
) -> Result<Vec<*mut sys::PJRT_Device>> {
    let mut a = args!(PJRT_Client_AddressableDevices_Args { client: client });
    // SAFETY: forwarded from the caller; the array lives as long as the client.
    unsafe {
        api.call(&mut a)?;
        Ok(copied(a.addressable_devices, a.num_addressable_devices))
    }
}

/// `PJRT_Client_Compile` of `code` in program format `format`.
///
/// # Safety
/// `client` must be live.
pub(crate) unsafe fn compile(
    api: Api,
    client: *mut sys::PJRT_Client,
    code: &[u8],
    format: &str,
    options: &[u8],
) -> Result<*mut sys::PJRT_LoadedExecutable> {
    let program = args!(PJRT_Program {
        code: code.as_ptr() as *mut _,
        code_size: code.len(),
        format: format.as_ptr() as *const _,
        format_size: format.len(),
    });
    let mut a = args!(PJRT_Client_Compile_Args {
        client: client,
        program: &program,
        compile_options: options.as_ptr() as *const _,
        compile_options_size: options.len(),
    });
    // SAFETY: code, format and options outlive the call, and the plugin only reads
    // `code` during it.
    unsafe { api.call(&mut a)? };
    Ok(a.executable)
}

/// `PJRT_Client_BufferFromHostBuffer` (copy semantics: `data` may be freed once
/// the returned event is ready). Returns the buffer and the done event.
///
/// # Safety
/// `client` and `device` must be live; `data` must hold the dense array described.
pub(crate) unsafe fn buffer_from_host_buffer(
    api: Api,
    client: *mut sys::PJRT_Client,
    device: *mut sys::PJRT_Device,
    data: *const c_void,
    type_: c_int,
    dims: &[i64],
) -> Result<(*mut sys::PJRT_Buffer, *mut sys::PJRT_Event)> {
    let mut a = args!(PJRT_Client_BufferFromHostBuffer_Args {
        client: client,
        data: data,
        type_: type_,
        dims: dims.as_ptr(),
        num_dims: dims.len(),
        host_buffer_semantics: sys::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL,
        device: device,
    });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok((a.buffer, a.done_with_host_buffer))
}

/// `PJRT_Client_CreateViewOfDeviceBuffer`.
///
/// # Safety
/// `client` and `device` must be live; `data` must hold the dense array described
/// until `on_delete` has been called with `on_delete_arg` (exactly once, on any
/// thread). On error, `on_delete` is not called and `on_delete_arg` is still the
/// caller's.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn create_view_of_device_buffer(
    api: Api,
    client: *mut sys::PJRT_Client,
    device: *mut sys::PJRT_Device,
    data: *mut c_void,
    type_: c_int,
    dims: &[i64],
    stream: isize,
    on_delete: sys::OnDeleteCallback,
    on_delete_arg: *mut c_void,
) -> Result<*mut sys::PJRT_Buffer> {
    let mut a = args!(PJRT_Client_CreateViewOfDeviceBuffer_Args {
        client: client,
        device_buffer_ptr: data,
        dims: dims.as_ptr(),
        num_dims: dims.len(),
        element_type: type_,
        device: device,
        on_delete_callback: Some(on_delete),
        on_delete_callback_arg: on_delete_arg,
        stream: stream,
    });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.buffer)
}
