//! The RPC protocol.
//!
//! Every RPC message (a call, a post, a result) is one medium AM request `weft.rpc.msg` whose
//! arguments are a [`Header`]: as few words as the message needs (an eager call is three: the
//! ring header, arguments and a small index share one 64-byte line):
//! - **eager** (mode 0): the payload is the archive's index; the archive has no chunks.
//! - **rendezvous** (mode 1): the payload describes the chunks (and carries the index when it
//!   fits). The receiver pulls each chunk — RMA get from the sender's pool, or the fabric's peer
//!   read for unregistered memory — into its own pool, then sends `weft.rpc.ack(ack id)`; the
//!   sender then drops what it kept alive for the transfer (the "sent" signal).
//!
//! A plain function called eagerly, with nothing queued before it, runs inside the handler, and
//! its result goes back as the AM reply when it encodes eagerly (see [`RemoteFn::PLAIN`]).
//! Handlers queue every other message: pulling, decoding and running `async` functions happen
//! in the RPC progress hook, outside AM handlers, so those may communicate and block. Their
//! results travel back as messages of their own (kind `RESULT_OK` / `RESULT_ERR`).

use crate::archive::{self, Archive, ArchiveError, ChunkRef, ChunkSource, Locate};
use crate::buffer::{with_decode_pool, Numbers, Received};
use crate::calls::CallTable;
use crate::registry::{self, IdMap, Outbound, Outgoing, Registration, RemoteFn, Running, Started, Value};
use crate::tasks::{Flag, TaskQueue};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use weft_fabric::pod::AlignedBuf;
use weft_fabric::pool::BlockPool;
use weft_runtime::layer::{as_handler, serving, Layer, RmaPool};
use weft_runtime::{AmHandler, AmMsg, Comm, Endpoint, Error, GlobalPtr, Held, Result};

/// A call's outcome as delivered: success, the result's index, its pulled chunks.
type Outcome = (bool, Vec<u8>, Vec<Option<Received>>);

/// Sends one medium request AM (destination, handler, arguments, payload): the world's
/// default path or an endpoint's.
type Medium<'a> = dyn FnMut(u32, AmHandler, &[u64], &[u8]) -> Result<()> + 'a;

mod caller;
mod chunks;
pub use caller::{CallFuture, EndpointRpcExt, RpcExt, Sent};
pub use chunks::{parse_desc, rendezvous_message};
use chunks::{proto_desc, PoolLocator, Pulled};

/// Message kind (argument 0): a call that wants a result.
pub const CALL: u64 = 0;
/// Message kind: a call without a result.
pub const POST: u64 = 1;
/// Message kind: a result.
pub const RESULT_OK: u64 = 2;
/// Message kind: an error instead of a result (the payload is its text).
pub const RESULT_ERR: u64 = 3;
/// Mode (argument 3): the payload is the whole archive index.
pub const EAGER: u64 = 0;
/// Mode: the payload is a rendezvous descriptor (see [`rendezvous_message`]).
pub const RENDEZVOUS: u64 = 1;

thread_local! {
    /// An index buffer to encode eager messages into, reused (the message copies it).
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}
/// What a plain remote function hears when it tries what only `async` ones may.
const PLAIN_RULE: &str = "a plain remote function cannot send requests (calls, posts, AMs), run collectives \
     or wait_all (it may run inside its call's AM handler): declare it `async fn` to communicate";

/// Largest scratch buffer kept for reuse.
const SCRATCH_KEEP: usize = 64 << 10;

/// This thread's index buffer for an eager message.
fn take_scratch() -> Vec<u8> {
    SCRATCH.with(|s| s.take())
}

/// Keeps an eager message's index buffer for the next one (unless it grew large).
fn recycle_scratch(index: Vec<u8>) {
    if index.capacity() <= SCRATCH_KEEP {
        SCRATCH.with(|s| s.set(index));
    }
}

/// Default size threshold (bytes) from which a byte string travels as a chunk.
pub const DEFAULT_THRESHOLD: usize = 4096;
/// Default of [`Rpc::set_stage_max`]: 4 MiB.
pub const DEFAULT_STAGE_MAX: usize = 4 << 20;

