//! Collectives the runtime needs for itself: the world's dissemination barrier and an
//! all-gather of small byte strings (used to exchange registration descriptors), both over
//! AMs so that they work on any fabric. The all-gather exists for the world and for any group
//! of ranks (a team), keyed by the group's id (0 is the world).

use crate::am::internal;
use crate::progress::Deps;
use crate::{AmMsg, Comm, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use weft_fabric::{AmClass, AmPayload};

const MAX_ROUNDS: usize = 32;

/// World collective calls, numbered in one sequence per rank, of these kinds: a message of
/// call #c of one kind meeting call #c of the other is a mismatch (see [`WorldCalls`]).
const BARRIER_CALL: u64 = 1;
const EXCHANGE_CALL: u64 = 2;
/// The exchange of a segment allocation (`alloc_segment`, and the RPC layer's pool).
pub(crate) const SEGMENT_CALL: u64 = 3;

/// Calls ahead of this rank's whose kind is remembered: a rank can be at most one world
/// call ahead of another (finishing one needs everyone's messages).
const EARLY_SLOTS: usize = 8;

fn call_kind(kind: u64) -> &'static str {
    match kind {
        BARRIER_CALL => "a barrier",
        SEGMENT_CALL => "alloc_segment",
        _ => "an exchange (world_team, endpoints, ...)",
    }
}

/// Which world collective each rank is in: this rank's current call (`number << 2 | kind`),
/// and the kinds of calls ahead of it that peers' messages announced. Lock-free: a handler
/// stores an early kind then rereads `now`; a call stores `now` then reads the early kind
/// (both `SeqCst`), so one of the two sees the other.
struct WorldCalls {
    now: AtomicU64,
    early: [AtomicU64; EARLY_SLOTS],
    /// A mismatch found here and not yet reported to the others: `call << 4 | mine << 2 |
    /// theirs` (0: none).
    found: AtomicU64,
    /// A mismatch another rank reported for a call this rank has not entered yet: `call << 4
    /// | kinds`, with the reporter in bits 32.. of `told_by`.
    told: AtomicU64,
    told_by: AtomicU64,
    /// The mismatch that left the world's collectives out of step: every later one fails.
    broken: std::sync::OnceLock<Error>,
}

/// Exchange contributions of one source held here unconsumed: a bound on what another rank's
/// messages can make this one keep (a forged flood is refused and reported).
const MAX_HELD_PER_SOURCE: usize = 64;

/// Byte strings received for one exchange, by sending world rank.
type Contributions = HashMap<u32, Vec<u8>>;

pub(crate) struct CollectiveState {
    /// Serialises this rank's collective calls (they must happen in the same order everywhere).
    order: Mutex<Counters>,
    /// Barrier messages received per dissemination round, for the world (each round's only
    /// from the rank that round names).
    arrived: [AtomicU64; MAX_ROUNDS],
    /// World barriers this rank has entered (readable by the handler, which must not take
    /// `order`: a barrier holds it while it waits).
    entered: AtomicU64,
    /// All-gather contributions received, by (group id, sequence number), by world rank.
    gathered: Mutex<HashMap<(u64, u64), Contributions>>,
    /// Out of line: `Comm`'s layout is part of the medium-AM flood's speed (this state grew
    /// it by 150 bytes inline and cut the 64 B rate to a third).
    calls: Box<WorldCalls>,
}

#[derive(Default)]
struct Counters {
    barriers: u64,
    teams: u64,
    /// World barriers and exchanges, in one sequence.
    calls: u64,
}

impl CollectiveState {
    pub fn new() -> Self {
        CollectiveState {
            order: Mutex::new(Counters::default()),
            arrived: std::array::from_fn(|_| AtomicU64::new(0)),
            entered: AtomicU64::new(0),
            gathered: Mutex::new(HashMap::new()),
            calls: Box::new(WorldCalls {
                now: AtomicU64::new(0),
                early: std::array::from_fn(|_| AtomicU64::new(0)),
                found: AtomicU64::new(0),
                told: AtomicU64::new(0),
                told_by: AtomicU64::new(0),
                broken: std::sync::OnceLock::new(),
            }),
        }
    }

    /// This rank enters world call `call` of `kind`: fails if a peer's message already said
    /// that it is in another kind of call under that number.
    fn enter(&self, call: u64, kind: u64) -> Result<()> {
        self.calls.now.store(call << 2 | kind, Ordering::SeqCst);
        let seen = self.calls.early[call as usize % EARLY_SLOTS].load(Ordering::SeqCst);
        if seen >> 2 == call && seen & 3 != kind {
            return Err(self.found(call, kind, seen & 3, None));
        }
        let told = self.calls.told.load(Ordering::SeqCst);
        if told >> 4 == call {
            return Err(reported(
                call,
                (told >> 2) & 3,
                told & 3,
                self.calls.told_by.load(Ordering::Acquire) as u32,
            ));
        }
        Ok(())
    }

