//! Remote completion: [`Comm::wait_all`] returns once every request AM this rank sent (by any
//! thread, through the world or an endpoint; the RPC layer's calls and posts among them) has
//! been handled at its target.
//!
//! Counting: every fabric counts the request AMs this process sent to each peer and those
//! from each peer whose handlers returned ([`weft_fabric::Fabric::requests_sent`],
//! [`weft_fabric::Fabric::requests_handled`]; on shared memory plain stores under the ring
//! locks, nothing on the message path). A handler that hands its work on, as the RPC layer
//! does for functions that run later, holds its request back until that work is done
//! ([`crate::AmMsg::hold`]). `wait_all` asks each peer it sent to since its last call
//! ("weft.done.ask", the count so far); the peer answers ("weft.done.ok") once that many
//! were handled and not held: at once from the handler, or later from its progress. Every
//! request counts, the runtime's own included (they are handled when their handler returns).

use crate::am::internal;
use crate::progress::Deps;
use crate::{AmMsg, Comm, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use weft_fabric::{AmClass, AmPayload};

/// The counts of one world (the fabric counts requests sent and handled).
pub(crate) struct Counts {
    /// Held requests not yet released, per source (see [`AmMsg::hold`]).
    held: Box<[AtomicU64]>,
    /// Per destination: how many of ours it has said it handled.
    confirmed: Box<[AtomicU64]>,
    /// Per destination: this protocol's own requests sent to it (asks, late answers).
    protocol: Box<[AtomicU64]>,
    /// Per destination: held while one of the protocol's requests is sent and counted, and
    /// while `wait_all` reads the fabric's sent count with `protocol`, so that the two agree
    /// (another thread's ask between the two reads made this rank's own count one short,
    /// and `wait_all` return before its last request ran).
    sending: Box<[Mutex<()>]>,
    /// Per destination: requests other than the protocol's known handled (no ask needed
    /// while nothing new was sent).
    settled: Box<[AtomicU64]>,
    /// Questions not answered yet: (source, count).
    asked: Mutex<Vec<(u32, u64)>>,
    /// Whether `asked` holds any (one load per progress call otherwise).
    any_asked: AtomicBool,
}

impl Counts {
    /// Whether questions wait for answers.
    #[inline]
    pub(crate) fn asked(&self) -> bool {
        self.any_asked.load(Ordering::Relaxed)
    }

    pub(crate) fn new(size: u32) -> Self {
        let n = size as usize;
        Counts {
            held: (0..n).map(|_| AtomicU64::new(0)).collect(),
            confirmed: (0..n).map(|_| AtomicU64::new(0)).collect(),
            protocol: (0..n).map(|_| AtomicU64::new(0)).collect(),
            sending: (0..n).map(|_| Mutex::new(())).collect(),
            settled: (0..n).map(|_| AtomicU64::new(0)).collect(),
            asked: Mutex::new(Vec::new()),
            any_asked: AtomicBool::new(false),
        }
    }
}

/// Holds back the handled count of one request until dropped ([`AmMsg::hold`]).
pub struct Held {
    comm: Arc<Comm>,
    src: u32,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(h) = self.comm.counts.held.get(self.src as usize) {
            h.fetch_sub(1, Ordering::AcqRel);
        }
        // A question may wait on this request: have it looked at.
        if self.comm.counts.asked() {
            self.comm.want_progress();
        }
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held(request from rank {})", self.src)
    }
}

impl AmMsg<'_> {
    /// For a handler that hands its work on (to a queue, a task): this request counts as
    /// handled for [`Comm::wait_all`] only when the returned token is dropped, not when the
    /// handler returns. `None` for replies (not counted) and after a first call.
    pub fn hold(&self) -> Option<Held> {
        if self.is_reply() || self.held.replace(true) {
            return None;
        }
        let comm = self.comm();
        comm.counts.held.get(self.src() as usize)?.fetch_add(1, Ordering::AcqRel);
        Some(Held { comm: comm.arc(), src: self.src() })
    }
}

impl Comm {
    /// Whether the first `want` requests from `src` have all been handled and finished: as
    /// many handled, none held (a held request may be any of them: requests after them count
    /// in `handled` too), and nothing from `src` waiting or being delivered (its paths are
    /// FIFO, so every request sent before the question has left them).
    fn done_from(&self, src: u32, want: u64) -> bool {
        let held = self.counts.held.get(src as usize).map_or(0, |h| h.load(Ordering::Acquire));
        held == 0 && self.fabric.requests_handled(src) >= want && self.fabric.peer_drained(src)
    }

