//! Batch operations on the wire (aggregation kinds), the requests that await their replies,
//! and the handles a batch returns.
//!
//! A record's key is the array's id (high 32 bits) and the request's (low 32 bits). Items:
//!
//! | kind | prefix | item | reply item |
//! |---|---|---|---|
//! | `weft.array.add`, `weft.array.store` | value (u64) | offset (u64) | count (u32) per record |
//! | `weft.array.fetch_add` | value (u64) | position (u32), offset (u64) | position (u32), old value (u64) |
//! | `weft.array.load` | none | position (u32), offset (u64) | position (u32), value (u64) |

use crate::Arrays;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use weft_agg::{Kind, Replies, KINDS};
use weft_runtime::layer::Layer;
use weft_runtime::{Comm, Error, Result};

type Applied = std::result::Result<(), &'static str>;

#[linkme::distributed_slice(KINDS)]
pub(crate) static ADD: Kind = Kind { name: "weft.array.add", apply: apply_add, reply: reply_count };
#[linkme::distributed_slice(KINDS)]
pub(crate) static STORE: Kind = Kind { name: "weft.array.store", apply: apply_store, reply: reply_count };
#[linkme::distributed_slice(KINDS)]
pub(crate) static FETCH_ADD: Kind =
    Kind { name: "weft.array.fetch_add", apply: apply_fetch_add, reply: reply_values };
#[linkme::distributed_slice(KINDS)]
pub(crate) static LOAD: Kind = Kind { name: "weft.array.load", apply: apply_load, reply: reply_values };
/// The answer of an owner that does not hold the array a record names (dropped there first):
/// the count of items it could not apply.
#[linkme::distributed_slice(KINDS)]
pub(crate) static FAILED: Kind = Kind {
    name: "weft.array.failed",
    apply: |_, _, _, _, _| Err("a failure sent as a request"),
    reply: reply_failed,
};

