//! Thin wrappers of `PJRT_Device_*` and `PJRT_DeviceDescription_*` functions.

use super::{Api, string};
use crate::error::Result;
use crate::sys;

/// `PJRT_Device_GetDescription` (the description lives as long as the device).
///
/// # Safety
/// `device` must be live.
pub(crate) unsafe fn get_description(
    api: Api,
    device: *mut sys::PJRT_Device,
) -> Result<*mut sys::PJRT_DeviceDescription> {
    let mut a = args!(PJRT_Device_GetDescription_Args { device: device });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.device_description)
}

/// `PJRT_Device_LocalHardwareId`.
///
/// # Safety
/// `device` must be live.
pub(crate) unsafe fn local_hardware_id(api: Api, device: *mut sys::PJRT_Device) -> Result<i32> {
    let mut a = args!(PJRT_Device_LocalHardwareId_Args { device: device });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.local_hardware_id)
}

/// `PJRT_DeviceDescription_Id`.
///
/// # Safety
/// `description` must be live.
pub(crate) unsafe fn description_id(api: Api, description: *mut sys::PJRT_DeviceDescription) -> Result<i32> {
    let mut a = args!(PJRT_DeviceDescription_Id_Args { device_description: description });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.id)
}

/// `PJRT_DeviceDescription_Kind`, copied out.
///
/// # Safety
/// `description` must be live.
pub(crate) unsafe fn description_kind(
    api: Api,
    description: *mut sys::PJRT_DeviceDescription,
) -> Result<String> {
    let mut a = args!(PJRT_DeviceDescription_Kind_Args { device_description: description });
    // SAFETY: forwarded from the caller; the string lives as long as the device.
    unsafe {
        api.call(&mut a)?;
        Ok(string(a.device_kind, a.device_kind_size))
    }
}