/// Default of the most bytes the chunks of one incoming call or result may declare: 1 GiB
/// (`WEFT_RPC_MAX_ARG_MIB`).
pub const DEFAULT_MAX_ARG: u64 = 1 << 30;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counters of what the RPC layer rejected or survived.
#[derive(Debug, Default)]
pub struct RpcStats {
    /// Messages whose bytes did not decode.
    pub malformed: AtomicU64,
    /// Calls of functions this rank does not have.
    pub unknown_function: AtomicU64,
    /// Remote functions that panicked (reported to the caller as errors).
    pub panics: AtomicU64,
    /// Bytes of chunks this rank copied into its pool to send them (where the fabric could not
    /// let the target read them in place, or a copy was cheaper). This and
    /// [`RpcStats::registered_bytes`] count every value this rank sends: arguments of its
    /// calls and results of the calls it serves (at any time, from the progress thread too).
    pub copied_bytes: AtomicU64,
    /// Bytes of chunks this rank sent as registrations of their own memory (zero-copy on
    /// networks).
    pub registered_bytes: AtomicU64,
}

/// The AM arguments of an RPC message.
///
/// On the wire: word 0 is `kind | mode << 8`; then the function id (calls and posts), the call
/// id (calls and results), and the ack id (rendezvous only) — 2 to 4 words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// [`CALL`], [`POST`], [`RESULT_OK`] or [`RESULT_ERR`].
    pub kind: u64,
    /// [`EAGER`] or [`RENDEZVOUS`].
    pub mode: u64,
    /// The function's id (calls and posts; 0 otherwise).
    pub fn_id: u64,
    /// The call this message belongs to (calls and results; 0 for posts).
    pub call_id: u64,
    /// What the receiver acknowledges after pulling (rendezvous; 0 otherwise).
    pub ack_id: u64,
}

impl Header {
    /// The AM arguments: `words[..n]`.
    pub fn encode(&self) -> ([u64; 4], usize) {
        let mut w = [self.kind | self.mode << 8, 0, 0, 0];
        let mut n = 1;
        let mut push = |v: u64| {
            w[n] = v;
            n += 1;
        };
        match self.kind {
            CALL => {
                push(self.fn_id);
                push(self.call_id);
            }
            POST => push(self.fn_id),
            _ => push(self.call_id),
        }
        if self.mode == RENDEZVOUS {
            push(self.ack_id);
        }
        (w, n)
    }

    /// Reads AM arguments back; `None` if they are not a well-formed header.
    pub fn decode(args: &[u64]) -> Option<Header> {
        let (&w0, rest) = args.split_first()?;
        let (kind, mode) = (w0 & 0xff, w0 >> 8);
        if kind > RESULT_ERR || mode > RENDEZVOUS {
            return None;
        }
        let want = match kind {
            CALL => 2,
            _ => 1,
        } + mode as usize;
        if rest.len() != want {
            return None;
        }
        let (fn_id, call_id, tail) = match kind {
            CALL => (rest[0], rest[1], &rest[2..]),
            POST => (rest[0], 0, &rest[1..]),
            _ => (0, rest[0], &rest[1..]),
        };
        Some(Header { kind, mode, fn_id, call_id, ack_id: tail.first().copied().unwrap_or(0) })
    }
}

/// What the handler leaves for the progress hook.
enum Incoming {
    /// A message to pull, decode or run there; `held` keeps its request from counting as
    /// handled (for `wait_all`) until its function has finished.
    Message { src: u32, head: Header, payload: Vec<u8>, held: Option<Held> },
    /// The result (or error text) of a plain function that ran in the handler but could not
    /// go back as the AM reply (it needs chunks, or the reply failed): sent as a message of
    /// its own, with header `head`.
    Result { src: u32, head: Header, out: Box<dyn Outbound> },
}

/// What a call's caller waits for.
struct CallSlot {
    /// The rank called: only its result is taken.
    target: u32,
    outcome: Option<Outcome>,
    waker: Option<Waker>,
    /// The target died or left before answering (set by the liveness hook).
    failed: Option<Error>,
}

