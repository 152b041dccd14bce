//! Active messages: registration, sending (with back-pressure) and dispatch.

use crate::segment::GlobalPtr;
use crate::{Comm, Error, Result};
use std::cell::Cell;
use std::sync::Arc;
use weft_fabric::{AmClass, AmIn, AmInPayload, AmOut, AmPayload, EventSink, FabricResult, PollSet};

/// Id of a registered active-message handler (from [`crate::Builder::handler`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AmHandler(pub(crate) u16);

impl AmHandler {
    /// The numeric id (the same on every rank).
    pub fn id(self) -> u16 {
        self.0
    }
}

pub(crate) type HandlerFn = Arc<dyn Fn(&AmMsg<'_>) + Send + Sync>;

pub(crate) struct HandlerEntry {
    pub name: String,
    pub f: HandlerFn,
}

thread_local! {
    /// The class of the handler running on this thread, if any.
    static IN_HANDLER: Cell<Option<AmClass>> = const { Cell::new(None) };
    /// Why this thread runs under a handler's rules outside a handler, for the errors of what
    /// they refuse (see [`as_handler`]).
    static RESTRICTED: Cell<Option<&'static str>> = const { Cell::new(None) };
}

#[inline]
pub(crate) fn in_handler() -> Option<AmClass> {
    IN_HANDLER.with(|h| h.get())
}

/// The error for `what`, refused under a handler's rules: the restriction's own message where
/// code runs under [`as_handler`], else `in_handler` (what an AM handler hears).
#[cold]
pub(crate) fn refused(in_handler: &'static str) -> Error {
    Error::Misuse(RESTRICTED.with(|r| r.get()).unwrap_or(in_handler))
}

/// Runs `f` under the rules of a request handler (no requests, collectives, barriers or
/// `wait_all`; waits deliver replies only), wherever it runs; what those rules refuse fails
/// with `Misuse(why)`. For a layer's code that runs inside handlers at some times and from
/// hooks at others (the RPC layer's plain functions), so that it behaves the same either way.
pub fn as_handler<R>(why: &'static str, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<AmClass>, Option<&'static str>);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_HANDLER.with(|c| c.set(self.0));
            RESTRICTED.with(|c| c.set(self.1));
        }
    }
    let outer = IN_HANDLER.with(|c| c.replace(Some(c.get().unwrap_or(AmClass::Request))));
    let _restore = Restore(outer, RESTRICTED.with(|c| c.replace(Some(why))));
    f()
}

/// What this thread may handle while it waits: inside a handler only replies (so handlers
/// never recurse into requests), everything otherwise.
#[inline]
pub(crate) fn poll_set() -> PollSet {
    if in_handler().is_some() {
        PollSet::RepliesOnly
    } else {
        PollSet::All
    }
}

/// An active message being handled: who sent it, its arguments and payload, and the means to
/// reply (from request handlers only, at most once).
pub struct AmMsg<'a> {
    comm: &'a Comm,
    src: u32,
    class: AmClass,
    args: &'a [u64],
    payload: &'a [u8],
    long_offset: Option<usize>,
    replied: Cell<bool>,
    /// The handler took its [`crate::completion::Held`] (one per message).
    pub(crate) held: Cell<bool>,
}

impl<'a> AmMsg<'a> {
    /// The sending rank.
    pub fn src(&self) -> u32 {
        self.src
    }
    /// The handler arguments.
    pub fn args(&self) -> &'a [u64] {
        self.args
    }
    /// The payload: the message's bytes for a medium AM, the bytes written into this rank's
    /// segment for a long AM, empty for a short AM.
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
    /// For a long AM, the byte offset in the segment where the payload was written.
    pub fn long_offset(&self) -> Option<usize> {
        self.long_offset
    }
    /// Whether this message is a reply.
    pub fn is_reply(&self) -> bool {
        self.class == AmClass::Reply
    }
    /// The communication object (for RMA to local segments, rank, size...).
    pub fn comm(&self) -> &'a Comm {
        self.comm
    }
    fn check_reply(&self) -> Result<()> {
        if self.class == AmClass::Reply {
            return Err(Error::Misuse("a reply handler cannot reply"));
        }
        if self.replied.replace(true) {
            return Err(Error::Misuse("a request handler may reply only once"));
        }
        Ok(())
    }
    /// Replies with arguments only.
    pub fn reply_short(&self, h: AmHandler, args: &[u64]) -> Result<()> {
        self.check_reply()?;
        self.comm.send_am(self.src, h.0, AmClass::Reply, args, AmPayload::Short)
    }
    /// Replies with a payload delivered to the reply handler.
    pub fn reply_medium(&self, h: AmHandler, args: &[u64], payload: &[u8]) -> Result<()> {
        self.check_reply()?;
        self.comm.send_am(self.src, h.0, AmClass::Reply, args, AmPayload::Medium(payload))
    }
    /// Replies with a payload written to `dst` (in the requester's segment) before the reply
    /// handler runs.
    pub fn reply_long(&self, dst: GlobalPtr<u8>, h: AmHandler, args: &[u64], payload: &[u8]) -> Result<()> {
        self.check_reply()?;
        if dst.rank() != self.src {
            return Err(Error::Misuse("a long reply must target the requester's memory"));
        }
        self.comm.send_long(h.0, AmClass::Reply, args, payload, dst)
    }
}