    /// Notes a mismatch of world call `call` (to be reported to every rank) and says it.
    fn found(&self, call: u64, mine: u64, theirs: u64, src: Option<u32>) -> Error {
        let _ = self.calls.found.compare_exchange(
            0,
            call << 4 | mine << 2 | theirs,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        world_mismatch(call, mine, theirs, src)
    }

    /// A message of world call `call` of `kind` came from `src`: the error if this rank is in
    /// another kind of call under that number, or if the number is further ahead than any
    /// live rank can be (a forged message).
    fn heard(&self, call: u64, kind: u64, src: u32) -> Option<Error> {
        let now = self.calls.now.load(Ordering::SeqCst);
        let mine = now >> 2;
        if call == mine {
            return (now & 3 != kind).then(|| self.found(call, now & 3, kind, Some(src)));
        }
        if call < mine {
            return None;
        }
        if call > mine + 2 {
            return Some(Error::Remote(format!(
                "a message of world collective call #{call} from rank {src}, while this rank is at #{mine}"
            )));
        }
        self.calls.early[call as usize % EARLY_SLOTS].store(call << 2 | kind, Ordering::SeqCst);
        let now = self.calls.now.load(Ordering::SeqCst);
        (now >> 2 == call && now & 3 != kind).then(|| self.found(call, now & 3, kind, Some(src)))
    }
}

/// A group of ranks that runs collectives together: its id (the same on every member, 0 for
/// the world) and its members by world rank (in group-rank order).
pub(crate) struct Group<'a> {
    pub id: u64,
    pub members: &'a [u32],
    /// A team's check of its members' calls, run at every peer check of the group's waits
    /// (see [`crate::progress::Deps::Team`]).
    pub check: Option<&'a dyn Fn() -> Option<Error>>,
}

/// The error of world call `call`, which is `mine` here and `theirs` on rank `src` (a rank
/// whose message said so, if known).
fn world_mismatch(call: u64, mine: u64, theirs: u64, src: Option<u32>) -> Error {
    let who = src.map_or("another rank".to_string(), |r| format!("rank {r}"));
    Error::Mismatch(format!(
        "world collective call #{call}: this rank called {}, {who} called {}",
        call_kind(mine),
        call_kind(theirs)
    ))
}

/// The error of world call `call` as rank `by` reported it: `a` there, `b` on another rank.
fn reported(call: u64, a: u64, b: u64, by: u32) -> Error {
    Error::Mismatch(format!(
        "world collective call #{call}: rank {by} called {}, another rank {}",
        call_kind(a),
        call_kind(b)
    ))
}

impl Comm {
    /// Numbers the world's team creations (collective, so the same on every rank).
    pub(crate) fn next_world_team(&self) -> u64 {
        let mut order = self.coll.order.lock().unwrap_or_else(|p| p.into_inner());
        order.teams += 1;
        order.teams
    }

    /// Blocks until every rank has called `barrier` (dissemination algorithm: ⌈log2 N⌉ rounds
    /// of one short AM each). Fails if a rank dies or leaves meanwhile, and with
    /// [`Error::Mismatch`] if another rank is in another world collective.
    ///
    /// A barrier orders only what is complete when each rank enters it: blocking operations,
    /// and implicit ones after [`Comm::sync_nbi`]. It does not wait for this rank's implicit
    /// operations, handles, or active messages still in flight: an AM sent before the barrier
    /// may run at its target after the target has left it. Complete those first (`sync_nbi`,
    /// handles' `wait`), and have AM handlers reply when the sender must know they ran.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let seg = world.alloc_segment::<u64>(1)?;
    /// let next = (world.rank() + 1) % world.size();
    /// world.put_nbi(seg.at(next, 0), &[7])?;
    /// world.sync_nbi()?; // complete at the target...
    /// world.barrier()?; // ...before anyone leaves the barrier
    /// assert_eq!(seg.local().read(0), 7);
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn barrier(&self) -> Result<()> {
        if crate::am::in_handler().is_some() {
            return Err(crate::am::refused("barrier inside an AM handler"));
        }
        // What went wrong since (a refused message) is heard here, even where the barrier's
        // messages are all in and it would not wait.
        self.take_error()?;
        if let Some(e) = self.coll.calls.broken.get() {
            return Err(e.clone());
        }
        // Held for the whole barrier: one rank's collectives run one at a time, in order.
        let mut order = self.coll.order.lock().unwrap_or_else(|p| p.into_inner());
        order.barriers += 1;
        order.calls += 1;
        let (epoch, call) = (order.barriers, order.calls);
        self.coll.entered.store(epoch, Ordering::Release);
        let (me, n) = (self.rank() as usize, self.size() as usize);
        let r = self.coll.enter(call, BARRIER_CALL).and_then(|()| self.disseminate(n, me, call, epoch));
        self.world_call_ends(r)
    }