impl CallSlot {
    /// Nothing more will come: a result, or the failure that ends the wait for one.
    fn settled(&self) -> bool {
        self.outcome.is_some() || self.failed.is_some()
    }
}

/// The "sent" signal of one transfer.
#[derive(Default)]
struct SentState {
    done: AtomicBool,
    waker: Mutex<Option<Waker>>,
    /// The receiver died or left before pulling everything (set before `done`).
    lost: Mutex<Option<Error>>,
}

impl SentState {
    /// What the wait for the signal gives once `done` is set.
    fn result(&self) -> Result<()> {
        lock(&self.lost).clone().map_or(Ok(()), Err)
    }

    fn fire(&self) {
        self.done.store(true, Ordering::Release);
        if let Some(w) = lock(&self.waker).take() {
            w.wake();
        }
    }
}

/// What a sender keeps alive until the receiver acknowledges its pulls.
struct Kept {
    /// The rank that pulls: only its acknowledgement releases the value.
    to: u32,
    /// Registrations of the value's memory (released before the value: fields drop in order).
    _exposed: Vec<(u64, weft_runtime::Registration)>,
    _value: Box<dyn Outbound>,
    _index: Vec<u8>,
    _staged: Vec<weft_fabric::pool::Block>,
    sent: Arc<SentState>,
}

/// A remote function running on this rank (it returned `Pending` once).
struct Task {
    fut: Running,
    src: u32,
    call: Option<u64>,
    /// Its request counts as handled once the task is dropped (finished or failed).
    _held: Option<Held>,
}

/// A task's waker: sets its flag in the task queue, then asks the world's progress thread to run
/// the hook that polls it (nothing else may, where the program's threads are all busy elsewhere).
struct TaskWaker(Arc<Flag>, std::sync::Weak<Comm>);
impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wake();
        if let Some(c) = self.1.upgrade() {
            c.want_progress();
        }
    }
}

/// The RPC layer of one world (reach it with [`Rpc::of`]).
pub struct Rpc {
    msg: AmHandler,
    ack: AmHandler,
    fns: OnceLock<IdMap<Registration>>,
    pool: OnceLock<RmaPool>,
    threshold: AtomicU64,
    /// Bytes up to which the elements of a plain `Vec` of numbers are staged into the pool by
    /// the sender where the fabric could read them in place (see [`Rpc::set_stage_max`]).
    stage_max: AtomicU64,
    /// Most bytes the chunks of one incoming message may declare (`WEFT_RPC_MAX_ARG_MIB`).
    max_arg: AtomicU64,
    /// See [`Rpc::set_zero_copy`].
    zero_copy: AtomicBool,
    next_id: AtomicU64,
    calls: Mutex<CallTable<CallSlot>>,
    /// Results delivered so far: waiting callers look at the call table only when it moved.
    results: AtomicU64,
    kept: Mutex<IdMap<Kept>>,
    incoming: Mutex<VecDeque<Incoming>>,
    /// Messages in `incoming`. The progress hook runs in every wait: it reads this counter
    /// and the task queue's flag, and takes no lock when there is nothing to do.
    queued: AtomicUsize,
    /// Remote functions waiting for their wakers.
    tasks: TaskQueue<Task>,
    /// What was rejected.
    pub stats: RpcStats,
}

impl Rpc {
    pub(crate) fn new(msg: AmHandler, ack: AmHandler) -> Self {
        Rpc {
            msg,
            ack,
            fns: OnceLock::new(),
            pool: OnceLock::new(),
            threshold: AtomicU64::new(DEFAULT_THRESHOLD as u64),
            stage_max: AtomicU64::new(DEFAULT_STAGE_MAX as u64),
            max_arg: AtomicU64::new(DEFAULT_MAX_ARG),
            zero_copy: AtomicBool::new(true),
            next_id: AtomicU64::new(1),
            calls: Mutex::new(CallTable::default()),
            results: AtomicU64::new(0),
            kept: Mutex::new(IdMap::default()),
            incoming: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            tasks: TaskQueue::new(),
            stats: RpcStats::default(),
        }
    }

