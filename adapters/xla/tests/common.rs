//! Shared by the integration tests.
#![allow(dead_code)]

use handoff_xla::{Client, Plugin, Program};
use std::path::PathBuf;

/// The plugin the CPU tests use. `HANDOFF_PJRT_PLUGIN` must be set (the xtask sets
/// it): without it the tests fail with this message, unless
/// `HANDOFF_XLA_SKIP_CPU_TESTS=1` says to skip them (documented in the crate README).
pub fn plugin() -> Option<&'static Plugin> {
    if std::env::var_os("HANDOFF_PJRT_PLUGIN").is_none()
        && std::env::var_os("HANDOFF_XLA_SKIP_CPU_TESTS").is_some()
    {
        println!("SKIPPED: HANDOFF_PJRT_PLUGIN unset and HANDOFF_XLA_SKIP_CPU_TESTS set");
        return None;
    }
    match Plugin::from_env() {
        Ok(p) => Some(p),
        Err(e) => panic!("{e} (run `cargo xtask setup`, or set HANDOFF_XLA_SKIP_CPU_TESTS=1 to skip)"),
    }
}

pub fn client() -> Option<Client> {
    let p = plugin()?;
    Some(Client::new(p, &Default::default()).expect("client"))
}

pub fn program(name: &str) -> Program {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs").join(name);
    Program::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh())) as f32
}

pub fn gelu_scale(x: f32) -> f32 {
    gelu(x) * 1.1 + 0.5
}

pub fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

#[repr(C, align(64))]
pub struct Aligned<const N: usize>(pub [f32; N]);
