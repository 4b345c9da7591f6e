//! Clients and devices. Every method of [`Client`] is here; where the work belongs
//! to another module (buffers, compilation, the exchange), the method calls it there.

use crate::buffer::{self, Buffer};
use crate::error::{Result, XlaError};
use crate::exchange::{self, ViewOptions};
use crate::executable::{self, CompileOptions, Executable, Program};
use crate::options::{ClientOptions, named_value};
use crate::plugin::Plugin;
use crate::result::{self, Api};
use crate::sys;
use handoff_runtime::dtype::Element;
use handoff_runtime::{Handoff, Stream};
use std::sync::Arc;

pub(crate) struct ClientInner {
    pub(crate) plugin: &'static Plugin,
    pub(crate) raw: *mut sys::PJRT_Client,
    pub(crate) platform: String,
    pub(crate) platform_version: String,
    pub(crate) devices: Vec<DeviceInfo>,
    /// Each device's stream for external ready events, asked of PJRT once.
    pub(crate) ready_streams: Vec<std::sync::OnceLock<handoff_runtime::Stream>>,
}

// SAFETY: a PJRT client is thread-safe; the raw pointer is only passed to PJRT.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl ClientInner {
    pub(crate) fn api(&self) -> Api {
        self.plugin.api()
    }

    /// The ordinal of device `index` (`local_hardware_id`: the CUDA device number; on
    /// CPU the device index).
    pub(crate) fn ordinal(&self, index: usize) -> u32 {
        u32::try_from(self.devices[index].hardware_id).unwrap_or(index as u32)
    }

    /// The handoff device the memory of device `index` is on.
    pub(crate) fn handoff_device(&self, index: usize) -> handoff_runtime::Device {
        if self.plugin.is_gpu() {
            handoff_runtime::Device::Cuda(self.ordinal(index))
        } else {
            handoff_runtime::Device::Host
        }
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // SAFETY: the client is owned here, and every buffer and executable holds an
        // Arc to this, so none outlives it.
        if let Err(e) = unsafe { result::client::destroy(self.api(), self.raw) } {
            eprintln!("handoff-xla: destroying the PJRT client failed: {e}");
        }
    }
}

#[derive(Clone)]
pub(crate) struct DeviceInfo {
    pub(crate) raw: *mut sys::PJRT_Device,
    pub(crate) id: i32,
    pub(crate) kind: String,
    pub(crate) hardware_id: i32,
}

impl DeviceInfo {
    /// Reads a device's description: its id, kind and local hardware id.
    ///
    /// # Safety
    /// `raw` must be a live device of `api`'s plugin.
    unsafe fn read(api: Api, raw: *mut sys::PJRT_Device) -> Result<DeviceInfo> {
        // SAFETY: a live device; its description lives as long as it.
        unsafe {
            let description = result::device::get_description(api, raw)?;
            let id = result::device::description_id(api, description)?;
            let kind = result::device::description_kind(api, description)?;
            let hardware_id = result::device::local_hardware_id(api, raw)?;
            Ok(DeviceInfo { raw, id, kind, hardware_id })
        }
    }
}

/// A PJRT client: devices, compilation, buffers. Cheap to clone; buffers and
/// executables keep it alive.
///
/// ```no_run
/// use handoff_xla::{Client, ClientOptions, Plugin};
/// let client = Client::new(Plugin::from_env()?, &ClientOptions::default())?;
/// println!("{} with {} devices", client.platform(), client.devices().len());
/// # Ok::<(), handoff_xla::XlaError>(())
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Client({}, {} devices)", self.inner.platform, self.inner.devices.len())
    }
}

