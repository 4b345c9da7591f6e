//! Thin `Result` wrappers of the raw calls: each fills its argument struct with the
//! bound size, calls the plugin's function slot and turns a `PJRT_Error` into
//! [`XlaError::Pjrt`] with its message and code, destroying the error exactly once.
//!
//! These functions take and return raw handles; ownership is the caller's
//! (the safe types, `Client`, `Buffer`, `Executable`, `Event`, destroy each handle
//! exactly once).

use crate::error::{ErrorCode, Result, XlaError};
use crate::sys::{self, slot};
use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};

/// A loaded plugin's function table.
#[derive(Clone, Copy)]
pub struct Api {
    raw: &'static sys::PJRT_Api,
}

// SAFETY: the table is immutable and lives as long as the process (plugins are
// never unloaded); PJRT functions are thread-safe.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

macro_rules! args {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }) => {{
        // SAFETY: every argument struct is plain C data for which all-zero bytes
        // (null pointers, zero counts, `None` callbacks) is a valid value.
        #[allow(unused_unsafe)]
        let mut a: sys::$ty = unsafe { std::mem::zeroed() };
        a.struct_size = paste_size!($ty);
        $(a.$field = $value;)*
        a
    }};
}

macro_rules! paste_size {
    (PJRT_Error_GetCode_Args) => {
        sys::PJRT_Error_GetCode_Args_SIZE
    };
    (PJRT_Plugin_Initialize_Args) => {
        sys::PJRT_Plugin_Initialize_Args_SIZE
    };
    (PJRT_Plugin_Attributes_Args) => {
        sys::PJRT_Plugin_Attributes_Args_SIZE
    };
    (PJRT_Event_Args) => {
        sys::PJRT_Event_Args_SIZE
    };
    (PJRT_Event_IsReady_Args) => {
        sys::PJRT_Event_IsReady_Args_SIZE
    };
    (PJRT_Event_OnReady_Args) => {
        sys::PJRT_Event_OnReady_Args_SIZE
    };
    (PJRT_Client_Create_Args) => {
        sys::PJRT_Client_Create_Args_SIZE
    };
    (PJRT_Client_Destroy_Args) => {
        sys::PJRT_Client_Destroy_Args_SIZE
    };
    (PJRT_Client_String_Args) => {
        sys::PJRT_Client_String_Args_SIZE
    };
    (PJRT_Client_Devices_Args) => {
        sys::PJRT_Client_Devices_Args_SIZE
    };
    (PJRT_Program) => {
        sys::PJRT_Program_SIZE
    };
    (PJRT_Client_Compile_Args) => {
        sys::PJRT_Client_Compile_Args_SIZE
    };
    (PJRT_Client_BufferFromHostBuffer_Args) => {
        sys::PJRT_Client_BufferFromHostBuffer_Args_SIZE
    };
    (PJRT_Client_CreateViewOfDeviceBuffer_Args) => {
        sys::PJRT_Client_CreateViewOfDeviceBuffer_Args_SIZE
    };
    (PJRT_Device_GetDescription_Args) => {
        sys::PJRT_Device_GetDescription_Args_SIZE
    };
    (PJRT_Device_LocalHardwareId_Args) => {
        sys::PJRT_Device_LocalHardwareId_Args_SIZE
    };
    (PJRT_DeviceDescription_Id_Args) => {
        sys::PJRT_DeviceDescription_Id_Args_SIZE
    };
    (PJRT_DeviceDescription_String_Args) => {
        sys::PJRT_DeviceDescription_String_Args_SIZE
    };
    (PJRT_Executable_Destroy_Args) => {
        sys::PJRT_Executable_Destroy_Args_SIZE
    };
    (PJRT_LoadedExecutable_Destroy_Args) => {
        sys::PJRT_LoadedExecutable_Destroy_Args_SIZE
    };
    (PJRT_LoadedExecutable_GetExecutable_Args) => {
        sys::PJRT_LoadedExecutable_GetExecutable_Args_SIZE
    };
    (PJRT_Executable_NumOutputs_Args) => {
        sys::PJRT_Executable_NumOutputs_Args_SIZE
    };
    (PJRT_Executable_OptimizedProgram_Args) => {
        sys::PJRT_Executable_OptimizedProgram_Args_SIZE
    };
    (PJRT_Executable_OutputElementTypes_Args) => {
        sys::PJRT_Executable_OutputElementTypes_Args_SIZE
    };
    (PJRT_Executable_OutputDimensions_Args) => {
        sys::PJRT_Executable_OutputDimensions_Args_SIZE
    };
    (PJRT_ExecuteOptions) => {
        sys::PJRT_ExecuteOptions_SIZE
    };
    (PJRT_LoadedExecutable_Execute_Args) => {
        sys::PJRT_LoadedExecutable_Execute_Args_SIZE
    };
    (PJRT_Buffer_Args) => {
        sys::PJRT_Buffer_Args_SIZE
    };
    (PJRT_Buffer_ElementType_Args) => {
        sys::PJRT_Buffer_ElementType_Args_SIZE
    };
    (PJRT_Buffer_Dimensions_Args) => {
        sys::PJRT_Buffer_Dimensions_Args_SIZE
    };
    (PJRT_Buffer_PtrOut_Args) => {
        sys::PJRT_Buffer_PtrOut_Args_SIZE
    };
    (PJRT_Buffer_OnDeviceSizeInBytes_Args) => {
        sys::PJRT_Buffer_OnDeviceSizeInBytes_Args_SIZE
    };
    (PJRT_Buffer_ToHostBuffer_Args) => {
        sys::PJRT_Buffer_ToHostBuffer_Args_SIZE
    };
    (PJRT_Get_Stream_For_External_Ready_Events_Args) => {
        sys::PJRT_Get_Stream_For_External_Ready_Events_Args_SIZE
    };
    (PJRT_Wait_Until_Buffer_Ready_On_Stream_Args) => {
        sys::PJRT_Wait_Until_Buffer_Ready_On_Stream_Args_SIZE
    };
}

