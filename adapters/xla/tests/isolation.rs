//! The isolated loader on the CPU plugin: bytes that kill a process that compiles them
//! are refused with a typed error, and the calling process survives; sound bytes load
//! once per plugin; a program without the child's hook is reported, never run on the
//! bytes; a child past its time limit is killed.

mod common;

use handoff_xla::isolation::children_run;
use handoff_xla::{Buffer, Kernel, LoadOptions, Source, XlaError};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

fn programs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs")
}

/// Damaged artifacts (seeded byte mutations of the committed ones, found by
/// `examples/isolation_sweep.rs`), each of which kills a process that compiles it.
fn damaged() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/damaged");
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).expect("tests/damaged").flatten().map(|e| e.path()).collect();
    files.sort();
    assert!(!files.is_empty(), "no damaged artifacts in {}", dir.display());
    files
}

/// `children_run` is per process and tests run on threads: the tests that run
/// children take turns.
static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

const CONTROL_ENV: &str = "HANDOFF_XLA_TEST_IN_PROCESS";

/// The control's child: with `CONTROL_ENV` set (by the test below, in a process of its
/// own), compiles that file in this process, unprotected.
#[test]
fn in_process_control_child() {
    let Some(file) = std::env::var_os(CONTROL_ENV) else { return };
    let Some(c) = common::client() else { return };
    let r = Kernel::load_with(&c, PathBuf::from(file), &LoadOptions::trusted());
    println!("the in-process load returned: {:?}", r.map(|k| k.name().to_owned()));
}

/// The control: `file` compiled in a process of its own, unprotected; how that process ended.
fn in_process_outcome(file: &Path) -> std::process::ExitStatus {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "in_process_control_child", "--nocapture", "--test-threads=1"])
        .env(CONTROL_ENV, file)
        .output()
        .unwrap()
        .status
}

#[test]
fn damaged_artifacts_that_kill_an_in_process_load_are_refused_and_the_caller_survives() {
    let _turn = turn();
    let Some(c) = common::client() else { return };
    for file in damaged() {
        let bytes = std::fs::read(&file).unwrap();
        // Past handoff's own format checks: the child is what stops it.
        assert!(matches!(Source::from_bytes(bytes, None), Ok(Source::Artifact(_))), "{}", file.display());
        let e = Kernel::load(&c, &file).unwrap_err();
        let XlaError::Refused { ref name, ref outcome, .. } = e else { panic!("{}: {e:?}", file.display()) };
        assert!(name.ends_with(&*file.file_name().unwrap().to_string_lossy()), "{e}");
        assert!(outcome.starts_with("killed by signal"), "{}: {e}", file.display());
        println!("{e}");
        use std::os::unix::process::ExitStatusExt;
        let control = in_process_outcome(&file);
        assert!(
            control.signal().is_some(),
            "{}: the in-process control ended with {control}",
            file.display()
        );
    }
}

