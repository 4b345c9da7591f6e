//! The flatbuffer verification every artifact goes through before anything is read:
//! limits sized to the bytes given (an artifact comes from anywhere), and errors that
//! name the field and the byte offset at fault.

use super::fb;
use crate::error::{Result, XlaError};
use flatbuffers::{ErrorTraceDetail, InvalidFlatbuffer, VerifierOptions};

/// The verifier's limits for `len` bytes.
///
/// - depth 64 (the default): nested VJPs and pytree definitions recurse no deeper;
/// - tables: every table needs at least 4 bytes (its vtable offset), so a buffer of
///   `len` bytes holds at most `len / 4` distinct ones; a table referenced twice is
///   verified twice, which JAX's serializer never does (it indexes shared avals and
///   shardings instead), so `len / 2 + 1024` leaves room for that and bounds the
///   verifier's work by the input's size instead of the default million tables;
/// - apparent size (the bytes verified, counting repeats) at 4 times the length plus
///   1 MiB, for the same reason: a small buffer whose offsets all point at one large
///   string cannot make the verifier check gigabytes.
pub(super) fn options(len: usize) -> VerifierOptions {
    VerifierOptions {
        max_depth: 64,
        max_tables: len / 2 + 1024,
        max_apparent_size: len.saturating_mul(4).saturating_add(1 << 20),
        ignore_missing_null_terminator: false,
    }
}

/// Verifies `bytes` as an `Exported` table and returns its root.
pub(super) fn root(bytes: &[u8]) -> Result<fb::Exported<'_>> {
    flatbuffers::root_with_opts::<fb::Exported>(&options(bytes.len()), bytes)
        .map_err(|e| error(bytes.len(), &e))
}

/// The path from the root to what failed, e.g. `in_avals[1].shape[0]` (the verifier's
/// trace, innermost first, read outermost first).
fn path(trace: &[ErrorTraceDetail]) -> String {
    let mut p = String::new();
    for d in trace.iter().rev() {
        match d {
            ErrorTraceDetail::TableField { field_name, .. } => {
                if !p.is_empty() {
                    p.push('.');
                }
                p.push_str(field_name);
            }
            ErrorTraceDetail::VectorElement { index, .. } => p.push_str(&format!("[{index}]")),
            ErrorTraceDetail::UnionVariant { variant, .. } => p.push_str(&format!("({variant})")),
        }
    }
    p
}

/// An [`XlaError::Invalid`] naming the field (`Exported.<path>`), the byte offset and
/// what is wrong there.
#[cold]
#[inline(never)]
fn error(len: usize, e: &InvalidFlatbuffer) -> XlaError {
    use InvalidFlatbuffer::*;
    let hint = "a truncated or corrupted artifact (the bytes of jax.export's Exported.serialize() are \
                a flatbuffer)";
    let (trace, at, what): (&[ErrorTraceDetail], String, String) = match e {
        RangeOutOfBounds { range, error_trace } => (
            error_trace.as_ref(),
            format!("bytes {}..{}", range.start, range.end),
            format!("they lie past the artifact's end ({len} bytes): {hint}"),
        ),
        SignedOffsetOutOfBounds { soffset, position, error_trace } => (
            error_trace.as_ref(),
            format!("byte {position}"),
            format!("its vtable offset {soffset} points outside the artifact ({len} bytes): {hint}"),
        ),
        Unaligned { position, unaligned_type, error_trace } => (
            error_trace.as_ref(),
            format!("byte {position}"),
            format!("a {unaligned_type} there is not aligned: {hint}"),
        ),
        MissingNullTerminator { range, error_trace } => (
            error_trace.as_ref(),
            format!("bytes {}..{}", range.start, range.end),
            format!("the string there has no NUL terminator within the artifact ({len} bytes): {hint}"),
        ),
        Utf8Error { error, range, error_trace } => (
            error_trace.as_ref(),
            format!("bytes {}..{}", range.start, range.end),
            format!("the string there is not UTF-8 ({error}): {hint}"),
        ),
        MissingRequiredField { required, error_trace } => (
            error_trace.as_ref(),
            "absent".to_owned(),
            format!("required field {required} is missing: {hint}"),
        ),
        InconsistentUnion { field, field_type, error_trace } => (
            error_trace.as_ref(),
            "inconsistent".to_owned(),
            format!("exactly one of the union's type ({field_type}) and value ({field}) is present: {hint}"),
        ),
        TooManyTables => (
            &[],
            format!("{len} bytes"),
            format!("more than {} tables to verify (limit for this size)", options(len).max_tables),
        ),
        ApparentSizeTooLarge => (
            &[],
            format!("{len} bytes"),
            format!(
                "more than {} bytes to verify, counting repeats (limit for this size): its offsets \
                 point at the same data many times",
                options(len).max_apparent_size
            ),
        ),
        DepthLimitReached => (
            &[],
            format!("{len} bytes"),
            format!(
                "tables nested past the depth limit of {} (VJPs of VJPs, or pytrees)",
                options(len).max_depth
            ),
        ),
        // `InvalidFlatbuffer` is not `non_exhaustive` today; kept for a future variant.
        #[allow(unreachable_patterns)]
        other => (&[], format!("{len} bytes"), format!("{}: {hint}", other.to_string().trim())),
    };
    let p = path(trace);
    let field = if p.is_empty() {
        "jax.export artifact".to_owned()
    } else {
        format!("jax.export artifact: Exported.{p}")
    };
    XlaError::invalid(field, at, what)
}
