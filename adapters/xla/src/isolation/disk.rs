//! Passes kept on disk, for the processes that come after: a file that passed the
//! isolated check once is not checked again on this machine with the same plugin, when
//! the caller names a directory ([`LoadOptions::verdict_cache`](super::LoadOptions::verdict_cache)
//! or [`VERDICT_CACHE_ENV`](super::VERDICT_CACHE_ENV)).
//!
//! One file per pass, `<dir>/<hash>.pass`: a header naming what the pass holds for (the
//! plugin's path, platform version, file size and modification time; the device; the
//! child's limits; the length of the bytes), then the bytes themselves. A lookup
//! compares all of it, the bytes byte for byte, so a name that collides, a changed
//! plugin or a file someone edited reads as no pass. Only passes are kept: a refusal
//! can be the machine's (a time limit reached under load), and refused files are rare.
//! Writing is best effort (a temporary file renamed into place); a directory that
//! cannot be written only means the next process checks again.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

/// What a pass holds for, as the header of its file; `None` when the plugin's file
/// cannot be read (then nothing is kept).
pub(super) fn header(
    plugin: &Path,
    platform_version: &str,
    device: usize,
    limits: (Duration, u64),
    bytes: &[u8],
) -> Option<String> {
    let meta = std::fs::metadata(plugin).ok()?;
    let modified = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    Some(format!(
        "handoff-xla isolated check: passed\nplugin {}\nplatform {platform_version}\nplugin file {} bytes, \
         modified {modified} ns\ndevice {device}\nlimits {} ms, {} bytes\nbytes {}\n",
        plugin.display(),
        meta.len(),
        limits.0.as_millis(),
        limits.1,
        bytes.len()
    ))
}

fn file(dir: &Path, header: &str, bytes: &[u8]) -> PathBuf {
    let mut h = DefaultHasher::new();
    header.hash(&mut h);
    bytes.hash(&mut h);
    dir.join(format!("{:016x}.pass", h.finish()))
}

/// Whether `dir` holds a pass for exactly these bytes under exactly this header.
pub(super) fn passed(dir: &Path, header: &str, bytes: &[u8]) -> bool {
    std::fs::read(file(dir, header, bytes)).is_ok_and(|kept| {
        kept.len() == header.len() + bytes.len()
            && kept.starts_with(header.as_bytes())
            && kept[header.len()..] == *bytes
    })
}

/// Keeps a pass in `dir` (best effort: errors are the next process's extra check).
pub(super) fn keep_pass(dir: &Path, header: &str, bytes: &[u8]) {
    let target = file(dir, header, bytes);
    let temporary = target.with_extension(format!("{}.partial", std::process::id()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&temporary, [header.as_bytes(), bytes].concat()))
        .and_then(|()| std::fs::rename(&temporary, &target));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_found_only_for_the_same_header_and_bytes() {
        let dir = std::env::temp_dir().join(format!("handoff-verdicts-unit-{}", std::process::id()));
        let plugin = std::env::current_exe().unwrap();
        let limits = (Duration::from_secs(120), 8 << 30);
        let bytes = b"module @m {}".to_vec();
        let h = header(&plugin, "cpu 1", 0, limits, &bytes).unwrap();
        assert!(!passed(&dir, &h, &bytes), "nothing kept yet");
        keep_pass(&dir, &h, &bytes);
        assert!(passed(&dir, &h, &bytes));
        // Other bytes, another device, other limits: no pass.
        assert!(!passed(&dir, &h, b"module @n {}"));
        let other_device = header(&plugin, "cpu 1", 1, limits, &bytes).unwrap();
        assert!(!passed(&dir, &other_device, &bytes));
        let other_limits = header(&plugin, "cpu 1", 0, (Duration::from_secs(5), 8 << 30), &bytes).unwrap();
        assert!(!passed(&dir, &other_limits, &bytes));
        // A kept file whose bytes were changed in place reads as no pass.
        let path = file(&dir, &h, &bytes);
        let mut kept = std::fs::read(&path).unwrap();
        *kept.last_mut().unwrap() ^= 1;
        std::fs::write(&path, kept).unwrap();
        assert!(!passed(&dir, &h, &bytes));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
