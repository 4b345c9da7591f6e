//! Raw `repr(C)` bindings of the parts of the PJRT C API that handoff uses,
//! written from `xla/pjrt/c/pjrt_c_api.h` and `pjrt_c_api_stream_extension.h`.
//!
//! Bound version: **PJRT C API 0.115** (what JAX 0.11.2's CPU and CUDA plugins report).
//! Every `*_SIZE` constant is the struct's `PJRT_STRUCT_SIZE` at that version, and
//! equals what the 0.115 CPU plugin expects: each was checked against the plugin's
//! own "expected N" message for a too-small struct (all argument structs below except
//! `CreateViewOfDeviceBuffer_Args`, which the CPU plugin does not size-check, and the
//! stream extension's, which it lacks). The function-slot indices were checked the
//! same way (the messages name the struct of each slot).
//!
//! Nothing here is safe to call directly: [`crate::result`] wraps these calls.
#![allow(non_camel_case_types, non_upper_case_globals, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

/// The API major version bound here.
pub const API_MAJOR: i32 = 0;
/// The API minor version bound here.
pub const API_MINOR: i32 = 115;

macro_rules! opaque {
    ($($name:ident),* $(,)?) => {$(
        #[repr(C)]
        pub struct $name { _private: [u8; 0] }
    )*};
}
opaque!(
    PJRT_Error,
    PJRT_Client,
    PJRT_Device,
    PJRT_DeviceDescription,
    PJRT_Memory,
    PJRT_Executable,
    PJRT_LoadedExecutable,
    PJRT_Buffer,
    PJRT_Event,
    PJRT_ExecuteContext
);

#[repr(C)]
pub struct PJRT_Extension_Base {
    pub struct_size: usize,
    pub type_: c_int,
    pub next: *mut PJRT_Extension_Base,
}
pub const PJRT_Extension_Base_SIZE: usize = 24;

/// `PJRT_Extension_Type` values (the enum's order in the header).
pub const EXTENSION_NAMES: &[&str] = &[
    "Gpu_Custom_Call",
    "Profiler",
    "Custom_Partitioner",
    "Stream",
    "Layouts",
    "FFI",
    "MemoryDescriptions",
    "Triton",
    "RawBuffer",
    "PhaseCompile",
    "Example",
    "Unknown",
    "CrossHostTransfers",
    "ExecutableMetadata",
    "Callback",
    "HostAllocator",
    "TpuTopology",
    "TpuExecutable",
    "Megascale",
    "Shardings",
    "AbiVersion",
    "Collectives",
];
pub const EXTENSION_TYPE_STREAM: c_int = 3;

#[repr(C)]
pub struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub major_version: c_int,
    pub minor_version: c_int,
}

// ---------------------------------------------------------------- errors

#[repr(C)]
pub struct PJRT_Error_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *mut PJRT_Error,
}
pub const PJRT_Error_Destroy_Args_SIZE: usize = 24;

#[repr(C)]
pub struct PJRT_Error_Message_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *const PJRT_Error,
    pub message: *const c_char,
    pub message_size: usize,
}
pub const PJRT_Error_Message_Args_SIZE: usize = 40;

#[repr(C)]
pub struct PJRT_Error_GetCode_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *const PJRT_Error,
    pub code: c_int,
}
pub const PJRT_Error_GetCode_Args_SIZE: usize = 28;

// ---------------------------------------------------------------- named values

pub const NAMED_VALUE_STRING: c_int = 0;
pub const NAMED_VALUE_INT64: c_int = 1;
pub const NAMED_VALUE_INT64_LIST: c_int = 2;
pub const NAMED_VALUE_FLOAT: c_int = 3;
pub const NAMED_VALUE_BOOL: c_int = 4;

/// The value union of `PJRT_NamedValue`, stored as 8 raw bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