impl Comm {
    /// The handler registered under `name` (the same id on every rank), if any: how a tool
    /// that speaks a layer's wire protocol, or a test that forges its messages, reaches it.
    /// Any rank can send any registered handler a message, so every handler checks what
    /// arrives.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// assert!(world.handler_named("weft.barrier").is_some());
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn handler_named(&self, name: &str) -> Option<AmHandler> {
        let at = self.handlers.iter().position(|h| h.name == name)?;
        u16::try_from(at).ok().map(AmHandler)
    }
    /// Sends a request carrying arguments only to `dst`.
    pub fn am_request_short(&self, dst: u32, h: AmHandler, args: &[u64]) -> Result<()> {
        self.check_request(h)?;
        self.send_am(dst, h.0, AmClass::Request, args, AmPayload::Short)
    }
    /// Sends a request whose payload (at most [`crate::Caps::am_max_medium`] bytes) is delivered
    /// to the handler on `dst`.
    pub fn am_request_medium(&self, dst: u32, h: AmHandler, args: &[u64], payload: &[u8]) -> Result<()> {
        self.check_request(h)?;
        self.send_am(dst, h.0, AmClass::Request, args, AmPayload::Medium(payload))
    }
    /// Sends a request whose payload is first written to `dst` (a location in the target's
    /// segment, bounds-checked); the handler runs on `dst.rank()` once the bytes are in place.
    pub fn am_request_long(
        &self,
        dst: GlobalPtr<u8>,
        h: AmHandler,
        args: &[u64],
        payload: &[u8],
    ) -> Result<()> {
        self.check_request(h)?;
        self.send_long(h.0, AmClass::Request, args, payload, dst)
    }

    pub(crate) fn check_request(&self, h: AmHandler) -> Result<()> {
        if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(FINALIZED);
        }
        if in_handler().is_some() {
            return Err(refused("requests cannot be sent from inside an AM handler (reply instead)"));
        }
        if h.0 as usize >= self.handlers.len() {
            return Err(Error::UnknownHandler { id: h.0, src: self.rank() });
        }
        Ok(())
    }

    pub(crate) fn send_long(
        &self,
        h: u16,
        class: AmClass,
        args: &[u64],
        payload: &[u8],
        dst: GlobalPtr<u8>,
    ) -> Result<()> {
        let (seg, offset) = self.resolve(dst, payload.len())?;
        let region = seg.remote(dst.rank())?;
        if !self.native_rma {
            return Err(Error::Misuse("long AMs need a fabric with RMA; use a medium AM"));
        }
        self.send_am(dst.rank(), h, class, args, AmPayload::Long { region, offset, data: payload })
    }

    /// Sends any AM, making progress while the path to `dst` is full.
    ///
    /// Inline: this is most of a short AM's sending cost, and its checks are one branch.
    #[inline]
    pub(crate) fn send_am(
        &self,
        dst: u32,
        h: u16,
        class: AmClass,
        args: &[u64],
        payload: AmPayload<'_>,
    ) -> Result<()> {
        let medium = if let AmPayload::Medium(p) = payload { p.len() } else { 0 };
        if dst >= self.size()
            || args.len() > self.caps.am_max_args
            || medium > self.caps.am_max_medium
            || in_fork_child()
        {
            return Err(self.bad_am(dst, args.len(), medium));
        }
        let msg = AmOut { handler: h, class, args, payload };
        if self.fabric.am_try_send(dst, &msg)? {
            return Ok(());
        }
        self.send_am_when_free(dst, &msg)
    }

    /// Back-pressure: the path to `dst` is full. Makes progress (see `poll_set`) until the
    /// receiver drains it; a send error ends the wait and is returned.
    #[inline(never)]
    fn send_am_when_free(&self, dst: u32, msg: &AmOut<'_>) -> Result<()> {
        self.wait(crate::progress::Deps::Rank(dst), "an AM send (its ring is full)", || {
            self.fabric.am_try_send(dst, msg).unwrap_or_else(|e| {
                self.record_error(e.into());
                true
            })
        })?;
        self.take_error()
    }

    /// The error for an AM that [`Comm::send_am`] refuses.
    #[cold]
    fn bad_am(&self, dst: u32, nargs: usize, medium: usize) -> Error {
        if in_fork_child() {
            FORK_CHILD
        } else if dst >= self.size() {
            Error::NoSuchRank { rank: dst, size: self.size() }
        } else if nargs > self.caps.am_max_args {
            Error::TooLarge { what: "AM argument count", len: nargs, max: self.caps.am_max_args }
        } else {
            Error::TooLarge { what: "medium AM payload (bytes)", len: medium, max: self.caps.am_max_medium }
        }
    }
}

