//! Malformed `jax.export` artifacts on the CPU plugin: every one is a typed error,
//! none aborts the process.

mod common;

use handoff_xla::{ArraySpec, Artifact, CompileOptions, Kernel, Source, XlaError};
use std::path::PathBuf;

fn programs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs")
}

/// `ln_gelu_f32_8x16_cpu_cuda.jaxexport` with a few bytes overwritten (copy 3 of the
/// sweep below): the artifact parses, and the CPU plugin's `PJRT_Client_Compile` throws
/// a C++ exception on its module. Before the guard around PJRT calls this aborted the
/// process ("fatal runtime error: Rust cannot catch foreign exceptions").
const THROWS_IN_COMPILE: &[u8] =
    include_bytes!("../../../fuzz/regressions/artifact/compile-throws-cpp-exception");

#[test]
fn a_cpp_exception_in_compile_is_a_typed_error_and_the_client_still_works() {
    let Some(c) = common::client() else { return };
    let source = Source::from_bytes(THROWS_IN_COMPILE.to_vec(), None).unwrap();
    assert!(matches!(source, Source::Artifact(_)), "{source:?}");
    let e = Kernel::compile(&c, source, &CompileOptions::default()).unwrap_err();
    match &e {
        XlaError::PluginException { call, exception } => {
            assert_eq!(*call, "PJRT_Client_Compile");
            assert!(!exception.is_empty());
        }
        other => panic!("expected PluginException, got {other:?}"),
    }
    let text = e.to_string();
    assert!(text.contains("PJRT_Client_Compile") && text.contains("C++ exception"), "{text}");
    println!("{text}");
    // This plugin's client survives it: the unmutated artifact still compiles and runs.
    let k = Kernel::load(&c, programs().join("ln_gelu_f32_8x16_cpu_cuda.jaxexport")).unwrap();
    let x = c.buffer_from_host(&c.device(0).unwrap(), &[0.5f32; 128], &[8, 16]).unwrap();
    let _: handoff_xla::Buffer = k.call1(&x).unwrap();
}

fn artifact(name: &str) -> Vec<u8> {
    std::fs::read(programs().join(name)).unwrap()
}

