//! Gradients of `jax.export` artifacts on the CPU plugin: the VJP JAX serializes with
//! `Exported.serialize(vjp_order=1)`, read by `Artifact::vjp` and called through
//! `Kernel::vjp`, against JAX's own values (`jax.vjp`, written by
//! `programs/export.py` to `programs/vjp_reference.rs`); integer inputs and outputs
//! (JAX's `float0` cotangents); a VJP whose module reads only the cotangent; the
//! refusal of kernels without a VJP; the VJP's inputs checked like any call.

mod common;

use common::*;
use handoff_xla::{Artifact, Buffer, Client, CompileOptions, Kernel, XlaError};
use std::path::PathBuf;

/// JAX's inputs and values (generated).
mod jax {
    include!("../programs/vjp_reference.rs");
}

/// The tolerance against JAX's values: `|a - b| <= TOL * (1 + |b|)` (`common::close`).
/// Both are XLA CPU in f32; they differ by reassociation only (seen: below 1e-6).
const TOL: f32 = 1e-5;

const BLOCK_CPU: &str = "block_f32_8x16_cpu_vjp.jaxexport";
const BLOCK_CPU_CUDA: &str = "block_f32_8x16_cpu_cuda_vjp.jaxexport";
const INT_SCALE: &str = "int_scale_cpu_vjp.jaxexport";
const LINEAR: &str = "linear_f32_cpu_vjp.jaxexport";

fn programs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs")
}

