//! Where a tensor's memory lives, and its mapping to DLPack's `DLDevice`.

use crate::error::ValidationError;
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

    /// The device a DLPack descriptor names, or [`ValidationError::UnsupportedDevice`]
    /// for device types handoff does not exchange (OpenCL, Vulkan, ROCm, ...).
    pub fn from_dlpack(device: DLDevice) -> Result<Device, ValidationError> {
        let unsupported = || ValidationError::UnsupportedDevice {
            device_type: device.device_type.0,
            device_id: device.device_id,
        };
        let ordinal = u32::try_from(device.device_id).map_err(|_| unsupported());
        match device.device_type {
            DLDeviceType::CPU | DLDeviceType::CUDAHOST => Ok(Device::Host),
            DLDeviceType::CUDA => Ok(Device::Cuda(ordinal?)),
            DLDeviceType::EXTDEV => Ok(Device::Mock(ordinal?)),
            _ => Err(unsupported()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_unknown_devices() {
        for d in [Device::Host, Device::Cuda(0), Device::Cuda(7), Device::Mock(2)] {
            assert_eq!(Device::from_dlpack(d.to_dlpack()).unwrap(), d);
        }
        let vulkan = DLDevice { device_type: DLDeviceType::VULKAN, device_id: 0 };
        assert!(matches!(
            Device::from_dlpack(vulkan),
            Err(ValidationError::UnsupportedDevice { device_type: 7, device_id: 0 })
        ));
        let negative = DLDevice::cuda(-1);
        assert!(matches!(
            Device::from_dlpack(negative),
            Err(ValidationError::UnsupportedDevice { device_type: 2, device_id: -1 })
        ));
    }
}