    /// Collective start-up: the function tables must match on every rank; allocates the pool.
    pub(crate) fn start(&self, comm: &Comm) -> Result<()> {
        let fns = registry::table().map_err(Error::Mismatch)?;
        let mine = registry::signatures(&fns);
        for (r, theirs) in comm.exchange(mine.as_bytes())?.iter().enumerate() {
            registry::compare_signatures(&mine, theirs).map_err(|diff| {
                Error::Mismatch(format!(
                    "remote functions differ between rank {} and rank {r}: {diff}",
                    comm.rank()
                ))
            })?;
        }
        let _ = self.fns.set(fns);
        let mib = match std::env::var("WEFT_RPC_POOL_MIB") {
            Ok(v) => v.parse::<usize>().ok().filter(|&m| m > 0 && m <= 1 << 20).ok_or_else(|| {
                Error::Config(format!("WEFT_RPC_POOL_MIB={v}: expected a number of MiB from 1 to 1048576"))
            })?,
            Err(_) => 256,
        };
        if let Ok(v) = std::env::var("WEFT_RPC_STAGE_KIB") {
            let kib = v.parse::<u64>().ok().filter(|&k| k <= 1 << 30).ok_or_else(|| {
                Error::Config(format!("WEFT_RPC_STAGE_KIB={v}: expected a number of KiB from 0 to 2^30"))
            })?;
            self.set_stage_max(kib << 10);
        }
        if let Ok(v) = std::env::var("WEFT_RPC_MAX_ARG_MIB") {
            let mib = v.parse::<u64>().ok().filter(|&m| m > 0 && m <= 1 << 30).ok_or_else(|| {
                Error::Config(format!("WEFT_RPC_MAX_ARG_MIB={v}: expected a number of MiB from 1 to 2^30"))
            })?;
            self.max_arg.store(mib << 20, Ordering::Relaxed);
        }
        let pool = comm.alloc_pool(mib << 20)?;
        let _ = self.pool.set(pool);
        Ok(())
    }

    pub(crate) fn pool(&self) -> Result<&Arc<BlockPool>> {
        self.pool.get().map(|p| p.blocks()).ok_or(Error::Misuse("the RPC pool is not allocated yet"))
    }

    /// Bytes from which a byte string travels as a chunk (default 4 KiB).
    pub fn threshold(&self) -> usize {
        self.threshold.load(Ordering::Relaxed) as usize
    }
    /// Sets the chunk threshold for this world (per call: [`RpcExt::call_with`]).
    pub fn set_threshold(&self, bytes: usize) {
        self.threshold.store(bytes as u64, Ordering::Relaxed);
    }

    /// Sets the size up to which the elements of a plain `Vec` of numbers are copied into the
    /// registered pool by the sender, on fabrics where the target could read them in place
    /// (`WEFT_RPC_STAGE_KIB`, default 4 MiB). On the shared-memory fabric the in-place read is
    /// the kernel's cross-memory attach, a system call that pins the pages; on this project's
    /// machines the sender's memcpy plus the target's copy out of the mapped pool costs less
    /// (`weft bench rpc`: a 4 KiB `Vec` echo 2.4 against 6.2 µs, 1 MiB 164 against 253 µs).
    /// `0` reads every such chunk in place. Chunk-aware values
    /// ([`SerializeBuffer`](crate::SerializeBuffer), [`RmaVec`](crate::RmaVec)) are never
    /// copied on fabrics that can read them. On libfabric, chunks from `WEFT_OFI_ZCOPY_KIB`
    /// (16 KiB) up are registered for the transfer and read in place, smaller ones staged.
    pub fn set_stage_max(&self, bytes: u64) {
        self.stage_max.store(bytes, Ordering::Relaxed);
    }

    /// With `false`, every chunk outside the pool is copied into it by the sender, as on a
    /// fabric that could not let the target read it in place (default `true`): what
    /// `weft bench net` compares zero copy against.
    ///
    /// ```no_run
    /// # use weft_runtime as weft;
    /// let world = weft::World::init()?;
    /// weft_rpc::Rpc::of(&world)?.set_zero_copy(false);
    /// # Ok::<(), weft::Error>(())
    /// ```
    pub fn set_zero_copy(&self, on: bool) {
        self.zero_copy.store(on, Ordering::Relaxed);
    }

