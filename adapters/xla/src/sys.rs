//! Raw `repr(C)` bindings of the parts of the PJRT C API that handoff uses,
//! written from `xla/pjrt/c/pjrt_c_api.h` and `pjrt_c_api_stream_extension.h`.
//!
//! Bound version: **PJRT C API 0.115** (what JAX 0.11.2's CPU and CUDA plugins report).
//!
//! Beside each struct, one `pjrt!` line says what the header says of it:
//! - `size N`: its `PJRT_STRUCT_SIZE` at 0.115 ([`Struct::SIZE`]), which equals what the
//!   0.115 CPU plugin expects: each was checked against the plugin's own "expected N"
//!   message for a too-small struct (all argument structs below except
//!   `CreateViewOfDeviceBuffer_Args`, which the CPU plugin does not size-check, and
//!   the stream extension's, which it lacks);
//! - `slot I "NAME"`: the function of `PJRT_Api` that takes it ([`Args`]): its index
//!   in the function table and its C name. There is one struct per function, so a
//!   call with the wrong struct does not compile. The indices were checked the same
//!   way (the plugin's messages name the struct of each slot);
//! - `Extension.field "NAME"`: the same for an extension's function ([`ExtensionArgs`]).
//!
//! Nothing here is safe to call directly: the `result` module wraps these calls.
#![allow(non_camel_case_types, non_upper_case_globals, dead_code)] // a transcription of the header: C names, some unused values

use std::ffi::{c_char, c_int, c_void};

/// The API major version bound here.
pub const API_MAJOR: i32 = 0;
/// The API minor version bound here.
pub const API_MINOR: i32 = 115;

/// A PJRT struct that starts with `struct_size`.
pub trait Struct {
    /// Its `PJRT_STRUCT_SIZE` at 0.115: the offset of its last field plus that
    /// field's size (so padding after a last 4- or 1-byte field is not counted).
    const SIZE: usize;
}

/// The argument struct of one function of the `PJRT_Api` table.
///
/// # Safety
/// Slot `SLOT` of a 0.115 table must be a function taking a pointer to `Self` and
/// returning an owned `PJRT_Error` or null; `NAME` is that function's C name.
pub unsafe trait Args: Struct {
    /// The function's index in the table (0 is `PJRT_Error_Destroy`).
    const SLOT: usize;
    /// The function's C name (for errors).
    const NAME: &'static str;
}

/// The argument struct of one function of an extension (a struct of typed function
/// pointers after a [`PJRT_Extension_Base`]).
///
/// # Safety
/// [`function`](Self::function) must return the extension's function that takes
/// `Self`; `NAME` is its C name.
pub unsafe trait ExtensionArgs: Struct {
    /// The extension struct holding the function.
    type Extension;
    /// `Extension.field` (for errors).
    const FIELD: &'static str;
    /// The function's C name (for errors).
    const NAME: &'static str;
    /// The function in `ext`, if the plugin filled it in.
    fn function(ext: &Self::Extension) -> Option<Function<Self>>;
}

/// A PJRT function taking an `A` and returning an owned error or null.
pub type Function<A> = unsafe extern "C" fn(args: *mut A) -> *mut PJRT_Error;

/// Declares, beside a struct, what the 0.115 header says of it (see the module docs),
/// and checks at compile time that the Rust layout has that size (rounded up to the
/// struct's alignment, as C's `sizeof` is).
macro_rules! pjrt {
    ($ty:ident, size $size:literal $(, $($rest:tt)*)?) => {
        impl Struct for $ty {
            const SIZE: usize = $size;
        }
        const _: () = assert!(size_of::<$ty>() == <$ty as Struct>::SIZE.next_multiple_of(align_of::<$ty>()));
        $(pjrt!(@fn $ty, $($rest)*);)?
    };
    (@fn $ty:ident, slot $slot:literal $name:literal) => {
        // SAFETY: the header's function `$name` sits at `$slot` of the 0.115 table and
        // takes a `$ty` (the slot indices were checked against the 0.115 CPU plugin).
        unsafe impl Args for $ty {
            const SLOT: usize = $slot;
            const NAME: &'static str = $name;
        }
    };
    (@fn $ty:ident, $ext:ident . $field:ident $name:literal) => {
        // SAFETY: the field's type is `Option<Function<$ty>>` (else this does not compile).
        unsafe impl ExtensionArgs for $ty {
            type Extension = $ext;
            const FIELD: &'static str = concat!(stringify!($ext), ".", stringify!($field));
            const NAME: &'static str = $name;
            fn function(ext: &$ext) -> Option<Function<$ty>> {
                ext.$field
            }
        }
    };
}

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
pjrt!(PJRT_Extension_Base, size 24);

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

