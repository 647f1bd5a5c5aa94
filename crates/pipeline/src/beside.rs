//! Reading beside: the source's blocking work (a poll, or a poll and the
//! next batch's preparation) runs on the pipeline's source thread while the
//! loop does something else (a commit, a wait) and watches for a newer
//! version.
//!
//! It must not decide anything about the batch: it only runs the two side
//! by side and hands back what each gave.

use crate::Parts;
use sluice_core::config::TRANSFORM_THREAD_STACK_BYTES;
use sluice_core::sink::Sink;
use sluice_core::source::{PollSignals, Source};
use sluice_core::versions::{Swap, Versions};
use std::future::Future;

/// What reading beside gave.
pub(crate) struct Beside<R, A, T> {
    /// What the source's work returned.
    pub(crate) read: R,
    /// What ran alongside returned.
    pub(crate) alongside: A,
    /// A newer version found meanwhile, for the next batch boundary.
    pub(crate) swap: Option<Swap<T>>,
}

/// The one thread a pipeline's source works on, for the pipeline's life.
/// Transforms run there too (the read-ahead prepares the next batch), so
/// it has their stack; being the same thread batch after batch, its stack
/// pages, allocator caches and the engine's per-thread state stay warm.
pub(crate) struct SourceThread(rayon_core::ThreadPool);

impl SourceThread {
    pub(crate) fn new() -> SourceThread {
        let pool = rayon_core::ThreadPoolBuilder::new()
            .num_threads(1)
            .stack_size(TRANSFORM_THREAD_STACK_BYTES)
            .thread_name(|_| "sluice-source".into())
            .build()
            .expect("start the source thread");
        SourceThread(pool)
    }

    /// Runs `work` on the source thread while `here` runs on this one, and
    /// returns `here`'s result once both are done. A panic in `work` goes
    /// on here.
    fn both<'scope, T>(&self, work: impl FnOnce() + Send + 'scope, here: impl FnOnce() -> T) -> T {
        self.0.in_place_scope(|scope| {
            scope.spawn(move |_| work());
            here()
        })
    }
}

impl<S: Sink, V: Versions> Parts<S, V> {
    /// Runs `work` on `source` on the source thread while `alongside`
    /// runs here and the active version is watched; a version found
    /// interrupts `work`'s poll. Once `alongside` is done nothing holds the
    /// next batch back, so `work`'s poll may cut it as soon as it has read
    /// to the log end. If `work` ends first, the source thread holds the
    /// source's group membership (`Source::hold`) until `alongside` is
    /// done, so a commit retrying through a long sink outage does not get
    /// this instance thrown out of the group.
    ///
    /// Blocks this worker thread (the runtime moves its other tasks away);
    /// `alongside` and the watch run on it meanwhile.
    pub(crate) fn beside<Src: Source, R: Send, A: Future>(
        &self,
        source: &mut Src,
        work: impl FnOnce(&mut Src, &PollSignals) -> R + Send,
        alongside: A,
    ) -> Beside<R, A::Output, V::Transform> {
        let signals = PollSignals::new(self.options.until_caught_up);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let (alongside_done, hold_until) = std::sync::mpsc::channel();
        let mut read = None;
        let (alongside, swap) = tokio::task::block_in_place(|| {
            let signals = &signals;
            let read = &mut read;
            let working = move || {
                *read = Some(work(source, signals));
                let _ = done_tx.send(());
                source.hold(&hold_until);
            };
            let alongside = async {
                let output = alongside.await;
                signals.cut_at_end();
                let _ = alongside_done.send(());
                output
            };
            let watch = self.watch_versions(done_rx, signals);
            self.source_thread.both(working, || {
                tokio::runtime::Handle::current().block_on(async { tokio::join!(alongside, watch) })
            })
        });
        Beside {
            read: read.expect("the source's work ran"),
            alongside,
            swap,
        }
    }
}