/// A string the plugin owns, copied out.
unsafe fn string(ptr: *const std::ffi::c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: the caller passes a pointer and length the plugin returned together.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// One plugin attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    String(String),
    /// An integer.
    Int64(i64),
    /// A list of integers.
    Int64List(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

impl Api {
    /// Wraps a table returned by `GetPjrtApi`.
    ///
    /// # Safety
    /// `raw` must be a valid `PJRT_Api` that lives for the rest of the process.
    pub unsafe fn new(raw: &'static sys::PJRT_Api) -> Api {
        Api { raw }
    }

    /// The raw table.
    pub fn raw(&self) -> &'static sys::PJRT_Api {
        self.raw
    }

    /// The plugin's `PJRT_Api.struct_size`.
    pub fn struct_size(&self) -> usize {
        self.raw.struct_size
    }

    /// The function in `index`, if the plugin's table has it.
    fn slot(&self, index: usize, name: &'static str) -> Result<sys::Fn> {
        let end = sys::API_TABLE_OFFSET + (index + 1) * 8;
        let missing = || {
            XlaError::invalid(
                format!("PJRT_Api.{name}"),
                "absent",
                "this plugin's function table does not have it",
            )
        };
        if self.raw.struct_size < end {
            return Err(missing());
        }
        // SAFETY: the slot lies within the plugin's `struct_size` bytes of table, so it
        // is a (possibly null) function pointer of this signature.
        let f: Option<sys::Fn> = unsafe {
            let base = self.raw as *const sys::PJRT_Api as *const u8;
            std::ptr::read(base.add(sys::API_TABLE_OFFSET + index * 8) as *const Option<sys::Fn>)
        };
        f.ok_or_else(missing)
    }

    /// Calls slot `index` with `args`, turning an error into [`XlaError::Pjrt`].
    ///
    /// # Safety
    /// `A` must be the argument struct of that slot, filled as the header requires.
    unsafe fn call<A>(&self, index: usize, name: &'static str, args: &mut A) -> Result<()> {
        let f = self.slot(index, name)?;
        // SAFETY: forwarded from the caller.
        let err = unsafe { f(args as *mut A as *mut c_void) };
        // SAFETY: `err` was returned by this plugin and is owned by us.
        unsafe { self.check(name, err) }
    }

    /// Converts an owned error (null for none) to a `Result`, destroying it.
    ///
    /// # Safety
    /// `err` must be null or an error of this plugin that nothing else will destroy.
    pub unsafe fn check(&self, call: &'static str, err: *mut sys::PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut m = sys::PJRT_Error_Message_Args {
            struct_size: sys::PJRT_Error_Message_Args_SIZE,
            extension_start: null_mut(),
            error: err,
            message: null(),
            message_size: 0,
        };
        let message = match self.raw.error_message {
            // SAFETY: `err` is a live error; the message lives as long as it.
            Some(f) => unsafe {
                f(&mut m);
                string(m.message, m.message_size)
            },
            None => "(the plugin has no PJRT_Error_Message)".into(),
        };
        let mut c = args!(PJRT_Error_GetCode_Args { error: err });
        let code = match self.slot(slot::ERROR_GET_CODE, "PJRT_Error_GetCode") {
            // SAFETY: the GetCode slot with its argument struct; a failure to read the
            // code returns another error, which is destroyed below too.
            Ok(f) => unsafe {
                let e2 = f(&mut c as *mut _ as *mut c_void);
                self.destroy_error(e2);
                if e2.is_null() { c.code } else { 2 }
            },
            Err(_) => 2,
        };
        // SAFETY: destroyed once, after its message was copied.
        unsafe { self.destroy_error(err) };
        Err(XlaError::Pjrt { call, code: ErrorCode(code), message })
    }

    /// Destroys an error (null is allowed).
    ///
    /// # Safety
    /// `err` must be null or an owned error of this plugin, not used afterwards.
    pub unsafe fn destroy_error(&self, err: *mut sys::PJRT_Error) {
        if err.is_null() {
            return;
        }
        if let Some(f) = self.raw.error_destroy {
            let mut a = sys::PJRT_Error_Destroy_Args {
                struct_size: sys::PJRT_Error_Destroy_Args_SIZE,
                extension_start: null_mut(),
                error: err,
            };
            // SAFETY: forwarded from the caller.
            unsafe { f(&mut a) };
        }
    }

    // ------------------------------------------------------------ plugin

    /// `PJRT_Plugin_Initialize`.
    pub fn plugin_initialize(&self) -> Result<()> {
        let mut a = args!(PJRT_Plugin_Initialize_Args {});
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::PLUGIN_INITIALIZE, "PJRT_Plugin_Initialize", &mut a) }
    }

    /// `PJRT_Plugin_Attributes`, copied out.
    pub fn plugin_attributes(&self) -> Result<Vec<(String, Value)>> {
        let mut a = args!(PJRT_Plugin_Attributes_Args {});
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::PLUGIN_ATTRIBUTES, "PJRT_Plugin_Attributes", &mut a)? };
        // SAFETY: the plugin returned `num_attributes` values living for the process.
        Ok(unsafe { named_values(a.attributes, a.num_attributes) })
    }

    // ------------------------------------------------------------ events

    /// `PJRT_Event_Destroy`.
    ///
    /// # Safety
    /// `event` must be an owned event, not used afterwards.
    pub unsafe fn event_destroy(&self, event: *mut sys::PJRT_Event) -> Result<()> {
        let mut a = args!(PJRT_Event_Args { event: event });
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::EVENT_DESTROY, "PJRT_Event_Destroy", &mut a) }
    }

    /// `PJRT_Event_IsReady`. Never blocks.
    ///
    /// # Safety
    /// `event` must be live.
    pub unsafe fn event_is_ready(&self, event: *mut sys::PJRT_Event) -> Result<bool> {
        let mut a = args!(PJRT_Event_IsReady_Args { event: event });
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::EVENT_IS_READY, "PJRT_Event_IsReady", &mut a)? };
        Ok(a.is_ready)
    }

    /// `PJRT_Event_Error`: the event's status, once it is ready.
    ///
    /// # Safety
    /// `event` must be live and ready.
    pub unsafe fn event_error(&self, event: *mut sys::PJRT_Event) -> Result<()> {
        let mut a = args!(PJRT_Event_Args { event: event });
        let f = self.slot(slot::EVENT_ERROR, "PJRT_Event_Error")?;
        // SAFETY: the slot's own argument struct; the returned error is the event's
        // status, owned by us.
        unsafe { self.check("PJRT_Event_Error", f(&mut a as *mut _ as *mut c_void)) }
    }

    /// `PJRT_Event_Await`: blocks the host. Callers count it with `stats::host_sync`.
    ///
    /// # Safety
    /// `event` must be live.
    pub unsafe fn event_await(&self, event: *mut sys::PJRT_Event) -> Result<()> {
        let mut a = args!(PJRT_Event_Args { event: event });
        // SAFETY: the slot's own argument struct; the returned error is the event's
        // status, owned by us.
        unsafe { self.call(slot::EVENT_AWAIT, "PJRT_Event_Await", &mut a) }
    }

    /// `PJRT_Event_OnReady`.
    ///
    /// # Safety
    /// `event` must be live; `callback` must accept `user_arg` exactly once, on any
    /// thread, and destroy the error it is given.
    pub unsafe fn event_on_ready(
        &self,
        event: *mut sys::PJRT_Event,
        callback: sys::PJRT_Event_OnReadyCallback,
        user_arg: *mut c_void,
    ) -> Result<()> {
        let mut a =
            args!(PJRT_Event_OnReady_Args { event: event, callback: Some(callback), user_arg: user_arg });
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::EVENT_ON_READY, "PJRT_Event_OnReady", &mut a) }
    }

    // ------------------------------------------------------------ client

    /// `PJRT_Client_Create`.
    pub fn client_create(&self, options: &[sys::PJRT_NamedValue]) -> Result<*mut sys::PJRT_Client> {
        let mut a =
            args!(PJRT_Client_Create_Args { create_options: options.as_ptr(), num_options: options.len() });
        // SAFETY: the slot's own argument struct; `options` outlives the call.
        unsafe { self.call(slot::CLIENT_CREATE, "PJRT_Client_Create", &mut a)? };
        Ok(a.client)
    }

    /// `PJRT_Client_Destroy`.
    ///
    /// # Safety
    /// `client` must be owned and not used afterwards.
    pub unsafe fn client_destroy(&self, client: *mut sys::PJRT_Client) -> Result<()> {
        let mut a = args!(PJRT_Client_Destroy_Args { client: client });
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::CLIENT_DESTROY, "PJRT_Client_Destroy", &mut a) }
    }

    /// `PJRT_Client_PlatformName` or `_PlatformVersion` (`version = true`).
    ///
    /// # Safety
    /// `client` must be live.
    pub unsafe fn client_platform(&self, client: *mut sys::PJRT_Client, version: bool) -> Result<String> {
        let mut a = args!(PJRT_Client_String_Args { client: client });
        let (index, name) = if version {
            (slot::CLIENT_PLATFORM_VERSION, "PJRT_Client_PlatformVersion")
        } else {
            (slot::CLIENT_PLATFORM_NAME, "PJRT_Client_PlatformName")
        };
        // SAFETY: the slot's own argument struct; the string lives as long as the client.
        unsafe {
            self.call(index, name, &mut a)?;
            Ok(string(a.value, a.value_size))
        }
    }

    /// `PJRT_Client_AddressableDevices`.
    ///
    /// # Safety
    /// `client` must be live.
    pub unsafe fn client_addressable_devices(
        &self,
        client: *mut sys::PJRT_Client,
    ) -> Result<Vec<*mut sys::PJRT_Device>> {
        let mut a = args!(PJRT_Client_Devices_Args { client: client });
        // SAFETY: the slot's own argument struct; the array lives as long as the client.
        unsafe {
            self.call(slot::CLIENT_ADDRESSABLE_DEVICES, "PJRT_Client_AddressableDevices", &mut a)?;
            if a.devices.is_null() {
                return Ok(Vec::new());
            }
            Ok(std::slice::from_raw_parts(a.devices, a.num_devices).to_vec())
        }
    }

    /// `PJRT_Client_Compile` with the `mlir` format.
    ///
    /// # Safety
    /// `client` must be live.
    pub unsafe fn client_compile(
        &self,
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
        // SAFETY: the slot's own argument struct; code, format and options outlive the
        // call, and the plugin only reads `code` during it.
        unsafe { self.call(slot::CLIENT_COMPILE, "PJRT_Client_Compile", &mut a)? };
        Ok(a.executable)
    }

    /// `PJRT_Client_BufferFromHostBuffer` (copy semantics: `data` may be freed once
    /// the returned event is ready). Returns the buffer and the done event.
    ///
    /// # Safety
    /// `client` and `device` must be live; `data` must hold the dense array described.
    pub unsafe fn client_buffer_from_host(
        &self,
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
        // SAFETY: the slot's own argument struct.
        unsafe {
            self.call(slot::CLIENT_BUFFER_FROM_HOST_BUFFER, "PJRT_Client_BufferFromHostBuffer", &mut a)?
        };
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
    pub unsafe fn client_create_view(
        &self,
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
        // SAFETY: the slot's own argument struct.
        unsafe {
            self.call(
                slot::CLIENT_CREATE_VIEW_OF_DEVICE_BUFFER,
                "PJRT_Client_CreateViewOfDeviceBuffer",
                &mut a,
            )?
        };
        Ok(a.buffer)
    }

    // ------------------------------------------------------------ devices

    /// The device's description: (id, kind, local hardware id).
    ///
    /// # Safety
    /// `device` must be live.
    pub unsafe fn device_info(&self, device: *mut sys::PJRT_Device) -> Result<(i32, String, i32)> {
        let mut d = args!(PJRT_Device_GetDescription_Args { device: device });
        // SAFETY: each call with its slot's own argument struct; the description and
        // its strings live as long as the device.
        unsafe {
            self.call(slot::DEVICE_GET_DESCRIPTION, "PJRT_Device_GetDescription", &mut d)?;
            let mut id = args!(PJRT_DeviceDescription_Id_Args { device_description: d.device_description });
            self.call(slot::DEVICE_DESCRIPTION_ID, "PJRT_DeviceDescription_Id", &mut id)?;
            let mut kind =
                args!(PJRT_DeviceDescription_String_Args { device_description: d.device_description });
            self.call(slot::DEVICE_DESCRIPTION_KIND, "PJRT_DeviceDescription_Kind", &mut kind)?;
            let mut hw = args!(PJRT_Device_LocalHardwareId_Args { device: device });
            self.call(slot::DEVICE_LOCAL_HARDWARE_ID, "PJRT_Device_LocalHardwareId", &mut hw)?;
            Ok((id.id, string(kind.value, kind.value_size), hw.local_hardware_id))
        }
    }

    // ------------------------------------------------------------ executables

    /// `PJRT_LoadedExecutable_Destroy`.
    ///
    /// # Safety
    /// `exe` must be owned and not used afterwards.
    pub unsafe fn loaded_executable_destroy(&self, exe: *mut sys::PJRT_LoadedExecutable) -> Result<()> {
        let mut a = args!(PJRT_LoadedExecutable_Destroy_Args { executable: exe });
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::LOADED_EXECUTABLE_DESTROY, "PJRT_LoadedExecutable_Destroy", &mut a) }
    }

    /// Runs `f` on the `PJRT_Executable` of a loaded executable, destroying it after.
    ///
    /// # Safety
    /// `exe` must be live.
    pub unsafe fn with_executable<R>(
        &self,
        exe: *mut sys::PJRT_LoadedExecutable,
        f: impl FnOnce(*mut sys::PJRT_Executable) -> Result<R>,
    ) -> Result<R> {
        let mut a = args!(PJRT_LoadedExecutable_GetExecutable_Args { loaded_executable: exe });
        // SAFETY: the slot's own argument struct; the returned executable is ours.
        unsafe {
            self.call(slot::LOADED_EXECUTABLE_GET_EXECUTABLE, "PJRT_LoadedExecutable_GetExecutable", &mut a)?
        };
        let r = f(a.executable);
        let mut d = args!(PJRT_Executable_Destroy_Args { executable: a.executable });
        // SAFETY: destroyed exactly once, here.
        let destroyed = unsafe { self.call(slot::EXECUTABLE_DESTROY, "PJRT_Executable_Destroy", &mut d) };
        let r = r?;
        destroyed?;
        Ok(r)
    }

    /// Output element types and dimensions of an executable.
    ///
    /// # Safety
    /// `exe` must be live.
    pub unsafe fn executable_outputs(
        &self,
        exe: *mut sys::PJRT_Executable,
    ) -> Result<Vec<(c_int, Vec<i64>)>> {
        // SAFETY: each call with its slot's own argument struct; the arrays live as
        // long as the executable.
        unsafe {
            let mut n = args!(PJRT_Executable_NumOutputs_Args { executable: exe });
            self.call(slot::EXECUTABLE_NUM_OUTPUTS, "PJRT_Executable_NumOutputs", &mut n)?;
            let mut t = args!(PJRT_Executable_OutputElementTypes_Args { executable: exe });
            self.call(slot::EXECUTABLE_OUTPUT_ELEMENT_TYPES, "PJRT_Executable_OutputElementTypes", &mut t)?;
            let mut d = args!(PJRT_Executable_OutputDimensions_Args { executable: exe });
            self.call(slot::EXECUTABLE_OUTPUT_DIMENSIONS, "PJRT_Executable_OutputDimensions", &mut d)?;
            let count = n.num_outputs;
            if t.num_output_types != count || d.num_outputs != count {
                return Err(XlaError::invalid(
                    "PJRT_Executable_OutputElementTypes.num_output_types",
                    t.num_output_types,
                    format!("the executable reports {count} outputs"),
                ));
            }
            let types = if count == 0 { &[][..] } else { std::slice::from_raw_parts(t.output_types, count) };
            let sizes = if count == 0 { &[][..] } else { std::slice::from_raw_parts(d.dim_sizes, count) };
            let total: usize = sizes.iter().sum();
            let dims = if total == 0 { &[][..] } else { std::slice::from_raw_parts(d.dims, total) };
            let mut out = Vec::with_capacity(count);
            let mut at = 0;
            for i in 0..count {
                out.push((types[i], dims[at..at + sizes[i]].to_vec()));
                at += sizes[i];
            }
            Ok(out)
        }
    }

    /// `PJRT_Executable_OptimizedProgram`: the serialized `HloModuleProto`.
    ///
    /// # Safety
    /// `exe` must be live.
    pub unsafe fn executable_optimized_program(&self, exe: *mut sys::PJRT_Executable) -> Result<Vec<u8>> {
        let mut program = args!(PJRT_Program {});
        let mut a = args!(PJRT_Executable_OptimizedProgram_Args { executable: exe, program: &mut program });
        // SAFETY: called twice as the header asks: first for the size, then into a
        // buffer of that size.
        unsafe {
            self.call(slot::EXECUTABLE_OPTIMIZED_PROGRAM, "PJRT_Executable_OptimizedProgram", &mut a)?;
            let mut code = vec![0u8; program.code_size];
            program.code = code.as_mut_ptr() as *mut _;
            a.program = &mut program;
            self.call(slot::EXECUTABLE_OPTIMIZED_PROGRAM, "PJRT_Executable_OptimizedProgram", &mut a)?;
            code.truncate(program.code_size);
            Ok(code)
        }
    }

    /// `PJRT_LoadedExecutable_Execute` on one device. Returns the outputs and the
    /// device-complete event.
    ///
    /// # Safety
    /// `exe`, the inputs and `device` (if not null) must be live; `num_outputs` must
    /// be the executable's output count.
    pub unsafe fn execute(
        &self,
        exe: *mut sys::PJRT_LoadedExecutable,
        inputs: &[*mut sys::PJRT_Buffer],
        num_outputs: usize,
        device: *mut sys::PJRT_Device,
        non_donatable: &[i64],
    ) -> Result<(Vec<*mut sys::PJRT_Buffer>, *mut sys::PJRT_Event)> {
        let mut options = args!(PJRT_ExecuteOptions {
            non_donatable_input_indices: non_donatable.as_ptr(),
            num_non_donatable_input_indices: non_donatable.len(),
        });
        let arg_list: *const *mut sys::PJRT_Buffer = inputs.as_ptr();
        let mut outputs: Vec<*mut sys::PJRT_Buffer> = vec![null_mut(); num_outputs];
        let out_list: *mut *mut sys::PJRT_Buffer = outputs.as_mut_ptr();
        let mut complete: *mut sys::PJRT_Event = null_mut();
        let mut a = args!(PJRT_LoadedExecutable_Execute_Args {
            executable: exe,
            options: &mut options,
            argument_lists: &arg_list,
            num_devices: 1,
            num_args: inputs.len(),
            output_lists: &out_list,
            device_complete_events: &mut complete,
            execute_device: device,
        });
        // SAFETY: the slot's own argument struct; all lists outlive the call.
        unsafe { self.call(slot::LOADED_EXECUTABLE_EXECUTE, "PJRT_LoadedExecutable_Execute", &mut a)? };
        Ok((outputs, complete))
    }

    // ------------------------------------------------------------ buffers

    /// `PJRT_Buffer_Destroy`.
    ///
    /// # Safety
    /// `buffer` must be owned and not used afterwards.
    pub unsafe fn buffer_destroy(&self, buffer: *mut sys::PJRT_Buffer) -> Result<()> {
        let mut a = args!(PJRT_Buffer_Args { buffer: buffer });
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::BUFFER_DESTROY, "PJRT_Buffer_Destroy", &mut a) }
    }

    /// `PJRT_Buffer_IncreaseExternalReferenceCount` (`increase`) or `Decrease...`.
    ///
    /// # Safety
    /// `buffer` must be live; a decrease must match an earlier increase.
    pub unsafe fn buffer_external_reference(
        &self,
        buffer: *mut sys::PJRT_Buffer,
        increase: bool,
    ) -> Result<()> {
        let mut a = args!(PJRT_Buffer_Args { buffer: buffer });
        let (index, name) = if increase {
            (slot::BUFFER_INCREASE_EXTERNAL_REFERENCE_COUNT, "PJRT_Buffer_IncreaseExternalReferenceCount")
        } else {
            (slot::BUFFER_DECREASE_EXTERNAL_REFERENCE_COUNT, "PJRT_Buffer_DecreaseExternalReferenceCount")
        };
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(index, name, &mut a) }
    }

    /// Element type and dimensions of a buffer.
    ///
    /// # Safety
    /// `buffer` must be live.
    pub unsafe fn buffer_shape(&self, buffer: *mut sys::PJRT_Buffer) -> Result<(c_int, Vec<i64>)> {
        // SAFETY: each call with its slot's own argument struct; dims live as long
        // as the buffer.
        unsafe {
            let mut t = args!(PJRT_Buffer_ElementType_Args { buffer: buffer });
            self.call(slot::BUFFER_ELEMENT_TYPE, "PJRT_Buffer_ElementType", &mut t)?;
            let mut d = args!(PJRT_Buffer_Dimensions_Args { buffer: buffer });
            self.call(slot::BUFFER_DIMENSIONS, "PJRT_Buffer_Dimensions", &mut d)?;
            let dims = if d.num_dims == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(d.dims, d.num_dims).to_vec()
            };
            Ok((t.type_, dims))
        }
    }

    /// A one-pointer query of a buffer: `PJRT_Buffer_Device`, `_ReadyEvent` or
    /// `_OpaqueDeviceMemoryDataPointer`, chosen by `index`.
    ///
    /// # Safety
    /// `buffer` must be live; `index` must be one of those three slots.
    pub unsafe fn buffer_ptr_out(
        &self,
        buffer: *mut sys::PJRT_Buffer,
        index: usize,
        name: &'static str,
    ) -> Result<*mut c_void> {
        let mut a = args!(PJRT_Buffer_PtrOut_Args { buffer: buffer });
        // SAFETY: these three slots share the argument shape.
        unsafe { self.call(index, name, &mut a)? };
        Ok(a.out)
    }

    /// `PJRT_Buffer_OnDeviceSizeInBytes`.
    ///
    /// # Safety
    /// `buffer` must be live.
    pub unsafe fn buffer_on_device_size(&self, buffer: *mut sys::PJRT_Buffer) -> Result<usize> {
        let mut a = args!(PJRT_Buffer_OnDeviceSizeInBytes_Args { buffer: buffer });
        // SAFETY: the slot's own argument struct.
        unsafe {
            self.call(slot::BUFFER_ON_DEVICE_SIZE_IN_BYTES, "PJRT_Buffer_OnDeviceSizeInBytes", &mut a)?
        };
        Ok(a.on_device_size_in_bytes)
    }

    /// `PJRT_Buffer_ToHostBuffer` into `dst`; returns the copy's event.
    ///
    /// # Safety
    /// `buffer` must be live; `dst` must stay valid until the event is ready.
    pub unsafe fn buffer_to_host(
        &self,
        buffer: *mut sys::PJRT_Buffer,
        dst: &mut [u8],
    ) -> Result<*mut sys::PJRT_Event> {
        let mut a = args!(PJRT_Buffer_ToHostBuffer_Args {
            src: buffer,
            dst: dst.as_mut_ptr() as *mut c_void,
            dst_size: dst.len()
        });
        // SAFETY: the slot's own argument struct.
        unsafe { self.call(slot::BUFFER_TO_HOST_BUFFER, "PJRT_Buffer_ToHostBuffer", &mut a)? };
        Ok(a.event)
    }

    // ------------------------------------------------------------ stream extension

    /// `get_stream_for_external_ready_events` of the stream extension.
    ///
    /// # Safety
    /// `ext` must be this plugin's stream extension; `device` must be live.
    pub unsafe fn stream_for_external_ready_events(
        &self,
        ext: &sys::PJRT_Stream_Extension,
        device: *mut sys::PJRT_Device,
    ) -> Result<isize> {
        let name = "PJRT_Get_Stream_For_External_Ready_Events";
        let f = ext
            .get_stream
            .ok_or(XlaError::MissingExtension { extension: "Stream.get_stream", needed_for: name })?;
        let mut a = args!(PJRT_Get_Stream_For_External_Ready_Events_Args { device: device });
        // SAFETY: the extension function with its own argument struct.
        unsafe { self.check(name, f(&mut a as *mut _ as *mut c_void))? };
        Ok(a.stream)
    }

    /// `wait_until_buffer_ready_on_stream` of the stream extension: enqueues a wait
    /// on `stream` for the buffer's definition event. Does not block the host.
    ///
    /// # Safety
    /// `ext` must be this plugin's stream extension; `buffer` must be live and
    /// `stream` a stream of its device.
    pub unsafe fn wait_until_buffer_ready_on_stream(
        &self,
        ext: &sys::PJRT_Stream_Extension,
        buffer: *mut sys::PJRT_Buffer,
        stream: isize,
    ) -> Result<()> {
        let name = "PJRT_Wait_Until_Buffer_Ready_On_Stream";
        let f = ext
            .wait_stream
            .ok_or(XlaError::MissingExtension { extension: "Stream.wait_stream", needed_for: name })?;
        let mut a = args!(PJRT_Wait_Until_Buffer_Ready_On_Stream_Args { stream: stream, buffer: buffer });
        // SAFETY: the extension function with its own argument struct.
        unsafe { self.check(name, f(&mut a as *mut _ as *mut c_void)) }
    }
}

