//! Each thread's buffers (one per destination rank) and the [`Batch`] that fills them.

use crate::{wire, Agg, HEADER};
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use weft_runtime::{Comm, Error, Result};

thread_local! {
    /// This thread's buffers, by aggregation state (world) id.
    static MINE: RefCell<Vec<(u64, Arc<ThreadBufs>)>> = const { RefCell::new(Vec::new()) };
    /// A batch is open on this thread (its sends' waits must not flush into it).
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Whether a batch is open on this thread.
pub(crate) fn busy() -> bool {
    BUSY.with(|b| b.get())
}

/// Whether this thread holds unsent items for the aggregation state `id`.
pub(crate) fn pending_here(id: u64) -> bool {
    MINE.with(|m| m.borrow().iter().any(|(i, tb)| *i == id && tb.pending()))
}

/// One thread's buffers of one world.
#[derive(Default)]
pub(crate) struct ThreadBufs {
    pub bufs: Mutex<Bufs>,
    /// When the oldest unsent item went in (`os::now_ns`), 0 when none waits.
    pub oldest_ns: AtomicU64,
}

impl ThreadBufs {
    pub fn pending(&self) -> bool {
        self.oldest_ns.load(Relaxed) != 0
    }
}

const NONE: usize = usize::MAX;

struct Dest {
    buf: Vec<u8>,
    /// Where the open record's header is, or `NONE`.
    open: usize,
    kind: u16,
    key: u64,
    items: u64,
    listed: bool,
}

impl Default for Dest {
    fn default() -> Self {
        Dest { buf: Vec::new(), open: NONE, kind: 0, key: 0, items: 0, listed: false }
    }
}

#[derive(Default)]
pub(crate) struct Bufs {
    dests: Vec<Dest>,
    /// Destinations whose buffers took items since the last flush.
    listed: Vec<u32>,
}

/// An open batch of this thread's buffers (see [`Agg::batch`]): add items, each to a
/// destination rank, in a record of a kind and key.
pub struct Batch<'a> {
    comm: &'a Comm,
    agg: &'a Agg,
    tb: &'a ThreadBufs,
    bufs: &'a mut Bufs,
    cap: usize,
}

struct Busy;
impl Busy {
    fn set() -> Busy {
        BUSY.with(|b| b.set(true));
        Busy
    }
}
impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.with(|b| b.set(false));
    }
}

impl Agg {
    /// This thread's buffers (made on first use).
    fn mine(&self) -> Arc<ThreadBufs> {
        MINE.with(|m| {
            if let Some((_, tb)) = m.borrow().iter().find(|(i, _)| *i == self.id) {
                return tb.clone();
            }
            let tb = Arc::new(ThreadBufs::default());
            self.threads.lock().unwrap_or_else(|p| p.into_inner()).push(tb.clone());
            m.borrow_mut().push((self.id, tb.clone()));
            tb
        })
    }

