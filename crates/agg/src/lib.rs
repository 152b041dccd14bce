//! # weft-agg — many small operations as few messages
//!
//! Programs that issue millions of tiny operations to random ranks (histograms, index gathers,
//! hash tables) pay a message per operation unless something packs them. This layer keeps, for
//! each thread, a buffer per destination rank; operations go into it as *items* of *records*
//! (`[kind][key][items…]`, see [`Kind`]), and a buffer leaves as one active message:
//!
//! - when it is full (`WEFT_AGG_BYTES`, default 16 KiB, at most the fabric's largest medium
//!   AM);
//! - when its thread waits in weft: every wait, `barrier`, `wait_all`, `sync_nbi`, a future's
//!   poll and [`weft_runtime::Comm::flush`] send this thread's buffers first;
//! - at the latest `WEFT_AGG_DELAY_US` (default 100 µs) after its first item, sent by a helper
//!   thread, so a thread that stops calling weft still delivers.
//!
//! At the target, each record's items go to its kind's `apply` function inside the AM
//! handler, which may answer with reply items (results, acknowledgements); all the replies to
//! one message travel back as one message, to the kind's `reply` function. `weft-array`'s
//! batch operations are built on it.
//!
//! ```no_run
//! # use weft_runtime as weft;
//! use weft_agg::{Agg, Kind, Replies, KINDS};
//! use std::sync::atomic::{AtomicU64, Ordering};
//! static SEEN: AtomicU64 = AtomicU64::new(0);
//! fn apply(_: &weft::Comm, _src: u32, _key: u64, items: &[u8], _: &mut Replies) -> Result<(), &'static str> {
//!     SEEN.fetch_add(items.len() as u64 / 8, Ordering::Relaxed);
//!     Ok(())
//! }
//! fn reply(_: &weft::Comm, _src: u32, _key: u64, _items: &[u8]) -> Result<(), &'static str> { Ok(()) }
//! #[linkme::distributed_slice(KINDS)]
//! static COUNT: Kind = Kind { name: "example.count", apply, reply };
//!
//! let world = weft::World::init()?;
//! let agg = Agg::get(&world)?;
//! let dst = (world.rank() + 1) % world.size();
//! agg.batch(&world, |b| {
//!     for i in 0..1000u64 {
//!         b.item(dst, COUNT.id(), 0, &i.to_le_bytes())?;
//!     }
//!     Ok(())
//! })?;
//! world.wait_all()?; // flushes, then waits until the target ran the messages
//! # Ok::<(), weft::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod buffers;
mod timer;
mod wire;

pub use buffers::Batch;
pub use wire::HEADER;

use buffers::ThreadBufs;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use weft_runtime::layer::{Layer, LayerBuilder};
use weft_runtime::{AmHandler, AmMsg, Builder, Comm, Error, Result};

/// A kind of aggregated item: what the target does with a record's items, and what the sender
/// does with the reply items. Declare one as a static in [`KINDS`]; its [`Kind::id`] is the
/// same on every rank (the table is sorted by name).
#[derive(Debug)]
pub struct Kind {
    /// A name unique in the program (`crate.what`).
    pub name: &'static str,
    /// At the target, inside the AM handler: applies `items` of a record with `key` from rank
    /// `src`, adding reply items to `replies` (at most as many bytes as the record's). An
    /// `Err` says why the record is malformed (it is counted and said once).
    #[allow(clippy::type_complexity)]
    pub apply: fn(&Comm, u32, u64, &[u8], &mut Replies) -> std::result::Result<(), &'static str>,
    /// At the sender, inside the reply handler: takes the reply items of a record with `key`
    /// from rank `src`.
    pub reply: fn(&Comm, u32, u64, &[u8]) -> std::result::Result<(), &'static str>,
}

/// Every [`Kind`] of the program (a `linkme` distributed slice).
#[linkme::distributed_slice]
pub static KINDS: [Kind];

/// The kinds sorted by name: an id is a position here.
fn table() -> &'static [&'static Kind] {
    static TABLE: OnceLock<Vec<&'static Kind>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut v: Vec<&'static Kind> = KINDS.iter().collect();
        v.sort_by_key(|k| k.name);
        v
    })
}

impl Kind {
    /// This kind's id, the same on every rank.
    ///
    /// # Panics
    /// If the kind is not in [`KINDS`] (declare it with `#[linkme::distributed_slice(KINDS)]`).
    pub fn id(&'static self) -> u16 {
        let t = table();
        match t.binary_search_by_key(&self.name, |k| k.name) {
            Ok(i) if std::ptr::eq(t[i], self) => i as u16,
            _ => panic!("aggregation kind {:?} is not in weft_agg::KINDS", self.name),
        }
    }
}

/// Reply items that an [`Kind::apply`] function adds, sent back to the requester as one
/// message with those of every other record of the request.
#[derive(Debug)]
pub struct Replies {
    buf: Vec<u8>,
    kind: u16,
    open: Option<(u64, usize)>,
    limit: usize,
}