    fn stage_max(&self) -> usize {
        self.stage_max.load(Ordering::Relaxed) as usize
    }

    // ----- sending -------------------------------------------------------------------------

    /// Encodes `value` and sends it as a message; returns the "sent" signal (`None`: sent
    /// already, the message carried everything).
    fn send(
        &self,
        comm: &Comm,
        dst: u32,
        head: Header,
        value: impl Outgoing,
        threshold: usize,
    ) -> Result<Option<Arc<SentState>>> {
        self.send_via(
            comm,
            &mut |d, h, args, payload| comm.am_request_medium(d, h, args, payload),
            dst,
            head,
            value,
            threshold,
        )
    }

    /// [`Rpc::send`] with the message handed to `medium` (the world's default path, or an
    /// endpoint's).
    fn send_via(
        &self,
        comm: &Comm,
        medium: &mut Medium<'_>,
        dst: u32,
        head: Header,
        value: impl Outgoing,
        threshold: usize,
    ) -> Result<Option<Arc<SentState>>> {
        let caps = comm.caps();
        let zero_copy = self.zero_copy.load(Ordering::Relaxed);
        let expose =
            |b: &[u8]| if zero_copy { comm.expose(dst, b) } else { Ok(weft_runtime::Exposure::Copy) };
        let locate = PoolLocator::new(self.pool.get(), &expose, self.stage_max(), &self.stats);
        let mut archive =
            value.value().encode(threshold, &locate, take_scratch()).map_err(|e| Error::Encode(e.0))?;
        let max = caps.am_max_medium;
        if archive.chunks.is_empty() && archive.index.len() <= max {
            let (w, n) = Header { mode: EAGER, ack_id: 0, ..head }.encode();
            let r = medium(dst, self.msg, &w[..n], &archive.index);
            recycle_scratch(archive.index);
            return r.map(|_| None);
        }
        // The target pulls the chunks later: the value must outlive this call. Boxing moves
        // it; chunks are addresses of heap or pool memory, which does not move, unless a
        // value serialized bytes stored inside itself: then encode the boxed value again.
        let (value, moved) = value.into_kept();
        let inside = |c: &ChunkRef| locate.points_into(c, &|a| moved.contains(&a));
        if archive.chunks.iter().any(inside) {
            locate.reset();
            archive = value.encode(threshold, &locate, archive.index).map_err(|e| Error::Encode(e.0))?;
        }
        let sent = Arc::new(SentState::default());
        let ack = self.next_id.fetch_add(1, Ordering::Relaxed);
        let desc = proto_desc(&archive, max, &locate);
        locate.check()?;
        // After proto_desc, which may stage the index too.
        let (staged, exposed) = (locate.staged.take(), locate.exposed.take());
        let kept = Kept {
            to: dst,
            _exposed: exposed,
            _value: value,
            _index: archive.index,
            _staged: staged,
            sent: sent.clone(),
        };
        lock(&self.kept).insert(ack, kept);
        let (w, n) = Header { mode: RENDEZVOUS, ack_id: ack, ..head }.encode();
        if let Err(e) = medium(dst, self.msg, &w[..n], &desc) {
            lock(&self.kept).remove(&ack);
            return Err(e);
        }
        Ok(Some(sent))
    }

    // ----- handlers (inside AM progress: queue only) ----------------------------------------