#[repr(C)]
pub struct PJRT_NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub name: *const c_char,
    pub name_size: usize,
    pub type_: c_int,
    pub value: PJRT_NamedValue_Value,
    pub value_size: usize,
}
pub const PJRT_NamedValue_SIZE: usize = 56;

// ---------------------------------------------------------------- plugin

#[repr(C)]
pub struct PJRT_Plugin_Initialize_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
}
pub const PJRT_Plugin_Initialize_Args_SIZE: usize = 16;

#[repr(C)]
pub struct PJRT_Plugin_Attributes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub attributes: *const PJRT_NamedValue,
    pub num_attributes: usize,
}
pub const PJRT_Plugin_Attributes_Args_SIZE: usize = 32;

// ---------------------------------------------------------------- events

/// The shape of `PJRT_Event_Destroy_Args`, `_Error_Args` and `_Await_Args`.
#[repr(C)]
pub struct PJRT_Event_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}
pub const PJRT_Event_Args_SIZE: usize = 24;

#[repr(C)]
pub struct PJRT_Event_IsReady_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
    pub is_ready: bool,
}
pub const PJRT_Event_IsReady_Args_SIZE: usize = 25;

pub type PJRT_Event_OnReadyCallback = unsafe extern "C" fn(error: *mut PJRT_Error, user_arg: *mut c_void);

#[repr(C)]
pub struct PJRT_Event_OnReady_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
    pub callback: Option<PJRT_Event_OnReadyCallback>,
    pub user_arg: *mut c_void,
}
pub const PJRT_Event_OnReady_Args_SIZE: usize = 40;

// ---------------------------------------------------------------- client

#[repr(C)]
pub struct PJRT_Client_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub create_options: *const PJRT_NamedValue,
    pub num_options: usize,
    pub kv_get_callback: *mut c_void,
    pub kv_get_user_arg: *mut c_void,
    pub kv_put_callback: *mut c_void,
    pub kv_put_user_arg: *mut c_void,
    pub client: *mut PJRT_Client,
    pub kv_try_get_callback: *mut c_void,
    pub kv_try_get_user_arg: *mut c_void,
}
pub const PJRT_Client_Create_Args_SIZE: usize = 88;

#[repr(C)]
pub struct PJRT_Client_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
}
pub const PJRT_Client_Destroy_Args_SIZE: usize = 24;

/// The shape of `PJRT_Client_PlatformName_Args` and `_PlatformVersion_Args`.
#[repr(C)]
pub struct PJRT_Client_String_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub value: *const c_char,
    pub value_size: usize,
}
pub const PJRT_Client_String_Args_SIZE: usize = 40;

/// The shape of `PJRT_Client_Devices_Args` and `_AddressableDevices_Args`.
#[repr(C)]
pub struct PJRT_Client_Devices_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub devices: *const *mut PJRT_Device,
    pub num_devices: usize,
}
pub const PJRT_Client_Devices_Args_SIZE: usize = 40;

#[repr(C)]
pub struct PJRT_Program {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub code: *mut c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}
pub const PJRT_Program_SIZE: usize = 48;

#[repr(C)]
pub struct PJRT_Client_Compile_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub program: *const PJRT_Program,
    pub compile_options: *const c_char,
    pub compile_options_size: usize,
    pub executable: *mut PJRT_LoadedExecutable,
}
pub const PJRT_Client_Compile_Args_SIZE: usize = 56;

pub const HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: c_int = 0;

#[repr(C)]
pub struct PJRT_Client_BufferFromHostBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub data: *const c_void,
    pub type_: c_int,
    pub dims: *const i64,
    pub num_dims: usize,
    pub byte_strides: *const i64,
    pub num_byte_strides: usize,
    pub host_buffer_semantics: c_int,
    pub device: *mut PJRT_Device,
    pub memory: *mut PJRT_Memory,
    pub device_layout: *mut c_void,
    pub done_with_host_buffer: *mut PJRT_Event,
    pub buffer: *mut PJRT_Buffer,
}
pub const PJRT_Client_BufferFromHostBuffer_Args_SIZE: usize = 120;

