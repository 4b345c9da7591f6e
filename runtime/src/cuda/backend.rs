//! The CUDA [`Backend`]: one per device ordinal, on the device's primary context.

use super::driver::{self, backend_error, check, count_calls};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{Backend, EventPool, RawEvent, RawStream};
use cudarc::driver::sys;
use std::sync::{Arc, Mutex, OnceLock};

/// The raw handle of the legacy default stream, as handoff stores it.
pub(crate) const LEGACY: RawStream = 0;
/// `CU_STREAM_LEGACY`, another name of the legacy default stream.
pub(crate) const CU_STREAM_LEGACY: RawStream = 0x1;
/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
pub(crate) const CU_STREAM_PER_THREAD: RawStream = 0x2;

/// The backend of one CUDA device: its primary context and its event pool.
pub(crate) struct CudaBackend {
    ordinal: u32,
    ctx: sys::CUcontext,
    pool: EventPool,
}

// SAFETY: `ctx` is a driver handle, valid on every thread; the driver API is
// thread-safe and the handle is never released (backends live as long as the process).
unsafe impl Send for CudaBackend {}
// SAFETY: as above; the backend has no interior state but the pool, which locks.
unsafe impl Sync for CudaBackend {}

static BACKENDS: OnceLock<Box<[OnceLock<Arc<CudaBackend>>]>> = OnceLock::new();
static OPENING: Mutex<()> = Mutex::new(());

/// The cached backend of device `ordinal` (opened on first use).
pub(crate) fn backend(ordinal: u32) -> Result<&'static Arc<CudaBackend>> {
    let devices = driver::driver()?.devices;
    let cells = BACKENDS.get_or_init(|| (0..devices).map(|_| OnceLock::new()).collect());
    let Some(cell) = cells.get(ordinal as usize) else {
        return Err(Error::CudaUnavailable {
            reason: format!(
                "device ordinal {ordinal} does not exist: this machine has {devices} CUDA device(s)"
            ),
        });
    };
    if let Some(b) = cell.get() {
        return Ok(b);
    }
    let _opening = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = cell.get() {
        return Ok(b);
    }
    let b = Arc::new(CudaBackend::open(ordinal)?);
    Ok(cell.get_or_init(|| b))
}

impl CudaBackend {
    fn open(ordinal: u32) -> Result<CudaBackend> {
        let mut dev: sys::CUdevice = 0;
        count_calls(2);
        // SAFETY: `dev` is a valid out pointer; the driver is initialized.
        check(unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) })
            .map_err(|e| backend_error("cuDeviceGet", e, format_args!("ordinal {ordinal}")))?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out pointer and `dev` a device handle. The retained
        // primary context is never released: the backend is cached for the process.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) })
            .map_err(|e| backend_error("cuDevicePrimaryCtxRetain", e, format_args!("cuda:{ordinal}")))?;
        Ok(CudaBackend { ordinal, ctx, pool: EventPool::new() })
    }

    /// The device ordinal.
    pub(crate) fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device's primary context.
    pub(crate) fn context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// Makes the primary context current for the duration of the guard.
    ///
    /// Costs one `cuCtxGetCurrent` when it already is current (the usual case: PyTorch,
    /// XLA and cudarc all make the primary context current). When no context is
    /// current, it is set and left current (nothing to restore). When another context
    /// is current, it is pushed and popped again when the guard drops.
    pub(crate) fn enter(&self) -> Result<CtxGuard> {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        count_calls(1);
        // SAFETY: `current` is a valid out pointer.
        check(unsafe { sys::cuCtxGetCurrent(&mut current) })
            .map_err(|e| backend_error("cuCtxGetCurrent", e, format_args!("cuda:{}", self.ordinal)))?;
        if current == self.ctx {
            return Ok(CtxGuard { pushed: false });
        }
        count_calls(1);
        if current.is_null() {
            // SAFETY: `ctx` is a retained primary context, never released.
            check(unsafe { sys::cuCtxSetCurrent(self.ctx) })
                .map_err(|e| backend_error("cuCtxSetCurrent", e, format_args!("cuda:{}", self.ordinal)))?;
            return Ok(CtxGuard { pushed: false });
        }
        // SAFETY: as above; the guard pops it again.
        check(unsafe { sys::cuCtxPushCurrent_v2(self.ctx) })
            .map_err(|e| backend_error("cuCtxPushCurrent", e, format_args!("cuda:{}", self.ordinal)))?;
        Ok(CtxGuard { pushed: true })
    }

    /// `cuEventRecord`, with the device's context current.
    fn record_here(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        count_calls(1);
        // SAFETY: `event` comes from this device's pool; `stream` is a stream of this
        // device's primary context (or a special handle), borrowed from its owner.
        check(unsafe { sys::cuEventRecord(ev(event), st(stream)) }).map_err(|e| {
            backend_error(
                "cuEventRecord",
                e,
                format_args!("event {event:#x} on stream {}", describe(self.ordinal, stream)),
            )
        })
    }

    /// `cuStreamWaitEvent`, with the device's context current.
    fn wait_here(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        count_calls(1);
        // SAFETY: as in `record_here`; the wait is enqueued, the host does not block.
        check(unsafe { sys::cuStreamWaitEvent(st(stream), ev(event), 0) }).map_err(|e| {
            backend_error(
                "cuStreamWaitEvent",
                e,
                format_args!("stream {} waiting for event {event:#x}", describe(self.ordinal, stream)),
            )
        })
    }
}