    pub(crate) fn on_msg(&self, am: &AmMsg<'_>) {
        let Some(head) = Header::decode(am.args()) else {
            self.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if head.mode == EAGER {
            match head.kind {
                // A complete result: hand it to its caller now (no pull, no user code).
                RESULT_OK | RESULT_ERR => {
                    let src = am.src();
                    self.deliver(head.call_id, src, head.kind == RESULT_OK, am.payload().to_vec(), vec![]);
                    return;
                }
                // A plain function, with nothing queued before it (calls stay in order):
                // run it here and answer with the AM reply.
                CALL | POST if !am.is_reply() && self.queued.load(Ordering::Acquire) == 0 => {
                    if let Some(reg) = self.fns.get().and_then(|t| t.get(&head.fn_id)).filter(|r| r.plain) {
                        self.run_plain(am, head, reg);
                        return;
                    }
                }
                _ => {}
            }
        }
        let held = am.hold();
        self.enqueue(Incoming::Message { src: am.src(), head, payload: am.payload().to_vec(), held });
    }

    fn enqueue(&self, m: Incoming) {
        let mut q = lock(&self.incoming);
        q.push_back(m);
        // Counted under the lock, so the counter never runs behind the queue.
        self.queued.fetch_add(1, Ordering::Release);
    }

    /// Runs a plain function inside the handler of its eager call (see [`RemoteFn::PLAIN`]).
    fn run_plain(&self, am: &AmMsg<'_>, head: Header, reg: &Registration) {
        let source = Pulled(RefCell::new(vec![]));
        let out = match self.start_fn(am.comm(), reg, am.payload(), &source) {
            Ok(Started::Done(out)) => Ok(out),
            Ok(Started::Running(_)) => {
                // A plain function finishes at once: a registration saying otherwise is a bug.
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                Err(format!("{} did not finish at once", reg.name))
            }
            Err(why) => Err(why),
        };
        if head.kind != CALL {
            return;
        }
        let (head, out): (Header, Box<dyn Outbound>) = match out {
            Ok(out) => (result(RESULT_OK, head.call_id), out),
            Err(why) => (result(RESULT_ERR, head.call_id), Box::new(why)),
        };
        if !self.reply_eager(am, head, &*out) {
            self.enqueue(Incoming::Result { src: am.src(), head, out });
        }
    }

    /// Sends `value` back as the AM reply of `am` if it encodes eagerly (no chunks, one
    /// message); `false` if it must travel as a message of its own.
    fn reply_eager(&self, am: &AmMsg<'_>, head: Header, value: &dyn Outbound) -> bool {
        // No staging here: a value with chunks goes the long way, staged there.
        let Ok(archive) = value.encode(self.threshold(), &archive::NoPool, take_scratch()) else {
            return false;
        };
        let sent = archive.chunks.is_empty() && archive.index.len() <= am.comm().caps().am_max_medium && {
            let (w, n) = head.encode();
            am.reply_medium(self.msg, &w[..n], &archive.index).is_ok()
        };
        recycle_scratch(archive.index);
        sent
    }

    pub(crate) fn on_ack(&self, am: &AmMsg<'_>) {
        let Some(&id) = am.args().first() else { return };
        let mut kept = lock(&self.kept);
        // Only the receiver's acknowledgement releases the buffers: ids are sequential, and
        // another rank's forged one would let the caller reuse memory still to be pulled.
        if kept.get(&id).is_some_and(|k| k.to == am.src()) {
            if let Some(k) = kept.remove(&id) {
                drop(kept);
                k.sent.fire();
            }
        } else {
            self.stats.malformed.fetch_add(1, Ordering::Relaxed);
        }
    }

    // ----- progress hook (outside handlers) -------------------------------------------------

    pub(crate) fn progress(&self, comm: &Comm) -> Result<usize> {
        if self.pool.get().is_none() {
            // Start-up has not finished on this rank (its pool is allocated last, in a
            // collective step whose waits run this hook): a peer that finished first may
            // already call. Its messages wait in the queue until the pool exists, since
            // their results are staged in it where the fabric cannot read other memory.
            return Ok(0);
        }
        let mut n = 0;
        while self.queued.load(Ordering::Acquire) > 0 {
            let Some(m) = ({
                let mut q = lock(&self.incoming);
                q.pop_front().inspect(|_| {
                    self.queued.fetch_sub(1, Ordering::Release);
                })
            }) else {
                break;
            };
            n += 1;
            self.handle(comm, m)?;
        }
        for (flag, task) in self.tasks.take_ready() {
            n += 1;
            self.step(comm, flag, task)?;
        }
        if let Some(p) = self.pool.get() {
            p.purge_idle();
        }
        Ok(n)
    }

    fn handle(&self, comm: &Comm, m: Incoming) -> Result<()> {
        let (src, head, payload, held) = match m {
            Incoming::Message { src, head, payload, held } => (src, head, payload, held),
            Incoming::Result { src, head, out } => return self.send_result(comm, src, head, out),
        };
        let Header { kind, mode, fn_id: fid, call_id: call, ack_id: ack } = head;
        // Nothing is pulled for a function this rank does not have or for a result no call
        // here waits for (forged or late): refused before anything is allocated.
        let expected = match kind {
            CALL | POST => self.fns.get().is_some_and(|t| t.contains_key(&fid)),
            RESULT_OK | RESULT_ERR => self.awaits(call, src),
            _ => false,
        };
        // `Header::decode` admitted only the two modes.
        let pulled = match (mode, expected) {
            (RENDEZVOUS, true) => self.pull(comm, src, &payload),
            (RENDEZVOUS, false) => Ok((vec![], vec![])),
            _ => Ok((payload, vec![])),
        };
        if mode == RENDEZVOUS {
            // Whatever happened, the sender may release its buffers now.
            comm.am_request_short(src, self.ack, &[ack])?;
        }
        let (index, chunks) = match pulled {
            Ok(p) => p,
            Err(e) => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                match kind {
                    CALL => {
                        self.reply_err(comm, src, call, format!("rank {}: call refused: {e}", comm.rank()))?
                    }
                    // The caller is this rank: it hears why instead of waiting for ever.
                    RESULT_OK | RESULT_ERR => {
                        let why = format!("the result from rank {src} could not be received: {e}");
                        self.deliver(call, src, false, error_index(&why), vec![]);
                    }
                    _ => {}
                }
                return Ok(());
            }
        };
        match kind {
            CALL | POST => {
                let Some(reg) = self.fns.get().and_then(|t| t.get(&fid)).copied() else {
                    self.stats.unknown_function.fetch_add(1, Ordering::Relaxed);
                    if kind == CALL {
                        let why = format!("rank {} has no remote function with id {fid:#x}", comm.rank());
                        self.reply_err(comm, src, call, why)?;
                    }
                    return Ok(());
                };
                let source = Pulled(RefCell::new(chunks));
                let call = (kind == CALL).then_some(call);
                match self.start_fn(comm, &reg, &index, &source) {
                    Ok(Started::Done(out)) => {
                        if let Some(c) = call {
                            self.send_result(comm, src, result(RESULT_OK, c), out)?;
                        }
                    }
                    Ok(Started::Running(fut)) => {
                        self.step(comm, self.tasks.flag(), Task { fut, src, call, _held: held })?;
                    }
                    Err(why) => {
                        if let Some(c) = call {
                            self.reply_err(comm, src, c, why)?;
                        }
                    }
                }
            }
            RESULT_OK | RESULT_ERR => self.deliver(call, src, kind == RESULT_OK, index, chunks),
            _ => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// True if call `call` of this rank waits for its outcome from rank `src`.
    fn awaits(&self, call: u64, src: u32) -> bool {
        lock(&self.calls).get_mut(call).is_some_and(|slot| slot.outcome.is_none() && slot.target == src)
    }

    /// Gives call `call` its outcome from rank `src` and wakes its caller.
    fn deliver(&self, call: u64, src: u32, ok: bool, index: Vec<u8>, chunks: Vec<Option<Received>>) {
        let waker = {
            let mut calls = lock(&self.calls);
            match calls.get_mut(call).filter(|slot| slot.target == src) {
                Some(slot) => {
                    slot.outcome = Some((ok, index, chunks));
                    slot.waker.take()
                }
                None => {
                    // No such call (any more), or another rank's: a forged or late result.
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    None
                }
            }
        };
        self.results.fetch_add(1, Ordering::Release);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Starts function `reg` on the arguments in `index` and `source` (values decoded into
    /// this rank's pool), catching a panic. An error is the text for the caller, counted.
    fn start_fn(
        &self,
        comm: &Comm,
        reg: &Registration,
        index: &[u8],
        source: &Pulled,
    ) -> std::result::Result<Started, String> {
        let rank = comm.rank();
        let pool = self.pool.get().map(|p| p.blocks().clone());
        let start = || serving(comm, || with_decode_pool(pool, || (reg.start)(index, source)));
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // A plain function may run in its call's handler or from the hook: it follows a
            // handler's rules in both, so that what it may do does not depend on its input.
            if reg.plain {
                as_handler(PLAIN_RULE, start)
            } else {
                start()
            }
        }));
        match started {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                Err(format!("arguments of {} do not decode: {e}", reg.name))
            }
            Err(p) => Err(self.panic_reason(reg.name, &*p, rank)),
        }
    }