pub type OnDeleteCallback = unsafe extern "C" fn(device_buffer_ptr: *mut c_void, user_arg: *mut c_void);

#[repr(C)]
pub struct PJRT_Client_CreateViewOfDeviceBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub device_buffer_ptr: *mut c_void,
    pub dims: *const i64,
    pub num_dims: usize,
    pub element_type: c_int,
    pub layout: *mut c_void,
    pub device: *mut PJRT_Device,
    pub on_delete_callback: Option<OnDeleteCallback>,
    pub on_delete_callback_arg: *mut c_void,
    pub stream: isize,
    pub buffer: *mut PJRT_Buffer,
    pub memory: *mut PJRT_Memory,
}
pub const PJRT_Client_CreateViewOfDeviceBuffer_Args_SIZE: usize = 112;

// ---------------------------------------------------------------- devices

/// The shape of `PJRT_Device_GetDescription_Args`.
#[repr(C)]
pub struct PJRT_Device_GetDescription_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub device_description: *mut PJRT_DeviceDescription,
}
pub const PJRT_Device_GetDescription_Args_SIZE: usize = 32;

#[repr(C)]
pub struct PJRT_Device_LocalHardwareId_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub local_hardware_id: c_int,
}
pub const PJRT_Device_LocalHardwareId_Args_SIZE: usize = 28;

#[repr(C)]
pub struct PJRT_DeviceDescription_Id_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub id: c_int,
}
pub const PJRT_DeviceDescription_Id_Args_SIZE: usize = 28;

/// The shape of `PJRT_DeviceDescription_Kind_Args` and `_ToString_Args`.
#[repr(C)]
pub struct PJRT_DeviceDescription_String_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub value: *const c_char,
    pub value_size: usize,
}
pub const PJRT_DeviceDescription_String_Args_SIZE: usize = 40;

// ---------------------------------------------------------------- executables

#[repr(C)]
pub struct PJRT_Executable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
}
pub const PJRT_Executable_Destroy_Args_SIZE: usize = 24;

#[repr(C)]
pub struct PJRT_LoadedExecutable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
}
pub const PJRT_LoadedExecutable_Destroy_Args_SIZE: usize = 24;

#[repr(C)]
pub struct PJRT_LoadedExecutable_GetExecutable_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub loaded_executable: *mut PJRT_LoadedExecutable,
    pub executable: *mut PJRT_Executable,
}
pub const PJRT_LoadedExecutable_GetExecutable_Args_SIZE: usize = 32;

#[repr(C)]
pub struct PJRT_Executable_NumOutputs_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub num_outputs: usize,
}
pub const PJRT_Executable_NumOutputs_Args_SIZE: usize = 32;

#[repr(C)]
pub struct PJRT_Executable_OptimizedProgram_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub program: *mut PJRT_Program,
}
pub const PJRT_Executable_OptimizedProgram_Args_SIZE: usize = 32;

#[repr(C)]
pub struct PJRT_Executable_OutputElementTypes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub output_types: *const c_int,
    pub num_output_types: usize,
}
pub const PJRT_Executable_OutputElementTypes_Args_SIZE: usize = 40;

#[repr(C)]
pub struct PJRT_Executable_OutputDimensions_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub num_outputs: usize,
    pub dims: *const i64,
    pub dim_sizes: *const usize,
}
pub const PJRT_Executable_OutputDimensions_Args_SIZE: usize = 48;

