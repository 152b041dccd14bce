//! Teams: ordered subsets of the world's ranks that run collectives together, with
//! team-relative ranks and team segments (held by the team's members only).
//!
//! A team is made from the world ([`Comm::world_team`]) or from another team, by colour and
//! key ([`Team::split`], like `MPI_Comm_split`) or by a stride over a range ([`Team::subset`]).
//! Making a team is collective over its parent. Each team has its own collective scratch (a
//! team segment of flags and one slot per member) through which [the collectives](coll) move
//! data with puts and remote atomics.

mod blocking;
mod call;
mod channel;
pub mod coll;
mod counts;
mod nb;
mod tune;

use crate::collective::Group;
use crate::progress::Deps;
use crate::{Comm, Error, Pod, Result, Segment};
use channel::Channels;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

pub use coll::ReduceOp;
pub use nb::CollHandle;

/// An ordered group of ranks. Team rank `i` is world rank `members()[i]`.
///
/// Each member gives a team a few KiB of shared memory per member for flags, and message
/// slots within `WEFT_COLL_SCRATCH_KIB` (4 MiB by default, whatever the team's size).
/// Dropping the team gives them back; the next team of the same members reuses them.
///
/// Collectives come blocking (`allreduce`) and non-blocking (`allreduce_nb`, returning a
/// [`CollHandle`]). A team runs its collectives one at a time, in the order they were called
/// (the same on every member), so non-blocking ones overlap computation, not each other: use
/// several teams for collectives that should proceed side by side.
///
/// ```no_run
/// # use weft_runtime as weft;
/// # let world = weft_runtime::World::init()?;
/// let all = world.world_team()?;
/// // Even and odd world ranks in two teams, ordered by world rank.
/// let half = all.split(Some(world.rank() % 2), world.rank())?.expect("every rank has a colour");
/// let total = half.allreduce(&[world.rank() as u64], weft::ReduceOp::Sum)?;
/// println!("team rank {} of {}: sum of world ranks {}", half.rank(), half.size(), total[0]);
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub struct Team {
    core: Arc<Core>,
}

/// What a team's collectives need; shared with its non-blocking collectives in flight.
pub(crate) struct Core {
    comm: Arc<Comm>,
    id: u64,
    members: Vec<u32>,
    me: usize,
    /// Numbers this team's internal exchanges and splits (the same on every member).
    seq: Mutex<Seq>,
    channels: Channels,
    /// Non-blocking collectives not finished yet, oldest first (only the first one runs).
    queue: Mutex<VecDeque<Queued>>,
    /// The queue's length, kept with it under its lock: a blocking collective reads it
    /// without taking the lock.
    queued: AtomicUsize,
    /// How long collectives went each way (see [`tune`]).
    tuner: Mutex<tune::Tuner>,
    /// Calls numbered so far (see [`call`]): one thread numbers a team's calls at a time.
    calls: AtomicU64,
    /// The descriptor of the running call (0: none yet).
    current: AtomicU64,
    /// Its bits in the tags of its messages (see [`call::tag_bits`]).
    current_tag: AtomicU64,
    /// The running call failed on this member's own arguments (see [`Core::bad_argument`]).
    bad_argument: AtomicBool,
    /// The sender and call of a message the running call did not expect (see
    /// [`Core::note_mismatch`]).
    mismatched: Mutex<Option<(usize, u64)>>,
    /// The team's failure once known (see [`Core::poisoned`]).
    broken: OnceLock<Error>,
    /// A member the running call waits on, seen at a later call: (team rank, this call's
    /// descriptor, since when).
    past: Mutex<Option<(usize, u64, std::time::Instant)>>,
    /// An alltoall copies this member's own block (of [`coll::SELF_STREAMING`] bytes or more)
    /// with cache-bypassing stores: as the tuner chose for a tuned call; always for an
    /// untuned one (blocks from `coll_direct_bytes` up, 16 MiB by default, do not stay in a
    /// cache).
    stream_own: AtomicBool,
    /// Calls start by agreeing with every member (`WEFT_COLL_CHECK=strict`, [`Core::agree`]).
    strict: bool,
    /// Wakers of this team's handles awaited as futures, woken when progress drives the
    /// queue (see [`Comm::drive_teams`]).
    wakers: Mutex<Vec<std::task::Waker>>,
}