    /// What the caller hears of a panic in function `name` (counted).
    fn panic_reason(&self, name: &str, p: &(dyn std::any::Any + Send), rank: u32) -> String {
        self.stats.panics.fetch_add(1, Ordering::Relaxed);
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic".into());
        format!("{name} panicked on rank {rank}: {what}")
    }

    /// Polls a task once (its flag already cleared); finished tasks free their slot and send
    /// their result, others wait in the queue for their waker.
    fn step(&self, comm: &Comm, flag: Arc<Flag>, mut task: Task) -> Result<()> {
        let waker = Waker::from(Arc::new(TaskWaker(flag.clone(), Arc::downgrade(&comm.arc()))));
        let mut cx = Context::from_waker(&waker);
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serving(comm, || task.fut.as_mut().poll(&mut cx))
        }));
        if let Ok(Poll::Pending) = polled {
            self.tasks.park(flag, task);
            return Ok(());
        }
        self.tasks.close(&flag);
        match polled {
            Ok(Poll::Pending) => Ok(()),
            Ok(Poll::Ready(out)) => match task.call {
                Some(c) => self.send_result(comm, task.src, result(RESULT_OK, c), out),
                None => Ok(()),
            },
            Err(p) => {
                let why = self.panic_reason("a remote function", &*p, comm.rank());
                task.call.map_or(Ok(()), |c| self.reply_err(comm, task.src, c, why))
            }
        }
    }

    /// Sends a result to its caller `dst`; a result that cannot be sent (say, its chunks find
    /// no room in the registered pool) becomes an error the caller hears instead.
    fn send_result(&self, comm: &Comm, dst: u32, head: Header, out: Box<dyn Outbound>) -> Result<()> {
        match self.send(comm, dst, head, out, self.threshold()) {
            Ok(_) => Ok(()),
            Err(e @ Error::Encode(_)) => {
                let why = format!("rank {}: the result could not be sent: {e}", comm.rank());
                self.reply_err(comm, dst, head.call_id, why)
            }
            Err(e) => Err(e),
        }
    }

    fn reply_err(&self, comm: &Comm, dst: u32, call: u64, why: String) -> Result<()> {
        self.send(comm, dst, result(RESULT_ERR, call), Value(why), usize::MAX).map(|_| ())
    }
}

