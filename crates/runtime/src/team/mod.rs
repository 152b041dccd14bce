//! Teams: ordered subsets of the world's ranks that run collectives together, with
//! team-relative ranks and team segments (held by the team's members only).
//!
//! A team is made from the world ([`Comm::world_team`]) or from another team, by colour and
//! key ([`Team::split`], like `MPI_Comm_split`) or by a stride over a range ([`Team::subset`]).
//! Making a team is collective over its parent. Each team has its own collective scratch (a
//! team segment of flags and one slot per member) through which [the collectives](coll) move
//! data with puts and remote atomics.

mod channel;
pub mod coll;

use crate::collective::Group;
use crate::{Comm, Error, Pod, Result, Segment};
use channel::Channels;
use std::sync::Mutex;

pub use coll::ReduceOp;

/// An ordered group of ranks. Team rank `i` is world rank `members()[i]`.
///
/// ```no_run
/// # let world = weft_runtime::World::init()?;
/// let all = world.world_team()?;
/// // Even and odd world ranks in two teams, ordered by world rank.
/// let half = all.split(Some(world.rank() % 2), world.rank())?.expect("every rank has a colour");
/// let total = half.allreduce(&[world.rank() as u64], weft_runtime::ReduceOp::Sum)?;
/// println!("team rank {} of {}: sum of world ranks {}", half.rank(), half.size(), total[0]);
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub struct Team<'c> {
    comm: &'c Comm,
    id: u64,
    members: Vec<u32>,
    me: usize,
    /// Numbers this team's internal exchanges, barriers and splits (the same on every member).
    seq: Mutex<Seq>,
    channels: Channels,
}

#[derive(Default)]
struct Seq {
    exchanges: u64,
    barriers: u64,
    splits: u64,
}

impl std::fmt::Debug for Team<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Team({:#x}, rank {} of {:?})", self.id, self.me, self.members)
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
    pub fn world_team(&self) -> Result<Team<'_>> {
        let members: Vec<u32> = (0..self.size()).collect();
        let id = child_id(0, &[self.next_world_team()]);
        Team::new(self, id, members, self.rank() as usize)
    }
}

impl<'c> Team<'c> {
    fn new(comm: &'c Comm, id: u64, members: Vec<u32>, me: usize) -> Result<Team<'c>> {
        let mut t =
            Team { comm, id, members, me, seq: Mutex::new(Seq::default()), channels: Channels::empty() };
        t.channels = Channels::new(&t)?;
        Ok(t)
    }

    /// This rank's place in the team.
    pub fn rank(&self) -> u32 {
        self.me as u32
    }
    /// Members.
    pub fn size(&self) -> u32 {
        self.members.len() as u32
    }
    /// World ranks of the members, in team-rank order.
    pub fn members(&self) -> &[u32] {
        &self.members
    }
    /// The world rank of team rank `r`.
    pub fn world_rank(&self, r: u32) -> Result<u32> {
        self.members.get(r as usize).copied().ok_or(Error::NoSuchRank { rank: r, size: self.size() })
    }
    /// The team rank of world rank `w`, if it is a member.
    pub fn team_rank(&self, w: u32) -> Option<u32> {
        self.members.iter().position(|&m| m == w).map(|i| i as u32)
    }
    /// The world this team lives in.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    fn group(&self) -> Group<'_> {
        Group { id: self.id, members: &self.members, me: self.me }
    }

    /// Advances one of the team's sequence counters and returns its new value.
    fn next(&self, counter: fn(&mut Seq) -> &mut u64) -> u64 {
        let mut s = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        let c = counter(&mut s);
        *c += 1;
        *c
    }

    /// All-gather of one small byte string per member (at most a medium AM payload).
    pub(crate) fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let seq = self.next(|s| &mut s.exchanges);
        self.comm.group_exchange(&self.group(), seq, mine)
    }

    /// Blocks until every member has called `barrier` (dissemination, ⌈log2 n⌉ rounds).
    pub fn barrier(&self) -> Result<()> {
        if crate::am::in_handler().is_some() {
            return Err(Error::Misuse("barrier inside an AM handler"));
        }
        let epoch = self.next(|s| &mut s.barriers);
        self.comm.group_barrier(&self.group(), epoch)
    }

    /// Allocates a segment of `len` elements on every member (and on no other rank): its
    /// [`crate::GlobalPtr`]s name world ranks, and addressing a non-member is an error.
    /// Collective over the team.
    pub fn alloc_segment<T: Pod>(&self, len: usize) -> Result<Segment<T>> {
        self.comm.alloc_segment_among(len, &self.members, &|mine| self.exchange(mine), &|| self.barrier())
    }

    /// Splits the team like `MPI_Comm_split`: members with the same `color` form a team,
    /// ordered by `key` (ties: by rank in this team); `None` joins no team and gets `None`.
    /// Collective over this team.
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Team<'c>>> {
        let mut mine = Vec::with_capacity(16);
        mine.extend_from_slice(&color.map_or(u64::MAX, u64::from).to_le_bytes());
        mine.extend_from_slice(&(key as u64).to_le_bytes());
        let all = self.exchange(&mine)?;
        let word = |d: &[u8], i: usize| -> Result<u64> {
            d.get(i * 8..i * 8 + 8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
                .ok_or_else(|| Error::Mismatch("malformed split message".into()))
        };
        let split_no = self.next(|s| &mut s.splits);
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
    pub fn subset(&self, first: u32, stride: u32, count: u32) -> Result<Option<Team<'c>>> {
        let n = self.size() as u64;
        let last = first as u64 + (count.max(1) as u64 - 1) * stride as u64;
        if count == 0 || stride == 0 || last >= n {
            return Err(Error::Misuse("subset: empty, zero stride, or past the team's last rank"));
        }
        let split_no = self.next(|s| &mut s.splits);
        // Every member checks the others passed the same range.
        let spec = [first as u64, stride as u64, count as u64];
        let mine: Vec<u8> = spec.iter().flat_map(|w| w.to_le_bytes()).collect();
        if self.exchange(&mine)?.iter().any(|d| d != &mine) {
            return Err(Error::Mismatch("subset: members passed different ranges".into()));
        }
        let ranks: Vec<usize> = (0..count as usize).map(|i| first as usize + i * stride as usize).collect();
        self.child(&[split_no, u64::MAX, first as u64, stride as u64, count as u64], ranks)
    }

    /// Makes the child team of these team ranks (collective over the child's members).
    fn child(&self, id_words: &[u64], ranks: Vec<usize>) -> Result<Option<Team<'c>>> {
        let Some(me) = ranks.iter().position(|&r| r == self.me) else { return Ok(None) };
        let members = ranks.iter().map(|&r| self.members[r]).collect();
        Team::new(self.comm, child_id(self.id, id_words), members, me).map(Some)
    }
}