fn artifact(name: &str) -> Artifact {
    Artifact::from_bytes(&std::fs::read(programs().join(name)).unwrap())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn load(c: &Client, name: &str) -> Kernel {
    Kernel::load(c, programs().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn f32s(shape: &[i64]) -> handoff_xla::ArraySpec {
    handoff_xla::ArraySpec { dtype: Some(handoff_runtime::dtype::DataType::F32), shape: shape.to_vec() }
}

#[test]
fn artifact_reads_jax_vjp_calling_convention() {
    for (name, platforms) in [(BLOCK_CPU, &["cpu"][..]), (BLOCK_CPU_CUDA, &["cpu", "cuda"][..])] {
        let a = artifact(name);
        assert!(a.has_vjp());
        let vjp = a.vjp().unwrap();
        // Exported for the primal's platforms: several of them add a platform index.
        assert_eq!(vjp.platforms(), platforms);
        assert_eq!(vjp.takes_platform_index(), platforms.len() > 1);
        // The primal inputs, then the cotangent of each output.
        assert_eq!(vjp.inputs(), [f32s(&[8, 16]), f32s(&[16, 16]), f32s(&[8, 16])]);
        // The cotangent of each input.
        assert_eq!(vjp.outputs(), [f32s(&[8, 16]), f32s(&[16, 16])]);
        assert_eq!(vjp.kept_inputs(), [0, 1, 2]);
        assert!(vjp.module().starts_with(b"ML\xefR"));
        // vjp_order=1: the VJP has none of its own.
        assert!(!vjp.has_vjp());
        assert!(matches!(vjp.vjp(), Err(XlaError::NoVjp { .. })));
    }
    // An integer input and an integer output: float0 cotangents.
    let a = artifact(INT_SCALE);
    let vjp = a.vjp().unwrap();
    let bools = |shape: &[i64]| handoff_xla::ArraySpec {
        dtype: Some(handoff_runtime::dtype::DataType::BOOL),
        shape: shape.to_vec(),
    };
    let i32s = handoff_xla::ArraySpec { dtype: Some(handoff_runtime::dtype::DataType::I32), shape: vec![4] };
    assert_eq!(vjp.inputs(), [f32s(&[4]), i32s.clone(), f32s(&[4]), bools(&[4])]);
    assert_eq!((vjp.float0_inputs(), vjp.float0_outputs()), (&[3][..], &[1][..]));
    // The cotangent of `n + 1` is float0: the module drops it.
    assert_eq!(vjp.kept_inputs(), [0, 1, 2]);
    assert_eq!(vjp.outputs(), [f32s(&[4]), bools(&[4])]);
    assert!(a.float0_inputs().is_empty() && a.float0_outputs().is_empty());
}

#[test]
fn artifact_without_vjp_is_refused_by_name() {
    let a = artifact("ln_gelu_f32_8x16_cpu.jaxexport");
    assert!(!a.has_vjp());
    let e = a.vjp().unwrap_err();
    let msg = e.to_string();
    assert!(matches!(&e, XlaError::NoVjp { program, .. } if program == "ln_gelu"), "{e:?}");
    assert!(msg.starts_with("ln_gelu has no VJP: ") && msg.contains("vjp_order=1"), "{msg}");
}

#[test]
fn every_truncation_of_a_vjp_artifact_is_invalid() {
    // The nested VJP is verified with the rest: no truncation reads as something else.
    let bytes = std::fs::read(programs().join(INT_SCALE)).unwrap();
    let whole = Artifact::from_bytes(&bytes).unwrap();
    let padding = bytes.iter().rev().take_while(|&&b| b == 0).count().saturating_sub(1);
    for n in 0..bytes.len() {
        match Artifact::from_bytes(&bytes[..n]) {
            Err(XlaError::Invalid { .. }) if n < bytes.len() - padding => {}
            Ok(a) if n >= bytes.len() - padding => assert_eq!(a, whole),
            other => panic!("truncated to {n} of {} bytes: {other:?}", bytes.len()),
        }
    }
}

#[test]
fn vjp_kernel_matches_jax_gradients() {
    let Some(c) = client() else { return };
    let d = c.device(0).unwrap();
    let x = c.buffer_from_host(&d, &jax::BLOCK_X, &[8, 16]).unwrap();
    let w = c.buffer_from_host(&d, &jax::BLOCK_W, &[16, 16]).unwrap();
    let ct = c.buffer_from_host(&d, &jax::BLOCK_CT, &[8, 16]).unwrap();
    for name in [BLOCK_CPU, BLOCK_CPU_CUDA] {
        let k = load(&c, name);
        let [y]: [Buffer; 1] = k.call([&x, &w]).unwrap();
        close(&y.to_vec::<f32>().unwrap(), &jax::BLOCK_Y, TOL);
        let vjp = k.vjp().unwrap();
        assert_eq!(vjp.name(), "vjp(block)");
        // The caller passes primals and cotangent only: the platform index is the kernel's.
        assert_eq!(vjp.parameters().unwrap().len(), 3);
        let [dx, dw]: [Buffer; 2] = vjp.call([&x, &w, &ct]).unwrap();
        let (dx, dw) = (dx.to_vec::<f32>().unwrap(), dw.to_vec::<f32>().unwrap());
        close(&dx, &jax::BLOCK_DX, TOL);
        close(&dw, &jax::BLOCK_DW, TOL);
        let max = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        println!(
            "{name}: max |dx - jax| {:e}, max |dw - jax| {:e}",
            max(&dx, &jax::BLOCK_DX),
            max(&dw, &jax::BLOCK_DW)
        );
        // Compiled once, then kept.
        assert!(std::ptr::eq(vjp, k.vjp().unwrap()));
    }
}

#[test]
fn vjp_of_integer_inputs_and_outputs() {
    let Some(c) = client() else { return };
    let d = c.device(0).unwrap();
    let k = load(&c, INT_SCALE);
    let x = c.buffer_from_host(&d, &jax::INT_SCALE_X, &[4]).unwrap();
    let n = c.buffer_from_host(&d, &jax::INT_SCALE_N, &[4]).unwrap();
    let (y, n1): (Buffer, Buffer) = k.call([&x, &n]).unwrap();
    close(&y.to_vec::<f32>().unwrap(), &jax::INT_SCALE_Y, TOL);
    assert_eq!(n1.to_vec::<i32>().unwrap(), jax::INT_SCALE_N.map(|v| v + 1));
    // No cotangent for the integer output `n + 1`: x, n and the cotangent of y.
    let vjp = k.vjp().unwrap();
    assert_eq!(vjp.parameters().unwrap().len(), 3);
    let ct = c.buffer_from_host(&d, &jax::INT_SCALE_CT, &[4]).unwrap();
    let (dx, dn): (Buffer, Buffer) = vjp.call((&x, &n, &ct)).unwrap();
    close(&dx.to_vec::<f32>().unwrap(), &jax::INT_SCALE_DX, TOL);
    // n's cotangent is float0: a bool array of false.
    assert_eq!((dn.dtype(), dn.shape()), (handoff_runtime::dtype::DataType::BOOL, &[4][..]));
    assert_eq!(dn.to_host_bytes().unwrap(), [0u8; 4]);
}

#[test]
fn kernels_without_vjp_are_refused_with_the_reason() {
    let Some(c) = client() else { return };
    let k = load(&c, "ln_gelu_f32_8x16_cpu.jaxexport");
    let e = k.vjp().unwrap_err();
    assert!(matches!(&e, XlaError::NoVjp { program, .. } if program == "ln_gelu"), "{e:?}");
    assert!(e.to_string().contains("serialized without one") && e.to_string().contains("vjp_order=1"), "{e}");
    let k = load(&c, "gelu_scale_f32_4x8.mlir");
    let e = k.vjp().unwrap_err();
    assert!(matches!(e, XlaError::NoVjp { .. }), "{e:?}");
    assert!(e.to_string().contains("StableHLO") && e.to_string().contains("jax.export"), "{e}");
}

#[test]
fn vjp_inputs_are_checked_before_it_runs() {
    let Some(c) = client() else { return };
    let d = c.device(0).unwrap();
    let k = load(&c, BLOCK_CPU_CUDA);
    let vjp = k.vjp().unwrap();
    let x = c.buffer_from_host(&d, &jax::BLOCK_X, &[8, 16]).unwrap();
    let w = c.buffer_from_host(&d, &jax::BLOCK_W, &[16, 16]).unwrap();
    // A cotangent of the wrong shape: input 2 (the cotangent of output 0), named with both shapes.
    let short = c.buffer_from_host(&d, &jax::BLOCK_CT[..64], &[4, 16]).unwrap();
    let e = vjp.call::<_, _, [Buffer; 2], _>([&x, &w, &short]).unwrap_err();
    match &e {
        XlaError::InputMismatch { program, index, what, expected, got } => {
            assert_eq!((program.as_str(), *index, *what), ("vjp(block)", 2, "shape"));
            assert_eq!((expected.as_str(), got.as_str()), ("f32[8, 16]", "f32[4, 16]"));
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().starts_with("input 2 of vjp(block): shape is f32[4, 16]"), "{e}");
    // A primal of the wrong dtype.
    let ints = c.buffer_from_host(&d, &[0i32; 256], &[16, 16]).unwrap();
    let e = vjp.call::<_, _, [Buffer; 2], _>([&x, &ints, &x]).unwrap_err();
    assert!(matches!(e, XlaError::InputMismatch { index: 1, what: "dtype", .. }), "{e}");
    // The cotangent forgotten, or outputs asked for as in the forward.
    let e = vjp.call::<_, _, [Buffer; 2], _>([&x, &w]).unwrap_err();
    assert!(matches!(e, XlaError::Arity { what: "inputs", expected: 3, got: 2, .. }), "{e}");
    let e = vjp.call::<_, _, [Buffer; 1], _>([&x, &w, &x]).unwrap_err();
    assert!(matches!(e, XlaError::Arity { what: "outputs", expected: 2, got: 1, .. }), "{e}");
    // No float0 cotangent is passed for an integer output.
    let k = load(&c, INT_SCALE);
    let n = c.buffer_from_host(&d, &jax::INT_SCALE_N, &[4]).unwrap();
    let x4 = c.buffer_from_host(&d, &jax::INT_SCALE_X, &[4]).unwrap();
    let dummy = c.buffer_from_host(&d, &[0u8; 4], &[4]).unwrap();
    let e = k.vjp().unwrap().call::<_, _, [Buffer; 2], _>((&x4, &n, &x4, &dummy)).unwrap_err();
    assert!(matches!(e, XlaError::Arity { what: "inputs", expected: 3, got: 4, .. }), "{e}");
}

#[test]
fn vjp_compiles_for_the_kernel_device() {
    let Some(c) = client() else { return };
    if c.devices().len() < 2 {
        println!("SKIPPED: one device");
        return;
    }
    let bytes = std::fs::read(programs().join(BLOCK_CPU)).unwrap();
    let a = Artifact::from_bytes(&bytes).unwrap();
    let k = Kernel::compile(&c, a, &CompileOptions { device: Some(1) }).unwrap();
    let vjp = k.vjp().unwrap();
    assert_eq!(vjp.device(), &c.device(1).unwrap());
    let d = c.device(1).unwrap();
    let x = c.buffer_from_host(&d, &jax::BLOCK_X, &[8, 16]).unwrap();
    let w = c.buffer_from_host(&d, &jax::BLOCK_W, &[16, 16]).unwrap();
    let ct = c.buffer_from_host(&d, &jax::BLOCK_CT, &[8, 16]).unwrap();
    let [dx, _dw]: [Buffer; 2] = vjp.call([&x, &w, &ct]).unwrap();
    close(&dx.to_vec::<f32>().unwrap(), &jax::BLOCK_DX, TOL);
}

#[test]
fn vjp_that_reads_only_the_cotangent() {
    // `x * 3 + sum(w)`: JAX's VJP module keeps only the cotangent (module_kept_var_idx).
    assert_eq!(artifact(LINEAR).vjp().unwrap().kept_inputs(), [2]);
    let Some(c) = client() else { return };
    let d = c.device(0).unwrap();
    let vjp = load(&c, LINEAR);
    let vjp = vjp.vjp().unwrap();
    // The caller still passes the primals, which are checked but not passed.
    assert_eq!(vjp.parameters().unwrap().len(), 3);
    let x = c.buffer_from_host(&d, &[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let w = c.buffer_from_host(&d, &[5.0f32, 6.0], &[2]).unwrap();
    let ct = c.buffer_from_host(&d, &[0.5f32, -1.0, 2.0, 0.25], &[4]).unwrap();
    let (dx, dw): (Buffer, Buffer) = vjp.call([&x, &w, &ct]).unwrap();
    assert_eq!(dx.to_vec::<f32>().unwrap(), [1.5, -3.0, 6.0, 0.75]);
    assert_eq!(dw.to_vec::<f32>().unwrap(), [1.75, 1.75]);
    let short = c.buffer_from_host(&d, &[1.0f32; 3], &[3]).unwrap();
    let e = vjp.call::<_, _, [Buffer; 2], _>([&short, &w, &ct]).unwrap_err();
    assert!(matches!(e, XlaError::InputMismatch { index: 0, what: "shape", .. }), "{e}");
}