/// The index of an error outcome: `why` as the archive encodes a `String`.
fn error_index(why: &str) -> Vec<u8> {
    archive::encode_into(why, usize::MAX, &archive::NoPool, Vec::new()).map(|a| a.index).unwrap_or_default()
}

fn result(kind: u64, call_id: u64) -> Header {
    Header { kind, mode: EAGER, fn_id: 0, call_id, ack_id: 0 }
}

fn call_head(kind: u64, fn_id: u64, call_id: u64) -> Header {
    Header { kind, mode: EAGER, fn_id, call_id, ack_id: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_in_few_words() {
        for kind in [CALL, POST, RESULT_OK, RESULT_ERR] {
            for mode in [EAGER, RENDEZVOUS] {
                let call_id = if kind == POST { 0 } else { 77 };
                let fn_id = if kind <= POST { 0xabc } else { 0 };
                let ack_id = if mode == RENDEZVOUS { 5 } else { 0 };
                let h = Header { kind, mode, fn_id, call_id, ack_id };
                let (w, n) = h.encode();
                assert_eq!(Header::decode(&w[..n]), Some(h));
                assert!(n <= 4 && (kind != CALL || mode != EAGER || n == 3));
                assert_eq!(Header::decode(&w[..n - 1]), None, "{h:?} short");
            }
        }
        assert_eq!(Header::decode(&[]), None);
        assert_eq!(Header::decode(&[4, 1]), None, "unknown kind");
        assert_eq!(Header::decode(&[2 << 8, 1]), None, "unknown mode");
    }
}
