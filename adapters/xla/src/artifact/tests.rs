//! Reading real and synthetic `jax.export` artifacts, and refusing malformed ones.

use super::*;
use flatbuffers::{FlatBufferBuilder, WIPOffset};

const LN_GELU_CPU: &[u8] = include_bytes!("../../programs/ln_gelu_f32_8x16_cpu.jaxexport");
const LN_GELU_CPU_CUDA: &[u8] = include_bytes!("../../programs/ln_gelu_f32_8x16_cpu_cuda.jaxexport");
const RESIDUAL: &[u8] = include_bytes!("../../programs/residual_f32_8x16_cpu_cuda.jaxexport");
const UNUSED_ARG: &[u8] = include_bytes!("../../programs/unused_arg_f32_cpu.jaxexport");
const POLY: &[u8] = include_bytes!("../../programs/poly_f32_cpu.jaxexport");

fn f32s(shape: &[i64]) -> ArraySpec {
    ArraySpec { dtype: Some(DataType::F32), shape: shape.to_vec() }
}

fn feature(e: XlaError) -> String {
    match e {
        XlaError::Unsupported { feature, .. } => feature,
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn artifact_single_platform() {
    let a = Artifact::from_bytes(LN_GELU_CPU).unwrap();
    assert_eq!(a.function_name(), "ln_gelu");
    assert_eq!(a.platforms(), ["cpu"]);
    assert_eq!(a.platform_index("cpu"), Some(0));
    assert_eq!(a.platform_index("cuda"), None);
    assert!(!a.takes_platform_index());
    assert_eq!(a.inputs(), [f32s(&[8, 16])]);
    assert_eq!(a.outputs(), [f32s(&[8, 16])]);
    assert_eq!(a.kept_inputs(), [0]);
    assert!(a.module().starts_with(b"ML\xefR"));
    assert_eq!(a.calling_convention_version(), 10);
    assert!(format!("{a:?}").contains("bytes>"));
}

#[test]
fn artifact_multi_platform_takes_platform_index() {
    let a = Artifact::from_bytes(LN_GELU_CPU_CUDA).unwrap();
    assert_eq!(a.function_name(), "ln_gelu");
    assert_eq!(a.platforms(), ["cpu", "cuda"]);
    assert_eq!(a.platform_index("cuda"), Some(1));
    assert!(a.takes_platform_index());
    assert_eq!(a.inputs(), [f32s(&[8, 16])]);
    assert_eq!(a.outputs(), [f32s(&[8, 16])]);
    assert_eq!(a.kept_inputs(), [0]);
    assert!(a.module().starts_with(b"ML\xefR"));

    let r = Artifact::from_bytes(RESIDUAL).unwrap();
    assert_eq!(r.function_name(), "residual");
    assert_eq!(r.platforms(), ["cpu", "cuda"]);
    assert_eq!(r.platform_index("cpu"), Some(0));
    assert!(r.takes_platform_index());
    assert_eq!(r.inputs(), [f32s(&[8, 16]), f32s(&[16, 16])]);
    assert_eq!(r.outputs(), [f32s(&[8, 16]), f32s(&[8, 16])]);
    assert_eq!(r.kept_inputs(), [0, 1]);
    assert!(r.module().starts_with(b"ML\xefR"));
    assert_eq!(r.calling_convention_version(), 10);
}

#[test]
fn artifact_unused_input_is_dropped() {
    let a = Artifact::from_bytes(UNUSED_ARG).unwrap();
    assert_eq!(a.function_name(), "unused_arg");
    assert_eq!(a.platforms(), ["cpu"]);
    assert!(!a.takes_platform_index());
    assert_eq!(a.inputs(), [f32s(&[4]), f32s(&[8])]);
    assert_eq!(a.outputs(), [f32s(&[8])]);
    assert_eq!(a.kept_inputs(), [1]);
    assert!(a.module().starts_with(b"ML\xefR"));
}

#[test]
fn artifact_shape_polymorphism_is_refused() {
    let e = Artifact::from_bytes(POLY).unwrap_err();
    let msg = e.to_string();
    assert_eq!(feature(e), "shape polymorphism");
    assert!(msg.contains("`b`"), "{msg}");
}

#[test]
fn artifact_malformed_bytes_are_invalid() {
    for bytes in [&b""[..], b"\0", b"abc", b"\0\0\0\0", b"\xff\xff\xff\xff", b"ML\xefR not a flatbuffer"] {
        let e = Artifact::from_bytes(bytes).unwrap_err();
        assert!(matches!(e, XlaError::Invalid { .. }), "{bytes:?}: {e:?}");
    }
    let e = Artifact::from_bytes(&LN_GELU_CPU[..LN_GELU_CPU.len() / 2]).unwrap_err();
    assert!(matches!(e, XlaError::Invalid { .. }), "{e:?}");
    assert!(e.to_string().starts_with("jax.export artifact"), "{e}");
}

#[test]
fn artifact_every_truncation_is_invalid() {
    for bytes in [LN_GELU_CPU, RESIDUAL, UNUSED_ARG, POLY] {
        let whole = Artifact::from_bytes(bytes);
        // The buffer ends with the first string JAX wrote (the function name), its
        // NUL and zero padding: cutting only padding leaves the same artifact.
        let padding = bytes.iter().rev().take_while(|&&b| b == 0).count().saturating_sub(1);
        for n in 0..bytes.len() {
            match Artifact::from_bytes(&bytes[..n]) {
                Err(XlaError::Invalid { .. }) if n < bytes.len() - padding => {}
                Ok(a) if n >= bytes.len() - padding => assert_eq!(Ok(&a), whole.as_ref().map_err(|_| ())),
                Err(XlaError::Unsupported { .. }) if n >= bytes.len() - padding && whole.is_err() => {}
                other => panic!("truncated to {n} of {} bytes: {other:?}", bytes.len()),
            }
        }
    }
}

#[test]
fn artifact_random_corruption_never_panics() {
    // xorshift64*: deterministic, no dependency.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let (mut ok, mut refused) = (0, 0);
    for base in [RESIDUAL, LN_GELU_CPU_CUDA] {
        for _ in 0..3000 {
            let mut bytes = base.to_vec();
            for _ in 0..=(next() % 4) {
                let at = (next() % bytes.len() as u64) as usize;
                match next() % 3 {
                    0 => bytes[at] ^= 1 << (next() % 8),
                    1 => bytes[at] = next() as u8,
                    _ => bytes[at] = [0x00, 0xff, 0x7f, 0x80][(next() % 4) as usize],
                }
            }
            match Artifact::from_bytes(&bytes) {
                Ok(_) => ok += 1,
                Err(XlaError::Invalid { .. } | XlaError::Unsupported { .. }) => refused += 1,
                Err(e) => panic!("unexpected error kind: {e:?}"),
            }
        }
    }
    assert!(refused > 0 && ok > 0, "ok {ok}, refused {refused}");
}

/// What a synthetic artifact holds (built with the flatbuffers builder, the layout
/// JAX writes): the defaults make a valid single-platform f32[4] -> f32[4] artifact.
struct Fake {
    version: u16,
    calling_convention: u16,
    nr_devices: u32,
    dtype: i8,
    dims: Vec<&'static str>,
    memory_space: i8,
    ordered_effects: usize,
    mesh_axis_sizes: Option<Vec<u32>>,
    inline_avals: bool,
    kept: Vec<u16>,
    platforms: Vec<&'static str>,
    /// How many inputs (all alike; one output).
    inputs: usize,
    /// The nested VJP (`serialize(vjp_order=1)`).
    vjp: Option<Box<Fake>>,
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            version: 12,
            calling_convention: 10,
            nr_devices: 1,
            dtype: 10,
            dims: vec!["4"],
            memory_space: 1,
            ordered_effects: 0,
            mesh_axis_sizes: None,
            inline_avals: false,
            kept: vec![0],
            platforms: vec!["cpu"],
            inputs: 1,
            vjp: None,
        }
    }
}