    /// Runs `f` with this thread's buffers open: items go into them, and full buffers are sent
    /// as `f` goes. Refused inside an AM handler (it sends requests) and inside another batch.
    ///
    /// ```no_run
    /// # use weft_runtime as weft;
    /// # static K: weft_agg::Kind = weft_agg::Kind { name: "doc.k", apply: |_, _, _, _, _| Ok(()), reply: |_, _, _, _| Ok(()) };
    /// # let world = weft::World::init()?;
    /// let agg = weft_agg::Agg::get(&world)?;
    /// agg.batch(&world, |b| b.item(0, K.id(), 0, &[1, 2, 3]))?;
    /// # Ok::<(), weft::Error>(())
    /// ```
    pub fn batch<R>(&self, comm: &Comm, f: impl FnOnce(&mut Batch<'_>) -> Result<R>) -> Result<R> {
        if weft_runtime::layer::in_handler() {
            return Err(Error::Misuse("aggregated operations cannot be sent from inside an AM handler"));
        }
        if busy() {
            return Err(Error::Misuse("an aggregation batch is already open on this thread"));
        }
        let tb = self.mine();
        let _busy = Busy::set();
        let mut g = tb.bufs.lock().unwrap_or_else(|p| p.into_inner());
        self.run_batch(comm, &tb, &mut g, f)
    }

    pub(crate) fn run_batch<R>(
        &self,
        comm: &Comm,
        tb: &ThreadBufs,
        bufs: &mut Bufs,
        f: impl FnOnce(&mut Batch<'_>) -> Result<R>,
    ) -> Result<R> {
        let size = comm.size() as usize;
        if bufs.dests.len() < size {
            bufs.dests.resize_with(size, Dest::default);
        }
        let cap = self.cap.load(Relaxed);
        let mut b = Batch { comm, agg: self, tb, bufs, cap };
        f(&mut b)
    }
}

impl Batch<'_> {
    /// Adds `item` to the record of `kind` and `key` for rank `dst` (consecutive items of one
    /// kind and key share a record). Sends the buffer first if the item does not fit.
    #[inline]
    pub fn item(&mut self, dst: u32, kind: u16, key: u64, item: &[u8]) -> Result<()> {
        self.item_after(dst, kind, key, &[], item)
    }

    /// [`Batch::item`] where a record that this item opens starts with `prefix` (what every
    /// item of the record shares: a value, say). Every record of a kind and key must then be
    /// given the same prefix.
    #[inline]
    pub fn item_after(&mut self, dst: u32, kind: u16, key: u64, prefix: &[u8], item: &[u8]) -> Result<()> {
        if let Some(d) = self.bufs.dests.get_mut(dst as usize) {
            if d.open != NONE && d.kind == kind && d.key == key && d.buf.len() + item.len() <= self.cap {
                d.buf.extend_from_slice(item);
                d.items += 1;
                return Ok(());
            }
        }
        self.item_slow(dst, kind, key, prefix, item)
    }

    #[inline(never)]
    fn item_slow(&mut self, dst: u32, kind: u16, key: u64, prefix: &[u8], item: &[u8]) -> Result<()> {
        let size = self.comm.size();
        if dst >= size {
            return Err(Error::NoSuchRank { rank: dst, size });
        }
        let max = self.agg.max_item();
        let len = prefix.len() + item.len();
        if len > max {
            return Err(Error::TooLarge { what: "aggregated item and prefix (bytes)", len, max });
        }
        let limit = if self.cap == 0 { HEADER + len } else { self.cap.max(HEADER + len) };
        let d = &mut self.bufs.dests[dst as usize];
        if d.open != NONE {
            wire::close(&mut d.buf, d.open);
            d.open = NONE;
        }
        if !d.buf.is_empty() && d.buf.len() + HEADER + len > limit {
            self.send(dst)?;
        }
        let d = &mut self.bufs.dests[dst as usize];
        if !d.listed {
            d.listed = true;
            self.bufs.listed.push(dst);
        }
        d.open = wire::open(&mut d.buf, kind, key);
        d.kind = kind;
        d.key = key;
        d.buf.extend_from_slice(prefix);
        d.buf.extend_from_slice(item);
        d.items += 1;
        if self.tb.oldest_ns.load(Relaxed) == 0 {
            self.tb.oldest_ns.store(weft_fabric::os::now_ns().max(1), Ordering::SeqCst);
            self.agg.timer.arm(self.comm);
        }
        if self.cap == 0 {
            self.send(dst)?;
        }
        Ok(())
    }

    /// Sends `dst`'s buffer now; this rank's own buffer is applied in place.
    fn send(&mut self, dst: u32) -> Result<()> {
        let d = &mut self.bufs.dests[dst as usize];
        if d.open != NONE {
            wire::close(&mut d.buf, d.open);
            d.open = NONE;
        }
        if d.buf.is_empty() {
            return Ok(());
        }
        if dst == self.comm.rank() {
            self.agg.loopback(self.comm, &d.buf);
            d.buf.clear();
            d.items = 0;
            return Ok(());
        }
        let r = self.comm.am_request_medium(dst, self.agg.msg, &[], &d.buf);
        let c = &self.agg.counters;
        c.messages.fetch_add(1, Relaxed);
        c.items.fetch_add(d.items, Relaxed);
        c.bytes.fetch_add(d.buf.len() as u64, Relaxed);
        d.buf.clear();
        d.items = 0;
        r?;
        // Serve what peers sent meanwhile: a rank that only sends would leave its peers'
        // messages in its rings until they fill, and then they wait for it.
        self.comm.poll().map(drop)
    }

    /// Sends every buffer of this thread that holds items. The first error is returned after
    /// every buffer was tried (what failed to leave is dropped: the layers above fail the
    /// operations it carried when they find the peer gone).
    pub fn flush_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        let listed = std::mem::take(&mut self.bufs.listed);
        for &dst in &listed {
            let r = self.send(dst);
            self.bufs.dests[dst as usize].listed = false;
            if first.is_ok() {
                first = r;
            }
        }
        self.bufs.listed = listed;
        self.bufs.listed.clear();
        self.tb.oldest_ns.store(0, Relaxed);
        first
    }

    /// Applies the items this rank added for itself now (they go in place, not in a message;
    /// otherwise they wait for the buffer to fill or a flush like any other).
    pub fn send_own(&mut self) -> Result<()> {
        self.send(self.comm.rank())
    }

    /// The world the batch sends on.
    pub fn comm(&self) -> &Comm {
        self.comm
    }
}
