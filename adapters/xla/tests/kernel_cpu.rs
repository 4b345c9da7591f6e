//! Kernels on the CPU plugin: StableHLO and `jax.export` artifacts (one platform, and
//! `("cpu", "cuda")` with its platform-index argument), inputs checked against the
//! program before it runs, buffers of another client refused, the registry's XLA
//! entry importing into the client it is given.

mod common;

use common::*;
use handoff_runtime::registry::{self, RegistryError};
use handoff_runtime::{Device, Export, Handoff, Ready, Release, Stream, TensorDesc, dtype::DataType, stats};
use handoff_xla::{Artifact, Buffer, CallOptions, Client, CompileOptions, Kernel, Source, XlaError};
use std::path::PathBuf;

fn programs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs")
}

/// `gelu_tanh(layernorm(row))` per row, in f64 (eps 1e-5, no affine).
fn ln_gelu(x: &[f32], cols: usize) -> Vec<f32> {
    x.chunks(cols)
        .flat_map(|row| {
            let n = row.len() as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let inv = 1.0 / (var + 1e-5).sqrt();
            row.iter().map(move |&v| gelu(((v as f64 - mean) * inv) as f32)).collect::<Vec<_>>()
        })
        .collect()
}

fn matmul(a: &[f32], b: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * m];
    for i in 0..n {
        for j in 0..m {
            out[i * m + j] = (0..k).map(|t| a[i * k + t] as f64 * b[t * m + j] as f64).sum::<f64>() as f32;
        }
    }
    out
}