impl Replies {
    fn new(limit: usize, room: usize) -> Self {
        Replies { buf: Vec::with_capacity(room.min(limit)), kind: 0, open: None, limit }
    }
    fn start(&mut self, kind: u16) {
        self.close();
        self.kind = kind;
    }
    fn close(&mut self) {
        if let Some((_, at)) = self.open.take() {
            wire::close(&mut self.buf, at);
        }
    }
    /// Adds `item` to a reply record of another kind (`kind`, an id from [`Kind::id`]) with
    /// `key`: an answer the requester's reply function for that kind takes (a failure, say).
    pub fn item_of(&mut self, kind: u16, key: u64, item: &[u8]) -> std::result::Result<(), &'static str> {
        let own = self.kind;
        if kind == own {
            return self.item(key, item);
        }
        self.close();
        self.kind = kind;
        let r = self.item(key, item);
        self.close();
        self.kind = own;
        r
    }

    /// Adds `item` to the reply record with `key` (of the kind being applied).
    #[inline(always)]
    pub fn item(&mut self, key: u64, item: &[u8]) -> std::result::Result<(), &'static str> {
        if !matches!(self.open, Some((k, _)) if k == key) {
            self.close();
            if self.buf.len() + HEADER > self.limit {
                return Err("its replies outgrow the largest message");
            }
            let at = wire::open(&mut self.buf, self.kind, key);
            self.open = Some((key, at));
        }
        if self.buf.len() + item.len() > self.limit {
            return Err("its replies outgrow the largest message");
        }
        self.buf.extend_from_slice(item);
        Ok(())
    }
}

/// What a rank's aggregation counted (see [`Agg::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AggStats {
    /// Aggregated messages sent.
    pub messages: u64,
    /// Items they carried.
    pub items: u64,
    /// Bytes they carried.
    pub bytes: u64,
    /// Messages sent by the delay bound's helper thread.
    pub by_delay: u64,
    /// Malformed records received (dropped).
    pub malformed: u64,
}

impl AggStats {
    /// Items per message.
    pub fn mean_batch(&self) -> f64 {
        if self.messages == 0 {
            0.0
        } else {
            self.items as f64 / self.messages as f64
        }
    }
}

#[derive(Default)]
struct Counters {
    messages: AtomicU64,
    items: AtomicU64,
    bytes: AtomicU64,
    by_delay: AtomicU64,
    malformed: AtomicU64,
    said: AtomicBool,
}

/// The aggregation state of a world (a layer every world of a program linking this crate has).
pub struct Agg {
    id: u64,
    msg: AmHandler,
    reply: AmHandler,
    /// Bytes of a destination's buffer (0: every item alone); set at start-up.
    cap: AtomicUsize,
    /// The largest message (the fabric's largest medium AM).
    max: AtomicUsize,
    delay_ns: AtomicU64,
    threads: Mutex<Vec<Arc<ThreadBufs>>>,
    counters: Counters,
    timer: timer::Timer,
}

impl std::fmt::Debug for Agg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Agg {{ buffer: {} B, {:?} }}", self.cap.load(Ordering::Relaxed), self.stats())
    }
}

const NO_AGG: Error =
    Error::Misuse("this world has no aggregation layer (the program does not link weft-agg)");

/// Default bytes of a destination's buffer.
pub const DEFAULT_BYTES: usize = 16 << 10;
/// Default delay bound, µs.
pub const DEFAULT_DELAY_US: u64 = 100;

#[linkme::distributed_slice(weft_runtime::LAYERS)]
static AGG_LAYER: fn(&mut Builder) = install;

fn install(b: &mut Builder) {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let slot: Arc<OnceLock<Arc<Agg>>> = Arc::default();
    let s = slot.clone();
    let msg = b.handler("weft.agg.msg", move |am| {
        if let Some(a) = s.get() {
            a.on_msg(am)
        }
    });
    let s = slot.clone();
    let reply = b.handler("weft.agg.reply", move |am| {
        if let Some(a) = s.get() {
            a.on_reply(am)
        }
    });
    let agg = Arc::new(Agg {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        msg,
        reply,
        cap: AtomicUsize::new(DEFAULT_BYTES),
        max: AtomicUsize::new(DEFAULT_BYTES),
        delay_ns: AtomicU64::new(DEFAULT_DELAY_US * 1000),
        threads: Mutex::new(Vec::new()),
        counters: Counters::default(),
        timer: timer::Timer::default(),
    });
    let _ = slot.set(agg.clone());
    b.extension(agg);
    b.flush_hook(Arc::new(|c: &Comm| match c.extension_ref::<Agg>() {
        Some(a) => a.flush(c),
        None => Ok(()),
    }));
    b.on_start(Box::new(|c: &Comm| Agg::get(c)?.start(c)));
}

impl Agg {
    /// The aggregation layer of `comm`.
    pub fn get(comm: &Comm) -> Result<&Agg> {
        comm.extension_ref::<Agg>().ok_or(NO_AGG)
    }

