//! # handoff-xla
//!
//! XLA for Rust programs through the PJRT C API that JAX uses, with buffers
//! exchanged zero-copy and stream-ordered with the rest of handoff.
//!
//! The common path is one call: a [`Kernel`] (StableHLO, or a `jax.export`
//! [`Artifact`]) called on any exportable values — PyTorch tensors, CUDA buffers, XLA
//! buffers, your own types — returning the type asked for, with no stream written:
//!
//! ```no_run
//! use handoff_xla::{Buffer, Client, Kernel};
//! let client = Client::from_env()?; // HANDOFF_PJRT_PLUGIN
//! let kernel = Kernel::load(&client, "adapters/xla/programs/ln_gelu_f32_8x16_cpu.jaxexport")?;
//! let x = client.buffer_from_host(&client.device(0)?, &[0.5f32; 128], &[8, 16])?;
//! let y: Buffer = kernel.call1(&x)?; // with handoff-torch: `let y: tch::Tensor = kernel.call1(&t)?`
//! println!("{:?}", y.to_vec::<f32>()?);
//! # Ok::<(), handoff_xla::XlaError>(())
//! ```
//!
//! Underneath, three layers, as in cudarc (the first two private):
//! - `sys`: own `repr(C)` bindings of PJRT C API **0.115** (no bindgen), loaded
//!   with `libloading`; each argument struct declares its size, its function's slot
//!   in the `PJRT_Api` table and its C name, so a call can only pass a function its
//!   own struct;
//! - `result`: thin wrappers, one PJRT call each, turning a `PJRT_Error` into
//!   [`XlaError::Pjrt`] (its message and code), destroying the error;
//! - safe RAII types: [`Plugin`] (loaded once, never unloaded), [`Client`] (each
//!   method in the module that does its work), [`XlaDevice`], [`Executable`],
//!   [`Buffer`], [`PjrtEvent`], each destroyed exactly once; [`ClientOptions`] and
//!   the named values in `options`.
//!
//! Exchange: [`Buffer`] is `StreamOrdered` and `Export` like every adapter's type, and
//! imports into a [`Client`] (`ImportInto<Client>`: `handoff::transfer_into(value,
//! &client)`, or [`Client::import`] for a [`handoff_runtime::Handoff`]); see [`exchange`].
#![warn(missing_docs)]

mod artifact;
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bare_calls;
mod buffer;
#[cfg(feature = "cuda")]
mod capture;
pub mod capture_clients;
mod client;
pub mod dtype;
mod error;
pub mod exchange;
mod executable;
mod few;
pub mod hlo;
pub mod isolation;
mod kernel;
mod options;
mod plugin;
mod result;
mod sys;

pub use artifact::Artifact;
pub use buffer::{Buffer, OutputBuffer, PjrtEvent, ViewWatch};
pub use client::{Client, XlaDevice};
pub use error::{ErrorCode, Result, XlaError};
pub use exchange::{Borrowed, CPU_ALIGNMENT, GPU_ALIGNMENT, ViewOptions};
pub use executable::{CompileOptions, Executable, Program};
pub use hlo::ArraySpec;
pub use isolation::{Isolation, LoadOptions};
pub use kernel::{Args, AsIs, CallOptions, Imported, Inputs, Kernel, Output, OutputBuffers, Outputs, Source};
pub use options::{ClientOptions, OptionValue, Value};
pub use plugin::{PLUGIN_ENV, Plugin};

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