fn input(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

fn load(c: &Client, name: &str) -> Kernel {
    Kernel::load(c, programs().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn stablehlo_text_kernel_runs_on_buffers() {
    let Some(c) = client() else { return };
    let k = load(&c, "gelu_scale_f32_4x8.mlir");
    assert_eq!(k.parameters().map(|p| p.len()), Some(1));
    let xs = input(32, 1);
    let x = c.buffer_from_host(&c.device(0).unwrap(), &xs, &[4, 8]).unwrap();
    let (y, d): (Result<Buffer, _>, _) = stats::measure(|| k.call1(&x));
    let y = y.unwrap();
    assert_eq!(
        (d.exports, d.imports, d.copies),
        (0, 0, 0),
        "a buffer of the kernel's client is passed as it is"
    );
    close(&y.to_vec::<f32>().unwrap(), &xs.iter().map(|&v| gelu_scale(v)).collect::<Vec<_>>(), 1e-5);
}

#[test]
fn jax_export_artifact_for_cpu_runs() {
    let Some(c) = client() else { return };
    let k = load(&c, "ln_gelu_f32_8x16_cpu.jaxexport");
    assert_eq!(k.parameters().unwrap().len(), 1);
    let xs = input(128, 2);
    let x = c.buffer_from_host(&c.device(0).unwrap(), &xs, &[8, 16]).unwrap();
    let y: Buffer = k.call1(&x).unwrap();
    close(&y.to_vec::<f32>().unwrap(), &ln_gelu(&xs, 16), 1e-5);
}

#[test]
fn multi_platform_artifact_gets_its_platform_index() {
    let Some(c) = client() else { return };
    let bytes = std::fs::read(programs().join("ln_gelu_f32_8x16_cpu_cuda.jaxexport")).unwrap();
    let artifact = Artifact::from_bytes(&bytes).unwrap();
    assert_eq!(artifact.platforms(), ["cpu", "cuda"]);
    assert!(artifact.takes_platform_index());
    let k = Kernel::compile(&c, artifact, &CompileOptions::default()).unwrap();
    // The caller passes only its own input: the platform index is the kernel's.
    assert_eq!(k.parameters().unwrap().len(), 1);
    let xs = input(128, 3);
    let x = c.buffer_from_host(&c.device(0).unwrap(), &xs, &[8, 16]).unwrap();
    let y: Buffer = k.call1(&x).unwrap();
    close(&y.to_vec::<f32>().unwrap(), &ln_gelu(&xs, 16), 1e-5);

    // Two inputs, two outputs, as an array in and a tuple out.
    let k = load(&c, "residual_f32_8x16_cpu_cuda.jaxexport");
    let ws = input(256, 4).iter().map(|v| v / 4.0).collect::<Vec<_>>();
    let d = c.device(0).unwrap();
    let (x, w) =
        (c.buffer_from_host(&d, &xs, &[8, 16]).unwrap(), c.buffer_from_host(&d, &ws, &[16, 16]).unwrap());
    let (out, h): (Buffer, Buffer) = k.call([&x, &w]).unwrap();
    let h_ref = matmul(&xs, &ws, 8, 16, 16);
    close(&h.to_vec::<f32>().unwrap(), &h_ref, 1e-4);
    let out_ref: Vec<f32> = xs.iter().zip(ln_gelu(&h_ref, 16)).map(|(a, b)| a + b).collect();
    close(&out.to_vec::<f32>().unwrap(), &out_ref, 1e-4);
}

#[test]
fn unused_inputs_are_checked_but_not_passed() {
    let Some(c) = client() else { return };
    let k = load(&c, "unused_arg_f32_cpu.jaxexport");
    let d = c.device(0).unwrap();
    let unused = c.buffer_from_host(&d, &[9.0f32; 4], &[4]).unwrap();
    let xs = input(8, 5);
    let x = c.buffer_from_host(&d, &xs, &[8]).unwrap();
    let [y]: [Buffer; 1] = k.call((&unused, &x)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), xs.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    // A wrong shape of the unused input is still refused, naming it.
    let bad = c.buffer_from_host(&d, &[9.0f32; 5], &[5]).unwrap();
    let e = k.call::<_, _, [Buffer; 1], _>((&bad, &x)).unwrap_err();
    assert!(matches!(e, XlaError::InputMismatch { index: 0, what: "shape", .. }), "{e}");
}

#[test]
fn shape_polymorphic_artifact_is_refused_by_name() {
    let Some(c) = client() else { return };
    let e = Kernel::load(&c, programs().join("poly_f32_cpu.jaxexport")).unwrap_err();
    assert!(
        matches!(&e, XlaError::Unsupported { feature, .. } if feature.contains("shape polymorphism")),
        "{e}"
    );
}

#[test]
fn inputs_are_checked_before_anything_runs() {
    let Some(c) = client() else { return };
    let k = load(&c, "ln_gelu_f32_8x16_cpu.jaxexport");
    let d = c.device(0).unwrap();
    let wrong_shape = c.buffer_from_host(&d, &[0f32; 64], &[4, 16]).unwrap();
    let e = k.call1::<_, _, Buffer, _>(&wrong_shape).unwrap_err();
    match &e {
        XlaError::InputMismatch { index, what, expected, got, .. } => {
            assert_eq!((*index, *what), (0, "shape"));
            assert_eq!((expected.as_str(), got.as_str()), ("f32[8, 16]", "f32[4, 16]"));
        }
        other => panic!("{other}"),
    }
    let wrong_dtype = c.buffer_from_host(&d, &[0i32; 128], &[8, 16]).unwrap();
    let e = k.call1::<_, _, Buffer, _>(&wrong_dtype).unwrap_err();
    assert!(matches!(e, XlaError::InputMismatch { index: 0, what: "dtype", .. }), "{e}");
    let x = c.buffer_from_host(&d, &[0f32; 128], &[8, 16]).unwrap();
    let e = k.call::<_, _, [Buffer; 1], _>([&x, &x]).unwrap_err();
    assert!(matches!(e, XlaError::Arity { what: "inputs", expected: 1, got: 2, .. }), "{e}");
    let e = k.call::<_, _, [Buffer; 2], _>([&x]).unwrap_err();
    assert!(matches!(e, XlaError::Arity { what: "outputs", expected: 1, got: 2, .. }), "{e}");
}

#[test]
fn a_buffer_of_another_client_is_refused_with_a_typed_error() {
    let Some(a) = client() else { return };
    let b = client().unwrap();
    let xs = input(128, 6);
    let of_b = b.buffer_from_host(&b.device(0).unwrap(), &xs, &[8, 16]).unwrap();
    // The kernel call: refused by type, naming the input.
    let k = load(&a, "ln_gelu_f32_8x16_cpu.jaxexport");
    let e = k.call1::<_, _, Buffer, _>(&of_b).unwrap_err();
    assert!(matches!(e, XlaError::ClientMismatch { index: 0, .. }), "{e}");
    // The executable too, even with no parameter list to check against.
    let exe = a.compile(&program("gelu_scale_f32_4x8.mlir")).unwrap();
    let small = b.buffer_from_host(&b.device(0).unwrap(), &xs[..32], &[4, 8]).unwrap();
    let e = exe.execute(&[&small]).unwrap_err();
    assert!(matches!(e, XlaError::ClientMismatch { index: 0, .. }), "{e}");
    // Moved into client a first, it runs: a view of b's memory, no copy.
    let (moved, d) = stats::measure(|| handoff_runtime::transfer_into::<Buffer, _, _>(&of_b, &a));
    let moved = moved.unwrap();
    assert_eq!((d.copies, d.exports, d.imports), (0, 1, 1));
    assert_eq!(moved.device_pointer().unwrap(), of_b.device_pointer().unwrap());
    let y: Buffer = k.call1(&moved).unwrap();
    close(&y.to_vec::<f32>().unwrap(), &ln_gelu(&xs, 16), 1e-5);
}

/// A kernel compiled for another client (what a CUDA graph capture runs on its own
/// client): compiled once per client, the same values, the first client's buffers
/// viewed in place, a third client's buffers refused.
#[test]
fn a_kernel_on_another_client_reads_its_first_clients_buffers_in_place() {
    let Some(a) = client() else { return };
    let (b, c) = (client().unwrap(), client().unwrap());
    let k = load(&a, "ln_gelu_f32_8x16_cpu.jaxexport");
    let on_b = k.on_client(&b).unwrap();
    assert!(std::sync::Arc::ptr_eq(&on_b, &k.on_client(&b).unwrap()), "compiled once per client");
    assert_eq!(on_b.client().platform(), b.platform());
    let xs = input(128, 7);
    let x = a.buffer_from_host(&a.device(0).unwrap(), &xs, &[8, 16]).unwrap();
    let (y, d) = stats::measure(|| on_b.call1::<_, _, Buffer, _>(&x));
    let y = y.unwrap();
    assert_eq!((d.copies, d.imports), (0, 1), "a view of a's buffer");
    assert_eq!(y.device(), b.device(0).unwrap(), "an output of b's");
    close(&y.to_vec::<f32>().unwrap(), &ln_gelu(&xs, 16), 1e-5);
    let of_c = c.buffer_from_host(&c.device(0).unwrap(), &xs, &[8, 16]).unwrap();
    let e = on_b.call1::<_, _, Buffer, _>(&of_c).unwrap_err();
    assert!(matches!(e, XlaError::ClientMismatch { index: 0, .. }), "{e}");
}

/// Host memory handed to a kernel: viewed when 64-byte aligned, refused otherwise
/// unless the call allows a copy.
#[test]
fn host_inputs_are_viewed_or_copied_only_when_asked() {
    let Some(c) = client() else { return };
    let k = load(&c, "gelu_scale_f32_4x8.mlir");
    let xs = input(32, 7);
    let mut block = Box::new(Aligned::<33>([0.0; 33]));
    block.0[..32].copy_from_slice(&xs);
    let ptr = block.0.as_mut_ptr() as *mut std::ffi::c_void;
    let host = |offset: u64| {
        Handoff::with_keep_alive(
            (),
            move |_| {
                Ok(TensorDesc::new(ptr, Device::Host, DataType::F32, &[4, 8][..]).with_byte_offset(offset))
            },
            &Stream::host(),
            Ready::Elided,
            Release::AfterConsumer,
        )
        .unwrap()
    };
    let (y, d) = stats::measure(|| k.call1::<_, _, Buffer, _>(HostValue(host(0))));
    close(&y.unwrap().to_vec::<f32>().unwrap(), &xs.iter().map(|&v| gelu_scale(v)).collect::<Vec<_>>(), 1e-5);
    assert_eq!(d.copies, 0);
    let e = k.call1::<_, _, Buffer, _>(HostValue(host(4))).unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, XlaError::InputMismatch { index: 0, what: "data address", .. }), "{e:?}");
    assert!(m.contains("allow_copy") && m.contains("64-byte") && m.contains("4 bytes past"), "{m}");
    let (y, d) = stats::measure(|| {
        k.call_with::<_, _, [Buffer; 1], _>(&CallOptions::default().allow_copy(), [HostValue(host(4))])
    });
    let [y] = y.unwrap();
    assert_eq!(d.copies, 1);
    let shifted: Vec<f32> = block.0[1..33].iter().map(|&v| gelu_scale(v)).collect();
    close(&y.to_vec::<f32>().unwrap(), &shifted, 1e-5);
}

/// A value exported from an existing hand-off (what a foreign producer gives).
struct HostValue(Handoff);

impl handoff_runtime::StreamOrdered for HostValue {
    fn device(&self) -> Device {
        self.0.device()
    }
    fn stream(&self) -> Option<Stream> {
        None
    }
}

impl Export for HostValue {
    fn describe(&self) -> handoff_runtime::Result<TensorDesc<'_>> {
        let h = &self.0;
        Ok(TensorDesc::new(h.data(), h.device(), h.dtype(), h.shape()).with_byte_offset(h.byte_offset()))
    }
}

