//! Shared by the integration tests.
#![allow(dead_code)]

use handoff_xla::{Client, Plugin, Program};

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

macro_rules! embedded {
    ($($file:literal),* $(,)?) => {
        /// The bytes of a program of `programs/`, embedded in the test binary so that
        /// it runs from any directory (the GPU bundle runs it on another machine).
        pub fn program_bytes(name: &str) -> &'static [u8] {
            match name {
                $($file => include_bytes!(concat!("../programs/", $file)),)*
                _ => panic!("{name} is not embedded in the tests: add it to tests/common.rs"),
            }
        }
    };
}

embedded!(
    "gelu_scale_f32_1024.mlir",
    "gelu_scale_f32_4x8.mlir",
    "gelu_scale_f32_4x8_cpu.mlirbc",
    "gelu_scale_f32_4x8_cuda.mlirbc",
    "layernorm_gelu_bf16_64x64.mlir",
    "layernorm_gelu_f32_64x64.mlir",
    "layernorm_gelu_f32_1024x1024.mlir",
    "matmul_f32_16x32x8.mlir",
    "row_sum_f32_8x16.mlir",
    "sum_and_max_f32_64.mlir",
);

/// An embedded program (see [`program_bytes`]), named after its file.
pub fn program(name: &str) -> Program {
    let bytes = program_bytes(name);
    let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
    let p = if name.ends_with(".mlirbc") {
        Program::bytecode(bytes.to_vec())
    } else {
        Program::text(std::str::from_utf8(bytes).expect("StableHLO text"))
    };
    p.named(stem)
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
