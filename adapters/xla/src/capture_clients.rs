//! CUDA graph captures with XLA work inside: each capture's own PJRT client.
//!
//! A replay of a captured graph writes again the memory XLA gave the executions it
//! captured: their outputs, and their scratch, which XLA hands back to its allocator as
//! soon as an execution is enqueued. On the kernel's own client the buffers made after
//! the capture can land in that memory, and a replay then overwrites them.
//!
//! With capture clients on ([`set_enabled`]), a [`Kernel`](crate::Kernel) called inside a capture that
//! its thread announced (`handoff_runtime::graph::announce`; handoff-torch's
//! `Graph::capture` does) runs on a client that capture leases for the graph's life: a
//! second client of the kernel's plugin, with its own streams and allocator, on which
//! the kernel is compiled once more (and kept). Nothing outside the graph allocates from
//! that client. The lease is kept with the graph and gives the client back when the
//! graph is gone, for a later capture; at most [`limit`] clients per device are made.
//! Inputs that are buffers of the kernel's own client are viewed on the capture's client
//! (no copy).
//!
//! Off by default, as in the Python package (`handoff.capture_clients`). On an H100 the
//! check of this path (`gpu_graph`'s `on_a_capture_client` test) found 0 of 64 buffers
//! made after the capture overwritten, where the kernel's own client had 3 overwritten
//! and the replay's value wrong; they stay off until the graph examples have run with
//! them on a GPU and the crash the Python clients showed is understood.

use crate::client::Client;
use crate::error::{Result, XlaError};
use crate::options::ClientOptions;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

static ENABLED: AtomicBool = AtomicBool::new(false);
static LIMIT: AtomicUsize = AtomicUsize::new(8);

/// Switches capture clients on or off (see the [module docs](self)); off by default.
///
/// ```
/// handoff_xla::capture_clients::set_enabled(true);
/// assert!(handoff_xla::capture_clients::is_enabled());
/// # handoff_xla::capture_clients::set_enabled(false);
/// ```
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether capture clients are on.
pub fn is_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// At most `clients` capture clients per device (default 8): a capture past it is
/// refused with an error naming the limit. Refused: 0.
///
/// ```
/// assert!(handoff_xla::capture_clients::set_limit(0).is_err());
/// handoff_xla::capture_clients::set_limit(4)?;
/// assert_eq!(handoff_xla::capture_clients::limit(), 4);
/// # handoff_xla::capture_clients::set_limit(8)?;
/// # Ok::<(), handoff_xla::XlaError>(())
/// ```
pub fn set_limit(clients: usize) -> Result<()> {
    if clients == 0 {
        return Err(XlaError::invalid("capture client limit", clients, "at least one client per device"));
    }
    LIMIT.store(clients, Ordering::Relaxed);
    Ok(())
}

/// The most capture clients made per device.
pub fn limit() -> usize {
    LIMIT.load(Ordering::Relaxed)
}

/// The capture clients made so far, per CUDA device ordinal.
pub fn made() -> HashMap<u32, usize> {
    let pool = CLIENTS.pool.lock().unwrap_or_else(PoisonError::into_inner);
    let mut out = HashMap::new();
    for ((_, ordinal), n) in &pool.made {
        *out.entry(*ordinal).or_insert(0) += n;
    }
    out
}

/// The capture clients, keyed by plugin (its address) and device ordinal.
static CLIENTS: LazyLock<Leases<(usize, u32), Client>> = LazyLock::new(Leases::default);

/// `then` of the client that the capture `capture` leases for the device `ordinal` of
/// `own`'s plugin (leased at its first XLA call, and the lease kept with its graph).
/// A client's start and a compilation in `then` allocate device memory: allowed inside
/// the capture, as PyTorch's allocator allows its own.
pub(crate) fn on_leased<T>(
    own: &Client,
    ordinal: u32,
    capture: &handoff_runtime::graph::Capture,
    then: impl FnOnce(&Client) -> Result<T>,
) -> Result<T> {
    let key = (own.plugin() as *const _ as usize, ordinal);
    relaxed(|| {
        let (client, lease) = CLIENTS
            .lease(key, capture.id(), limit(), || Client::new(own.plugin(), &ClientOptions::default()))?;
        if let Some(lease) = lease {
            handoff_runtime::graph::keep(capture.stream(), lease)?;
        }
        then(&client)
    })
}

/// `f` with the thread's capture mode relaxed (CUDA), as PyTorch's allocator does.
fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "cuda")]
    return handoff_runtime::cuda::with_capture_mode_relaxed(f);
    #[cfg(not(feature = "cuda"))]
    f()
}

/// Clients leased to captures: idle ones per key, how many were made per key, and the
/// one each live capture holds (by capture id).
struct Pool<K, C> {
    free: HashMap<K, Vec<C>>,
    made: HashMap<K, usize>,
    leased: HashMap<u64, (K, C)>,
}