/// Slot 0 (`PJRT_Error_Destroy`, which returns nothing: a typed field of [`PJRT_Api`]).
#[repr(C)]
pub struct PJRT_Error_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *mut PJRT_Error,
}
pjrt!(PJRT_Error_Destroy_Args, size 24);

/// Slot 1 (`PJRT_Error_Message`, which returns nothing: a typed field of [`PJRT_Api`]).
#[repr(C)]
pub struct PJRT_Error_Message_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *const PJRT_Error,
    pub message: *const c_char,
    pub message_size: usize,
}
pjrt!(PJRT_Error_Message_Args, size 40);

#[repr(C)]
pub struct PJRT_Error_GetCode_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *const PJRT_Error,
    pub code: c_int,
}
pjrt!(PJRT_Error_GetCode_Args, size 28, slot 2 "PJRT_Error_GetCode");

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
pjrt!(PJRT_NamedValue, size 56);

// ---------------------------------------------------------------- plugin

#[repr(C)]
pub struct PJRT_Plugin_Initialize_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
}
pjrt!(PJRT_Plugin_Initialize_Args, size 16, slot 3 "PJRT_Plugin_Initialize");

#[repr(C)]
pub struct PJRT_Plugin_Attributes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub attributes: *const PJRT_NamedValue,
    pub num_attributes: usize,
}
pjrt!(PJRT_Plugin_Attributes_Args, size 32, slot 4 "PJRT_Plugin_Attributes");

// ---------------------------------------------------------------- events

#[repr(C)]
pub struct PJRT_Event_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}
pjrt!(PJRT_Event_Destroy_Args, size 24, slot 5 "PJRT_Event_Destroy");

#[repr(C)]
pub struct PJRT_Event_IsReady_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
    pub is_ready: bool,
}
pjrt!(PJRT_Event_IsReady_Args, size 25, slot 6 "PJRT_Event_IsReady");

#[repr(C)]
pub struct PJRT_Event_Error_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}
pjrt!(PJRT_Event_Error_Args, size 24, slot 7 "PJRT_Event_Error");

#[repr(C)]
pub struct PJRT_Event_Await_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}
pjrt!(PJRT_Event_Await_Args, size 24, slot 8 "PJRT_Event_Await");

pub type PJRT_Event_OnReadyCallback = unsafe extern "C" fn(error: *mut PJRT_Error, user_arg: *mut c_void);

#[repr(C)]
pub struct PJRT_Event_OnReady_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
    pub callback: Option<PJRT_Event_OnReadyCallback>,
    pub user_arg: *mut c_void,
}
pjrt!(PJRT_Event_OnReady_Args, size 40, slot 9 "PJRT_Event_OnReady");

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
pjrt!(PJRT_Client_Create_Args, size 88, slot 10 "PJRT_Client_Create");

#[repr(C)]
pub struct PJRT_Client_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
}
pjrt!(PJRT_Client_Destroy_Args, size 24, slot 11 "PJRT_Client_Destroy");

#[repr(C)]
pub struct PJRT_Client_PlatformName_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
}
pjrt!(PJRT_Client_PlatformName_Args, size 40, slot 12 "PJRT_Client_PlatformName");

#[repr(C)]
pub struct PJRT_Client_PlatformVersion_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub platform_version: *const c_char,
    pub platform_version_size: usize,
}
pjrt!(PJRT_Client_PlatformVersion_Args, size 40, slot 14 "PJRT_Client_PlatformVersion");

#[repr(C)]
pub struct PJRT_Client_AddressableDevices_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub addressable_devices: *const *mut PJRT_Device,
    pub num_addressable_devices: usize,
}
pjrt!(PJRT_Client_AddressableDevices_Args, size 40, slot 16 "PJRT_Client_AddressableDevices");

#[repr(C)]
pub struct PJRT_Program {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub code: *mut c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}
pjrt!(PJRT_Program, size 48);

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
pjrt!(PJRT_Client_Compile_Args, size 56, slot 20 "PJRT_Client_Compile");

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
pjrt!(PJRT_Client_BufferFromHostBuffer_Args, size 120, slot 22 "PJRT_Client_BufferFromHostBuffer");

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
pjrt!(PJRT_Client_CreateViewOfDeviceBuffer_Args, size 112, slot 93 "PJRT_Client_CreateViewOfDeviceBuffer");