#[repr(C)]
pub struct PJRT_ExecuteOptions {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub send_callbacks: *mut *mut c_void,
    pub recv_callbacks: *mut *mut c_void,
    pub num_send_ops: usize,
    pub num_recv_ops: usize,
    pub launch_id: c_int,
    pub non_donatable_input_indices: *const i64,
    pub num_non_donatable_input_indices: usize,
    pub context: *mut PJRT_ExecuteContext,
    pub call_location: *const c_char,
    pub num_tasks: usize,
    pub task_ids: *mut c_int,
    pub incarnation_ids: *mut i64,
}
pub const PJRT_ExecuteOptions_SIZE: usize = 112;

#[repr(C)]
pub struct PJRT_LoadedExecutable_Execute_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
    pub options: *mut PJRT_ExecuteOptions,
    pub argument_lists: *const *const *mut PJRT_Buffer,
    pub num_devices: usize,
    pub num_args: usize,
    pub output_lists: *const *mut *mut PJRT_Buffer,
    pub device_complete_events: *mut *mut PJRT_Event,
    pub execute_device: *mut PJRT_Device,
}
pub const PJRT_LoadedExecutable_Execute_Args_SIZE: usize = 80;

// ---------------------------------------------------------------- buffers

/// The shape of `PJRT_Buffer_Destroy_Args`, `_IncreaseExternalReferenceCount_Args`
/// and `_DecreaseExternalReferenceCount_Args`.
#[repr(C)]
pub struct PJRT_Buffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}
pub const PJRT_Buffer_Args_SIZE: usize = 24;

#[repr(C)]
pub struct PJRT_Buffer_ElementType_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub type_: c_int,
}
pub const PJRT_Buffer_ElementType_Args_SIZE: usize = 28;

#[repr(C)]
pub struct PJRT_Buffer_Dimensions_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub dims: *const i64,
    pub num_dims: usize,
}
pub const PJRT_Buffer_Dimensions_Args_SIZE: usize = 40;

/// The shape of `PJRT_Buffer_Device_Args`, `_ReadyEvent_Args` and
/// `_OpaqueDeviceMemoryDataPointer_Args`: one pointer out.
#[repr(C)]
pub struct PJRT_Buffer_PtrOut_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub out: *mut c_void,
}
pub const PJRT_Buffer_PtrOut_Args_SIZE: usize = 32;

#[repr(C)]
pub struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub on_device_size_in_bytes: usize,
}
pub const PJRT_Buffer_OnDeviceSizeInBytes_Args_SIZE: usize = 32;

#[repr(C)]
pub struct PJRT_Buffer_ToHostBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub src: *mut PJRT_Buffer,
    pub host_layout: *mut c_void,
    pub dst: *mut c_void,
    pub dst_size: usize,
    pub event: *mut PJRT_Event,
}
pub const PJRT_Buffer_ToHostBuffer_Args_SIZE: usize = 56;

// ---------------------------------------------------------------- stream extension

#[repr(C)]
pub struct PJRT_Get_Stream_For_External_Ready_Events_Args {
    pub struct_size: usize,
    pub device: *mut PJRT_Device,
    pub stream: isize,
}
pub const PJRT_Get_Stream_For_External_Ready_Events_Args_SIZE: usize = 24;

#[repr(C)]
pub struct PJRT_Wait_Until_Buffer_Ready_On_Stream_Args {
    pub struct_size: usize,
    pub stream: isize,
    pub buffer: *mut PJRT_Buffer,
}
pub const PJRT_Wait_Until_Buffer_Ready_On_Stream_Args_SIZE: usize = 24;

/// A function taking one argument struct and returning an error or null.
pub type Fn = unsafe extern "C" fn(args: *mut c_void) -> *mut PJRT_Error;

#[repr(C)]
pub struct PJRT_Stream_Extension {
    pub base: PJRT_Extension_Base,
    pub get_stream: Option<Fn>,
    pub wait_stream: Option<Fn>,
}
pub const PJRT_Stream_Extension_SIZE: usize = 40;

// ---------------------------------------------------------------- the table

pub type ErrorDestroyFn = unsafe extern "C" fn(args: *mut PJRT_Error_Destroy_Args);
pub type ErrorMessageFn = unsafe extern "C" fn(args: *mut PJRT_Error_Message_Args);

