//! Clients and devices.

use crate::error::{Result, XlaError};
use crate::plugin::Plugin;
use crate::result::{Api, OptionValue, named_value};
use crate::sys;
use std::sync::Arc;

/// Options for [`Client::new`]. On GPU plugins `preallocate` defaults to `false`, so
/// that XLA shares the GPU with PyTorch instead of taking most of its memory.
///
/// ```
/// let opts = handoff_xla::ClientOptions::default().memory_fraction(0.25);
/// assert_eq!(opts.memory_fraction, Some(0.25));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientOptions {
    /// `preallocate` (GPU). `None`: `false` on GPU plugins, unset on others.
    pub preallocate: Option<bool>,
    /// `memory_fraction` (GPU): the share of device memory XLA's allocator may use.
    pub memory_fraction: Option<f32>,
    /// Further platform-specific options, passed as they are.
    pub extra: Vec<(&'static str, OptionValue)>,
}

impl ClientOptions {
    /// Sets `preallocate`.
    pub fn preallocate(mut self, on: bool) -> Self {
        self.preallocate = Some(on);
        self
    }

    /// Sets `memory_fraction`.
    pub fn memory_fraction(mut self, fraction: f32) -> Self {
        self.memory_fraction = Some(fraction);
        self
    }

    /// Adds a platform-specific option.
    pub fn option(mut self, name: &'static str, value: OptionValue) -> Self {
        self.extra.push((name, value));
        self
    }

    fn resolve(&self, gpu: bool) -> Result<Vec<(&'static str, OptionValue)>> {
        let mut out = Vec::new();
        match (self.preallocate, gpu) {
            (Some(p), _) => out.push(("preallocate", OptionValue::Bool(p))),
            (None, true) => out.push(("preallocate", OptionValue::Bool(false))),
            (None, false) => {}
        }
        if let Some(f) = self.memory_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(XlaError::invalid("ClientOptions.memory_fraction", f, "it must be in (0, 1]"));
            }
            out.push(("memory_fraction", OptionValue::Float(f)));
        }
        out.extend(self.extra.iter().cloned());
        Ok(out)
    }
}

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
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // SAFETY: the client is owned here, and every buffer and executable holds an
        // Arc to this, so none outlives it.
        if let Err(e) = unsafe { self.api().client_destroy(self.raw) } {
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
        let raw = api.client_create(&named)?;
        let build = || -> Result<(String, String, Vec<DeviceInfo>)> {
            // SAFETY: `raw` is the live client just created.
            unsafe {
                let platform = api.client_platform(raw, false)?;
                let version = api.client_platform(raw, true)?;
                let mut devices = Vec::new();
                for d in api.client_addressable_devices(raw)? {
                    let (id, kind, hardware_id) = api.device_info(d)?;
                    devices.push(DeviceInfo { raw: d, id, kind, hardware_id });
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
                let _ = unsafe { api.client_destroy(raw) };
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
    pub fn devices(&self) -> Vec<Device> {
        (0..self.inner.devices.len()).map(|i| Device { client: self.inner.clone(), index: i }).collect()
    }

    /// The addressable device at `index`.
    pub fn device(&self, index: usize) -> Result<Device> {
        if index >= self.inner.devices.len() {
            return Err(XlaError::invalid(
                "device index",
                index,
                format!("the client has {} addressable devices", self.inner.devices.len()),
            ));
        }
        Ok(Device { client: self.inner.clone(), index })
    }

    /// The device with this ordinal (CUDA device number; CPU device index).
    pub fn device_by_ordinal(&self, ordinal: u32) -> Result<Device> {
        let i = self.inner.devices.iter().position(|d| d.hardware_id == ordinal as i32).ok_or_else(|| {
            XlaError::invalid(
                "device ordinal",
                ordinal,
                format!("the {} client has no such device", self.platform()),
            )
        })?;
        Ok(Device { client: self.inner.clone(), index: i })
    }
}

/// An addressable device of a client.
#[derive(Clone)]
pub struct Device {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) index: usize,
}

impl Device {
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
        u32::try_from(self.info().hardware_id).unwrap_or(self.index as u32)
    }

    /// The device kind (`cpu`, `NVIDIA H200`).
    pub fn kind(&self) -> &str {
        &self.info().kind
    }

    /// The handoff device its memory is on.
    pub fn handoff_device(&self) -> handoff_runtime::Device {
        if self.client.plugin.is_gpu() {
            handoff_runtime::Device::Cuda(self.ordinal())
        } else {
            handoff_runtime::Device::Host
        }
    }

    /// A handle to the client.
    pub fn client(&self) -> Client {
        Client { inner: self.client.clone() }
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.client, &other.client) && self.index == other.index
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Device({} {}, id {}, ordinal {})",
            self.client.platform,
            self.kind(),
            self.id(),
            self.ordinal()
        )
    }
}