impl Client {
    /// Creates a client of `plugin`.
    pub fn new(plugin: &'static Plugin, options: &ClientOptions) -> Result<Client> {
        let resolved = options.resolve(plugin.is_gpu())?;
        let named: Vec<sys::PJRT_NamedValue> = resolved.iter().map(|(n, v)| named_value(n, v)).collect();
        let api = plugin.api();
        let raw = result::client::create(api, &named)?;
        let build = || -> Result<(String, String, Vec<DeviceInfo>)> {
            // SAFETY: `raw` is the live client just created.
            unsafe {
                let platform = result::client::platform_name(api, raw)?;
                let version = result::client::platform_version(api, raw)?;
                let mut devices = Vec::new();
                for d in result::client::addressable_devices(api, raw)? {
                    devices.push(DeviceInfo::read(api, d)?);
                }
                Ok((platform, version, devices))
            }
        };
        match build() {
            Ok((platform, platform_version, devices)) => {
                let ready_streams = devices.iter().map(|_| std::sync::OnceLock::new()).collect();
                Ok(Client {
                    inner: Arc::new(ClientInner {
                        plugin,
                        raw,
                        platform,
                        platform_version,
                        devices,
                        ready_streams,
                    }),
                })
            }
            Err(e) => {
                // SAFETY: owned, destroyed once on this error path.
                let _ = unsafe { result::client::destroy(api, raw) };
                Err(e)
            }
        }
    }

    /// A client of the plugin in `HANDOFF_PJRT_PLUGIN`, with default options.
    pub fn from_env() -> Result<Client> {
        Client::new(Plugin::from_env()?, &ClientOptions::default())
    }

    /// The plugin.
    pub fn plugin(&self) -> &'static Plugin {
        self.inner.plugin
    }

    /// The platform name (`cpu`, `cuda`).
    pub fn platform(&self) -> &str {
        &self.inner.platform
    }

    /// The platform version string.
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// Whether the devices are GPUs (the plugin has the stream extension).
    pub fn is_gpu(&self) -> bool {
        self.inner.plugin.is_gpu()
    }

    /// The addressable devices, in PJRT's order.
    pub fn devices(&self) -> Vec<XlaDevice> {
        (0..self.inner.devices.len()).map(|i| XlaDevice { client: self.inner.clone(), index: i }).collect()
    }

    /// The addressable device at `index`.
    pub fn device(&self, index: usize) -> Result<XlaDevice> {
        Ok(XlaDevice { client: self.inner.clone(), index: self.checked_index(index)? })
    }

    fn checked_index(&self, index: usize) -> Result<usize> {
        if index >= self.inner.devices.len() {
            return Err(XlaError::invalid(
                "device index",
                index,
                format!("the client has {} addressable devices", self.inner.devices.len()),
            ));
        }
        Ok(index)
    }

    /// The device with this ordinal (CUDA device number; CPU device index).
    pub fn device_by_ordinal(&self, ordinal: u32) -> Result<XlaDevice> {
        Ok(XlaDevice { client: self.inner.clone(), index: self.index_of_ordinal(ordinal)? })
    }

    fn index_of_ordinal(&self, ordinal: u32) -> Result<usize> {
        self.inner.devices.iter().position(|d| d.hardware_id == ordinal as i32).ok_or_else(|| {
            XlaError::invalid(
                "device ordinal",
                ordinal,
                format!("the {} client has no such device", self.platform()),
            )
        })
    }

    /// The index of the device a hand-off of `memory` is viewed on: `index` when
    /// given, else the device `memory` names (device 0 for host memory).
    pub(crate) fn device_index_for(
        &self,
        memory: handoff_runtime::Device,
        index: Option<usize>,
    ) -> Result<usize> {
        let i = match (memory, index) {
            (_, Some(i)) => self.checked_index(i)?,
            (handoff_runtime::Device::Host, None) => self.checked_index(0)?,
            (handoff_runtime::Device::Cuda(n), None) => self.index_of_ordinal(n)?,
            (other, None) => {
                return Err(XlaError::invalid(
                    "hand-off device",
                    other,
                    "XLA takes host and CUDA memory only",
                ));
            }
        };
        let want = self.inner.handoff_device(i);
        if memory != want {
            return Err(XlaError::from(handoff_runtime::Error::CrossDevice { from: memory, to: want }));
        }
        Ok(i)
    }

    /// Copies a host array to a new buffer on `device` (waits for the copy to be
    /// done with `data`: a counted host sync).
    pub fn buffer_from_host<T: Element + Copy>(
        &self,
        device: &XlaDevice,
        data: &[T],
        shape: &[i64],
    ) -> Result<Buffer> {
        buffer::from_host(self, device, data, shape)
    }

    /// Compiles a program with default options.
    ///
    /// ```no_run
    /// use handoff_xla::{Client, Program};
    /// let client = Client::from_env()?;
    /// let exe = client.compile(&Program::from_file("adapters/xla/programs/row_sum_f32_8x16.mlir")?)?;
    /// let x = client.buffer_from_host(&client.device(0)?, &[1.0f32; 128], &[8, 16])?;
    /// let sums = exe.execute(&[&x])?[0].to_vec::<f32>()?;
    /// assert_eq!(sums, [16.0; 8]);
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn compile(&self, program: &Program) -> Result<Executable> {
        self.compile_with(program, &CompileOptions::default())
    }

    /// Compiles a program.
    pub fn compile_with(&self, program: &Program, options: &CompileOptions) -> Result<Executable> {
        executable::compile(self, program, options)
    }

    /// The stream a producer must make its data ready on before XLA reads it on
    /// `device` (CUDA: the stream extension's `get_stream_for_external_ready_events`,
    /// asked of PJRT once per device). Export a value to this stream to hand it to
    /// [`Client::import`] with no extra wait. On CPU it is the host stream.
    pub fn ready_stream(&self, device: &XlaDevice) -> Result<Stream> {
        exchange::ready_stream(self, device)
    }

    /// Imports a hand-off as a zero-copy PJRT buffer (see [`exchange`]).
    ///
    /// ```no_run
    /// use handoff_xla::Client;
    /// use handoff_runtime::{Device, Handoff, Ready, Release, Stream, TensorDesc, dtype::DataType};
    /// #[repr(align(64))]
    /// struct Block([f32; 16]);
    /// let client = Client::from_env()?;
    /// let block = Box::new(Block([1.0; 16]));
    /// let h = Handoff::with_keep_alive(block, |b| {
    ///     Ok(TensorDesc::new(b.0.as_ptr() as *mut _, Device::Host, DataType::F32, &[16][..]))
    /// }, &Stream::host(), Ready::Elided, Release::AfterConsumer)?;
    /// let x = client.import(h)?; // a view: no copy
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn import(&self, handoff: Handoff) -> Result<Buffer> {
        self.import_with(handoff, ViewOptions::default())
    }

    /// Imports a hand-off, with options (counted in `stats` as an import).
    pub fn import_with(&self, handoff: Handoff, options: ViewOptions) -> Result<Buffer> {
        exchange::import(self, handoff, options)
    }
}