/// Copies out `n` named values.
///
/// # Safety
/// `values` must point to `n` valid `PJRT_NamedValue`s (or `n` must be 0).
unsafe fn named_values(values: *const sys::PJRT_NamedValue, n: usize) -> Vec<(String, Value)> {
    if values.is_null() || n == 0 {
        return Vec::new();
    }
    // SAFETY: forwarded from the caller.
    let values = unsafe { std::slice::from_raw_parts(values, n) };
    values
        .iter()
        .map(|v| {
            // SAFETY: each value's union member is the one its type names.
            unsafe {
                let name = string(v.name, v.name_size);
                let value = match v.type_ {
                    sys::NAMED_VALUE_STRING => Value::String(string(v.value.string_value, v.value_size)),
                    sys::NAMED_VALUE_INT64 => Value::Int64(v.value.int64_value),
                    sys::NAMED_VALUE_INT64_LIST if !v.value.int64_array_value.is_null() => Value::Int64List(
                        std::slice::from_raw_parts(v.value.int64_array_value, v.value_size).to_vec(),
                    ),
                    sys::NAMED_VALUE_INT64_LIST => Value::Int64List(Vec::new()),
                    sys::NAMED_VALUE_FLOAT => Value::Float(v.value.float_value),
                    _ => Value::Bool(v.value.bool_value),
                };
                (name, value)
            }
        })
        .collect()
}

/// A named value to pass in, with storage that must outlive the call.
pub(crate) fn named_value(name: &'static str, value: &OptionValue) -> sys::PJRT_NamedValue {
    let (type_, v, size) = match value {
        OptionValue::Int64(i) => (sys::NAMED_VALUE_INT64, sys::PJRT_NamedValue_Value { int64_value: *i }, 1),
        OptionValue::Float(f) => (sys::NAMED_VALUE_FLOAT, sys::PJRT_NamedValue_Value { float_value: *f }, 1),
        OptionValue::Bool(b) => (sys::NAMED_VALUE_BOOL, sys::PJRT_NamedValue_Value { bool_value: *b }, 1),
        OptionValue::String(s) => (
            sys::NAMED_VALUE_STRING,
            sys::PJRT_NamedValue_Value { string_value: s.as_ptr() as *const _ },
            s.len(),
        ),
    };
    sys::PJRT_NamedValue {
        struct_size: sys::PJRT_NamedValue_SIZE,
        extension_start: null_mut(),
        name: name.as_ptr() as *const _,
        name_size: name.len(),
        type_,
        value: v,
        value_size: size,
    }
}

/// A client-creation option value.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// An integer.
    Int64(i64),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(String),
}
