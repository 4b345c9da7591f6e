//! Malformed `jax.export` artifacts on the CPU plugin: every one is a typed error,
//! none aborts the process.

mod common;

use handoff_xla::{CompileOptions, Kernel, Source, XlaError};
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