impl EventSink for Comm {
    fn on_am(&self, am: AmIn<'_>) {
        let Some(h) = self.handlers.get(am.handler as usize) else {
            self.record_error(Error::UnknownHandler { id: am.handler, src: am.src });
            return;
        };
        let (payload, long_offset) = match am.payload {
            AmInPayload::Short => (&[][..], None),
            AmInPayload::Medium(p) => (p, None),
            AmInPayload::Long { offset, data, .. } => (data, Some(offset)),
        };
        let msg = AmMsg {
            comm: self,
            src: am.src,
            class: am.class,
            args: am.args,
            payload,
            long_offset,
            replied: Cell::new(false),
            held: Cell::new(false),
        };
        let outer = IN_HANDLER.with(|c| c.replace(Some(am.class)));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (h.f)(&msg)));
        IN_HANDLER.with(|c| c.set(outer));
        if r.is_err() {
            self.record_error(Error::Remote(format!(
                "AM handler {:?} panicked on a message from rank {}",
                h.name, am.src
            )));
        }
    }

    fn on_complete(&self, token: u64, value: u64, result: FabricResult<()>) {
        self.ops.complete(token, value, result.map_err(Error::from));
    }
}

/// What a call on a world whose `World` was dropped (finalized) returns.
pub(crate) const FINALIZED: Error = Error::Misuse("this world was finalized (its World was dropped)");

/// What a call in a child of `fork` returns: the child shares its parent's rings and mappings,
/// and would take the parent's messages.
pub(crate) const FORK_CHILD: Error =
    Error::Misuse("weft cannot be used in a child of fork (it would take its parent's messages)");

/// Set in a child of `fork` of a process that started a world.
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn forked() {
    FORKED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Has the child of `fork` note that it is one (once per process).
pub(crate) fn watch_fork() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        weft_fabric::signals::at_fork_child(forked);
    });
}

/// Whether this process is a child of `fork` of one that started a world.
#[inline(always)]
pub(crate) fn in_fork_child() -> bool {
    FORKED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Handlers the runtime itself registers before the program's (ids `0..COUNT`).
pub(crate) mod internal {
    use super::{HandlerEntry, HandlerFn};
    use std::sync::Arc;

    pub const BARRIER: u16 = 0;
    pub const EXCHANGE: u16 = 1;
    pub const RMA_PUT: u16 = 2;
    pub const RMA_GET: u16 = 3;
    pub const RMA_ATOMIC: u16 = 4;
    pub const RMA_DONE: u16 = 5;
    pub const VIS_PUT: u16 = 6;
    pub const VIS_GET: u16 = 7;
    pub const WORLD_MISMATCH: u16 = 8;
    pub const DONE_ASK: u16 = 9;
    pub const DONE_OK: u16 = 10;
    pub const COUNT: u16 = 11;

    pub fn handlers() -> Vec<HandlerEntry> {
        let list: [(&str, HandlerFn); COUNT as usize] = [
            ("weft.barrier", Arc::new(|m| m.comm().on_barrier(m))),
            ("weft.exchange", Arc::new(|m| m.comm().on_exchange(m))),
            ("weft.rma.put", Arc::new(|m| m.comm().on_am_put(m))),
            ("weft.rma.get", Arc::new(|m| m.comm().on_am_get(m))),
            ("weft.rma.atomic", Arc::new(|m| m.comm().on_am_atomic(m))),
            ("weft.rma.done", Arc::new(|m| m.comm().on_am_done(m))),
            ("weft.vis.put", Arc::new(|m| m.comm().on_vis_put(m))),
            ("weft.vis.get", Arc::new(|m| m.comm().on_vis_get(m))),
            ("weft.world.mismatch", Arc::new(|m| m.comm().on_world_mismatch(m))),
            ("weft.done.ask", Arc::new(|m| m.comm().on_done_ask(m))),
            ("weft.done.ok", Arc::new(|m| m.comm().on_done_ok(m))),
        ];
        list.into_iter().map(|(n, f)| HandlerEntry { name: n.to_string(), f }).collect()
    }
}
