//! # handoff-xla
//!
//! XLA for Rust programs through the PJRT C API that JAX uses, with buffers
//! exchanged zero-copy and stream-ordered with the rest of handoff.
//!
//! Three layers, as in cudarc:
//! - [`sys`]: own `repr(C)` bindings of PJRT C API **0.115** (no bindgen), loaded
//!   with `libloading`;
//! - [`result`]: thin wrappers turning a `PJRT_Error` into [`XlaError::Pjrt`] (its
//!   message and code), destroying the error;
//! - safe RAII types: [`Plugin`] (loaded once, never unloaded), [`Client`],
//!   [`Device`], [`Executable`], [`Buffer`], [`Event`], each destroyed exactly once.
//!
//! Exchange: [`Client::import`] views a [`handoff_runtime::Handoff`] as a PJRT buffer
//! and [`Buffer::export`] hands a PJRT buffer out as one (see [`exchange`]).
//!
//! ```no_run
//! use handoff_xla::{Client, Program};
//! let client = Client::from_env()?; // HANDOFF_PJRT_PLUGIN
//! let exe = client.compile(&Program::from_file("adapters/xla/programs/gelu_scale_f32_4x8.mlir")?)?;
//! let x = client.buffer_from_host(&client.device(0)?, &[0.5f32; 32], &[4, 8])?;
//! let y = exe.execute(&[&x])?;
//! println!("{:?}", y[0].to_vec::<f32>()?);
//! # Ok::<(), handoff_xla::XlaError>(())
//! ```
#![warn(missing_docs)]

mod artifact;
mod buffer;
mod client;
pub mod dtype;
mod error;
pub mod exchange;
mod executable;
pub mod hlo;
mod kernel;
mod plugin;
pub mod result;
pub mod sys;

pub use artifact::Artifact;
pub use buffer::{Buffer, Event, ViewWatch};
pub use client::{Client, ClientOptions, Device};
pub use error::{ErrorCode, Result, XlaError};
pub use exchange::{Borrowed, CPU_ALIGNMENT, ImportOptions};
pub use executable::{CompileOptions, Executable, Program};
pub use hlo::ArraySpec;
pub use kernel::{Args, AsIs, CallOptions, Imported, Inputs, Kernel, Output, Outputs, Source};
pub use plugin::{PLUGIN_ENV, Plugin};
pub use result::{OptionValue, Value};

fn probe() -> Vec<handoff_runtime::registry::Probe> {
    use handoff_runtime::registry::Probe;
    let line = |what: &str, found: Result<&'static Plugin>| match found {
        Ok(p) => {
            let (major, minor) = p.api_version();
            Probe::found(
                what,
                format!(
                    "{} (PJRT C API {major}.{minor}; extensions: {})",
                    p.path().display(),
                    p.extensions().join(", ")
                ),
            )
        }
        Err(e) => Probe::not_found(what, e.to_string()),
    };
    vec![
        line("PJRT plugins: $HANDOFF_PJRT_PLUGIN", Plugin::from_env()),
        line("PJRT plugins: JAX's CUDA plugin", Plugin::cuda()),
    ]
}

// Imports go into the client the caller names: `registry::convert_into(value, "torch",
// "xla", &client)`.
handoff_runtime::registry::submit! {
    handoff_runtime::registry::Adapter::new("xla", env!("CARGO_PKG_VERSION"))
        .about("PJRT buffers of XLA's CPU and CUDA plugins (imports into a handoff_xla::Client)")
        .devices(&[handoff_runtime::registry::DeviceKind::Host, handoff_runtime::registry::DeviceKind::Cuda])
        .dtypes(&dtype::DTYPES)
        .exports::<Buffer>()
        .imports_into::<Buffer, Client>()
        .probe(probe)
}