/// Pops the context [`CudaBackend::enter`] pushed, if it pushed one.
pub(crate) struct CtxGuard {
    pushed: bool,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            count_calls(1);
            // SAFETY: pops the context this guard pushed on this thread.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

fn ev(event: RawEvent) -> sys::CUevent {
    event as usize as sys::CUevent
}

fn st(stream: RawStream) -> sys::CUstream {
    stream as usize as sys::CUstream
}

/// A stream's name in messages: `cuda:0/legacy`, `cuda:0/per-thread`, `cuda:0/0x55d0...`.
pub(crate) fn describe(ordinal: u32, stream: RawStream) -> String {
    match stream {
        LEGACY | CU_STREAM_LEGACY => format!("cuda:{ordinal}/legacy"),
        CU_STREAM_PER_THREAD => format!("cuda:{ordinal}/per-thread"),
        s => format!("cuda:{ordinal}/{s:#x}"),
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn event_pool(&self) -> &EventPool {
        &self.pool
    }

    fn create_event(&self) -> Result<RawEvent> {
        let _ctx = self.enter()?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        count_calls(1);
        // SAFETY: `event` is a valid out pointer; the device's context is current.
        check(unsafe { sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) })
            .map_err(|e| backend_error("cuEventCreate", e, format_args!("cuda:{}", self.ordinal)))?;
        Ok(event as usize as RawEvent)
    }

    fn destroy_event(&self, event: RawEvent) {
        if let Ok(_ctx) = self.enter() {
            count_calls(1);
            // SAFETY: the pool gives each event it created back exactly once.
            let _ = unsafe { sys::cuEventDestroy_v2(ev(event)) };
        }
    }

    fn record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let _ctx = self.enter()?;
        self.record_here(event, stream)
    }

    fn wait(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        let _ctx = self.enter()?;
        self.wait_here(stream, event)
    }

    fn record_and_wait(
        &self,
        event: RawEvent,
        producer: RawStream,
        consumer: RawStream,
    ) -> (bool, Result<()>) {
        // One context check for both calls.
        let _ctx = match self.enter() {
            Ok(g) => g,
            Err(e) => return (false, Err(e)),
        };
        match self.record_here(event, producer) {
            Ok(()) => (true, self.wait_here(consumer, event)),
            Err(e) => (false, Err(e)),
        }
    }

    fn query(&self, event: RawEvent) -> Result<bool> {
        let _ctx = self.enter()?;
        count_calls(1);
        // SAFETY: `event` comes from this device's pool; cuEventQuery never blocks.
        match unsafe { sys::cuEventQuery(ev(event)) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(backend_error(
                "cuEventQuery",
                cudarc::driver::result::DriverError(r),
                format_args!("event {event:#x} of cuda:{}", self.ordinal),
            )),
        }
    }

    fn synchronize(&self, event: RawEvent) -> Result<()> {
        let _ctx = self.enter()?;
        count_calls(1);
        // SAFETY: `event` comes from this device's pool. This blocks the host; the
        // runtime only calls it through `stats::host_sync`, which counts it.
        check(unsafe { sys::cuEventSynchronize(ev(event)) }).map_err(|e| {
            backend_error("cuEventSynchronize", e, format_args!("event {event:#x} of cuda:{}", self.ordinal))
        })
    }

    fn describe_stream(&self, stream: RawStream) -> String {
        describe(self.ordinal, stream)
    }

    fn is_thread_relative(&self, stream: RawStream) -> bool {
        stream == CU_STREAM_PER_THREAD
    }

    fn is_capturing(&self, stream: RawStream) -> Result<bool> {
        self.capture_graph(stream).map(|g| g.is_some())
    }

    fn relax_capture_mode(&self) {
        thread_local!(static RELAXED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
        if !RELAXED.get() {
            RELAXED.set(super::graph::relax_capture_mode());
        }
    }

    fn keep_with_graph(
        &self,
        stream: RawStream,
        keep_alive: crate::graph::Kept,
    ) -> std::result::Result<(), (Error, crate::graph::Kept)> {
        self.keep(stream, keep_alive)
    }
}