impl Fake {
    fn build(&self) -> Vec<u8> {
        let mut b = FlatBufferBuilder::new();
        let root = self.table(&mut b);
        b.finish_minimal(root);
        b.finished_data().to_vec()
    }

    /// The `Exported` table, in `b`.
    fn table(&self, b: &mut FlatBufferBuilder<'_>) -> WIPOffset<flatbuffers::TableFinishedWIPOffset> {
        type Off = WIPOffset<flatbuffers::TableFinishedWIPOffset>;
        let vjp = self.vjp.as_ref().map(|v| v.table(b));
        let dims: Vec<_> = self.dims.iter().map(|d| b.create_string(d)).collect();
        let shape = b.create_vector(&dims);
        let t = b.start_table();
        b.push_slot::<i8>(4, 0, 0);
        b.push_slot_always(6, shape);
        b.push_slot::<i8>(8, self.dtype, 0);
        b.push_slot::<i8>(10, self.memory_space, 0);
        let aval: Off = b.end_table(t);
        let avals = b.create_vector(&[aval]);
        let in_avals = b.create_vector(&vec![aval; self.inputs]);
        let name = b.create_string("fake");
        let platforms: Vec<_> = self.platforms.iter().map(|p| b.create_string(p)).collect();
        let platforms = b.create_vector(&platforms);
        let effects: Vec<Off> = (0..self.ordered_effects)
            .map(|_| {
                let n = b.create_string("<class 'Effect'>");
                let t = b.start_table();
                b.push_slot_always(4, n);
                b.end_table(t)
            })
            .collect();
        let effects = b.create_vector(&effects);
        let module = b.create_vector(&b"ML\xefR fake module"[..]);
        let kept = b.create_vector(&self.kept);
        let idxs = b.create_vector(&[0u32]);
        let in_idxs = b.create_vector(&vec![0u32; self.inputs]);
        let sharding = u32::from(self.mesh_axis_sizes.is_some());
        let in_sharding_idxs = b.create_vector(&vec![sharding; self.inputs]);
        let (meshes, shardings, sharding_idxs) = match &self.mesh_axis_sizes {
            None => (None, None, b.create_vector(&[0u32])),
            Some(sizes) => {
                let sizes = b.create_vector(sizes);
                let t = b.start_table();
                b.push_slot_always(4, sizes);
                let mesh: Off = b.end_table(t);
                let t = b.start_table();
                b.push_slot_always(4, mesh);
                b.push_slot::<u32>(10, 0, 0);
                let named: Off = b.end_table(t);
                let meshes = b.create_vector(&[mesh]);
                let named = b.create_vector(&[named]);
                (Some(meshes), Some(named), b.create_vector(&[1u32]))
            }
        };
        let t = b.start_table();
        b.push_slot::<u16>(4, self.version, 0);
        b.push_slot_always(6, name);
        if self.inline_avals {
            b.push_slot_always(10, in_avals);
            b.push_slot_always(14, avals);
        } else {
            b.push_slot_always(42, avals);
            b.push_slot_always(48, in_idxs);
            b.push_slot_always(50, idxs);
        }
        b.push_slot_always(22, platforms);
        b.push_slot_always(24, effects);
        b.push_slot_always(30, module);
        b.push_slot::<u16>(32, self.calling_convention, 0);
        b.push_slot_always(34, kept);
        b.push_slot::<u32>(40, self.nr_devices, 0);
        if let (Some(m), Some(s)) = (meshes, shardings) {
            b.push_slot_always(44, m);
            b.push_slot_always(46, s);
        }
        b.push_slot_always(52, in_sharding_idxs);
        b.push_slot_always(54, sharding_idxs);
        if let Some(vjp) = vjp {
            b.push_slot_always(38, vjp);
        }
        b.end_table(t)
    }

