//! Every PJRT object of a hand-off is released exactly once: over many views of host
//! memory and exports of PJRT buffers on the CPU plugin, each foreign owner is
//! released once PJRT lets go, each exported buffer's external reference is given
//! back, and nothing is left pending in the reaper.

mod common;

use handoff_runtime::{
    Device, Export, Handoff, Ready, Release, Stream, TensorDesc, dtype::DataType, reaper, stats,
};
use handoff_xla::ViewOptions;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[repr(C, align(64))]
struct Block([f32; 16]);

/// Host memory that counts how often it is dropped.
struct Counted(Box<Block>, Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn views_and_exports_are_released_exactly_once() {
    let Some(c) = common::client() else { return };
    let d = c.device(0).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    const N: usize = 2000;
    let before = stats::thread_stats();
    for i in 0..N {
        let owner = Counted(Box::new(Block([i as f32; 16])), drops.clone());
        let h = Handoff::with_keep_alive(
            owner,
            |o| Ok(TensorDesc::new(o.0.0.as_ptr() as *mut _, Device::Host, DataType::F32, &[16][..])),
            &Stream::host(),
            Ready::Elided,
            Release::AfterConsumer,
        )
        .unwrap();
        // Every other pair of rounds, a view without a watch: PJRT's callback then
        // releases the hand-off itself (the owner's drops still count it).
        let watched = i % 4 < 2;
        let view = c.import_with(h, ViewOptions { watch: watched, ..ViewOptions::default() }).unwrap();
        let watch = view.view_watch();
        assert_eq!(watch.is_some(), watched, "a watch only when asked for");
        let released = || watch.as_ref().is_none_or(|w| w.is_released());
        assert!(watch.as_ref().is_none_or(|w| !w.is_released()));
        // Every other round, export the view back out and drop the export first.
        if i % 2 == 0 {
            let out = view.clone().export(&Stream::host()).unwrap();
            assert_eq!(out.shape(), &[16]);
            drop(view);
            assert!(
                watch.as_ref().is_none_or(|w| !w.is_released()),
                "released while an export still holds the buffer"
            );
            assert_eq!(
                drops.load(Ordering::SeqCst),
                i,
                "round {i}: released while an export still holds the buffer"
            );
            drop(out);
        } else {
            drop(view);
        }
        assert!(released(), "round {i}: PJRT did not release an idle view at destroy");
        assert_eq!(drops.load(Ordering::SeqCst), i + 1, "round {i}: owner dropped a wrong number of times");
    }
    // Exports of PJRT-owned buffers: the external reference goes back each time.
    let x = c.buffer_from_host(&d, &[1.0f32; 16], &[16]).unwrap();
    for _ in 0..N {
        drop(x.clone().export(&Stream::host()).unwrap());
    }
    drop(x);
    reaper::flush_stream(&Stream::host());
    let delta = stats::thread_stats().since(&before);
    assert_eq!(drops.load(Ordering::SeqCst), N);
    assert_eq!(delta.exports, (N + N / 2 + N) as u64);
    assert_eq!(delta.imports, N as u64);
    assert_eq!(delta.copies, 0);
}
