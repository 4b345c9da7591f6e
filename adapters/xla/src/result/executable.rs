//! Thin wrappers of `PJRT_Executable_*` and `PJRT_LoadedExecutable_*` functions.

use super::{Api, copied};
use crate::error::Result;
use crate::sys;
use smallvec::SmallVec;
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
) -> Result<RawList> {
    let mut options = args!(PJRT_ExecuteOptions {
        non_donatable_input_indices: non_donatable.as_ptr(),
        num_non_donatable_input_indices: non_donatable.len(),
    });
    let arg_list: *const *mut sys::PJRT_Buffer = inputs.as_ptr();
    let mut outputs = RawList::nulls(num_outputs);
    let out_list: *mut *mut sys::PJRT_Buffer = outputs.as_mut_slice().as_mut_ptr();
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

/// The raw buffer handles of one execution's argument or output list: up to
/// [`RawList::INLINE`] on the stack, more on the heap, so that a call of a kernel of a
/// few inputs and outputs allocates no list.
pub(crate) struct RawList(SmallVec<[*mut sys::PJRT_Buffer; RawList::INLINE]>);

impl RawList {
    /// How many handles are kept without an allocation.
    pub(crate) const INLINE: usize = 8;

    /// `n` null handles (an output list for PJRT to fill).
    pub(crate) fn nulls(n: usize) -> RawList {
        RawList(smallvec::smallvec![null_mut(); n])
    }

    /// The handles `handles` yields, in order.
    pub(crate) fn of(handles: impl IntoIterator<Item = *mut sys::PJRT_Buffer>) -> RawList {
        RawList(handles.into_iter().collect())
    }

    /// The handles.
    pub(crate) fn as_slice(&self) -> &[*mut sys::PJRT_Buffer] {
        &self.0
    }

    /// The handles, to fill.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [*mut sys::PJRT_Buffer] {
        &mut self.0
    }
}

/// `0..n` as a list of argument positions (none donated): borrowed from a constant
/// for the usual few, else made.
pub(crate) fn all_positions(n: usize) -> std::borrow::Cow<'static, [i64]> {
    const FEW: [i64; RawList::INLINE] = [0, 1, 2, 3, 4, 5, 6, 7];
    match FEW.get(..n) {
        Some(few) => std::borrow::Cow::Borrowed(few),
        None => std::borrow::Cow::Owned((0..n as i64).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_lists_hold_their_handles_inline_or_on_the_heap() {
        for n in [0usize, 1, RawList::INLINE, RawList::INLINE + 1, 20] {
            let handles: Vec<*mut sys::PJRT_Buffer> = (1..=n).map(|i| i as *mut sys::PJRT_Buffer).collect();
            let list = RawList::of(handles.iter().copied());
            assert_eq!(list.as_slice(), &handles[..], "n = {n}");
            assert_eq!(list.0.spilled(), n > RawList::INLINE, "n = {n}");
            assert!(RawList::nulls(n).as_slice().iter().all(|h| h.is_null()));
            assert_eq!(RawList::nulls(n).as_slice().len(), n);
            assert_eq!(&all_positions(n)[..], &(0..n as i64).collect::<Vec<_>>()[..]);
        }
    }
}