    /// The rounds of the world's dissemination barrier number `epoch` (world call `call`):
    /// round `r` sends `[r, 0, call]` to the rank 2^r ahead and waits for the one 2^r behind.
    fn disseminate(&self, n: usize, me: usize, call: u64, epoch: u64) -> Result<()> {
        let (mut dist, mut round) = (1usize, 0usize);
        while dist < n {
            let (to, from) = (((me + dist) % n) as u32, ((me + n - dist) % n) as u32);
            let args = [round as u64, 0, call];
            self.send_am(to, internal::BARRIER, AmClass::Request, &args, AmPayload::Short)?;
            let arrived = &self.coll.arrived[round];
            // This round needs `from` only: others may have finished and left already.
            self.wait(Deps::Rank(from), "a barrier", || arrived.load(Ordering::Acquire) >= epoch)?;
            round += 1;
            dist <<= 1;
        }
        Ok(())
    }

    pub(crate) fn on_barrier(&self, m: &AmMsg<'_>) {
        let (src, n, me) = (m.src() as usize, self.size() as usize, self.rank() as usize);
        let (round, group) = (m.args().first().map(|&r| r as usize), m.args().get(1));
        let refused = match (round, group, m.args().get(2)) {
            // Round r of the world's barrier comes from the rank 2^r behind, and only from it.
            (Some(r), Some(0), Some(&call))
                if r < MAX_ROUNDS && (1usize << r) < n && (src + (1 << r)) % n == me =>
            {
                if let Some(e) = self.coll.heard(call, BARRIER_CALL, m.src()) {
                    return self.record_error(e);
                }
                // A partner is at most one barrier ahead of this rank (it cannot finish one
                // without this rank's messages): more is a forged arrival, refused.
                let ahead = self.coll.entered.load(Ordering::Acquire) + 1;
                let counted = self.coll.arrived[r]
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c < ahead).then_some(c + 1));
                if counted.is_ok() {
                    return;
                }
                "a barrier message for a barrier two ahead of this rank's"
            }
            _ => "a malformed barrier message, or one not from this round's partner",
        };
        self.record_error(Error::Remote(format!("{refused} from rank {}", m.src())));
    }

    /// Collective all-gather of one small byte string per rank (at most the largest medium AM
    /// payload): entry `r` of the result is rank `r`'s string.
    pub fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.world_exchange(EXCHANGE_CALL, mine)
    }

    /// [`Comm::exchange`] as world call kind `kind` (which its messages carry).
    pub(crate) fn world_exchange(&self, kind: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if let Some(e) = self.coll.calls.broken.get() {
            return Err(e.clone());
        }
        let mut order = self.coll.order.lock().unwrap_or_else(|p| p.into_inner());
        // The world's exchanges are numbered with its barriers, so that one meeting the other
        // is seen (its messages carry the call number as their sequence number).
        order.calls += 1;
        let seq = order.calls;
        let members: Vec<u32> = (0..self.size()).collect();
        let g = Group { id: 0, members: &members, check: None };
        let r = self.coll.enter(seq, kind).and_then(|()| self.group_exchange_as(&g, seq, kind, mine));
        self.world_call_ends(r)
    }

    /// All-gather of one small byte string per member of `g` (entry `i`: member `i`'s);
    /// `seq` numbers this group's exchanges (the same on every member).
    pub(crate) fn group_exchange(&self, g: &Group<'_>, seq: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.group_exchange_as(g, seq, 0, mine)
    }

    /// [`Comm::group_exchange`] whose messages carry `[seq, group, kind]` (the world's kind of
    /// call; 0 for other groups).
    fn group_exchange_as(&self, g: &Group<'_>, seq: u64, kind: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let me = self.rank();
        for &r in g.members.iter().filter(|&&r| r != me) {
            let args = [seq, g.id, kind];
            self.send_am(r, internal::EXCHANGE, AmClass::Request, &args, AmPayload::Medium(mine))?;
        }
        let others = g.members.len() - 1;
        let key = (g.id, seq);
        // Members whose string has not arrived are the ones this wait depends on.
        let missing = |r: u32| {
            let got = self.coll.gathered.lock().unwrap_or_else(|p| p.into_inner());
            g.members.contains(&r) && !got.get(&key).is_some_and(|c| c.contains_key(&r))
        };
        let deps = match g.check {
            None => Deps::Needed(&missing),
            Some(check) => Deps::Team { needed: &missing, check },
        };
        // Members' contributions only: another rank's would not stand for a missing one.
        self.wait(deps, "an exchange", || {
            let got = self.coll.gathered.lock().unwrap_or_else(|p| p.into_inner());
            got.get(&key).map_or(0, |c| g.members.iter().filter(|r| c.contains_key(r)).count()) == others
        })?;
        let mut got =
            self.coll.gathered.lock().unwrap_or_else(|p| p.into_inner()).remove(&key).unwrap_or_default();
        Ok(g.members
            .iter()
            .map(|r| if *r == me { mine.to_vec() } else { got.remove(r).unwrap_or_default() })
            .collect())
    }

    /// Ends world call `r`: a mismatch found here (in the call, or by a handler) is reported
    /// to every other rank, once: a rank whose partners are all in its own kind of call would
    /// otherwise wait for ever. (Handlers send no requests: the call reports it.)
    fn world_call_ends<T>(&self, r: Result<T>) -> Result<T> {
        let Err(e) = &r else {
            return r;
        };
        if let Error::Mismatch(m) = e {
            // Ranks disagree on how many calls each kind has had: nothing later is in step.
            let _ = self.coll.calls.broken.set(Error::Mismatch(format!(
                "the world's collectives are unusable after an earlier mismatch ({m})"
            )));
        }
        let found = self.coll.calls.found.swap(0, Ordering::AcqRel);
        if found != 0 {
            let args = [found >> 4, (found >> 2) & 3, found & 3];
            for to in (0..self.size()).filter(|&to| to != self.rank()) {
                let _ = self.send_am(to, internal::WORLD_MISMATCH, AmClass::Request, &args, AmPayload::Short);
            }
        }
        r
    }

    /// Another rank found a mismatch of world call `call`: this rank's wait in that call
    /// fails, or its entry into it if it has not got there yet (an old call is over).
    pub(crate) fn on_world_mismatch(&self, m: &AmMsg<'_>) {
        let (call, a, b) = match m.args() {
            &[call, a, b] if (1..=3).contains(&a) && (1..=3).contains(&b) => (call, a, b),
            _ => {
                return self
                    .record_error(Error::Remote(format!("malformed mismatch report from rank {}", m.src())))
            }
        };
        let calls = &self.coll.calls;
        let mine = calls.now.load(Ordering::SeqCst) >> 2;
        if call < mine || call > mine + 2 {
            return;
        }
        if call > mine {
            calls.told_by.store(u64::from(m.src()), Ordering::Release);
            calls.told.store(call << 4 | a << 2 | b, Ordering::SeqCst);
            if calls.now.load(Ordering::SeqCst) >> 2 != call {
                return;
            }
        }
        self.record_error(reported(call, a, b, m.src()));
        self.fabric.notify(self.rank());
    }

    pub(crate) fn on_exchange(&self, m: &AmMsg<'_>) {
        let Some(&seq) = m.args().first() else {
            return self
                .record_error(Error::Remote(format!("malformed exchange message from rank {}", m.src())));
        };
        let group = m.args().get(1).copied().unwrap_or(0);
        if group == 0 {
            let kind = m.args().get(2).copied().filter(|k| (EXCHANGE_CALL..=SEGMENT_CALL).contains(k));
            let Some(kind) = kind else {
                return self.record_error(Error::Remote(format!(
                    "malformed exchange message from rank {}",
                    m.src()
                )));
            };
            if let Some(e) = self.coll.heard(seq, kind, m.src()) {
                return self.record_error(e);
            }
        }
        let mut g = self.coll.gathered.lock().unwrap_or_else(|p| p.into_inner());
        if g.values().filter(|c| c.contains_key(&m.src())).count() >= MAX_HELD_PER_SOURCE {
            drop(g);
            return self.record_error(Error::Remote(format!(
                "rank {} sent more than {MAX_HELD_PER_SOURCE} exchange contributions not yet used here",
                m.src()
            )));
        }
        g.entry((group, seq)).or_default().insert(m.src(), m.payload().to_vec());
    }
}