#[test]
fn a_sound_artifact_is_checked_once_then_loads() {
    let _turn = turn();
    let Some(c) = common::client() else { return };
    let path = programs().join("block_f32_8x16_cpu_vjp.jaxexport");
    let before = children_run();
    let k = Kernel::load(&c, &path).unwrap();
    let d = c.device(0).unwrap();
    let x = c.buffer_from_host(&d, &[0.5f32; 128], &[8, 16]).unwrap();
    let w = c.buffer_from_host(&d, &[0.1f32; 256], &[16, 16]).unwrap();
    let [_y]: [Buffer; 1] = k.call([&x, &w]).unwrap();
    assert_eq!(children_run(), before + 1, "one child");
    let _again = Kernel::load(&c, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let _as_bytes = Kernel::load_bytes(&c, bytes, &LoadOptions::default()).unwrap();
    assert_eq!(children_run(), before + 1, "the same bytes with the same plugin: the verdict is kept");
    let _trusted =
        Kernel::load_with(&c, programs().join("ln_gelu_f32_8x16_cpu.jaxexport"), &LoadOptions::trusted())
            .unwrap();
    assert_eq!(children_run(), before + 1, "trusted: no child");
}

/// The artifact whose compile throws a C++ exception: the child's plugin refuses it
/// with an error, which comes back with the plugin's own message.
#[test]
fn bytes_the_plugin_refuses_come_back_with_its_message() {
    let _turn = turn();
    let Some(c) = common::client() else { return };
    let bytes = include_bytes!("../../../fuzz/regressions/artifact/compile-throws-cpp-exception").to_vec();
    let e = Kernel::load_bytes(&c, bytes, &LoadOptions::default()).unwrap_err();
    match &e {
        XlaError::Refused { outcome, last_line, .. } => {
            assert_eq!(outcome, "the plugin refused them");
            assert!(last_line.contains("PJRT_Client_Compile"), "{e}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
}

/// A checker that is not a program linking handoff-xla never gets the bytes' verdict:
/// the error says what to set. One that answers but hangs is killed at the time limit.
#[test]
fn a_program_without_the_hook_is_reported_and_a_hung_child_is_killed() {
    let _turn = turn();
    let Some(c) = common::client() else { return };
    let bytes = std::fs::read(programs().join("ln_gelu_f32_8x16_cpu.jaxexport")).unwrap();
    // Bytes no other test checks, so no verdict is kept for them yet.
    let mut unique = bytes.clone();
    unique.extend_from_slice(b"\0padding of this test");
    let e = Kernel::load_bytes(&c, unique.clone(), &LoadOptions::default().checker("/bin/true")).unwrap_err();
    assert!(e.to_string().contains("HANDOFF_XLA_CHECKER"), "{e}");
    let dir = std::env::temp_dir().join(format!("handoff-isolation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hung = dir.join("hung-checker");
    std::fs::write(&hung, "#!/bin/sh\necho 'handoff-xla isolated check 1'\nexec sleep 30\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hung, std::fs::Permissions::from_mode(0o755)).unwrap();
    let options = LoadOptions::default().checker(&hung).time_limit(Duration::from_millis(300));
    let e = Kernel::load_bytes(&c, unique, &options).unwrap_err();
    assert!(
        matches!(&e, XlaError::Refused { outcome, .. } if outcome.starts_with("still running after")),
        "{e:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The memory limit reaches the child: one too small to load the plugin is an error.
#[test]
fn the_memory_limit_applies_to_the_child() {
    let _turn = turn();
    let Some(c) = common::client() else { return };
    let mut bytes = std::fs::read(programs().join("ln_gelu_f32_8x16_cpu.jaxexport")).unwrap();
    bytes.extend_from_slice(b"\0padding of the memory-limit test");
    let e =
        Kernel::load_bytes(&c, bytes.clone(), &LoadOptions::default().memory_limit(32 << 20)).unwrap_err();
    println!("{e}");
    let k = Kernel::load_bytes(&c, bytes, &LoadOptions::default());
    assert!(k.is_ok(), "{k:?}");
}

/// `handoff-check`, as someone who received files runs it: what each file is, whether it
/// compiles (isolated), exit status 0 only when every file did.
#[test]
fn handoff_check_describes_each_file_and_says_whether_it_compiles() {
    let _turn = turn();
    let Some(_) = common::client() else { return };
    let check = |files: &[&Path]| {
        let out = Command::new(env!("CARGO_BIN_EXE_handoff-check")).args(files).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let sound = programs().join("block_f32_8x16_cpu_vjp.jaxexport");
    let (code, text) = check(&[&sound]);
    assert_eq!(code, Some(0), "{text}");
    for line in [
        "jax.export artifact of block",
        "platforms: cpu",
        "inputs: (f32[8, 16], f32[16, 16])",
        "VJP: serialized",
        "module: StableHLO_v",
        "compiles on cpu",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    let damaged = damaged();
    let dir = std::env::temp_dir().join(format!("handoff-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.jaxexport");
    std::fs::write(&empty, b"").unwrap();
    let (code, text) = check(&[&sound, &damaged[0], &empty]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("does not compile") && text.contains("killed by signal"), "{text}");
    assert!(text.contains("empty file"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pass_kept_on_disk_spares_later_processes_the_child_and_only_for_the_same_bytes() {
    let _turn = turn();
    let Some(_) = common::client() else { return };
    let cache = std::env::temp_dir().join(format!("handoff-verdicts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    // Each run of handoff-check is a later process for the one before it.
    let check = |file: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_handoff-check"))
            .arg(file)
            .env("HANDOFF_XLA_VERDICT_CACHE", &cache)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let sound = programs().join("block_f32_8x16_cpu_vjp.jaxexport");
    assert!(check(&sound).contains("isolated: checked in a child process"));
    let kept: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(kept.len(), 1, "one pass kept: {kept:?}");
    assert!(check(&sound).contains("isolated: passed the check before (verdict kept)"));
    // The same artifact with one more byte is other bytes: checked again.
    let grown = cache.join("grown.jaxexport");
    std::fs::write(&grown, [std::fs::read(&sound).unwrap(), vec![0]].concat()).unwrap();
    assert!(check(&grown).contains("isolated: checked in a child process"));
    // A kept pass whose bytes were changed on disk is no pass.
    let mut bytes = std::fs::read(&kept[0]).unwrap();
    *bytes.last_mut().unwrap() ^= 0x5a;
    std::fs::write(&kept[0], bytes).unwrap();
    assert!(check(&sound).contains("isolated: checked in a child process"));
    let _ = std::fs::remove_dir_all(&cache);
}