fn u64_at(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}
fn u32_at(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

/// What this rank holds of the array a key names (`None`: dropped here, or never made).
fn part_of(c: &Comm, key: u64) -> Option<Arc<crate::Part>> {
    Arrays::of(c).ok()?.part((key >> 32) as u32)
}

/// Applies `f(atomic, value)` to each offset item after a value prefix; acknowledges them all.
fn apply_each(
    c: &Comm,
    key: u64,
    items: &[u8],
    replies: &mut Replies,
    f: impl Fn(&AtomicU64, u64),
) -> Applied {
    if items.len() < 8 || !(items.len() - 8).is_multiple_of(8) {
        return Err("a record of offsets is cut short");
    }
    let v = u64_at(items);
    let offs = &items[8..];
    let n = (offs.len() / 8) as u32;
    let Some(part) = part_of(c, key) else {
        return replies.item_of(FAILED.id(), key, &n.to_le_bytes());
    };
    // Every item is acknowledged, applied or not, so that the sender's count adds up.
    replies.item(key, &n.to_le_bytes())?;
    let local = part.seg.local();
    let atoms = local.atomics();
    let mut bad = false;
    for ch in offs.chunks_exact(8) {
        match atoms.get(u64_at(ch) as usize) {
            Some(a) => f(a, v),
            None => bad = true,
        }
    }
    if bad {
        return Err("an offset past the array's part");
    }
    Ok(())
}

fn apply_add(c: &Comm, _: u32, key: u64, items: &[u8], r: &mut Replies) -> Applied {
    apply_each(c, key, items, r, |a, v| {
        a.fetch_add(v, Relaxed);
    })
}

fn apply_store(c: &Comm, _: u32, key: u64, items: &[u8], r: &mut Replies) -> Applied {
    apply_each(c, key, items, r, |a, v| a.store(v, Relaxed))
}

/// Answers each (position, offset) item with (position, `f(atomic)`).
fn apply_positioned(
    c: &Comm,
    key: u64,
    items: &[u8],
    r: &mut Replies,
    f: impl Fn(&AtomicU64) -> u64,
) -> Applied {
    if !items.len().is_multiple_of(12) {
        return Err("a record of positioned offsets is cut short");
    }
    let Some(part) = part_of(c, key) else {
        return r.item_of(FAILED.id(), key, &((items.len() / 12) as u32).to_le_bytes());
    };
    let local = part.seg.local();
    let atoms = local.atomics();
    let mut bad = false;
    let mut out = [0u8; 12];
    for ch in items.chunks_exact(12) {
        // An item that cannot be applied is still answered (with 0) so that the sender's count
        // adds up; the record is reported malformed.
        let v = match atoms.get(u64_at(&ch[4..]) as usize) {
            Some(a) => f(a),
            None => {
                bad = true;
                0
            }
        };
        out[..4].copy_from_slice(&ch[..4]);
        out[4..].copy_from_slice(&v.to_le_bytes());
        r.item(key, &out)?;
    }
    if bad {
        return Err("an offset past the array's part");
    }
    Ok(())
}

fn apply_fetch_add(c: &Comm, _: u32, key: u64, items: &[u8], r: &mut Replies) -> Applied {
    if items.len() < 8 {
        return Err("a record without its value");
    }
    let v = u64_at(items);
    apply_positioned(c, key, &items[8..], r, |a| a.fetch_add(v, Relaxed))
}

fn apply_load(c: &Comm, _: u32, key: u64, items: &[u8], r: &mut Replies) -> Applied {
    apply_positioned(c, key, items, r, |a| a.load(Relaxed))
}

fn reply_count(c: &Comm, src: u32, key: u64, items: &[u8]) -> Applied {
    if items.len() != 4 {
        return Err("an acknowledgement that is not one count");
    }
    let arrays = Arrays::of(c).map_err(|_| "no array layer")?;
    arrays.requests.answered(key as u32, src, u32_at(items) as u64, &[]);
    Ok(())
}

fn reply_failed(c: &Comm, src: u32, key: u64, items: &[u8]) -> Applied {
    if items.len() != 4 {
        return Err("a failure that is not one count");
    }
    let arrays = Arrays::of(c).map_err(|_| "no array layer")?;
    let why = format!("rank {src} does not hold the array the batch names (dropped there first?)");
    arrays.requests.failed(key as u32, src, u32_at(items) as u64, Error::Remote(why));
    Ok(())
}

fn reply_values(c: &Comm, src: u32, key: u64, items: &[u8]) -> Applied {
    if !items.len().is_multiple_of(12) {
        return Err("a record of values is cut short");
    }
    let arrays = Arrays::of(c).map_err(|_| "no array layer")?;
    arrays.requests.answered(key as u32, src, (items.len() / 12) as u64, items);
    Ok(())
}

/// A batch awaiting its replies.
struct Req {
    /// Items sent to each rank less those answered (answers may come before the count).
    outstanding: Vec<i64>,
    /// The counts are in (every item was sent).
    sealed: bool,
    /// The values answered, by position (empty for updates).
    results: Vec<u64>,
    error: Option<Error>,
    waker: Option<Waker>,
}

impl Req {
    /// A rank that answered more items than it was sent (a rank that lies): the batch fails
    /// rather than wait for ever or complete on false answers.
    fn check_overanswered(&mut self) {
        if self.error.is_none() {
            if let Some(r) = self.outstanding.iter().position(|&o| o < 0) {
                self.error = Some(Error::Remote(format!(
                    "rank {r} answered more items of an array batch than it was sent"
                )));
            }
        }
    }

    fn done(&self) -> bool {
        self.error.is_some() || (self.sealed && self.outstanding.iter().all(|&n| n == 0))
    }
}

/// The batches of a world that await replies.
#[derive(Default)]
pub(crate) struct Requests {
    map: Mutex<HashMap<u32, Req>>,
    next: AtomicU32,
}

impl Requests {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Req>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new request id (not in use) for a batch whose `results` values are answered.
    pub fn open(&self, ranks: u32, results: usize) -> u32 {
        let mut m = self.lock();
        loop {
            let id = self.next.fetch_add(1, Relaxed);
            if let std::collections::hash_map::Entry::Vacant(e) = m.entry(id) {
                e.insert(Req {
                    outstanding: vec![0; ranks as usize],
                    sealed: false,
                    results: vec![0; results],
                    error: None,
                    waker: None,
                });
                return id;
            }
        }
    }

    /// Every item of `id` was sent: `sent[r]` to rank `r`.
    pub fn seal(&self, id: u32, sent: &[u64]) {
        if let Some(r) = self.lock().get_mut(&id) {
            for (o, &s) in r.outstanding.iter_mut().zip(sent) {
                *o += s as i64;
            }
            r.sealed = true;
            r.check_overanswered();
        }
    }

    pub fn close(&self, id: u32) {
        self.lock().remove(&id);
    }

    /// `n` items of `id` sent to `src` were answered, with `values` (position, value) pairs.
    fn answered(&self, id: u32, src: u32, n: u64, values: &[u8]) {
        let mut m = self.lock();
        // A request whose handle was dropped is gone: its answers are not wanted.
        let Some(r) = m.get_mut(&id) else { return };
        if let Some(o) = r.outstanding.get_mut(src as usize) {
            *o -= n as i64;
        }
        if r.sealed {
            r.check_overanswered();
        }
        for ch in values.chunks_exact(12) {
            if let Some(slot) = r.results.get_mut(u32_at(ch) as usize) {
                *slot = u64_at(&ch[4..]);
            }
        }
        if r.done() {
            if let Some(w) = r.waker.take() {
                w.wake();
            }
        }
    }

    /// `n` items of `id` sent to `src` were not applied there: the batch fails with `e`.
    fn failed(&self, id: u32, src: u32, n: u64, e: Error) {
        let mut m = self.lock();
        let Some(r) = m.get_mut(&id) else { return };
        if let Some(o) = r.outstanding.get_mut(src as usize) {
            *o -= n as i64;
        }
        r.error.get_or_insert(e);
        if let Some(w) = r.waker.take() {
            w.wake();
        }
    }

    /// Fails the requests that await answers from ranks that are gone.
    pub fn fail_gone(&self, gone: &dyn Fn(u32) -> Option<Error>) -> usize {
        let mut failed = 0;
        for r in self.lock().values_mut() {
            if r.error.is_some() {
                continue;
            }
            let dead =
                r.outstanding.iter().enumerate().filter(|(_, &n)| n != 0).find_map(|(k, _)| gone(k as u32));
            if let Some(e) = dead {
                r.error = Some(e);
                failed += 1;
                if let Some(w) = r.waker.take() {
                    w.wake();
                }
            }
        }
        failed
    }

    /// `Some` once `id` is done: its error, or its values by position.
    fn take_if_done(&self, id: u32, waker: Option<&Waker>) -> Option<Result<Vec<u64>>> {
        let mut m = self.lock();
        let r = m.get_mut(&id)?;
        if !r.done() {
            if let Some(w) = waker {
                r.waker = Some(w.clone());
            }
            return None;
        }
        let r = m.remove(&id)?;
        Some(match r.error {
            Some(e) => Err(e),
            None => Ok(r.results),
        })
    }
}

/// What a finished batch gives: nothing, or one value per index in input order.
pub trait Outcome: Sized + Send + 'static {
    /// Builds the outcome from the values answered, by position.
    #[doc(hidden)]
    fn finish(values: Vec<u64>) -> Self;
}