/// A non-blocking collective waiting its turn; it stores its own result.
type Queued = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

#[derive(Default)]
struct Seq {
    exchanges: u64,
    splits: u64,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.core;
        write!(f, "Team({:#x}, rank {} of {:?})", c.id, c.me, c.members)
    }
}

/// FNV-1a over words: the id of a child team, the same on all its members.
fn child_id(parent: u64, words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ parent;
    for w in words {
        for b in w.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    h | 1 // never 0, the world's group id
}

impl Comm {
    /// A team of every rank, in world order. Collective over the world.
    pub fn world_team(&self) -> Result<Team> {
        let members: Vec<u32> = (0..self.size()).collect();
        let k = self.next_world_team();
        // A world collective like the others: a rank in another one (a barrier) hears of it
        // instead of waiting; and every rank must be making the same team.
        let mine = k.to_le_bytes();
        if let Some(r) = self.exchange(&mine)?.iter().position(|d| d[..] != mine) {
            return Err(Error::Mismatch(format!(
                "world_team: this rank makes the world's team #{k}, rank {r} another one"
            )));
        }
        Team::new(self, child_id(0, &[k]), members, self.rank() as usize)
    }
}

/// Advances one of a team's sequence counters and returns its new value.
fn next(seq: &Mutex<Seq>, counter: fn(&mut Seq) -> &mut u64) -> u64 {
    let mut s = seq.lock().unwrap_or_else(|p| p.into_inner());
    let c = counter(&mut s);
    *c += 1;
    *c
}

/// Allocates a segment held by `g`'s members only (collective over them), through exchanges
/// numbered by `seq`.
fn alloc_among<T: Pod>(comm: &Comm, g: &Group<'_>, seq: &Mutex<Seq>, len: usize) -> Result<Segment<T>> {
    let exchange = |mine: &[u8]| comm.group_exchange(g, next(seq, |s| &mut s.exchanges), mine);
    comm.alloc_segment_among(len, g.members, &exchange, crate::segment::Backing::Fresh)
}

thread_local! {
    /// Set while this thread runs a blocking collective on a core of its own: its transfers
    /// may spin on their flags (see [`channel::Transfer`]).
    static SPIN_ON_FLAGS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True if this thread runs a blocking collective and may spin on flags.
fn spin_on_flags() -> bool {
    SPIN_ON_FLAGS.with(|s| s.get())
}

/// Sets [`SPIN_ON_FLAGS`] for its lifetime, then restores it.
struct SpinScope(bool);

impl SpinScope {
    fn enter(on: bool) -> SpinScope {
        SpinScope(SPIN_ON_FLAGS.with(|s| s.replace(on)))
    }
}

impl Drop for SpinScope {
    fn drop(&mut self) {
        SPIN_ON_FLAGS.with(|s| s.set(self.0));
    }
}

/// Polls of a blocking collective's future before its wait loop, on a load/store fabric
/// where waits spin: a small collective's last message usually lands within them, and a
/// poll of the future alone sees it sooner than a turn of the wait loop, which also polls
/// every AM ring (2 ranks, 8 B alltoall 151-157 -> 143-148 ns, 3 alternating runs).
const PRESPIN: u32 = 64;

impl Core {
    fn group(&self) -> Group<'_> {
        Group { id: self.id, members: &self.members, check: None }
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    /// True if world rank `w` is a member this team's running collective still waits on.
    fn needs(&self, w: u32) -> bool {
        self.members.iter().position(|&m| m == w).is_some_and(|t| self.channels.needs(t))
    }

    /// Polls the queued non-blocking collectives, oldest first, as far as they go; true when
    /// none is left.
    fn drive(&self) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.drive_queue(&mut q)
    }

    /// [`Core::drive`] unless the queue is being driven already (on this thread further up
    /// the stack: a collective whose put waits runs the hooks, which drive awaited teams);
    /// `None` then.
    fn try_drive(&self) -> Option<bool> {
        let mut q = match self.queue.try_lock() {
            Ok(q) => q,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(self.drive_queue(&mut q))
    }

    fn drive_queue(&self, q: &mut VecDeque<Queued>) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        while let Some(front) = q.front_mut() {
            if front.as_mut().poll(&mut cx).is_pending() {
                return false;
            }
            q.pop_front();
            self.queued.store(q.len(), Ordering::Release);
        }
        true
    }

    /// Queues a non-blocking collective behind the ones called before it.
    fn enqueue(&self, fut: Queued) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back(fut);
        self.queued.store(q.len(), Ordering::Release);
    }

    /// Finishes the queued non-blocking collectives.
    fn drain(&self) -> Result<()> {
        if self.queued.load(Ordering::Acquire) == 0 {
            return Ok(()); // the usual case: no lock to take, no wait to set up
        }
        let deps = |w: u32| self.needs(w);
        let deps = Deps::Team { needed: &deps, check: &|| self.check() };
        self.comm.wait(deps, "a non-blocking team collective", || self.drive())
    }

    /// Runs the collective `fut` of the call [`Core::open`] started to completion, making
    /// progress and watching the members it waits on (their liveness, and the call they run).
    ///
    /// The caller pins the future where it makes it (`run(pin!(…))`): a collective's future
    /// is a few hundred bytes, and moving it into place cost a `memcpy` per call.
    fn run<R, F: Future<Output = Result<R>>>(&self, mut fut: Pin<&mut F>) -> Result<R> {
        let deps = |w: u32| self.needs(w);
        let deps = Deps::Team { needed: &deps, check: &|| self.check() };
        let _spin = SpinScope::enter(!self.comm.cfg.spin.is_zero());
        // A collective that ends within the pre-spin never reaches a wait loop, which would
        // say that this thread is in weft.
        self.comm.touch();
        let mut cx = Context::from_waker(Waker::noop());
        if self.comm.caps().load_store && !self.comm.cfg.spin.is_zero() {
            for _ in 0..PRESPIN {
                if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                    return self.close(r);
                }
                std::hint::spin_loop();
            }
        }
        let mut out = None;
        let waited = self.comm.wait(deps, "a team collective", || match fut.as_mut().poll(&mut cx) {
            Poll::Ready(r) => {
                out = Some(r);
                true
            }
            Poll::Pending => false,
        });
        self.close(waited.and_then(|()| out.unwrap_or(Err(Error::Misuse("collective future vanished")))))
    }

    /// The tuning class of a blocking collective of kind `coll` moving `bytes` per member (or
    /// per block) from `data`, if its long messages' way is chosen by measurement: from
    /// [`tune::TUNE_MIN`] up to `coll_direct_bytes`, where both ways exist. Data in a segment
    /// the other members can read in place (on a load/store fabric) is a class of its own.
    /// Taken before the collective's future borrows `data`.
    fn tuning(&self, coll: u64, bytes: usize, data: &[u8]) -> Option<Tuning> {
        let cfg = &self.comm.cfg;
        if !cfg.coll_tune
            || bytes < tune::TUNE_MIN
            || bytes >= cfg.coll_direct_bytes
            || !self.comm.caps().peer_read
        {
            return None;
        }
        let in_segment =
            self.comm.caps().load_store && self.comm.segment_holding(data, self.comm.rank()).is_some();
        Some(Tuning {
            key: tune::Key::new(coll, bytes, in_segment),
            streaming: coll == coll::tag::ALLTOALL && bytes >= coll::SELF_STREAMING,
        })
    }

    /// [`Core::run`] for a collective whose [`Core::tuning`] is `tuning`: with one, its long
    /// messages go the way the team's measurements say is faster (see [`tune`]), and the call
    /// is timed.
    fn run_tuned<R, F: Future<Output = Result<R>>>(
        &self,
        tuning: Option<Tuning>,
        fut: Pin<&mut F>,
    ) -> Result<R> {
        let Some(Tuning { key, streaming }) = tuning else { return self.run(fut) };
        let cfg = &self.comm.cfg;
        let way = self.tuner.lock().unwrap_or_else(|p| p.into_inner()).choose(key, streaming);
        if way.direct {
            self.channels.set_direct_from(tune::DIRECT_MIN);
        }
        self.stream_own.store(way.streaming, Ordering::Relaxed);
        let t = weft_fabric::os::now_ns();
        let r = self.run(fut);
        let took = weft_fabric::os::now_ns().saturating_sub(t) as f64;
        self.channels.set_direct_from(cfg.coll_direct_bytes);
        self.stream_own.store(true, Ordering::Relaxed);
        if r.is_ok() {
            self.tuner.lock().unwrap_or_else(|p| p.into_inner()).record(key, way, took);
        }
        r
    }
}