#[test]
fn registry_imports_into_the_client_it_is_given() {
    let Some(c) = client() else { return };
    let other = client().unwrap();
    let x = other.buffer_from_host(&other.device(0).unwrap(), &[1.0f32, 2.0], &[2]).unwrap();
    // No context: refused before any work, naming the context type.
    let e = registry::convert(Box::new(x.clone()), "xla", "xla", &Stream::host()).unwrap_err();
    assert!(matches!(e.error, RegistryError::WrongContext { adapter: "xla", .. }), "{e}");
    assert!(e.to_string().contains("Client"), "{e}");
    // With the client: a view in that client.
    let y = registry::convert_into(Box::new(x.clone()), "xla", "xla", &c).unwrap();
    let y = y.downcast::<Buffer>().unwrap();
    assert!(y.client().devices()[0] == c.device(0).unwrap());
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    // The adapter advertises what it can import: no fp6.
    let xla = registry::find("xla").unwrap();
    assert!(xla.supports_dtype(DataType::BF16) && !xla.supports_dtype(DataType::F6E2M3FN));
}

#[test]
fn kernel_source_is_recognized_by_content() {
    let bytes = std::fs::read(programs().join("ln_gelu_f32_8x16_cpu.jaxexport")).unwrap();
    assert!(matches!(Source::from_bytes(bytes, None).unwrap(), Source::Artifact(_)));
    let text = std::fs::read(programs().join("row_sum_f32_8x16.mlir")).unwrap();
    assert!(matches!(Source::from_bytes(text, None).unwrap(), Source::Program(p) if !p.is_bytecode()));
    let bc = std::fs::read(programs().join("gelu_scale_f32_4x8_cpu.mlirbc")).unwrap();
    assert!(matches!(Source::from_bytes(bc, None).unwrap(), Source::Program(p) if p.is_bytecode()));
    assert!(Source::from_bytes(vec![0xff, 0xfe, 0x00], None).is_err());
    let e = Source::from_bytes(Vec::new(), None).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

#[test]
fn a_jaxexport_file_is_read_as_an_artifact_and_refused_as_one() {
    let artifact = std::fs::read(programs().join("ln_gelu_f32_8x16_cpu.jaxexport")).unwrap();
    let dir = std::env::temp_dir().join(format!("handoff-jaxexport-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let e = Source::from_file(write("empty.jaxexport", b"")).unwrap_err();
    assert!(e.to_string().contains("empty file"), "{e}");
    // The first 7 and 64 bytes of a real artifact: refused as an artifact, never
    // handed to the StableHLO parser (which would have taken them as program text).
    for n in [7, 64] {
        let e = Source::from_file(write("cut.jaxexport", &artifact[..n])).unwrap_err();
        let message = e.to_string();
        assert!(message.contains(&format!("not a jax.export artifact ({n} bytes)")), "{message}");
    }
    assert!(matches!(Source::from_file(write("whole.jaxexport", &artifact)).unwrap(), Source::Artifact(_)));
    let _ = std::fs::remove_dir_all(&dir);
}
