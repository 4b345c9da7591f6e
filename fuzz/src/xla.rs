//! Targets `artifact` and `stablehlo`: what a user hands handoff-xla to compile.
//!
//! **`artifact`** ([`fuzz_artifact`]): arbitrary bytes, and libFuzzer's mutations of
//! the real `jax.export` artifacts (the seeds in `corpus/artifact/` are
//! `adapters/xla/programs/*.jaxexport`), into `Artifact::from_bytes` and, for what
//! parses, `Kernel::compile` on the CPU plugin (`HANDOFF_PJRT_PLUGIN`; without it the
//! compile is skipped, with a note printed once) exactly as `Kernel::load` does, then
//! one call of the kernel on zeros of the shapes the artifact declares.
//!
//! Oracle: every failure is a typed `XlaError` with a non-empty message (`Invalid`
//! with field, value and reason; `Unsupported`; `Pjrt` or `PluginException` from the
//! plugin; `NoVjp`); nothing panics, aborts or trips a sanitizer. An artifact that
//! parses reads the same twice; its platforms are not empty, its module starts with
//! the MLIR bytecode magic and its kept inputs are increasing indices of its inputs;
//! its VJP, if it has one, reads or is refused with a typed error; and the same bytes
//! with 1 to 8 bytes cut off the end either are refused or read as exactly the same
//! artifact (the truncation promise of `Artifact::from_bytes`). A compiled kernel takes
//! as many parameters as the artifact has inputs.
//!
//! **Which modules reach the plugin.** The CPU plugin's MLIR bytecode reader has
//! defects handoff cannot contain in-process: besides C++ exceptions (which handoff's
//! guard turns into `XlaError::PluginException`), some malformed modules make it call
//! `abort()` ("LLVM ERROR: Property conversion failed"), corrupt its heap ("malloc():
//! invalid size") or never return. A run that compiled every mutated module would
//! report those plugin defects within minutes and say nothing about handoff. So by
//! default the plugin compiles only modules the harness knows it survives: those of the
//! seed corpus and of `regressions/artifact/` (which holds a module whose compile
//! throws, so the guard is exercised on every run), with any metadata around them.
//! `HANDOFF_FUZZ_ARTIFACT_COMPILE=all` compiles every module that parses, to hunt for
//! plugin defects (run it with `-fork=1 -ignore_crashes=1`; see RELIABILITY.md).
//! A known module compiles the first time it is seen and then for one input in 16
//! (picked by the input's hash, so a replay takes the same path): a compile costs
//! milliseconds, and a million executions must fit in a run.
//!
//! **`stablehlo`** ([`fuzz_stablehlo`]): bytes as StableHLO text or bytecode, up to
//! where handoff itself parses anything: `Source::from_bytes` (recognition by
//! content: bytecode magic, a `jax.export` flatbuffer, or UTF-8 text),
//! `Program::text` (the module name), and `hlo::parameters`, handoff's protobuf reader
//! of the `HloModuleProto` a plugin returns (fed the same bytes: its input comes from
//! the plugin, but it must not panic on any). The plugin's compile is not included by
//! default (milliseconds per execution, and the same plugin defects as above);
//! `HANDOFF_FUZZ_STABLEHLO_COMPILE=1` adds it.

use handoff_xla::{Artifact, Buffer, Client, CompileOptions, Kernel, Program, Source, XlaError};
use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, OnceLock};

fn hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// The CPU client, if `HANDOFF_PJRT_PLUGIN` is set (a note is printed once if not).
fn client() -> Option<&'static Client> {
    static CLIENT: OnceLock<Option<Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            if std::env::var_os(handoff_xla::PLUGIN_ENV).is_none_or(|v| v.is_empty()) {
                eprintln!(
                    "handoff-fuzz: {} is not set: the plugin's compile is skipped \
                     (`eval \"$(cargo xtask env)\"` sets it)",
                    handoff_xla::PLUGIN_ENV
                );
                return None;
            }
            Some(Client::from_env().expect("the CPU PJRT client"))
        })
        .as_ref()
}

/// Checks the oracle on a failure: a typed error with a non-empty message.
fn check_error(at: &str, e: &XlaError) {
    let msg = e.to_string();
    assert!(!msg.trim().is_empty(), "{at}: an empty message: {e:?}");
    match e {
        XlaError::Invalid { field, value, reason } => {
            assert!(!field.is_empty() && !value.is_empty() && !reason.is_empty(), "{at}: {e:?}");
        }
        XlaError::Unsupported { feature, detail } => {
            assert!(!feature.is_empty() && !detail.is_empty(), "{at}: {e:?}");
        }
        XlaError::Pjrt { call, .. } => assert!(!call.is_empty(), "{at}: {e:?}"),
        XlaError::PluginException { call, exception } => {
            assert!(!call.is_empty() && !exception.is_empty(), "{at}: {e:?}")
        }
        XlaError::NoVjp { program, reason } => assert!(!reason.is_empty(), "{at}: {program}: {e:?}"),
        other => panic!("{at}: an unexpected kind of error: {other:?}"),
    }
}

/// The modules the plugin compiles by default: those of the seeds and kept regressions.
fn known_modules() -> &'static HashSet<u64> {
    static KNOWN: OnceLock<HashSet<u64>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut known = HashSet::new();
        for dir in ["corpus/artifact", "regressions/artifact"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
            for entry in entries.flatten() {
                if let Ok(a) = std::fs::read(entry.path())
                    .map_err(|_| ())
                    .and_then(|b| Artifact::from_bytes(&b).map_err(|_| ()))
                {
                    known.insert(hash(a.module()));
                }
            }
        }
        known
    })
}