/// The field and value of an `Invalid` error.
fn invalid(e: XlaError) -> (String, String, String) {
    match e {
        XlaError::Invalid { field, value, reason } => (field, value, reason),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn truncated_artifacts_load_identically_or_are_refused_by_field() {
    let (mut loaded_cut, mut padding_total) = (0, 0);
    for name in [
        "ln_gelu_f32_8x16_cpu.jaxexport",
        "ln_gelu_f32_8x16_cpu_cuda.jaxexport",
        "residual_f32_8x16_cpu_cuda.jaxexport",
        "unused_arg_f32_cpu.jaxexport",
        "block_f32_8x16_cpu_cuda_vjp.jaxexport",
    ] {
        let bytes = artifact(name);
        let whole = Artifact::from_bytes(&bytes).unwrap();
        // The string JAX writes first ends the buffer: its NUL, then padding.
        let mut with_nul = whole.function_name().as_bytes().to_vec();
        with_nul.push(0);
        let at = bytes.windows(with_nul.len()).rposition(|w| w == with_nul).unwrap();
        let padding_bytes = bytes.len() - at - with_nul.len();
        assert!(bytes[at + with_nul.len()..].iter().all(|&b| b == 0), "{name}");
        padding_total += padding_bytes;
        for cut in 1..=64 {
            match Artifact::from_bytes(&bytes[..bytes.len() - cut]) {
                Ok(a) => {
                    assert!(
                        cut <= padding_bytes,
                        "{name} cut by {cut} loads, but only {padding_bytes} are padding"
                    );
                    assert_eq!(a, whole, "{name} cut by {cut} loads as another artifact");
                    loaded_cut += 1;
                }
                Err(e) => {
                    assert!(
                        cut > padding_bytes,
                        "{name} cut by {cut} (padding {padding_bytes}) refused: {e}"
                    );
                    let text = e.to_string();
                    let (field, value, _) = invalid(e);
                    assert!(
                        field.starts_with("jax.export artifact: Exported."),
                        "{name} cut by {cut}: {text}"
                    );
                    assert!(value.starts_with("byte"), "{name} cut by {cut}: {text}");
                    if cut == padding_bytes + 1 {
                        assert_eq!(field, "jax.export artifact: Exported.function_name", "{text}");
                        assert!(text.contains("NUL terminator"), "{text}");
                    }
                }
            }
        }
    }
    // Every cut of padding loads, no other: `residual` has 3 padding bytes,
    // `block` 2, `unused_arg` 1, `ln_gelu` none (its NUL is the last byte).
    assert_eq!((loaded_cut, padding_total), (6, 6));
}

#[test]
fn a_malformed_artifact_is_refused_naming_the_field_and_the_offset() {
    let bytes = artifact("residual_f32_8x16_cpu_cuda.jaxexport");
    let n = bytes.len();

    // The length of `function_name` (the last string: length, "residual", NUL, padding)
    // made to run past the end.
    let mut long_name = bytes.clone();
    let at = n - 4 - 8 - 4;
    assert_eq!(&long_name[at..at + 4], &8u32.to_le_bytes());
    long_name[at..at + 4].copy_from_slice(&4000u32.to_le_bytes());
    let e = Artifact::from_bytes(&long_name).unwrap_err();
    let text = e.to_string();
    let (field, value, reason) = invalid(e);
    assert_eq!(field, "jax.export artifact: Exported.function_name", "{text}");
    assert_eq!(value, format!("bytes {}..{}", at + 4, at + 4 + 4000), "{text}");
    assert!(reason.contains("past the artifact's end"), "{text}");

    // A platform name that is not UTF-8: the field, its element and the bytes.
    let mut bad_utf8 = bytes.clone();
    let cuda = bad_utf8.windows(4).position(|w| w == b"cuda").unwrap();
    bad_utf8[cuda] = 0xff;
    let e = Artifact::from_bytes(&bad_utf8).unwrap_err();
    let text = e.to_string();
    let (field, value, _) = invalid(e);
    assert_eq!(field, "jax.export artifact: Exported.platforms[1]", "{text}");
    assert_eq!(value, format!("bytes {cuda}..{}", cuda + 4), "{text}");

    // The root offset pointing past the end.
    let mut bad_root = bytes.clone();
    bad_root[..4].copy_from_slice(&(n as u32 + 64).to_le_bytes());
    let text = Artifact::from_bytes(&bad_root).unwrap_err().to_string();
    assert!(text.contains("jax.export artifact") && text.contains("byte"), "{text}");

    // Nothing at all.
    let text = Artifact::from_bytes(&[]).unwrap_err().to_string();
    assert!(text.contains("bytes 0..4") || text.contains("0 bytes"), "{text}");
}

/// A sweep of mutated artifacts (1-8 random bytes overwritten), for finding inputs
/// that abort: `HANDOFF_SWEEP=<file>:<start>:<count>` loads copies `start..count`,
/// printing each index to stderr before loading it (run by hand, in a loop that
/// restarts after an abort).
#[test]
#[ignore = "a search, run by hand"]
fn sweep() {
    let Ok(spec) = std::env::var("HANDOFF_SWEEP") else { return };
    let mut parts = spec.split(':');
    let file = parts.next().unwrap();
    let start: u64 = parts.next().unwrap().parse().unwrap();
    let count: u64 = parts.next().unwrap().parse().unwrap();
    let original = std::fs::read(programs().join(file)).unwrap();
    let c = common::client().unwrap();
    for i in start..count {
        let mut state = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut bytes = original.clone();
        let n = 1 + next() % 8;
        for _ in 0..n {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = next() as u8;
        }
        eprintln!("SWEEP {i}");
        std::fs::write("/tmp/sweep_current", &bytes).unwrap();
        let r =
            Source::from_bytes(bytes, None).and_then(|s| Kernel::compile(&c, s, &CompileOptions::default()));
        if let Err(e) = r {
            let m = e.to_string();
            assert!(!m.is_empty());
        }
    }
}

/// Loads the files `HANDOFF_LOAD_FILES` names (`:`-separated) and prints each outcome
/// (run by hand on a sweep's or a fuzzer's findings).
#[test]
#[ignore = "run by hand"]
fn load_files() {
    let Ok(files) = std::env::var("HANDOFF_LOAD_FILES") else { return };
    let c = common::client().unwrap();
    for f in files.split(':') {
        let t = std::time::Instant::now();
        let r = Kernel::load(&c, f);
        println!("{f}: {:?} in {:?}", r.map(|_| ()), t.elapsed());
    }
}

/// An artifact whose listed shapes are not its module's (a dimension or an aval index
/// changed in the file, which still parses): refused when compiled, naming the parameter or
/// result, the listed shape and the module's. Calls are checked against the listed
/// shapes, so such a file would otherwise hand the program buffers of another size
/// than it reads.
#[test]
fn an_artifact_whose_shapes_are_not_its_modules_is_refused_naming_both() {
    let Some(c) = common::client() else { return };
    let compile = |bytes: Vec<u8>| {
        Kernel::compile(&c, Source::from_bytes(bytes, None).unwrap(), &CompileOptions::default())
    };
    let differs = |l: &[ArraySpec], w: &[ArraySpec]| l.iter().zip(w).position(|(l, w)| l != w);
    // `changed` is refused naming `field`, the listed spec and the module's.
    let refused = |changed: Vec<u8>, field: String, listed: &ArraySpec, module: &ArraySpec, case: &str| {
        let e = compile(changed).unwrap_err();
        let text = e.to_string();
        let (f, value, reason) = invalid(e);
        assert_eq!((f, value), (field, listed.to_string()), "{case}: {text}");
        assert!(reason.contains(&module.to_string()), "{case}: {text}");
        println!("{case}: {text}");
    };
    let (mut inputs_changed, mut outputs_changed) = (0, 0);
    for name in [
        "ln_gelu_f32_8x16_cpu.jaxexport",
        "unused_arg_f32_cpu.jaxexport",
        "residual_f32_8x16_cpu_cuda.jaxexport",
        "linear_f32_cpu_vjp.jaxexport",
    ] {
        let bytes = artifact(name);
        let whole = Artifact::from_bytes(&bytes).unwrap();
        // A flatbuffer string of one or two digits (a dimension): its length, the
        // digits, a NUL; the first digit is changed.
        let digits = (0..bytes.len() - 8).filter(|&i| {
            let n = bytes[i] as usize;
            (1..=2).contains(&n)
                && bytes[i + 1..i + 4] == [0, 0, 0]
                && bytes[i + 4..i + 4 + n].iter().all(u8::is_ascii_digit)
                && bytes[i + 4 + n] == 0
        });
        for at in digits {
            let mut changed = bytes.clone();
            changed[at + 4] = if changed[at + 4] == b'9' { b'7' } else { changed[at + 4] + 1 };
            let Ok(a) = Artifact::from_bytes(&changed) else { continue };
            let (field, listed, module) = if let Some(i) = differs(a.inputs(), whole.inputs()) {
                // The module's parameters are the platform index, when taken, then the
                // kept inputs, in order.
                let Some(p) = whole.kept_inputs().iter().position(|&k| k == i) else { continue };
                let p = p + usize::from(whole.takes_platform_index());
                inputs_changed += 1;
                (format!("jax.export artifact parameters[{p}]"), &a.inputs()[i], &whole.inputs()[i])
            } else if let Some(i) = differs(a.outputs(), whole.outputs()) {
                outputs_changed += 1;
                (format!("jax.export artifact results[{i}]"), &a.outputs()[i], &whole.outputs()[i])
            } else {
                continue;
            };
            refused(changed, field, listed, module, &format!("{name}, byte {at}"));
        }
        // The outputs share their avals with inputs in these files: an output made to
        // list another aval instead (a one-element vector of small indices, `[i]`, made
        // `[j]`).
        let one_index = |i: usize| {
            bytes[i..i + 4] == [1, 0, 0, 0] && bytes[i + 4] < 4 && bytes[i + 5..i + 8] == [0, 0, 0]
        };
        for (at, j) in
            (0..bytes.len() - 8).filter(|&i| one_index(i)).flat_map(|i| (0..4u8).map(move |j| (i, j)))
        {
            let mut changed = bytes.clone();
            if changed[at + 4] == j {
                continue;
            }
            changed[at + 4] = j;
            let Ok(a) = Artifact::from_bytes(&changed) else { continue };
            let Some(i) = differs(a.outputs(), whole.outputs()).filter(|_| a.inputs() == whole.inputs())
            else {
                continue;
            };
            outputs_changed += 1;
            let (listed, module) = (&a.outputs()[i], &whole.outputs()[i]);
            let field = format!("jax.export artifact results[{i}]");
            refused(changed, field, listed, module, &format!("{name}, byte {at}"));
        }
        // The file as written compiles.
        compile(bytes).unwrap();
    }
    assert!(
        inputs_changed >= 2 && outputs_changed >= 1,
        "{inputs_changed} inputs, {outputs_changed} outputs"
    );
}