/// What [`Core::run_tuned`] measures a call as: its class, and whether it also chooses how
/// an alltoall's own block is copied.
#[derive(Clone, Copy)]
struct Tuning {
    key: tune::Key,
    streaming: bool,
}

impl Team {
    fn new(comm: &Comm, id: u64, members: Vec<u32>, me: usize) -> Result<Team> {
        let seq = Mutex::new(Seq::default());
        let g = Group { id, members: &members, check: None };
        let n = members.len();
        let flags = alloc_among::<u64>(comm, &g, &seq, Channels::flag_words(n))?;
        let slot = channel::Slot::for_team(n, comm.cfg.coll_scratch_bytes);
        let slots =
            alloc_among::<u8>(comm, &g, &seq, Channels::slot_bytes(n, slot)).map_err(|e| match e {
                Error::Mismatch(m) => Error::Mismatch(format!(
                    "{m} (a team's message slots: WEFT_COLL_SCRATCH_KIB must be the same on every rank)"
                )),
                e => e,
            })?;
        let channels = Channels::new(flags, slots, slot, n, comm.cfg.coll_direct_bytes);
        let core = Core {
            comm: comm.arc(),
            id,
            members,
            me,
            seq,
            channels,
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            tuner: Mutex::default(),
            calls: AtomicU64::new(0),
            current: AtomicU64::new(0),
            current_tag: AtomicU64::new(0),
            bad_argument: AtomicBool::new(false),
            mismatched: Mutex::new(None),
            broken: OnceLock::new(),
            past: Mutex::new(None),
            stream_own: AtomicBool::new(true),
            strict: comm.cfg.coll_strict,
            wakers: Mutex::new(Vec::new()),
        };
        Ok(Team { core: Arc::new(core) })
    }

