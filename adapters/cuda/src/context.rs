//! The cudarc side: one event-tracking-free context per device, and the handoff
//! [`Stream`] of a cudarc stream.

use cudarc::driver::{CudaContext, CudaStream, result as cu};
use handoff_runtime::{Error, Result, Stream, cuda};
use std::sync::{Arc, Mutex, OnceLock};

#[cold]
#[inline(never)]
pub(crate) fn refuse<T>(message: String) -> Result<T> {
    Err(Error::Adapter { adapter: "handoff-cuda", message })
}

static CONTEXTS: OnceLock<Box<[OnceLock<Arc<CudaContext>>]>> = OnceLock::new();
static OPENING: Mutex<()> = Mutex::new(());

/// A cudarc [`CudaContext`] on the primary context of device `ordinal`, with
/// cudarc's event tracking **disabled**, cached for the process.
///
/// handoff orders work between streams itself, so cudarc's own tracking is not
/// needed and would add hidden CUDA calls (and one `cuCtxSynchronize` in the first
/// `new_stream`). Streams and slices made from this context make none. It is the
/// context imported views live in, and a good one for your own producers. Making it
/// leaves the calling thread's current context as it was.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a usable driver or device `ordinal`;
/// [`Error::Backend`] if the driver refuses the context.
pub fn context(ordinal: u32) -> Result<Arc<CudaContext>> {
    context_ref(ordinal).cloned()
}

/// [`context`] without a new reference: the cached context itself, which lives as
/// long as the process.
pub(crate) fn context_ref(ordinal: u32) -> Result<&'static Arc<CudaContext>> {
    // The runtime probes libcuda without panicking; cudarc is safe to call after.
    let devices = cuda::device_count()?;
    let cells = CONTEXTS.get_or_init(|| (0..devices).map(|_| OnceLock::new()).collect());
    let Some(cell) = cells.get(ordinal as usize) else {
        return Err(Error::CudaUnavailable {
            reason: format!(
                "device ordinal {ordinal} does not exist: this machine has {devices} CUDA device(s)"
            ),
        });
    };
    if let Some(c) = cell.get() {
        return Ok(c);
    }
    let _opening = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = cell.get() {
        return Ok(c);
    }
    let driver = |call: &'static str| {
        move |e: cu::DriverError| Error::Backend {
            backend: "cuda",
            call,
            message: format!("{e} (cuda:{ordinal})"),
        }
    };
    let before = cu::ctx::get_current().map_err(driver("cuCtxGetCurrent"))?;
    let ctx = CudaContext::new(ordinal as usize).map_err(driver("cuDevicePrimaryCtxRetain"))?;
    // SAFETY: no slice has been made from this context yet, so none is tracked.
    unsafe { ctx.disable_event_tracking() };
    if before != Some(ctx.cu_ctx()) {
        // SAFETY: restores the context (or none) that was current before.
        unsafe { cu::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) }
            .map_err(driver("cuCtxSetCurrent"))?;
    }
    Ok(cell.get_or_init(|| ctx))
}

/// The handoff [`Stream`] of a cudarc stream. The `Stream` (and every clone) keeps
/// the `CudaStream` alive, so a release recorded on it later never meets a
/// destroyed stream.
///
/// # Errors
/// [`Error::Adapter`] when the stream belongs to a non-primary context (handoff
/// orders work on primary contexts, which PyTorch and XLA share);
/// [`Error::CudaUnavailable`] as [`cuda::stream`].
pub fn stream_of(stream: &Arc<CudaStream>) -> Result<Stream> {
    let ctx = stream.context();
    if !ctx.is_primary() {
        return refuse(format!(
            "stream {:p} belongs to a non-primary context of cuda:{}: handoff orders work on primary \
             contexts only (make it with CudaContext::new or handoff_cuda::context)",
            stream.cu_stream(),
            ctx.ordinal()
        ));
    }
    let ordinal = u32::try_from(ctx.ordinal())
        .or_else(|_| refuse(format!("device ordinal {} does not fit in u32", ctx.ordinal())))?;
    // SAFETY: a stream of the primary context of `ordinal`, kept alive by the owner
    // attached to the result.
    let borrowed = unsafe { cuda::stream(ordinal, stream.cu_stream() as usize as u64) }?;
    Ok(borrowed.with_owner(stream.clone()))
}