/// The head of `PJRT_Api`, then its function table. Slots are read by index
/// ([`slot`]), after checking that the plugin's `struct_size` covers them.
#[repr(C)]
pub struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub pjrt_api_version: PJRT_Api_Version,
    pub error_destroy: Option<ErrorDestroyFn>,
    pub error_message: Option<ErrorMessageFn>,
    // ... followed by the other functions, read through `slot`.
}

/// Byte offset of function slot 0 in `PJRT_Api`.
pub const API_TABLE_OFFSET: usize = 40;
/// The size of `PJRT_Api` at 0.115 (138 function slots).
pub const PJRT_Api_SIZE: usize = API_TABLE_OFFSET + 138 * 8;

/// Indices of the function slots handoff calls, in `PJRT_Api` order.
pub mod slot {
    pub const ERROR_GET_CODE: usize = 2;
    pub const PLUGIN_INITIALIZE: usize = 3;
    pub const PLUGIN_ATTRIBUTES: usize = 4;
    pub const EVENT_DESTROY: usize = 5;
    pub const EVENT_IS_READY: usize = 6;
    pub const EVENT_ERROR: usize = 7;
    pub const EVENT_AWAIT: usize = 8;
    pub const EVENT_ON_READY: usize = 9;
    pub const CLIENT_CREATE: usize = 10;
    pub const CLIENT_DESTROY: usize = 11;
    pub const CLIENT_PLATFORM_NAME: usize = 12;
    pub const CLIENT_PLATFORM_VERSION: usize = 14;
    pub const CLIENT_ADDRESSABLE_DEVICES: usize = 16;
    pub const CLIENT_COMPILE: usize = 20;
    pub const CLIENT_BUFFER_FROM_HOST_BUFFER: usize = 22;
    pub const DEVICE_DESCRIPTION_ID: usize = 23;
    pub const DEVICE_DESCRIPTION_KIND: usize = 26;
    pub const DEVICE_GET_DESCRIPTION: usize = 29;
    pub const DEVICE_LOCAL_HARDWARE_ID: usize = 31;
    pub const EXECUTABLE_DESTROY: usize = 40;
    pub const EXECUTABLE_NUM_OUTPUTS: usize = 44;
    pub const EXECUTABLE_OPTIMIZED_PROGRAM: usize = 48;
    pub const LOADED_EXECUTABLE_DESTROY: usize = 50;
    pub const LOADED_EXECUTABLE_GET_EXECUTABLE: usize = 51;
    pub const LOADED_EXECUTABLE_EXECUTE: usize = 55;
    pub const BUFFER_DESTROY: usize = 58;
    pub const BUFFER_ELEMENT_TYPE: usize = 59;
    pub const BUFFER_DIMENSIONS: usize = 60;
    pub const BUFFER_ON_DEVICE_SIZE_IN_BYTES: usize = 64;
    pub const BUFFER_DEVICE: usize = 65;
    pub const BUFFER_TO_HOST_BUFFER: usize = 70;
    pub const BUFFER_READY_EVENT: usize = 72;
    pub const BUFFER_INCREASE_EXTERNAL_REFERENCE_COUNT: usize = 74;
    pub const BUFFER_DECREASE_EXTERNAL_REFERENCE_COUNT: usize = 75;
    pub const BUFFER_OPAQUE_DEVICE_MEMORY_DATA_POINTER: usize = 76;
    pub const EXECUTABLE_OUTPUT_ELEMENT_TYPES: usize = 90;
    pub const EXECUTABLE_OUTPUT_DIMENSIONS: usize = 91;
    pub const CLIENT_CREATE_VIEW_OF_DEVICE_BUFFER: usize = 93;
}

