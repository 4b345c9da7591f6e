//! What the CPU tests of the examples share.

use handoff_xla::{Client, ClientOptions, Plugin};

/// The CPU client, or `None` (printed) when `HANDOFF_XLA_SKIP_CPU_TESTS=1` and no plugin is set.
pub fn cpu_client() -> Option<Client> {
    if std::env::var_os(handoff_xla::PLUGIN_ENV).is_none()
        && std::env::var_os("HANDOFF_XLA_SKIP_CPU_TESTS").is_some()
    {
        println!("SKIPPED: HANDOFF_PJRT_PLUGIN unset and HANDOFF_XLA_SKIP_CPU_TESTS set");
        return None;
    }
    let plugin = Plugin::from_env().unwrap_or_else(|e| panic!("{e} (run `cargo xtask setup`)"));
    if plugin.is_gpu() {
        println!("SKIPPED: HANDOFF_PJRT_PLUGIN is a GPU plugin; the CPU tests need the CPU one");
        return None;
    }
    Some(Client::new(plugin, &ClientOptions::default()).unwrap())
}