// ---------------------------------------------------------------- devices

#[repr(C)]
pub struct PJRT_DeviceDescription_Id_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub id: c_int,
}
pjrt!(PJRT_DeviceDescription_Id_Args, size 28, slot 23 "PJRT_DeviceDescription_Id");

#[repr(C)]
pub struct PJRT_DeviceDescription_Kind_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub device_kind: *const c_char,
    pub device_kind_size: usize,
}
pjrt!(PJRT_DeviceDescription_Kind_Args, size 40, slot 26 "PJRT_DeviceDescription_Kind");

#[repr(C)]
pub struct PJRT_Device_GetDescription_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub device_description: *mut PJRT_DeviceDescription,
}
pjrt!(PJRT_Device_GetDescription_Args, size 32, slot 29 "PJRT_Device_GetDescription");

#[repr(C)]
pub struct PJRT_Device_LocalHardwareId_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub local_hardware_id: c_int,
}
pjrt!(PJRT_Device_LocalHardwareId_Args, size 28, slot 31 "PJRT_Device_LocalHardwareId");

// ---------------------------------------------------------------- executables

#[repr(C)]
pub struct PJRT_Executable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
}
pjrt!(PJRT_Executable_Destroy_Args, size 24, slot 40 "PJRT_Executable_Destroy");

#[repr(C)]
pub struct PJRT_Executable_NumOutputs_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub num_outputs: usize,
}
pjrt!(PJRT_Executable_NumOutputs_Args, size 32, slot 44 "PJRT_Executable_NumOutputs");

#[repr(C)]
pub struct PJRT_Executable_OptimizedProgram_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub program: *mut PJRT_Program,
}
pjrt!(PJRT_Executable_OptimizedProgram_Args, size 32, slot 48 "PJRT_Executable_OptimizedProgram");

#[repr(C)]
pub struct PJRT_LoadedExecutable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
}
pjrt!(PJRT_LoadedExecutable_Destroy_Args, size 24, slot 50 "PJRT_LoadedExecutable_Destroy");

#[repr(C)]
pub struct PJRT_LoadedExecutable_GetExecutable_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub loaded_executable: *mut PJRT_LoadedExecutable,
    pub executable: *mut PJRT_Executable,
}
pjrt!(PJRT_LoadedExecutable_GetExecutable_Args, size 32, slot 51 "PJRT_LoadedExecutable_GetExecutable");

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
pjrt!(PJRT_ExecuteOptions, size 112);

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
pjrt!(PJRT_LoadedExecutable_Execute_Args, size 80, slot 55 "PJRT_LoadedExecutable_Execute");

#[repr(C)]
pub struct PJRT_Executable_OutputElementTypes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub output_types: *const c_int,
    pub num_output_types: usize,
}
pjrt!(PJRT_Executable_OutputElementTypes_Args, size 40, slot 90 "PJRT_Executable_OutputElementTypes");

#[repr(C)]
pub struct PJRT_Executable_OutputDimensions_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub num_outputs: usize,
    pub dims: *const i64,
    pub dim_sizes: *const usize,
}
pjrt!(PJRT_Executable_OutputDimensions_Args, size 48, slot 91 "PJRT_Executable_OutputDimensions");

// ---------------------------------------------------------------- buffers

#[repr(C)]
pub struct PJRT_Buffer_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}
pjrt!(PJRT_Buffer_Destroy_Args, size 24, slot 58 "PJRT_Buffer_Destroy");

#[repr(C)]
pub struct PJRT_Buffer_ElementType_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub type_: c_int,
}
pjrt!(PJRT_Buffer_ElementType_Args, size 28, slot 59 "PJRT_Buffer_ElementType");

#[repr(C)]
pub struct PJRT_Buffer_Dimensions_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub dims: *const i64,
    pub num_dims: usize,
}
pjrt!(PJRT_Buffer_Dimensions_Args, size 40, slot 60 "PJRT_Buffer_Dimensions");

#[repr(C)]
pub struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub on_device_size_in_bytes: usize,
}
pjrt!(PJRT_Buffer_OnDeviceSizeInBytes_Args, size 32, slot 64 "PJRT_Buffer_OnDeviceSizeInBytes");