// `PJRT_Buffer_Type` values.
pub const BUFFER_TYPE_INVALID: c_int = 0;
pub const BUFFER_TYPE_PRED: c_int = 1;
pub const BUFFER_TYPE_S8: c_int = 2;
pub const BUFFER_TYPE_S16: c_int = 3;
pub const BUFFER_TYPE_S32: c_int = 4;
pub const BUFFER_TYPE_S64: c_int = 5;
pub const BUFFER_TYPE_U8: c_int = 6;
pub const BUFFER_TYPE_U16: c_int = 7;
pub const BUFFER_TYPE_U32: c_int = 8;
pub const BUFFER_TYPE_U64: c_int = 9;
pub const BUFFER_TYPE_F16: c_int = 10;
pub const BUFFER_TYPE_F32: c_int = 11;
pub const BUFFER_TYPE_F64: c_int = 12;
pub const BUFFER_TYPE_BF16: c_int = 13;
pub const BUFFER_TYPE_C64: c_int = 14;
pub const BUFFER_TYPE_C128: c_int = 15;
pub const BUFFER_TYPE_F8E5M2: c_int = 16;
pub const BUFFER_TYPE_F8E4M3FN: c_int = 17;
pub const BUFFER_TYPE_F8E4M3B11FNUZ: c_int = 18;
pub const BUFFER_TYPE_F8E5M2FNUZ: c_int = 19;
pub const BUFFER_TYPE_F8E4M3FNUZ: c_int = 20;
pub const BUFFER_TYPE_F8E4M3: c_int = 26;
pub const BUFFER_TYPE_F8E3M4: c_int = 27;
pub const BUFFER_TYPE_F8E8M0FNU: c_int = 28;
pub const BUFFER_TYPE_F4E2M1FN: c_int = 29;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn struct_sizes_match_the_0_115_header() {
        assert_eq!(size_of::<PJRT_Extension_Base>(), PJRT_Extension_Base_SIZE);
        assert_eq!(size_of::<PJRT_Error_Destroy_Args>(), PJRT_Error_Destroy_Args_SIZE);
        assert_eq!(size_of::<PJRT_Error_Message_Args>(), PJRT_Error_Message_Args_SIZE);
        // C's STRUCT_SIZE is offsetof(last) + sizeof(last): padding after a last
        // 4- or 1-byte field is not counted.
        assert_eq!(size_of::<PJRT_Error_GetCode_Args>(), 32);
        assert_eq!(PJRT_Error_GetCode_Args_SIZE, 28);
        assert_eq!(size_of::<PJRT_NamedValue>(), PJRT_NamedValue_SIZE);
        assert_eq!(size_of::<PJRT_Plugin_Initialize_Args>(), PJRT_Plugin_Initialize_Args_SIZE);
        assert_eq!(size_of::<PJRT_Plugin_Attributes_Args>(), PJRT_Plugin_Attributes_Args_SIZE);
        assert_eq!(size_of::<PJRT_Event_Args>(), PJRT_Event_Args_SIZE);
        assert_eq!(size_of::<PJRT_Event_IsReady_Args>(), 32);
        assert_eq!(size_of::<PJRT_Event_OnReady_Args>(), PJRT_Event_OnReady_Args_SIZE);
        assert_eq!(size_of::<PJRT_Client_Create_Args>(), PJRT_Client_Create_Args_SIZE);
        assert_eq!(size_of::<PJRT_Client_Destroy_Args>(), PJRT_Client_Destroy_Args_SIZE);
        assert_eq!(size_of::<PJRT_Client_String_Args>(), PJRT_Client_String_Args_SIZE);
        assert_eq!(size_of::<PJRT_Client_Devices_Args>(), PJRT_Client_Devices_Args_SIZE);
        assert_eq!(size_of::<PJRT_Program>(), PJRT_Program_SIZE);
        assert_eq!(size_of::<PJRT_Client_Compile_Args>(), PJRT_Client_Compile_Args_SIZE);
        assert_eq!(
            size_of::<PJRT_Client_BufferFromHostBuffer_Args>(),
            PJRT_Client_BufferFromHostBuffer_Args_SIZE
        );
        assert_eq!(
            size_of::<PJRT_Client_CreateViewOfDeviceBuffer_Args>(),
            PJRT_Client_CreateViewOfDeviceBuffer_Args_SIZE
        );
        assert_eq!(size_of::<PJRT_Device_GetDescription_Args>(), PJRT_Device_GetDescription_Args_SIZE);
        assert_eq!(size_of::<PJRT_Device_LocalHardwareId_Args>(), 32);
        assert_eq!(size_of::<PJRT_DeviceDescription_Id_Args>(), 32);
        assert_eq!(size_of::<PJRT_DeviceDescription_String_Args>(), PJRT_DeviceDescription_String_Args_SIZE);
        assert_eq!(size_of::<PJRT_Executable_Destroy_Args>(), PJRT_Executable_Destroy_Args_SIZE);
        assert_eq!(size_of::<PJRT_LoadedExecutable_Destroy_Args>(), PJRT_LoadedExecutable_Destroy_Args_SIZE);
        assert_eq!(
            size_of::<PJRT_LoadedExecutable_GetExecutable_Args>(),
            PJRT_LoadedExecutable_GetExecutable_Args_SIZE
        );
        assert_eq!(size_of::<PJRT_Executable_NumOutputs_Args>(), PJRT_Executable_NumOutputs_Args_SIZE);
        assert_eq!(
            size_of::<PJRT_Executable_OptimizedProgram_Args>(),
            PJRT_Executable_OptimizedProgram_Args_SIZE
        );
        assert_eq!(
            size_of::<PJRT_Executable_OutputElementTypes_Args>(),
            PJRT_Executable_OutputElementTypes_Args_SIZE
        );
        assert_eq!(
            size_of::<PJRT_Executable_OutputDimensions_Args>(),
            PJRT_Executable_OutputDimensions_Args_SIZE
        );
        assert_eq!(size_of::<PJRT_ExecuteOptions>(), PJRT_ExecuteOptions_SIZE);
        assert_eq!(size_of::<PJRT_LoadedExecutable_Execute_Args>(), PJRT_LoadedExecutable_Execute_Args_SIZE);
        assert_eq!(size_of::<PJRT_Buffer_Args>(), PJRT_Buffer_Args_SIZE);
        assert_eq!(size_of::<PJRT_Buffer_ElementType_Args>(), 32);
        assert_eq!(size_of::<PJRT_Buffer_Dimensions_Args>(), PJRT_Buffer_Dimensions_Args_SIZE);
        assert_eq!(size_of::<PJRT_Buffer_PtrOut_Args>(), PJRT_Buffer_PtrOut_Args_SIZE);
        assert_eq!(
            size_of::<PJRT_Buffer_OnDeviceSizeInBytes_Args>(),
            PJRT_Buffer_OnDeviceSizeInBytes_Args_SIZE
        );
        assert_eq!(size_of::<PJRT_Buffer_ToHostBuffer_Args>(), PJRT_Buffer_ToHostBuffer_Args_SIZE);
        assert_eq!(
            size_of::<PJRT_Get_Stream_For_External_Ready_Events_Args>(),
            PJRT_Get_Stream_For_External_Ready_Events_Args_SIZE
        );
        assert_eq!(
            size_of::<PJRT_Wait_Until_Buffer_Ready_On_Stream_Args>(),
            PJRT_Wait_Until_Buffer_Ready_On_Stream_Args_SIZE
        );
        assert_eq!(size_of::<PJRT_Stream_Extension>(), PJRT_Stream_Extension_SIZE);
        assert_eq!(std::mem::offset_of!(PJRT_Api, error_destroy), API_TABLE_OFFSET);
        assert_eq!(PJRT_Api_SIZE, 1144);
    }
}
