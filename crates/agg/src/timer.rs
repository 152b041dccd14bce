//! The delay bound: a helper thread sends the buffers of threads that stopped calling weft.

use crate::buffers::ThreadBufs;
use crate::Agg;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, TryLockError, Weak};
use std::time::Duration;
use weft_runtime::layer::Layer;
use weft_runtime::Comm;

/// How long the helper sleeps at most while no buffer holds items (it then checks that its
/// world still exists).
const IDLE: Duration = Duration::from_millis(50);
/// How soon it looks again at a buffer whose thread was filling it.
const RETRY_NS: u64 = 20_000;

#[derive(Default)]
pub(crate) struct Timer {
    thread: OnceLock<Option<std::thread::Thread>>,
    sleeping: AtomicBool,
}

impl Timer {
    /// A thread's buffers went from empty to holding items: make sure the helper will look.
    pub fn arm(&self, comm: &Comm) {
        let t = self.thread.get_or_init(|| {
            let agg = comm.extension::<Agg>()?;
            let world = Arc::downgrade(&comm.arc());
            let b = std::thread::Builder::new().name("weft-agg-delay".into());
            weft_fabric::signals::spawn_quiet(b, move || run(agg, world)).ok().map(|h| h.thread().clone())
        });
        if self.sleeping.swap(false, Ordering::SeqCst) {
            if let Some(t) = t {
                t.unpark();
            }
        }
    }
}

fn run(agg: Arc<Agg>, world: Weak<Comm>) {
    let mut threads: Vec<Arc<ThreadBufs>> = Vec::new();
    loop {
        let delay = agg.delay_ns.load(Ordering::Relaxed);
        threads.clear();
        {
            let mut list = agg.threads.lock().unwrap_or_else(|p| p.into_inner());
            // Threads that ended with nothing pending.
            list.retain(|tb| Arc::strong_count(tb) > 1 || tb.pending());
            threads.extend(list.iter().cloned());
        }
        let now = weft_fabric::os::now_ns();
        let mut next: Option<u64> = None;
        for tb in &threads {
            let since = tb.oldest_ns.load(Ordering::SeqCst);
            if since == 0 {
                continue;
            }
            let due = since.saturating_add(delay);
            if now < due {
                next = Some(next.map_or(due, |n| n.min(due)));
                continue;
            }
            let mut g = match tb.bufs.try_lock() {
                Ok(g) => g,
                // A panic in a batch (a user's iterator) left it: the buffers are whole
                // (items go in whole), so they are sent as they are.
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    // Its thread is adding items: it sends what fills, and waits flush.
                    next = Some(next.map_or(now + RETRY_NS, |n| n.min(now + RETRY_NS)));
                    continue;
                }
            };
            if !tb.pending() {
                continue;
            }
            let Some(comm) = world.upgrade() else { return };
            agg.counters.by_delay.fetch_add(1, Ordering::Relaxed);
            // A failed send (a finalized world, a peer gone) drops the items: the layers
            // above fail what waits on them.
            let _ = agg.run_batch(&comm, tb, &mut g, |b| b.flush_all());
        }
        match next {
            Some(t) => std::thread::park_timeout(Duration::from_nanos(t.saturating_sub(now).max(1_000))),
            None => {
                agg.timer.sleeping.store(true, Ordering::SeqCst);
                if threads.iter().any(|tb| tb.pending()) {
                    agg.timer.sleeping.store(false, Ordering::SeqCst);
                    continue;
                }
                std::thread::park_timeout(IDLE);
                if world.strong_count() == 0 {
                    return;
                }
            }
        }
    }
}
