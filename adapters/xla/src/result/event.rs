//! Thin wrappers of `PJRT_Event_*` functions.

use super::Api;
use crate::error::Result;
use crate::sys;

/// `PJRT_Event_Destroy`.
///
/// # Safety
/// `event` must be an owned event, not used afterwards.
pub(crate) unsafe fn destroy(api: Api, event: *mut sys::PJRT_Event) -> Result<()> {
    let mut a = args!(PJRT_Event_Destroy_Args { event: event });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a) }
}

/// `PJRT_Event_IsReady`. Never blocks.
///
/// # Safety
/// `event` must be live.
pub(crate) unsafe fn is_ready(api: Api, event: *mut sys::PJRT_Event) -> Result<bool> {
    let mut a = args!(PJRT_Event_IsReady_Args { event: event });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.is_ready)
}

/// `PJRT_Event_Error`: the event's status, once it is ready.
///
/// # Safety
/// `event` must be live and ready.
pub(crate) unsafe fn error(api: Api, event: *mut sys::PJRT_Event) -> Result<()> {
    let mut a = args!(PJRT_Event_Error_Args { event: event });
    // SAFETY: forwarded from the caller; the returned error is the event's status,
    // owned by us.
    unsafe { api.call(&mut a) }
}

/// `PJRT_Event_Await`: blocks the host. Callers count it with `stats::host_sync`.
///
/// # Safety
/// `event` must be live.
pub(crate) unsafe fn wait(api: Api, event: *mut sys::PJRT_Event) -> Result<()> {
    let mut a = args!(PJRT_Event_Await_Args { event: event });
    // SAFETY: forwarded from the caller; the returned error is the event's status,
    // owned by us.
    unsafe { api.call(&mut a) }
}