fn compile_all() -> bool {
    static ALL: OnceLock<bool> = OnceLock::new();
    *ALL.get_or_init(|| std::env::var("HANDOFF_FUZZ_ARTIFACT_COMPILE").is_ok_and(|v| v == "all"))
}

/// Whether this input's artifact goes to the plugin (see the module docs).
fn should_compile(data: &[u8], artifact: &Artifact) -> bool {
    if compile_all() {
        return true;
    }
    let module = hash(artifact.module());
    if !known_modules().contains(&module) {
        return false;
    }
    static SEEN: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
    let first = SEEN.lock().unwrap().get_or_insert_with(HashSet::new).insert(module);
    first || hash(data).is_multiple_of(16)
}

fn check_artifact(a: &Artifact, data: &[u8]) {
    assert!(!a.platforms().is_empty(), "an artifact without platforms: {a:?}");
    assert!(a.module().starts_with(b"ML\xefR"), "a module that is not bytecode: {a:?}");
    let kept = a.kept_inputs();
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "kept inputs not increasing: {a:?}");
    assert!(kept.iter().all(|&k| k < a.inputs().len()), "a kept input past the inputs: {a:?}");
    assert_eq!(a.takes_platform_index(), a.platforms().len() > 1);
    for (i, spec) in a.inputs().iter().chain(a.outputs()).enumerate() {
        assert!(spec.dtype.is_some(), "spec {i} without a dtype: {a:?}");
    }
    let again = Artifact::from_bytes(data).expect("the same bytes read twice");
    assert!(&again == a, "the same bytes read as two artifacts");
    for cut in 1..=8.min(data.len()) {
        match Artifact::from_bytes(&data[..data.len() - cut]) {
            Ok(t) => assert!(&t == a, "cut by {cut}, the bytes read as another artifact"),
            Err(e) => check_error(&format!("the artifact cut by {cut}"), &e),
        }
    }
    if a.has_vjp() {
        match a.vjp() {
            Ok(v) => assert!(!v.platforms().is_empty()),
            Err(e) => check_error("Artifact::vjp", &e),
        }
    }
}

/// Target `artifact`: see the module docs.
pub fn fuzz_artifact(data: &[u8]) {
    let artifact = match Artifact::from_bytes(data) {
        Ok(a) => a,
        Err(e) => return check_error("Artifact::from_bytes", &e),
    };
    check_artifact(&artifact, data);
    let Some(client) = client() else { return };
    if !should_compile(data, &artifact) {
        return;
    }
    let inputs = artifact.inputs().to_vec();
    // What `Kernel::load` does with the bytes of a file.
    let source = match Source::from_bytes(data.to_vec(), None) {
        Ok(s) => s,
        Err(e) => return check_error("Source::from_bytes", &e),
    };
    assert!(matches!(source, Source::Artifact(_)), "an artifact recognized as {source:?}");
    let kernel = match Kernel::compile(client, source, &CompileOptions::default()) {
        Ok(k) => k,
        Err(e) => return check_error("Kernel::compile", &e),
    };
    if let Some(params) = kernel.parameters() {
        assert_eq!(params.len(), inputs.len(), "the kernel's parameters are not the artifact's inputs");
    }
    call_on_zeros(client, &kernel, &inputs);
}

/// One call of `kernel` on zeros of the shapes the artifact declares (f32 inputs of at
/// most 64 Ki elements only): a typed error or outputs, whatever the metadata says.
fn call_on_zeros(client: &Client, kernel: &Kernel, inputs: &[handoff_xla::ArraySpec]) {
    let f32 = handoff::dtype::DataType::F32;
    let mut buffers = Vec::new();
    for spec in inputs {
        let n = spec.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?));
        match n {
            Some(n) if spec.dtype == Some(f32) && n <= 1 << 16 => {
                let device = client.device(0).expect("device 0");
                match client.buffer_from_host(&device, &vec![0f32; n], &spec.shape) {
                    Ok(b) => buffers.push(b),
                    Err(e) => return check_error("Client::buffer_from_host", &e),
                }
            }
            _ => return,
        }
    }
    let r: handoff_xla::Result<Vec<Buffer>> = kernel.call(buffers.iter().collect::<Vec<_>>());
    match r {
        Ok(outs) => assert_eq!(outs.len(), kernel.outputs().len()),
        Err(e) => check_error("Kernel::call", &e),
    }
}

/// Target `stablehlo`: see the module docs.
pub fn fuzz_stablehlo(data: &[u8]) {
    // The protobuf reader of a plugin's optimized program: any bytes, no panic.
    if let Some(params) = handoff_xla::hlo::parameters(data) {
        for p in &params {
            let _ = p.to_string();
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let p = Program::text(text);
        assert!(!p.name().is_empty() && !p.is_bytecode() || data.starts_with(b"ML\xefR"));
    }
    let source = match Source::from_bytes(data.to_vec(), None) {
        Ok(s) => s,
        Err(e) => return check_error("Source::from_bytes", &e),
    };
    match &source {
        Source::Program(p) => {
            assert_eq!(p.is_bytecode(), data.starts_with(b"ML\xefR"));
            assert_eq!(p.code(), data);
        }
        Source::Artifact(a) => check_artifact(a, data),
    }
    static COMPILE: OnceLock<bool> = OnceLock::new();
    if !*COMPILE.get_or_init(|| std::env::var_os("HANDOFF_FUZZ_STABLEHLO_COMPILE").is_some()) {
        return;
    }
    let Some(client) = client() else { return };
    if let Err(e) = Kernel::compile(client, source, &CompileOptions::default()) {
        check_error("Kernel::compile", &e);
    }
}
