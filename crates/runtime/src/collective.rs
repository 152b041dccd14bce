//! Collectives the runtime needs for itself: a dissemination barrier and an all-gather of
//! small byte strings (used to exchange registration descriptors), both over AMs so that
//! they work on any fabric. Both exist for the world and for any group of ranks (a team),
//! keyed by the group's id (0 is the world).

use crate::am::internal;
use crate::progress::Deps;
use crate::{AmMsg, Comm, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use weft_fabric::{AmClass, AmPayload};

const MAX_ROUNDS: usize = 32;

/// Group barrier counters one source may have made here (one per group it shares with this
/// rank), and exchange contributions of one source held here unconsumed: bounds on what
/// another rank's messages can make this one keep (a forged flood is refused and reported).
const MAX_GROUPS_PER_SOURCE: usize = 1024;
const MAX_HELD_PER_SOURCE: usize = 64;

/// Arrivals per dissemination round.
type Rounds = Arc<[AtomicU64; MAX_ROUNDS]>;

/// A barrier's arrival counters: the world's (kept inline: moving them to the heap changed
/// `Comm`'s layout and cut a medium-AM flood's rate to a third), or a group's, per sender.
#[derive(Clone, Copy)]
enum Arrivals<'a> {
    World(&'a [AtomicU64; MAX_ROUNDS]),
    Group(&'a dyn Fn(u32) -> Option<Rounds>),
}

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
    /// The same for other groups, by group id and sending world rank (the handler does not
    /// know a group's members: the wait reads its round's sender's counters).
    group_arrived: Mutex<HashMap<(u64, u32), Rounds>>,
    /// All-gather contributions received, by (group id, sequence number), by world rank.
    gathered: Mutex<HashMap<(u64, u64), Contributions>>,
}

#[derive(Default)]
struct Counters {
    barriers: u64,
    exchanges: u64,
    teams: u64,
}

impl CollectiveState {
    pub fn new() -> Self {
        CollectiveState {
            order: Mutex::new(Counters::default()),
            arrived: std::array::from_fn(|_| AtomicU64::new(0)),
            entered: AtomicU64::new(0),
            group_arrived: Mutex::new(HashMap::new()),
            gathered: Mutex::new(HashMap::new()),
        }
    }

    /// The barrier counters of `group` for messages from world rank `src`; `None` if `src`
    /// already made [`MAX_GROUPS_PER_SOURCE`] of them.
    fn group_counters(&self, group: u64, src: u32) -> Option<Rounds> {
        let mut g = self.group_arrived.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = g.get(&(group, src)) {
            return Some(c.clone());
        }
        if g.keys().filter(|k| k.1 == src).count() >= MAX_GROUPS_PER_SOURCE {
            return None;
        }
        let c: Rounds = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
        g.insert((group, src), c.clone());
        Some(c)
    }
}

/// A group of ranks that runs collectives together: its id (the same on every member, 0 for
/// the world), its members by world rank (in group-rank order) and this rank's place in it.
pub(crate) struct Group<'a> {
    pub id: u64,
    pub members: &'a [u32],
    pub me: usize,
    /// A team's check of its members' calls, run at every peer check of the group's waits
    /// (see [`crate::progress::Deps::Team`]).
    pub check: Option<&'a dyn Fn() -> Option<Error>>,
}

impl Comm {
    /// Numbers the world's team creations (collective, so the same on every rank).
    pub(crate) fn next_world_team(&self) -> u64 {
        let mut order = self.coll.order.lock().unwrap_or_else(|p| p.into_inner());
        order.teams += 1;
        order.teams
    }

    /// Blocks until every rank has called `barrier` (dissemination algorithm: ⌈log2 N⌉ rounds
    /// of one short AM each). Fails if a rank dies or leaves meanwhile.
    pub fn barrier(&self) -> Result<()> {
        if crate::am::in_handler().is_some() {
            return Err(Error::Misuse("barrier inside an AM handler"));
        }
        // What went wrong since (a refused message) is heard here, even where the barrier's
        // messages are all in and it would not wait.
        self.take_error()?;
        // Held for the whole barrier: one rank's collectives run one at a time, in order.
        let mut order = self.coll.order.lock().unwrap_or_else(|p| p.into_inner());
        order.barriers += 1;
        let epoch = order.barriers;
        self.coll.entered.store(epoch, Ordering::Release);
        let (me, n) = (self.rank() as usize, self.size() as usize);
        self.disseminate(n, me, &|i| i as u32, None, (Arrivals::World(&self.coll.arrived), epoch), None)
    }