    fn read(self) -> Result<Artifact> {
        Artifact::from_bytes(&self.build())
    }
}

#[test]
fn artifact_synthetic_valid() {
    let a = Fake::default().read().unwrap();
    assert_eq!(a.function_name(), "fake");
    assert_eq!(a.inputs(), [f32s(&[4])]);
    assert_eq!(a.outputs(), [f32s(&[4])]);
    let a = Fake { inline_avals: true, version: 0, dtype: 14, ..Fake::default() }.read().unwrap();
    assert_eq!(a.inputs(), [ArraySpec { dtype: Some(DataType::BF16), shape: vec![4] }]);
    // A named sharding on a mesh of one device is one device.
    let a = Fake { mesh_axis_sizes: Some(vec![1, 1]), ..Fake::default() }.read().unwrap();
    assert_eq!(a.kept_inputs(), [0]);
    let a = Fake { dims: vec![], ..Fake::default() }.read().unwrap();
    assert_eq!(a.inputs(), [f32s(&[])]);
    // float0 (a cotangent of an integer value): the module's bool array, never read.
    let a = Fake { dtype: 22, kept: vec![], ..Fake::default() }.read().unwrap();
    assert_eq!(a.inputs(), [ArraySpec { dtype: Some(DataType::BOOL), shape: vec![4] }]);
    assert_eq!((a.float0_inputs(), a.float0_outputs()), (&[0][..], &[0][..]));
    assert!(!a.has_vjp());
}

#[test]
fn artifact_unsupported_features_are_named() {
    let cases = [
        (Fake { version: 13, ..Fake::default() }, "serialization version 13"),
        (Fake { calling_convention: 11, ..Fake::default() }, "calling convention version 11"),
        (Fake { ordered_effects: 1, ..Fake::default() }, "effects"),
        (Fake { nr_devices: 8, ..Fake::default() }, "sharding over several devices"),
        (Fake { mesh_axis_sizes: Some(vec![2, 1]), ..Fake::default() }, "sharding over several devices"),
        (Fake { dtype: 22, ..Fake::default() }, "a float0 input read by the module"),
        (Fake { dtype: 15, ..Fake::default() }, "the dtype i4"),
        (Fake { dtype: 27, ..Fake::default() }, "the dtype key<fry> (PRNG key)"),
        (Fake { dtype: 99, ..Fake::default() }, "the dtype code 99"),
        (Fake { dims: vec!["2*b"], ..Fake::default() }, "shape polymorphism"),
        (Fake { memory_space: 2, ..Fake::default() }, "a memory space other than Device"),
    ];
    for (fake, want) in cases {
        let e = fake.read().unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("this jax.export artifact uses {want}, ")), "{msg}");
        assert_eq!(feature(e), want);
    }
}

