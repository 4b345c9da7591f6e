//! Clients and devices. The methods of [`Client`] whose work belongs to another
//! module (buffers, compilation, the exchange) are in that module's `impl Client`
//! block, as in cudarc: this module imports none of them.

use crate::error::{Result, XlaError};
use crate::options::{ClientOptions, named_value};
use crate::plugin::Plugin;
use crate::result::{self, Api};
use crate::sys;
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

    pub(crate) fn checked_index(&self, index: usize) -> Result<usize> {
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

    pub(crate) fn index_of_ordinal(&self, ordinal: u32) -> Result<usize> {
        self.inner.devices.iter().position(|d| d.hardware_id == ordinal as i32).ok_or_else(|| {
            XlaError::invalid(
                "device ordinal",
                ordinal,
                format!("the {} client has no such device", self.platform()),
            )
        })
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
