//! Hand-offs made while a stream captures a graph (a CUDA graph).
//!
//! A stream that captures records the work enqueued on it, and on every stream that
//! waits on it meanwhile, into a graph instead of running it; each replay of the graph
//! runs that work again, on the same memory. For a hand-off made during a capture:
//!
//! - **Ordering is unchanged.** The event a producer records and its consumer waits on
//!   become an edge of the graph, so a replay keeps the order an eager run had.
//! - **A release waits for the graph, not an event.** An event recorded during a
//!   capture cannot be asked whether it completed (the CUDA driver refuses, and in its
//!   relaxed mode the capture is lost), and the memory is used by every replay anyway.
//!   So a release on a capturing stream records nothing: its keep-alive is kept with
//!   the graph, and dropped once the graph and every executable graph made from it are
//!   destroyed and their launches are done (as the reaper would drop it: at its home
//!   thread). [`stats()`](crate::stats())`.releases_with_graph` counts them.
//!
//! A [`Backend`](crate::Backend) says whether a stream captures and keeps memory with
//! its graph ([`Backend::is_capturing`](crate::Backend::is_capturing),
//! [`Backend::keep_with_graph`](crate::Backend::keep_with_graph)); CUDA's attaches it to
//! the graph as a CUDA user object. The mock device captures too
//! ([`Mock::begin_capture`](crate::mock::Mock::begin_capture)), for tests without a GPU.
//!
//! ```
//! use handoff_runtime::{mock::Mock, reaper, stats};
//! let mock = Mock::new();
//! let s = mock.stream(0, "s");
//! mock.begin_capture(&s);
//! let (_, delta) = stats::measure(|| reaper::release_after(Some(&s), vec![1u8; 4]));
//! assert_eq!((delta.releases_with_graph, delta.releases_deferred), (1, 0));
//! let graph = mock.end_capture(&s);
//! assert_eq!(graph.kept(), 1);
//! drop(graph); // the graph is gone: what it kept is dropped
//! ```

pub use crate::stream::Kept;

/// Keeps `value` until the graph `stream` is capturing is destroyed and every launch
/// of it is done, then drops it on a thread of handoff's: for an adapter whose memory
/// a graph uses beyond a hand-off's own release (an XLA output, which every replay
/// writes). Refused when `stream` does not capture; when the backend cannot keep it,
/// `value` is leaked (never dropped: a replay may use it) and the error returned.
///
/// ```
/// use handoff_runtime::{graph, mock::Mock};
/// let mock = Mock::new();
/// let s = mock.stream(0, "s");
/// assert!(graph::keep(&s, vec![0u8; 4]).is_err()); // not capturing
/// mock.begin_capture(&s);
/// graph::keep(&s, vec![0u8; 4]).unwrap();
/// assert_eq!(mock.end_capture(&s).kept(), 1);
/// ```
pub fn keep<K: Send + 'static>(stream: &crate::stream::Stream, value: K) -> crate::error::Result<()> {
    if !stream.is_capturing()? {
        return Err(crate::error::Error::Backend {
            backend: stream.backend().name(),
            call: "graph::keep",
            message: format!("{stream:?} is not capturing a graph"),
        });
    }
    stream.keep_with_graph(Box::new(move || drop(value))).map_err(|(e, value)| {
        std::mem::forget(value);
        e
    })
}

/// How many releases graphs keep (or were destroyed and not yet did): those of live
/// graphs, and those the driver has not yet handed back after a graph was destroyed.
pub fn pending() -> usize {
    crate::stream::kept_with_graphs()
}

/// Waits, polling, up to `timeout` for every release kept with a graph to be done
/// ([`pending`] 0): after the program dropped its graphs, before it exits, so that
/// what they kept is not released while the process tears CUDA down. Whether all were.
pub fn wait_released(timeout: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    while pending() != 0 {
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// A graph capture that a thread announces while it runs code inside it
/// ([`announce`]): handoff-torch's `Graph::capture` does, around the captured step. An
/// adapter whose own memory every replay writes (handoff-xla's kernels: an XLA
/// execution's scratch and outputs) reads it with [`current`] and gives that capture
/// memory nothing outside the graph allocates from.
#[derive(Clone, Debug)]
pub struct Capture {
    stream: crate::stream::Stream,
    id: u64,
}

impl Capture {
    /// The stream that captures.
    pub fn stream(&self) -> &crate::stream::Stream {
        &self.stream
    }

    /// The capture's id: unique in the process, never reused.
    pub fn id(&self) -> u64 {
        self.id
    }
}

thread_local! {
    static CURRENT: std::cell::RefCell<Option<Capture>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with the capture `stream` makes announced on this thread ([`current`]),
/// then announces again what was announced before (also when `f` unwinds).
///
/// ```
/// use handoff_runtime::{graph, mock::Mock};
/// let mock = Mock::new();
/// let s = mock.stream(0, "s");
/// assert!(graph::current().is_none());
/// let id = graph::announce(&s, || graph::current().map(|c| c.id()));
/// assert!(id.is_some() && graph::current().is_none());
/// ```
pub fn announce<R>(stream: &crate::stream::Stream, f: impl FnOnce() -> R) -> R {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    struct Restore(Option<Capture>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = before);
        }
    }
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let capture = Capture { stream: stream.clone(), id };
    let _restore = Restore(CURRENT.with(|c| c.borrow_mut().replace(capture)));
    f()
}

/// The capture announced on this thread ([`announce`]), if any.
pub fn current() -> Option<Capture> {
    CURRENT.with(|c| c.borrow().clone())
}