#[repr(C)]
pub struct PJRT_Buffer_Device_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub device: *mut PJRT_Device,
}
pjrt!(PJRT_Buffer_Device_Args, size 32, slot 65 "PJRT_Buffer_Device");

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
pjrt!(PJRT_Buffer_ToHostBuffer_Args, size 56, slot 70 "PJRT_Buffer_ToHostBuffer");

#[repr(C)]
pub struct PJRT_Buffer_ReadyEvent_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub event: *mut PJRT_Event,
}
pjrt!(PJRT_Buffer_ReadyEvent_Args, size 32, slot 72 "PJRT_Buffer_ReadyEvent");

#[repr(C)]
pub struct PJRT_Buffer_IncreaseExternalReferenceCount_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}
pjrt!(
    PJRT_Buffer_IncreaseExternalReferenceCount_Args,
    size 24,
    slot 74 "PJRT_Buffer_IncreaseExternalReferenceCount"
);

#[repr(C)]
pub struct PJRT_Buffer_DecreaseExternalReferenceCount_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}
pjrt!(
    PJRT_Buffer_DecreaseExternalReferenceCount_Args,
    size 24,
    slot 75 "PJRT_Buffer_DecreaseExternalReferenceCount"
);

#[repr(C)]
pub struct PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub device_memory_ptr: *mut c_void,
}
pjrt!(
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args,
    size 32,
    slot 76 "PJRT_Buffer_OpaqueDeviceMemoryDataPointer"
);

// ---------------------------------------------------------------- stream extension

/// The Stream extension (`PJRT_Extension_Type` 3). Its argument structs have no
/// `extension_start`.
#[repr(C)]
pub struct PJRT_Stream_Extension {
    pub base: PJRT_Extension_Base,
    pub get_stream: Option<Function<PJRT_Get_Stream_For_External_Ready_Events_Args>>,
    pub wait_stream: Option<Function<PJRT_Wait_Until_Buffer_Ready_On_Stream_Args>>,
}
pjrt!(PJRT_Stream_Extension, size 40);

#[repr(C)]
pub struct PJRT_Get_Stream_For_External_Ready_Events_Args {
    pub struct_size: usize,
    pub device: *mut PJRT_Device,
    pub stream: isize,
}
pjrt!(
    PJRT_Get_Stream_For_External_Ready_Events_Args,
    size 24,
    PJRT_Stream_Extension.get_stream "PJRT_Get_Stream_For_External_Ready_Events"
);

#[repr(C)]
pub struct PJRT_Wait_Until_Buffer_Ready_On_Stream_Args {
    pub struct_size: usize,
    pub stream: isize,
    pub buffer: *mut PJRT_Buffer,
}
pjrt!(
    PJRT_Wait_Until_Buffer_Ready_On_Stream_Args,
    size 24,
    PJRT_Stream_Extension.wait_stream "PJRT_Wait_Until_Buffer_Ready_On_Stream"
);

// ---------------------------------------------------------------- the table

/// The head of `PJRT_Api`, then its function table: slots 0 and 1 (which return
/// nothing) are typed here; every other slot is read by the index its argument
/// struct declares ([`Args::SLOT`]), after checking that the plugin's `struct_size`
/// covers it.
#[repr(C)]
pub struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub pjrt_api_version: PJRT_Api_Version,
    pub error_destroy: Option<unsafe extern "C" fn(args: *mut PJRT_Error_Destroy_Args)>,
    pub error_message: Option<unsafe extern "C" fn(args: *mut PJRT_Error_Message_Args)>,
    // ... followed by the other functions, read by `Args::SLOT`.
}