impl Outcome for () {
    fn finish(_: Vec<u64>) {}
}

impl<T: crate::Element> Outcome for Vec<T> {
    fn finish(values: Vec<u64>) -> Vec<T> {
        // In place (same size and alignment): no second vector.
        values.into_iter().map(T::from_bits).collect()
    }
}

/// The handle of a batch operation: owns its world and its results, so it moves into threads
/// and tasks; [`BatchHandle::wait`] or `.await` gives the results (`()` for updates, the values
/// in input order for fetches and loads). Dropping it drops the results, not the operations.
#[must_use = "a batch completes when its handle is waited on or awaited"]
pub struct BatchHandle<R: Outcome> {
    comm: Arc<Comm>,
    /// The request awaiting answers (`None`: no item travelled, or done).
    id: Option<u32>,
    /// Values found without a message (in mapped memory), by position; 0 where answered.
    here: Option<Vec<u64>>,
    _r: std::marker::PhantomData<fn() -> R>,
}

impl<R: Outcome> std::fmt::Debug for BatchHandle<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BatchHandle {{ request: {:?} }}", self.id)
    }
}

impl<R: Outcome> BatchHandle<R> {
    pub(crate) fn new(comm: Arc<Comm>, id: Option<u32>, here: Option<Vec<u64>>) -> Self {
        BatchHandle { comm, id, here, _r: std::marker::PhantomData }
    }

    /// The outcome of answered values and those found here (each position is one or the other,
    /// the other 0).
    fn finish(&mut self, mut answered: Vec<u64>) -> R {
        if let Some(here) = self.here.take() {
            if answered.is_empty() {
                answered = here;
            } else {
                for (a, h) in answered.iter_mut().zip(here) {
                    *a = a.wrapping_add(h);
                }
            }
        }
        R::finish(answered)
    }

    /// Waits until every operation of the batch was applied at its owner (this thread's
    /// buffers are sent first) and returns the results. Fails with `PeerFailed` if an owner it
    /// sent items to died or left first; items applied straight to mapped memory (see
    /// [`crate::Mapped`]) were done when the batch call returned, on a dead owner's memory too.
    /// Fails with `Remote` if an owner no longer holds the array.
    pub fn wait(mut self) -> Result<R> {
        let Some(id) = self.id else { return Ok(self.finish(Vec::new())) };
        let comm = self.comm.clone();
        let requests = &Arrays::of(&comm)?.requests;
        let mut got = None;
        comm.wait_until(|| {
            got = requests.take_if_done(id, None);
            got.is_some()
        })?;
        self.id = None;
        let answered = got.unwrap_or(Err(Error::Misuse("a batch's request vanished")))?;
        Ok(self.finish(answered))
    }
}

impl<R: Outcome> Drop for BatchHandle<R> {
    fn drop(&mut self) {
        if let (Some(id), Ok(r)) = (self.id, Arrays::of(&self.comm)) {
            r.requests.close(id);
        }
    }
}

impl<R: Outcome> Unpin for BatchHandle<R> {}

impl<R: Outcome> Future for BatchHandle<R> {
    type Output = Result<R>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<R>> {
        let Some(id) = self.id else { return Poll::Ready(Ok(self.finish(Vec::new()))) };
        let comm = self.comm.clone();
        // Progress (and this thread's buffers sent), then a look.
        if let Err(e) = comm.poll() {
            return Poll::Ready(Err(e));
        }
        let requests = match Arrays::of(&comm) {
            Ok(a) => &a.requests,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match requests.take_if_done(id, Some(cx.waker())) {
            Some(r) => {
                self.id = None;
                Poll::Ready(r.map(|answered| self.finish(answered)))
            }
            None => {
                comm.future_pending(cx);
                Poll::Pending
            }
        }
    }
}