    /// Dissemination barrier among `g`'s members; `epoch` counts this group's barriers (the
    /// caller keeps it, the same on every member).
    pub(crate) fn group_barrier(&self, g: &Group<'_>, epoch: u64) -> Result<()> {
        let counters = |from: u32| self.coll.group_counters(g.id, from);
        let counters = (Arrivals::Group(&counters), epoch);
        self.disseminate(g.members.len(), g.me, &|i| g.members[i], Some(g.id), counters, g.check)
    }

    /// The rounds of a dissemination barrier among `n` members (`member(i)`: world rank of
    /// member `i`): round `r` sends to the member 2^r ahead and waits for the one 2^r behind.
    /// Messages carry `[round]` for the world, `[round, group]` for other groups.
    fn disseminate(
        &self,
        n: usize,
        me: usize,
        member: &dyn Fn(usize) -> u32,
        group: Option<u64>,
        (counters, epoch): (Arrivals<'_>, u64),
        check: Option<&dyn Fn() -> Option<Error>>,
    ) -> Result<()> {
        let (mut dist, mut round) = (1usize, 0usize);
        while dist < n {
            let (to, from) = (member((me + dist) % n), member((me + n - dist) % n));
            let args = [round as u64, group.unwrap_or(0)];
            let args = if group.is_some() { &args[..] } else { &args[..1] };
            self.send_am(to, internal::BARRIER, AmClass::Request, args, AmPayload::Short)?;
            let rounds;
            let arrived = match counters {
                Arrivals::World(a) => &a[round],
                Arrivals::Group(f) => {
                    rounds = f(from).ok_or(Error::Misuse("too many groups share this rank's barriers"))?;
                    &rounds[round]
                }
            };
            // This round needs `from` only: others may have finished and left already.
            let cond = || arrived.load(Ordering::Acquire) >= epoch;
            match check {
                None => self.wait(Deps::Rank(from), "a barrier", cond)?,
                Some(check) => {
                    let needed = |r: u32| r == from;
                    self.wait(Deps::Team { needed: &needed, check }, "a team barrier", cond)?
                }
            }
            round += 1;
            dist <<= 1;
        }
        Ok(())
    }

    pub(crate) fn on_barrier(&self, m: &AmMsg<'_>) {
        let (src, n, me) = (m.src() as usize, self.size() as usize, self.rank() as usize);
        let refused = match (m.args().first().map(|&r| r as usize), m.args().get(1)) {
            // Round r of the world's barrier comes from the rank 2^r behind, and only from it.
            (Some(r), None) if r < MAX_ROUNDS && (1usize << r) < n && (src + (1 << r)) % n == me => {
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
            (Some(r), Some(&group)) if r < MAX_ROUNDS => match self.coll.group_counters(group, m.src()) {
                Some(c) => {
                    c[r].fetch_add(1, Ordering::AcqRel);
                    return;
                }
                None => "a barrier message for one group too many",
            },
            _ => "a malformed barrier message, or one not from this round's partner",
        };
        self.record_error(Error::Remote(format!("{refused} from rank {}", m.src())));
    }

    /// Collective all-gather of one small byte string per rank (at most the largest medium AM
    /// payload): entry `r` of the result is rank `r`'s string.
    pub fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut order = self.coll.order.lock().unwrap_or_else(|p| p.into_inner());
        order.exchanges += 1;
        let seq = order.exchanges;
        let members: Vec<u32> = (0..self.size()).collect();
        self.group_exchange(
            &Group { id: 0, members: &members, me: self.rank() as usize, check: None },
            seq,
            mine,
        )
    }

    /// All-gather of one small byte string per member of `g` (entry `i`: member `i`'s);
    /// `seq` numbers this group's exchanges (the same on every member).
    pub(crate) fn group_exchange(&self, g: &Group<'_>, seq: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let me = self.rank();
        for &r in g.members.iter().filter(|&&r| r != me) {
            self.send_am(r, internal::EXCHANGE, AmClass::Request, &[seq, g.id], AmPayload::Medium(mine))?;
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

    pub(crate) fn on_exchange(&self, m: &AmMsg<'_>) {
        let Some(&seq) = m.args().first() else {
            return self
                .record_error(Error::Remote(format!("malformed exchange message from rank {}", m.src())));
        };
        let group = m.args().get(1).copied().unwrap_or(0);
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