/// Byte offset of function slot 0 in `PJRT_Api`.
pub const API_TABLE_OFFSET: usize = 40;
/// The size of `PJRT_Api` at 0.115 (138 function slots).
pub const PJRT_Api_SIZE: usize = API_TABLE_OFFSET + 138 * 8;

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
    use std::mem::{align_of, size_of};

    /// The figure beside each struct (its `PJRT_STRUCT_SIZE` at 0.115) against its Rust
    /// layout: C's `sizeof` is `PJRT_STRUCT_SIZE` rounded up to the alignment (padding
    /// after a last 4- or 1-byte field is not counted in `struct_size`).
    fn layout<S: Struct>() {
        let name = std::any::type_name::<S>();
        assert_eq!(size_of::<S>(), S::SIZE.next_multiple_of(align_of::<S>()), "{name}");
    }

    /// The size, and a slot of the table that no other struct takes, named after it.
    fn function<A: Args>(slots: &mut Vec<usize>) {
        layout::<A>();
        let name = std::any::type_name::<A>();
        assert!(name.ends_with(&format!("::{}_Args", A::NAME)), "{name} names {}", A::NAME);
        assert!(API_TABLE_OFFSET + (A::SLOT + 1) * 8 <= PJRT_Api_SIZE, "{name}: slot {}", A::SLOT);
        assert!(!slots.contains(&A::SLOT), "{name}: slot {} taken twice", A::SLOT);
        slots.push(A::SLOT);
    }

    fn extension<A: ExtensionArgs>() {
        layout::<A>();
        let name = std::any::type_name::<A>();
        assert!(name.ends_with(&format!("::{}_Args", A::NAME)), "{name} names {}", A::NAME);
    }

    #[test]
    fn struct_sizes_and_slots_match_the_0_115_header() {
        layout::<PJRT_Extension_Base>();
        layout::<PJRT_Error_Destroy_Args>();
        layout::<PJRT_Error_Message_Args>();
        layout::<PJRT_NamedValue>();
        layout::<PJRT_Program>();
        layout::<PJRT_ExecuteOptions>();
        layout::<PJRT_Stream_Extension>();
        extension::<PJRT_Get_Stream_For_External_Ready_Events_Args>();
        extension::<PJRT_Wait_Until_Buffer_Ready_On_Stream_Args>();
        let mut slots = vec![0, 1];
        let s = &mut slots;
        function::<PJRT_Error_GetCode_Args>(s);
        function::<PJRT_Plugin_Initialize_Args>(s);
        function::<PJRT_Plugin_Attributes_Args>(s);
        function::<PJRT_Event_Destroy_Args>(s);
        function::<PJRT_Event_IsReady_Args>(s);
        function::<PJRT_Event_Error_Args>(s);
        function::<PJRT_Event_Await_Args>(s);
        function::<PJRT_Event_OnReady_Args>(s);
        function::<PJRT_Client_Create_Args>(s);
        function::<PJRT_Client_Destroy_Args>(s);
        function::<PJRT_Client_PlatformName_Args>(s);
        function::<PJRT_Client_PlatformVersion_Args>(s);
        function::<PJRT_Client_AddressableDevices_Args>(s);
        function::<PJRT_Client_Compile_Args>(s);
        function::<PJRT_Client_BufferFromHostBuffer_Args>(s);
        function::<PJRT_Client_CreateViewOfDeviceBuffer_Args>(s);
        function::<PJRT_DeviceDescription_Id_Args>(s);
        function::<PJRT_DeviceDescription_Kind_Args>(s);
        function::<PJRT_Device_GetDescription_Args>(s);
        function::<PJRT_Device_LocalHardwareId_Args>(s);
        function::<PJRT_Executable_Destroy_Args>(s);
        function::<PJRT_Executable_NumOutputs_Args>(s);
        function::<PJRT_Executable_OptimizedProgram_Args>(s);
        function::<PJRT_LoadedExecutable_Destroy_Args>(s);
        function::<PJRT_LoadedExecutable_GetExecutable_Args>(s);
        function::<PJRT_LoadedExecutable_Execute_Args>(s);
        function::<PJRT_Executable_OutputElementTypes_Args>(s);
        function::<PJRT_Executable_OutputDimensions_Args>(s);
        function::<PJRT_Buffer_Destroy_Args>(s);
        function::<PJRT_Buffer_ElementType_Args>(s);
        function::<PJRT_Buffer_Dimensions_Args>(s);
        function::<PJRT_Buffer_OnDeviceSizeInBytes_Args>(s);
        function::<PJRT_Buffer_Device_Args>(s);
        function::<PJRT_Buffer_ToHostBuffer_Args>(s);
        function::<PJRT_Buffer_ReadyEvent_Args>(s);
        function::<PJRT_Buffer_IncreaseExternalReferenceCount_Args>(s);
        function::<PJRT_Buffer_DecreaseExternalReferenceCount_Args>(s);
        function::<PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args>(s);
        assert_eq!(std::mem::offset_of!(PJRT_Api, error_destroy), API_TABLE_OFFSET);
        assert_eq!(std::mem::offset_of!(PJRT_Api, error_message), API_TABLE_OFFSET + 8);
        assert_eq!(PJRT_Api_SIZE, 1144);
    }
}