    /// This rank's place in the team.
    pub fn rank(&self) -> u32 {
        self.core.me as u32
    }
    /// Members.
    pub fn size(&self) -> u32 {
        self.core.members.len() as u32
    }
    /// World ranks of the members, in team-rank order.
    pub fn members(&self) -> &[u32] {
        &self.core.members
    }
    /// The world rank of team rank `r`.
    pub fn world_rank(&self, r: u32) -> Result<u32> {
        self.core.members.get(r as usize).copied().ok_or(Error::NoSuchRank { rank: r, size: self.size() })
    }
    /// The team rank of world rank `w`, if it is a member.
    pub fn team_rank(&self, w: u32) -> Option<u32> {
        self.core.members.iter().position(|&m| m == w).map(|i| i as u32)
    }
    /// The world this team lives in.
    pub fn comm(&self) -> &Comm {
        &self.core.comm
    }

    /// All-gather of one small byte string per member (at most a medium AM payload) in the
    /// call `desc`: every member's string comes with its call's descriptor, and a member whose
    /// call differs makes the team unusable (see [`call`]).
    fn exchange(&self, desc: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let c = &self.core;
        let mut msg = desc.to_le_bytes().to_vec();
        msg.extend_from_slice(mine);
        let check = || c.check();
        let g = Group { check: Some(&check), ..c.group() };
        let all = c.close(c.comm.group_exchange(&g, next(&c.seq, |s| &mut s.exchanges), &msg))?;
        call::strip_descriptors(c, desc, all)
    }