/// The bookkeeping of capture clients, apart from what a client is (tested with plain
/// values on the mock device).
pub(crate) struct Leases<K, C> {
    pool: Arc<Mutex<Pool<K, C>>>,
}

impl<K, C> Default for Leases<K, C> {
    fn default() -> Self {
        let pool = Pool { free: HashMap::new(), made: HashMap::new(), leased: HashMap::new() };
        Leases { pool: Arc::new(Mutex::new(pool)) }
    }
}

/// A capture's hold on its client, kept with its graph: dropped, it gives the client back.
pub(crate) struct Lease<K: Eq + Hash, C> {
    pool: Arc<Mutex<Pool<K, C>>>,
    capture: u64,
}

impl<K: Eq + Hash, C> Drop for Lease<K, C> {
    fn drop(&mut self) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((key, client)) = pool.leased.remove(&self.capture) {
            pool.free.entry(key).or_default().push(client);
        }
    }
}

impl<K: Eq + Hash + Clone + std::fmt::Debug, C: Clone> Leases<K, C> {
    /// The client of capture `capture` for `key`: the one it holds, else an idle one,
    /// else a new one (`make`), at most `limit` made per key. With a client not held
    /// before, the [`Lease`] to keep with the capture's graph.
    pub(crate) fn lease(
        &self,
        key: K,
        capture: u64,
        limit: usize,
        make: impl FnOnce() -> Result<C>,
    ) -> Result<(C, Option<Lease<K, C>>)> {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, client)) = pool.leased.get(&capture) {
            return Ok((client.clone(), None));
        }
        let client = match pool.free.get_mut(&key).and_then(Vec::pop) {
            Some(client) => client,
            None => {
                let made = pool.made.get(&key).copied().unwrap_or(0);
                if made >= limit {
                    return Err(XlaError::invalid(
                        "capture clients",
                        format!("{made} of {key:?}"),
                        format!(
                            "each live CUDA graph with XLA work holds a PJRT client of its own (limit {limit}): \
                             drop graphs no longer replayed, or raise the limit \
                             (handoff_xla::capture_clients::set_limit)"
                        ),
                    ));
                }
                let client = make()?;
                *pool.made.entry(key.clone()).or_insert(0) += 1;
                client
            }
        };
        pool.leased.insert(capture, (key, client.clone()));
        Ok((client, Some(Lease { pool: self.pool.clone(), capture })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_runtime::{graph, mock::Mock};

    /// A "client" is a number: which one was made.
    fn counter() -> (Arc<AtomicUsize>, impl Fn() -> Result<usize> + Clone) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (n, move || Ok(m.fetch_add(1, Ordering::SeqCst)))
    }

    #[test]
    fn one_client_per_capture_kept_with_its_graph_and_reused_after_it() {
        let mock = Mock::new();
        let s = mock.stream(0, "s");
        let leases = Leases::<u32, usize>::default();
        let (made, make) = counter();
        mock.begin_capture(&s);
        let (a, lease) = leases.lease(0, 1, 8, make.clone()).unwrap();
        graph::keep(&s, lease.expect("the first call of a capture leases")).unwrap();
        // The same capture again: the same client, nothing more to keep.
        let (again, none) = leases.lease(0, 1, 8, make.clone()).unwrap();
        assert_eq!((again, none.is_none()), (a, true));
        // Another capture while the first graph lives: a client of its own.
        let (b, other) = leases.lease(0, 2, 8, make.clone()).unwrap();
        assert_ne!(a, b);
        let graph = mock.end_capture(&s);
        assert_eq!(made.load(Ordering::SeqCst), 2);
        drop(graph); // its lease goes back with it
        let (c, _third) = leases.lease(0, 3, 8, make.clone()).unwrap();
        assert_eq!((c, made.load(Ordering::SeqCst)), (a, 2), "the first graph's client serves the third");
        drop(other);
    }

    #[test]
    fn keys_apart_and_the_limit_per_key() {
        let leases = Leases::<u32, usize>::default();
        let (made, make) = counter();
        let (_a, _la) = leases.lease(0, 1, 1, make.clone()).unwrap();
        let err = leases.lease(0, 2, 1, make.clone()).err().expect("past the limit");
        assert!(err.to_string().contains("limit 1"), "{err}");
        // Another device has its own count.
        let (_b, _lb) = leases.lease(1, 2, 1, make.clone()).unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_failed_start_leases_nothing() {
        let leases = Leases::<u32, usize>::default();
        let failed = leases.lease(0, 1, 8, || Err(XlaError::invalid("client", 0, "no device")));
        assert!(failed.is_err());
        let (made, make) = counter();
        let (first, _l) = leases.lease(0, 1, 8, make).unwrap();
        assert_eq!((first, made.load(Ordering::SeqCst)), (0, 1));
    }

    #[test]
    fn settings_refuse_a_zero_limit() {
        assert!(set_limit(0).is_err());
        assert!(!is_enabled(), "off by default");
    }
}
