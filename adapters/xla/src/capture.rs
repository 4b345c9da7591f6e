//! XLA executions inside a CUDA graph capture.
//!
//! A stream the caller captures (a PyTorch stream under `torch.cuda.graph`, or one of
//! its own) can hold XLA executions: a hand-off into XLA orders XLA's ready stream
//! after the capturing stream, which joins it (and PJRT's compute stream, which waits
//! there) to the capture. Two things of PJRT's would then break the graph, and are
//! settled when an XLA buffer is made ready on a capturing stream (every output that
//! goes back to the caller is):
//!
//! - PJRT's streams end with work the capturing stream never waits on (its ready
//!   stream's tail, its host callbacks), which `cuStreamEndCapture` refuses as unjoined
//!   work. The capturing stream waits on XLA's ready stream and is made to depend on
//!   every leaf of the graph.
//! - PJRT enqueues host callbacks (`cuLaunchHostFunc`) that release what an execution
//!   held; captured, they would run again at every replay. They are taken out of the
//!   graph and run once when the graph is gone.
//!
//! What an execution in the graph uses lives as long as the graph: its inputs' views
//! and PJRT's holds (released by the callbacks taken out), and its outputs, whose
//! addresses are baked into the graph: a buffer made ready on a capturing stream keeps
//! a share of itself with the graph (`handoff_runtime::graph::keep`), whenever its
//! hand-off is released.

use crate::client::ClientInner;
use handoff_runtime::Stream;

/// Settles the capture `consumer` belongs to, after an XLA buffer of `client`'s device
/// `device` was made ready on it (see the module docs); whether it captures (nothing is
/// done when it does not).
pub(crate) fn settle(
    client: &ClientInner,
    device: usize,
    consumer: &Stream,
) -> handoff_runtime::Result<bool> {
    if !consumer.is_capturing()? {
        return Ok(false);
    }
    if let Some(ready) = client.ready_streams[device].get().filter(|r| !r.is_host()) {
        consumer.wait(&ready.record()?)?;
    }
    handoff_runtime::cuda::settle_capture(consumer, |code| client.plugin.owns_code(code))?;
    Ok(true)
}