    fn start(&self, c: &Comm) -> Result<()> {
        let names = table();
        if let Some(w) = names.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(Error::Config(format!("two aggregation kinds are named {:?}", w[0].name)));
        }
        let max = c.caps().am_max_medium;
        let bytes: usize =
            weft_runtime::config::parse("WEFT_AGG_BYTES", "a byte count")?.unwrap_or(DEFAULT_BYTES);
        if bytes != 0 && bytes < 2 * HEADER {
            return Err(Error::Config(format!(
                "WEFT_AGG_BYTES={bytes}: expected 0 (no aggregation) or at least {} bytes",
                2 * HEADER
            )));
        }
        let us: u64 =
            weft_runtime::config::parse("WEFT_AGG_DELAY_US", "microseconds")?.unwrap_or(DEFAULT_DELAY_US);
        self.max.store(max, Ordering::Relaxed);
        self.cap.store(bytes.min(max), Ordering::Relaxed);
        self.delay_ns.store(us.saturating_mul(1000), Ordering::Relaxed);
        Ok(())
    }

    /// Bytes of a destination's buffer (0: no aggregation, every item is sent alone).
    pub fn buffer_bytes(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// The largest item a record can carry.
    pub fn max_item(&self) -> usize {
        self.max.load(Ordering::Relaxed) - HEADER
    }

    /// What this rank's aggregation counted.
    pub fn stats(&self) -> AggStats {
        let c = &self.counters;
        AggStats {
            messages: c.messages.load(Ordering::Relaxed),
            items: c.items.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            by_delay: c.by_delay.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
        }
    }

    /// Sends this thread's buffers now (what every wait does first). Does nothing inside a
    /// [`Agg::batch`] of this thread or an AM handler.
    pub fn flush(&self, comm: &Comm) -> Result<()> {
        if buffers::busy() || weft_runtime::layer::in_handler() {
            return Ok(());
        }
        if buffers::pending_here(self.id) {
            self.batch(comm, |b| b.flush_all())
        } else {
            Ok(())
        }
    }

    fn malformed(&self, src: u32, me: u32, why: &str) {
        self.counters.malformed.fetch_add(1, Ordering::Relaxed);
        if !self.counters.said.swap(true, Ordering::Relaxed) {
            eprintln!(
                "weft: rank {me} dropped a malformed aggregated record from rank {src}: {why} \
                 (said once; weft_agg::Agg::stats counts them)"
            );
        }
    }

    /// "weft.agg.msg": the records of a message, applied in order.
    fn on_msg(&self, am: &AmMsg<'_>) {
        let replies = self.apply(am.comm(), am.src(), am.payload());
        if !replies.is_empty() {
            if let Err(e) = am.reply_medium(self.reply, &[], &replies) {
                let why = if matches!(e, Error::PeerFailed { .. }) {
                    "its sender is gone"
                } else {
                    "its reply failed"
                };
                self.malformed(am.src(), am.comm().rank(), why);
            }
        }
    }

    /// Applies the records of `msg` from `src`; returns the reply records.
    fn apply(&self, comm: &Comm, src: u32, msg: &[u8]) -> Vec<u8> {
        let mut replies = Replies::new(self.max.load(Ordering::Relaxed), msg.len());
        self.each_record(comm, src, msg, "an unknown kind", |k, rec| {
            replies.start(rec.kind);
            (k.apply)(comm, src, rec.key, rec.items, &mut replies)
        });
        replies.close();
        replies.buf
    }

    /// Runs `f` on each record of `msg` from `src` with its kind; a malformed record ends the
    /// message, an `Err` of `f` only its record (each is counted and said once).
    fn each_record(
        &self,
        comm: &Comm,
        src: u32,
        msg: &[u8],
        unknown: &str,
        mut f: impl FnMut(&Kind, wire::Record<'_>) -> std::result::Result<(), &'static str>,
    ) {
        let kinds = table();
        for r in wire::records(msg) {
            let rec = match r {
                Ok(rec) => rec,
                Err(why) => {
                    self.malformed(src, comm.rank(), why);
                    break;
                }
            };
            let Some(k) = kinds.get(rec.kind as usize) else {
                self.malformed(src, comm.rank(), unknown);
                break;
            };
            if let Err(why) = f(k, rec) {
                self.malformed(src, comm.rank(), why);
            }
        }
    }

    /// The items a rank sends itself: applied and answered in place, no message.
    fn loopback(&self, comm: &Comm, msg: &[u8]) {
        let replies = self.apply(comm, comm.rank(), msg);
        self.take_replies(comm, comm.rank(), &replies);
    }

    /// "weft.agg.reply": reply records, to their kinds.
    fn on_reply(&self, am: &AmMsg<'_>) {
        self.take_replies(am.comm(), am.src(), am.payload());
    }

    fn take_replies(&self, comm: &Comm, src: u32, msg: &[u8]) {
        self.each_record(comm, src, msg, "an unknown kind in a reply", |k, rec| {
            (k.reply)(comm, src, rec.key, rec.items)
        });
    }
}
