//! Thin wrappers of `PJRT_Plugin_*` functions.

use super::Api;
use crate::error::Result;
use crate::sys;

/// `PJRT_Plugin_Initialize`.
pub(crate) fn initialize(api: Api) -> Result<()> {
    let mut a = args!(PJRT_Plugin_Initialize_Args {});
    // SAFETY: nothing to fill.
    unsafe { api.call(&mut a) }
}

/// `PJRT_Plugin_Attributes`: the plugin's attributes, which live for the process.
pub(crate) fn attributes(api: Api) -> Result<&'static [sys::PJRT_NamedValue]> {
    let mut a = args!(PJRT_Plugin_Attributes_Args {});
    // SAFETY: nothing to fill.
    unsafe { api.call(&mut a)? };
    if a.attributes.is_null() || a.num_attributes == 0 {
        return Ok(&[]);
    }
    // SAFETY: the plugin returned `num_attributes` values living for the process.
    Ok(unsafe { std::slice::from_raw_parts(a.attributes, a.num_attributes) })
}
