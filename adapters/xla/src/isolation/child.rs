//! The child's side of the isolated check: the hook that runs before `main` when
//! [`CHILD_ENV`] is set, reads the bytes on standard input, compiles them with the
//! plugin it is told and exits with a status the parent reads ([`super`]'s docs).

use super::{CHILD_ENV, HANDSHAKE, NO_CLIENT, PLUGIN_VAR, REFUSED};
use crate::client::Client;
use crate::error::{Result, XlaError};
use crate::executable::CompileOptions;
use crate::kernel::Kernel;
use std::io::{Read, Write};
use std::path::PathBuf;

// The child's entry: in `.init_array`, so it runs before `main` in every program that
// links the isolated loader (kept there by `check`'s reference to it). Sound there: it
// runs after the C runtime and libc are set up (as every `.init_array` entry does) and
// returns at once unless `CHILD_ENV` is set; a child never returns to `main`.
#[used]
#[unsafe(link_section = ".init_array")]
pub(super) static CHILD_HOOK: extern "C" fn() = child_hook;

extern "C" fn child_hook() {
    let Some(device) = std::env::var_os(CHILD_ENV) else { return };
    let code = std::panic::catch_unwind(|| child_main(&device.to_string_lossy())).unwrap_or(101);
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}

/// Reads the bytes on standard input and compiles them (and an artifact's VJP) with the
/// plugin in [`PLUGIN_VAR`] for `device`: 0 when they compiled, [`REFUSED`] with the
/// plugin's error on standard error ([`NO_CLIENT`] when the plugin gave no client).
fn child_main(device: &str) -> i32 {
    println!("{HANDSHAKE}");
    let _ = std::io::stdout().flush();
    let fail = |code: i32, e: XlaError| {
        eprintln!("{e}");
        code
    };
    let client = (|| -> Result<(Client, usize, Vec<u8>)> {
        let device: usize =
            device.parse().map_err(|_| XlaError::invalid(CHILD_ENV, device, "not a device index"))?;
        let plugin = std::env::var_os(PLUGIN_VAR)
            .ok_or_else(|| XlaError::invalid(PLUGIN_VAR, "unset", "the plugin to load"))?;
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| XlaError::invalid("standard input", "unreadable", e.to_string()))?;
        let plugin = crate::plugin::Plugin::load(PathBuf::from(plugin))?;
        // A CUDA child takes GPU memory as it needs it, not most of the GPU at once.
        let options = if plugin.is_gpu() {
            crate::options::ClientOptions::default().preallocate(false)
        } else {
            crate::options::ClientOptions::default()
        };
        Ok((Client::new(plugin, &options)?, device, bytes))
    })();
    let (client, device, bytes) = match client {
        Ok(c) => c,
        Err(e) => return fail(NO_CLIENT, e),
    };
    let compiled = (|| -> Result<()> {
        let source = crate::kernel::Source::from_bytes(bytes, None)?;
        let kernel = Kernel::compile(&client, source, &CompileOptions { device: Some(device) })?;
        if kernel.has_vjp() {
            kernel.vjp()?;
        }
        Ok(())
    })();
    match compiled {
        Ok(()) => {
            println!("compiled");
            0
        }
        Err(e) => fail(REFUSED, e),
    }
}
