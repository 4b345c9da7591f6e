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

/// What a graph keeps until it is destroyed: the release to do then (dropping a
/// keep-alive at its home, or running a callback a framework enqueued during the
/// capture), run once, on a thread of handoff's.
pub type Kept = Box<dyn FnOnce() + Send>;