#[test]
fn artifact_inconsistent_fields_are_invalid() {
    for fake in [
        Fake { kept: vec![1], ..Fake::default() },
        Fake { platforms: vec![], ..Fake::default() },
        Fake { nr_devices: 0, ..Fake::default() },
        Fake { dims: vec!["99999999999999999999"], ..Fake::default() },
    ] {
        let e = fake.read().unwrap_err();
        assert!(matches!(e, XlaError::Invalid { .. }), "{e:?}");
    }
}

#[test]
fn artifact_dtype_table_matches_dlpack() {
    for (code, name, dtype) in DTYPES {
        if let Some(d) = dtype {
            assert!(handoff_runtime::dtype::check(*d).is_ok(), "{name}");
            assert!(crate::dtype::to_pjrt(*d).is_some(), "{name}");
        }
        assert_eq!(DTYPES.iter().filter(|(c, _, _)| c == code).count(), 1);
    }
}

/// A VJP of the default fake (f32[4] -> f32[4]) as JAX writes it: the primal input and
/// the output's cotangent in, the input's cotangent out.
fn fake_vjp() -> Fake {
    Fake { inputs: 2, kept: vec![0, 1], ..Fake::default() }
}

#[test]
fn artifact_vjp_is_read_and_checked_against_the_convention() {
    let a = Fake { vjp: Some(Box::new(fake_vjp())), ..Fake::default() }.read().unwrap();
    assert!(a.has_vjp());
    let v = a.vjp().unwrap();
    assert_eq!(v.inputs(), [f32s(&[4]), f32s(&[4])]);
    assert_eq!(v.outputs(), [f32s(&[4])]);
    assert!(!v.has_vjp());
    // The nested VJP's own refusals carry where they are.
    let nested = Fake { vjp: Some(Box::new(Fake { inputs: 1, ..Fake::default() })), ..fake_vjp() };
    let e = Fake { vjp: Some(Box::new(nested)), ..Fake::default() }.read().unwrap_err();
    assert!(e.to_string().contains("vjp arity (in the VJP, Exported.vjp)"), "{e}");
    // Not JAX's convention: refused as invalid, naming what differs.
    for (vjp, field) in [
        (Fake { inputs: 1, ..Fake::default() }, "vjp arity"),
        (Fake { platforms: vec!["cuda"], ..fake_vjp() }, "vjp platforms"),
        (Fake { dims: vec!["5"], ..fake_vjp() }, "vjp input 0"),
        (Fake { kept: vec![3], ..fake_vjp() }, "module_kept_var_idx (in the VJP, Exported.vjp)"),
    ] {
        let e = Fake { vjp: Some(Box::new(vjp)), ..Fake::default() }.read().unwrap_err();
        assert!(
            matches!(&e, XlaError::Invalid { field: f, .. } if f == &format!("jax.export artifact: {field}")),
            "{field}: {e:?}"
        );
    }
}

#[test]
fn artifact_vjp_refused_or_absent_says_why() {
    // A VJP using what handoff does not support: the primal loads, `vjp()` says why not.
    let a = Fake { vjp: Some(Box::new(Fake { dims: vec!["b"], ..fake_vjp() })), ..Fake::default() }
        .read()
        .unwrap();
    assert!(a.has_vjp());
    let e = a.vjp().unwrap_err();
    let msg = e.to_string();
    assert!(matches!(&e, XlaError::NoVjp { program, .. } if program == "fake"), "{e:?}");
    assert!(
        msg.starts_with("fake has no VJP: its VJP is refused: ") && msg.contains("shape polymorphism"),
        "{msg}"
    );
    // None: serialized with vjp_order=0.
    let e = Fake::default().read().unwrap().vjp().unwrap_err();
    assert!(e.to_string().contains("vjp_order=1"), "{e}");
    for real in [LN_GELU_CPU, LN_GELU_CPU_CUDA, RESIDUAL, UNUSED_ARG] {
        assert!(!Artifact::from_bytes(real).unwrap().has_vjp());
    }
}

#[test]
fn artifact_deeply_nested_vjps_are_refused_by_the_verifier() {
    // Each VJP is a nested table: the verifier's depth limit bounds the recursion.
    let mut fake = Fake::default();
    for _ in 0..70 {
        fake = Fake { vjp: Some(Box::new(fake)), ..Fake::default() };
    }
    let e = fake.read().unwrap_err();
    assert!(matches!(e, XlaError::Invalid { .. }) && e.to_string().contains("depth"), "{e}");
}