    /// Allocates a segment of `len` elements on every member (and on no other rank): its
    /// [`crate::GlobalPtr`]s name world ranks, and addressing a non-member is an error.
    /// Collective over the team.
    pub fn alloc_segment<T: Pod>(&self, len: usize) -> Result<Segment<T>> {
        let c = &self.core;
        // Collectives called before it come first, as on every member.
        let desc = c.open(call::Call::new(coll::tag::ALLOC, None, len.saturating_mul(size_of::<T>())))?;
        // The members' calls agree before anything is allocated.
        self.exchange(desc, &[])?;
        let check = || c.check();
        let g = Group { check: Some(&check), ..c.group() };
        c.close(alloc_among(&c.comm, &g, &c.seq, len))
    }

    /// Splits the team like `MPI_Comm_split`: members with the same `color` form a team,
    /// ordered by `key` (ties: by rank in this team); `None` joins no team and gets `None`.
    /// Collective over this team.
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Team>> {
        let desc = self.core.open(call::Call::new(coll::tag::SPLIT, None, 0))?;
        let mut mine = Vec::with_capacity(16);
        mine.extend_from_slice(&color.map_or(u64::MAX, u64::from).to_le_bytes());
        mine.extend_from_slice(&(key as u64).to_le_bytes());
        let all = self.exchange(desc, &mine)?;
        let word = |d: &[u8], i: usize| -> Result<u64> {
            d.get(i * 8..i * 8 + 8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
                .ok_or_else(|| Error::Mismatch("malformed split message".into()))
        };
        let split_no = next(&self.core.seq, |s| &mut s.splits);
        let Some(color) = color else { return Ok(None) };
        let mut chosen: Vec<(u64, usize)> = vec![];
        for (r, d) in all.iter().enumerate() {
            if word(d, 0)? == color as u64 {
                chosen.push((word(d, 1)?, r));
            }
        }
        chosen.sort_unstable();
        self.child(&[split_no, color as u64], chosen.into_iter().map(|(_, r)| r).collect())
    }

    /// The team of this team's ranks `first, first + stride, …` (`count` of them). Collective
    /// over this team; non-members get `None`.
    pub fn subset(&self, first: u32, stride: u32, count: u32) -> Result<Option<Team>> {
        let n = self.size() as u64;
        let last = first as u64 + (count.max(1) as u64 - 1) * stride as u64;
        if count == 0 || stride == 0 || last >= n {
            return Err(Error::Misuse("subset: empty, zero stride, or past the team's last rank"));
        }
        // The range is part of the call: members that passed different ones disagree on it.
        let spec = [first as u64, stride as u64, count as u64];
        let digest = child_id(0, &spec) as usize & 0x7fff;
        let desc = self.core.open(call::Call::new(coll::tag::SUBSET, None, digest))?;
        let split_no = next(&self.core.seq, |s| &mut s.splits);
        let mine: Vec<u8> = spec.iter().flat_map(|w| w.to_le_bytes()).collect();
        if self.exchange(desc, &mine)?.iter().any(|d| d != &mine) {
            let e = Error::Mismatch("subset: members passed different ranges".into());
            return Err(self.core.fail(e, None));
        }
        let ranks: Vec<usize> = (0..count as usize).map(|i| first as usize + i * stride as usize).collect();
        self.child(&[split_no, u64::MAX, first as u64, stride as u64, count as u64], ranks)
    }

    /// Makes the child team of these team ranks (collective over the child's members).
    fn child(&self, id_words: &[u64], ranks: Vec<usize>) -> Result<Option<Team>> {
        let c = &self.core;
        let Some(me) = ranks.iter().position(|&r| r == c.me) else { return Ok(None) };
        let members = ranks.iter().map(|&r| c.members[r]).collect();
        Team::new(&c.comm, child_id(c.id, id_words), members, me).map(Some)
    }
}

impl Drop for Team {
    /// Finishes the non-blocking collectives still in flight (the other members take part in
    /// them); their handles then hold their results.
    fn drop(&mut self) {
        let c = &self.core;
        if c.drain().is_err() {
            // A member failed: the queued collectives cannot finish; their handles report it.
            let mut q = c.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.clear();
            c.queued.store(0, Ordering::Release);
        }
    }
}
