//! Thin wrappers of `PJRT_Executable_*` and `PJRT_LoadedExecutable_*` functions.

use super::{Api, copied};
use crate::error::Result;
use crate::sys;
use std::ffi::c_int;
use std::ptr::null_mut;

/// `PJRT_LoadedExecutable_Destroy`.
///
/// # Safety
/// `exe` must be owned and not used afterwards.
pub(crate) unsafe fn destroy_loaded(api: Api, exe: *mut sys::PJRT_LoadedExecutable) -> Result<()> {
    let mut a = args!(PJRT_LoadedExecutable_Destroy_Args { executable: exe });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a) }
}

/// `PJRT_LoadedExecutable_GetExecutable`: an executable the caller must destroy.
///
/// # Safety
/// `exe` must be live.
pub(crate) unsafe fn get_executable(
    api: Api,
    exe: *mut sys::PJRT_LoadedExecutable,
) -> Result<*mut sys::PJRT_Executable> {
    let mut a = args!(PJRT_LoadedExecutable_GetExecutable_Args { loaded_executable: exe });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.executable)
}

/// `PJRT_Executable_Destroy`.
///
/// # Safety
/// `exe` must be owned and not used afterwards.
pub(crate) unsafe fn destroy(api: Api, exe: *mut sys::PJRT_Executable) -> Result<()> {
    let mut a = args!(PJRT_Executable_Destroy_Args { executable: exe });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a) }
}

/// `PJRT_Executable_NumOutputs`.
///
/// # Safety
/// `exe` must be live.
pub(crate) unsafe fn num_outputs(api: Api, exe: *mut sys::PJRT_Executable) -> Result<usize> {
    let mut a = args!(PJRT_Executable_NumOutputs_Args { executable: exe });
    // SAFETY: forwarded from the caller.
    unsafe { api.call(&mut a)? };
    Ok(a.num_outputs)
}

/// `PJRT_Executable_OutputElementTypes`, copied out.
///
/// # Safety
/// `exe` must be live.
pub(crate) unsafe fn output_element_types(api: Api, exe: *mut sys::PJRT_Executable) -> Result<Vec<c_int>> {
    let mut a = args!(PJRT_Executable_OutputElementTypes_Args { executable: exe });
    // SAFETY: forwarded from the caller; the array lives as long as the executable.
    unsafe {
        api.call(&mut a)?;
        Ok(copied(a.output_types, a.num_output_types))
    }
}

/// `PJRT_Executable_OutputDimensions`, copied out: each output's dimensions.
///
/// # Safety
/// `exe` must be live.
pub(crate) unsafe fn output_dimensions(api: Api, exe: *mut sys::PJRT_Executable) -> Result<Vec<Vec<i64>>> {
    let mut a = args!(PJRT_Executable_OutputDimensions_Args { executable: exe });
    // SAFETY: forwarded from the caller; the arrays live as long as the executable,
    // `dims` holding the sum of `dim_sizes`.
    unsafe {
        api.call(&mut a)?;
        let sizes = copied(a.dim_sizes, a.num_outputs);
        let dims = copied(a.dims, sizes.iter().sum());
        let mut rest = &dims[..];
        Ok(sizes
            .iter()
            .map(|&n| {
                let (head, tail) = rest.split_at(n);
                rest = tail;
                head.to_vec()
            })
            .collect())
    }
}

/// `PJRT_Executable_OptimizedProgram` with no code buffer: the size of the
/// serialized `HloModuleProto`.
///
/// # Safety
/// `exe` must be live.
pub(crate) unsafe fn optimized_program_size(api: Api, exe: *mut sys::PJRT_Executable) -> Result<usize> {
    let mut program = args!(PJRT_Program {});
    let mut a = args!(PJRT_Executable_OptimizedProgram_Args { executable: exe, program: &mut program });
    // SAFETY: forwarded from the caller; `program` outlives the call.
    unsafe { api.call(&mut a)? };
    Ok(program.code_size)
}

/// `PJRT_Executable_OptimizedProgram` into `code` (as large as the size asked
/// before); returns the bytes written.
///
/// # Safety
/// `exe` must be live.
pub(crate) unsafe fn optimized_program_into(
    api: Api,
    exe: *mut sys::PJRT_Executable,
    code: &mut [u8],
) -> Result<usize> {
    let mut program = args!(PJRT_Program { code: code.as_mut_ptr() as *mut _, code_size: code.len() });
    let mut a = args!(PJRT_Executable_OptimizedProgram_Args { executable: exe, program: &mut program });
    // SAFETY: forwarded from the caller; `program` and `code` outlive the call.
    unsafe { api.call(&mut a)? };
    Ok(program.code_size)
}

/// `PJRT_LoadedExecutable_Execute` on one device, without a completion event.
/// Returns the outputs.
///
/// # Safety
/// `exe`, the inputs and `device` (if not null) must be live; `num_outputs` must
/// be the executable's output count.
pub(crate) unsafe fn execute(
    api: Api,
    exe: *mut sys::PJRT_LoadedExecutable,
    inputs: &[*mut sys::PJRT_Buffer],
    num_outputs: usize,
    device: *mut sys::PJRT_Device,
    non_donatable: &[i64],
) -> Result<Vec<*mut sys::PJRT_Buffer>> {
    let mut options = args!(PJRT_ExecuteOptions {
        non_donatable_input_indices: non_donatable.as_ptr(),
        num_non_donatable_input_indices: non_donatable.len(),
    });
    let arg_list: *const *mut sys::PJRT_Buffer = inputs.as_ptr();
    let mut outputs: Vec<*mut sys::PJRT_Buffer> = vec![null_mut(); num_outputs];
    let out_list: *mut *mut sys::PJRT_Buffer = outputs.as_mut_ptr();
    let mut a = args!(PJRT_LoadedExecutable_Execute_Args {
        executable: exe,
        options: &mut options,
        argument_lists: &arg_list,
        num_devices: 1,
        num_args: inputs.len(),
        output_lists: &out_list,
        // No completion event: readiness is tracked per output buffer, and asking
        // for one costs PJRT host work on every call.
        device_complete_events: null_mut(),
        execute_device: device,
    });
    // SAFETY: forwarded from the caller; all lists outlive the call.
    unsafe { api.call(&mut a)? };
    Ok(outputs)
}