/// An addressable device of a client.
#[derive(Clone)]
pub struct XlaDevice {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) index: usize,
}

impl XlaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.client.devices[self.index]
    }

    pub(crate) fn raw(&self) -> *mut sys::PJRT_Device {
        self.info().raw
    }

    /// PJRT's global device id.
    pub fn id(&self) -> i32 {
        self.info().id
    }

    /// The device ordinal (`local_hardware_id`: the CUDA device number; on CPU the
    /// device index).
    pub fn ordinal(&self) -> u32 {
        self.client.ordinal(self.index)
    }

    /// The device kind (`cpu`, `NVIDIA H200`).
    pub fn kind(&self) -> &str {
        &self.info().kind
    }

    /// The handoff device its memory is on.
    pub fn handoff_device(&self) -> handoff_runtime::Device {
        self.client.handoff_device(self.index)
    }

    /// A handle to the client.
    pub fn client(&self) -> Client {
        Client { inner: self.client.clone() }
    }
}

impl PartialEq for XlaDevice {
    fn eq(&self, other: &XlaDevice) -> bool {
        Arc::ptr_eq(&self.client, &other.client) && self.index == other.index
    }
}

impl std::fmt::Debug for XlaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "XlaDevice({} {}, id {}, ordinal {})",
            self.client.platform,
            self.kind(),
            self.id(),
            self.ordinal()
        )
    }
}