    /// Returns once every request AM this rank sent before the call, by any of its threads,
    /// has been handled at its target, and this thread's implicit operations are complete
    /// ([`Comm::sync_nbi`]). For the RPC layer: every call and post has run (its function
    /// finished). An endpoint's AMs count once the endpoint has sent them (its `sync_nbi`
    /// sends what it still queues). Fails with [`crate::Error::PeerFailed`] if a target dies
    /// first.
    ///
    /// [`Comm::barrier`] does not wait for AMs in flight; `wait_all` on every rank, then a
    /// barrier, makes every rank's messages handled everywhere.
    ///
    /// A target answers once nothing from this rank is being delivered or held there, so
    /// while other threads of this rank keep sending to it without pause, the answer waits
    /// for a gap in that stream: call it in a quiet phase (as before a barrier).
    ///
    /// A target answers only once it holds none of this rank's requests ([`AmMsg::hold`]):
    /// an `async` remote function counts as held while it runs. So two such functions that
    /// call `wait_all` toward each other's ranks wait for each other for ever (the hang
    /// warning names the ranks); end the function first, or wait on an answer of your own.
    ///
    /// ```no_run
    /// # let mut b = weft_runtime::World::builder();
    /// # let h = b.handler("count", |_| {});
    /// # let world = b.init()?;
    /// world.am_request_short((world.rank() + 1) % world.size(), h, &[1])?;
    /// world.wait_all()?; // the handler has run on the target
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn wait_all(&self) -> Result<()> {
        if crate::am::in_handler().is_some() {
            // Its peers' questions are requests, which a handler's waits do not deliver.
            return Err(crate::am::refused("wait_all cannot run inside an AM handler"));
        }
        // sync_nbi flushes the layers' buffers first: their messages count below.
        self.sync_nbi()?;
        let c = &self.counts;
        let mut waiting = Vec::new();
        for dst in 0..self.size() {
            let d = dst as usize;
            let _sending = c.sending[d].lock().unwrap_or_else(|p| p.into_inner());
            let sent = self.fabric.requests_sent(dst);
            let own = sent.saturating_sub(c.protocol[d].load(Ordering::Acquire));
            if own > c.settled[d].load(Ordering::Acquire) {
                self.send_am(dst, internal::DONE_ASK, AmClass::Request, &[sent], AmPayload::Short)?;
                c.protocol[d].fetch_add(1, Ordering::AcqRel);
                waiting.push((dst, sent, own));
            }
        }
        for (dst, sent, own) in waiting {
            self.wait(Deps::Rank(dst), "wait_all (AMs handled at their targets)", || {
                c.confirmed[dst as usize].load(Ordering::Acquire) >= sent
            })?;
            c.settled[dst as usize].fetch_max(own, Ordering::AcqRel);
        }
        Ok(())
    }

    /// "weft.done.ask" [count]: answer once that many requests from the asker were handled.
    pub(crate) fn on_done_ask(&self, m: &AmMsg<'_>) {
        // A malformed question is dropped (any rank can send any handler anything).
        let Some(&want) = m.args().first() else { return };
        if self.done_from(m.src(), want) {
            let _ = m.reply_short(crate::AmHandler(internal::DONE_OK), &[want]);
            return;
        }
        // One open question per asker, for the most any of its threads asked: its answer
        // covers the others.
        self.reask(m.src(), want);
    }

    /// "weft.done.ok" [count]: the target handled that many of ours.
    pub(crate) fn on_done_ok(&self, m: &AmMsg<'_>) {
        let (Some(&n), Some(c)) = (m.args().first(), self.counts.confirmed.get(m.src() as usize)) else {
            return;
        };
        // A peer that claims more than was sent only ends this rank's wait early for itself.
        c.fetch_max(n.min(self.fabric.requests_sent(m.src())), Ordering::AcqRel);
    }

    /// Answers the questions whose counts have been reached (outside handlers: the answer
    /// is a request). Returns how many were answered.
    pub(crate) fn answer_asked(&self) -> Result<usize> {
        if !self.counts.any_asked.load(Ordering::Acquire) {
            return Ok(0);
        }
        let ready: Vec<(u32, u64)> = {
            let mut asked = self.counts.asked.lock().unwrap_or_else(|p| p.into_inner());
            let (ready, open): (Vec<_>, Vec<_>) =
                asked.drain(..).partition(|&(s, want)| self.done_from(s, want));
            *asked = open;
            self.counts.any_asked.store(!asked.is_empty(), Ordering::Release);
            ready
        };
        // Every answer is tried: one to a rank that died must not keep the others back.
        let (mut first_err, mut answered) = (None, 0);
        for &(src, want) in &ready {
            // A send of this thread toward `src` is under way further up the stack (its wait
            // for ring space runs the hooks): answer at a later round.
            let Ok(_sending) = self.counts.sending[src as usize].try_lock() else {
                self.reask(src, want);
                continue;
            };
            match self.send_am(src, internal::DONE_OK, AmClass::Request, &[want], AmPayload::Short) {
                Ok(()) => {
                    self.counts.protocol[src as usize].fetch_add(1, Ordering::AcqRel);
                    answered += 1;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(answered), Err)
    }

    /// Keeps the question of `src` for `want` open (again).
    fn reask(&self, src: u32, want: u64) {
        let mut asked = self.counts.asked.lock().unwrap_or_else(|p| p.into_inner());
        match asked.iter_mut().find(|(s, _)| *s == src) {
            Some((_, w)) => *w = (*w).max(want),
            None => asked.push((src, want)),
        }
        self.counts.any_asked.store(true, Ordering::Release);
    }
}
