//! Where a tensor's memory lives, and its mapping to DLPack's `DLDevice` (the way back,
//! [`Device::from_dlpack`], is validation's: `validate.rs`).

use dlpark::ffi::{DLDevice, DLDeviceType};
use std::fmt;

/// A device that holds tensor memory.
///
/// ```
/// use handoff_runtime::Device;
/// let d = Device::Cuda(1);
/// assert_eq!(Device::from_dlpack(d.to_dlpack()).unwrap(), d);
/// assert_eq!(d.to_string(), "cuda:1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// Host memory (DLPack `kDLCPU`; pinned `kDLCUDAHost` memory also imports as host).
    Host,
    /// A CUDA device by ordinal (DLPack `kDLCUDA`).
    Cuda(u32),
    /// A simulated device of [`crate::mock`] by ordinal (DLPack `kDLExtDev`):
    /// its memory is host memory that only simulated kernels may touch.
    Mock(u32),
}

impl Device {
    /// The DLPack descriptor of this device.
    pub const fn to_dlpack(self) -> DLDevice {
        match self {
            Device::Host => DLDevice::CPU,
            Device::Cuda(i) => DLDevice::cuda(i as i32),
            Device::Mock(i) => DLDevice { device_type: DLDeviceType::EXTDEV, device_id: i as i32 },
        }
    }

    /// Whether the host may read this memory directly.
    pub const fn is_host(self) -> bool {
        matches!(self, Device::Host)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Host => f.write_str("host"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Mock(i) => write!(f, "mock:{i}"),
        }
    }
}
