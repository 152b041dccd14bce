//! Collectives over a [`Team`], moved with one-sided operations through the team's channels:
//! binomial trees for broadcast and reduce (allreduce = reduce + broadcast, so every member gets
//! the same bits), a ring for allgather, pairwise exchange for alltoall, a chain for the
//! exclusive scan. Every algorithm works for any team size; reductions combine in an order
//! fixed by the team's size and the root, so floating-point results are reproducible run to
//! run. Lengths are checked on arrival: members that disagree get [`Error::Mismatch`].

use super::channel::{In, Out};
use super::Team;
use crate::{Error, Pod, Result};
use weft_fabric::pod::{bytes_of, bytes_of_mut};

/// Built-in reductions, for the element types of [`Number`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

/// Element types the built-in [`ReduceOp`]s apply to.
pub trait Number: Pod + PartialOrd {
    /// `a + b` (wrapping for integers).
    fn add(a: Self, b: Self) -> Self;
}

macro_rules! int_number {
    ($($t:ty),*) => {$(impl Number for $t { fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) } })*};
}
int_number!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);
impl Number for f32 {
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
}
impl Number for f64 {
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
}

fn builtin<T: Number>(op: ReduceOp) -> impl Fn(&mut T, &T) {
    move |a: &mut T, b: &T| {
        *a = match op {
            ReduceOp::Sum => T::add(*a, *b),
            ReduceOp::Min if *b < *a => *b,
            ReduceOp::Max if *b > *a => *b,
            _ => *a,
        }
    }
}

/// Collective tags (what a member announces with each message).
mod tag {
    pub const BROADCAST: u64 = 0xb1;
    pub const REDUCE: u64 = 0xb2;
    pub const GATHER: u64 = 0xb3;
    pub const ALLGATHER: u64 = 0xb4;
    pub const SCATTER: u64 = 0xb5;
    pub const ALLTOALL: u64 = 0xb6;
    pub const SCAN: u64 = 0xb7;
}

/// Offsets of blocks of the given element counts.
fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut at = 0;
    counts
        .iter()
        .map(|&c| {
            let o = at;
            at += c;
            o
        })
        .collect()
}

/// A block to read and a disjoint block to write, of one buffer.
fn read_write<T>(
    buf: &mut [T],
    read: std::ops::Range<usize>,
    write: std::ops::Range<usize>,
) -> (&[T], &mut [T]) {
    if write.is_empty() {
        return (&buf[read], &mut []);
    }
    if read.is_empty() {
        return (&[], &mut buf[write]);
    }
    if read.end <= write.start {
        let (a, b) = buf.split_at_mut(write.start);
        (&a[read], &mut b[..write.end - write.start])
    } else {
        let (a, b) = buf.split_at_mut(read.start);
        (&b[..read.end - read.start], &mut a[write])
    }
}

impl Team<'_> {
    fn check_counts(&self, counts: &[usize], mine: usize, what: &'static str) -> Result<()> {
        if counts.len() != self.members.len() {
            return Err(Error::Misuse(what));
        }
        if counts[self.me] != mine {
            return Err(Error::Mismatch(format!(
                "team rank {} passes {mine} elements but its count says {}",
                self.me, counts[self.me]
            )));
        }
        Ok(())
    }

    fn check_root(&self, root: u32) -> Result<usize> {
        (root < self.size())
            .then_some(root as usize)
            .ok_or(Error::NoSuchRank { rank: root, size: self.size() })
    }

    fn send_recv(&self, tag: u64, outs: &[Out<'_>], ins: &mut [In<'_>]) -> Result<()> {
        self.channels.transfer(self, tag, outs, ins)
    }

    /// Copies team rank `root`'s `buf` into every member's `buf` (binomial tree).
    pub fn broadcast<T: Pod>(&self, root: u32, buf: &mut [T]) -> Result<()> {
        let root = self.check_root(root)?;
        let n = self.members.len();
        let vr = (self.me + n - root) % n;
        let real = |v: usize| (v + root) % n;
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                let mut ins = [In { from: real(vr - mask), out: bytes_of_mut(buf) }];
                self.send_recv(tag::BROADCAST, &[], &mut ins)?;
                break;
            }
            mask <<= 1;
        }
        let children: Vec<usize> = std::iter::successors(Some(mask >> 1), |m| (*m > 1).then_some(m >> 1))
            .filter(|&m| m > 0 && vr + m < n)
            .map(|m| real(vr + m))
            .collect();
        let data = bytes_of(buf);
        let outs: Vec<Out<'_>> = children.into_iter().map(|to| Out { to, data }).collect();
        self.send_recv(tag::BROADCAST, &outs, &mut [])
    }

    /// Combines every member's `data` element-wise with `op`; team rank `root` gets the
    /// result, the others `None`.
    pub fn reduce<T: Number>(&self, root: u32, data: &[T], op: ReduceOp) -> Result<Option<Vec<T>>> {
        self.reduce_with(root, data, builtin::<T>(op))
    }

    /// As [`Team::reduce`], with a user combination `f(acc, x)` (associative; applied in a
    /// fixed order).
    pub fn reduce_with<T: Pod>(
        &self,
        root: u32,
        data: &[T],
        f: impl Fn(&mut T, &T),
    ) -> Result<Option<Vec<T>>> {
        let root = self.check_root(root)?;
        let n = self.members.len();
        let vr = (self.me + n - root) % n;
        let real = |v: usize| (v + root) % n;
        let mut acc = data.to_vec();
        let mut theirs = vec![T::zeroed(); data.len()];
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                let outs = [Out { to: real(vr - mask), data: bytes_of(&acc) }];
                self.send_recv(tag::REDUCE, &outs, &mut [])?;
                return Ok(None);
            }
            if vr + mask < n {
                let mut ins = [In { from: real(vr + mask), out: bytes_of_mut(&mut theirs) }];
                self.send_recv(tag::REDUCE, &[], &mut ins)?;
                acc.iter_mut().zip(&theirs).for_each(|(a, b)| f(a, b));
            }
            mask <<= 1;
        }
        Ok(Some(acc))
    }

    /// Every member gets the element-wise combination of every member's `data`.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let team = world.world_team()?;
    /// let max = team.allreduce(&[world.rank() as f64], weft_runtime::ReduceOp::Max)?;
    /// assert_eq!(max[0], (world.size() - 1) as f64);
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn allreduce<T: Number>(&self, data: &[T], op: ReduceOp) -> Result<Vec<T>> {
        self.allreduce_with(data, builtin::<T>(op))
    }

    /// As [`Team::allreduce`], with a user combination.
    pub fn allreduce_with<T: Pod>(&self, data: &[T], f: impl Fn(&mut T, &T)) -> Result<Vec<T>> {
        let mut out = self.reduce_with(0, data, f)?.unwrap_or_else(|| vec![T::zeroed(); data.len()]);
        self.broadcast(0, &mut out)?;
        Ok(out)
    }

    /// Team rank `root` gets every member's `data` (all the same length), in team order.
    pub fn gather<T: Pod>(&self, root: u32, data: &[T]) -> Result<Option<Vec<T>>> {
        let counts = vec![data.len(); self.members.len()];
        self.gatherv(root, data, &counts)
    }

    /// Team rank `root` gets member `i`'s `counts[i]` elements, concatenated in team order.
    /// Every member passes the same `counts`.
    pub fn gatherv<T: Pod>(&self, root: u32, data: &[T], counts: &[usize]) -> Result<Option<Vec<T>>> {
        let root = self.check_root(root)?;
        self.check_counts(counts, data.len(), "gatherv: one count per member")?;
        if self.me != root {
            return self
                .send_recv(tag::GATHER, &[Out { to: root, data: bytes_of(data) }], &mut [])
                .map(|_| None);
        }
        let at = offsets(counts);
        let mut all = vec![T::zeroed(); counts.iter().sum()];
        all[at[root]..at[root] + data.len()].copy_from_slice(data);
        let mut ins: Vec<In<'_>> = vec![];
        let mut rest = &mut all[..];
        let mut base = 0;
        for (r, (&o, &c)) in at.iter().zip(counts).enumerate() {
            let (_, tail) = rest.split_at_mut(o - base);
            let (block, tail) = tail.split_at_mut(c);
            rest = tail;
            base = o + c;
            if r != root {
                ins.push(In { from: r, out: bytes_of_mut(block) });
            }
        }
        self.send_recv(tag::GATHER, &[], &mut ins)?;
        Ok(Some(all))
    }

    /// Every member gets every member's `data` (all the same length), in team order.
    pub fn allgather<T: Pod>(&self, data: &[T]) -> Result<Vec<T>> {
        let counts = vec![data.len(); self.members.len()];
        self.allgatherv(data, &counts)
    }

    /// Every member gets member `i`'s `counts[i]` elements, concatenated in team order (ring:
    /// n - 1 steps, each member forwarding the block it got last).
    pub fn allgatherv<T: Pod>(&self, data: &[T], counts: &[usize]) -> Result<Vec<T>> {
        self.check_counts(counts, data.len(), "allgatherv: one count per member")?;
        let n = self.members.len();
        let at = offsets(counts);
        let mut all = vec![T::zeroed(); counts.iter().sum()];
        all[at[self.me]..at[self.me] + data.len()].copy_from_slice(data);
        let (right, left) = ((self.me + 1) % n, (self.me + n - 1) % n);
        for step in 0..n.saturating_sub(1) {
            let send = (self.me + n - step) % n;
            let recv = (self.me + n - step - 1) % n;
            let (out, inp) =
                read_write(&mut all, at[send]..at[send] + counts[send], at[recv]..at[recv] + counts[recv]);
            let mut ins = [In { from: left, out: bytes_of_mut(inp) }];
            self.send_recv(tag::ALLGATHER, &[Out { to: right, data: bytes_of(out) }], &mut ins)?;
        }
        Ok(all)
    }

    /// Team rank `root` passes `Some(data)` with `count` elements for each member, in team
    /// order; every member gets its `count`.
    pub fn scatter<T: Pod>(&self, root: u32, data: Option<&[T]>, count: usize) -> Result<Vec<T>> {
        let root = self.check_root(root)?;
        let n = self.members.len();
        let mut mine = vec![T::zeroed(); count];
        if self.me == root {
            let data = data.ok_or(Error::Misuse("scatter: the root passes the data"))?;
            if data.len() != n * count {
                return Err(Error::Mismatch(format!(
                    "scatter: the root passes {} elements for {n} members of {count}",
                    data.len()
                )));
            }
            mine.copy_from_slice(&data[root * count..(root + 1) * count]);
            let outs: Vec<Out<'_>> = (0..n)
                .filter(|&r| r != root)
                .map(|r| Out { to: r, data: bytes_of(&data[r * count..(r + 1) * count]) })
                .collect();
            self.send_recv(tag::SCATTER, &outs, &mut [])?;
        } else {
            self.send_recv(tag::SCATTER, &[], &mut [In { from: root, out: bytes_of_mut(&mut mine) }])?;
        }
        Ok(mine)
    }

    /// Member `i` sends block `j` of its `data` (`data.len() / n` elements each) to member `j`,
    /// and gets block `i` of every member, in team order (pairwise exchange).
    pub fn alltoall<T: Pod>(&self, data: &[T]) -> Result<Vec<T>> {
        let n = self.members.len();
        if !data.len().is_multiple_of(n) {
            return Err(Error::Misuse("alltoall: the data must be n equal blocks"));
        }
        let c = vec![data.len() / n; n];
        self.alltoallv(data, &c, &c)
    }

    /// As [`Team::alltoall`] with blocks of `send_counts[j]` elements to member `j` and of
    /// `recv_counts[j]` from member `j`.
    pub fn alltoallv<T: Pod>(
        &self,
        data: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Result<Vec<T>> {
        let n = self.members.len();
        if send_counts.len() != n || recv_counts.len() != n || send_counts.iter().sum::<usize>() != data.len()
        {
            return Err(Error::Misuse("alltoallv: one count per member, summing to the data's length"));
        }
        let (so, ro) = (offsets(send_counts), offsets(recv_counts));
        let mut all = vec![T::zeroed(); recv_counts.iter().sum()];
        let me = self.me;
        if send_counts[me] != recv_counts[me] {
            return Err(Error::Mismatch(format!(
                "alltoallv: team rank {me} sends itself {} elements but expects {}",
                send_counts[me], recv_counts[me]
            )));
        }
        all[ro[me]..ro[me] + recv_counts[me]].copy_from_slice(&data[so[me]..so[me] + send_counts[me]]);
        for step in 1..n {
            let (to, from) = ((me + step) % n, (me + n - step) % n);
            let out = Out { to, data: bytes_of(&data[so[to]..so[to] + send_counts[to]]) };
            let mut ins = [In { from, out: bytes_of_mut(&mut all[ro[from]..ro[from] + recv_counts[from]]) }];
            self.send_recv(tag::ALLTOALL, &[out], &mut ins)?;
        }
        Ok(all)
    }

    /// Exclusive prefix reduction: team rank `i > 0` gets the combination of ranks `0..i`'s
    /// `data`; rank 0 gets `None`.
    pub fn exscan<T: Number>(&self, data: &[T], op: ReduceOp) -> Result<Option<Vec<T>>> {
        self.exscan_with(data, builtin::<T>(op))
    }

    /// As [`Team::exscan`], with a user combination (applied in rank order).
    pub fn exscan_with<T: Pod>(&self, data: &[T], f: impl Fn(&mut T, &T)) -> Result<Option<Vec<T>>> {
        let (me, n) = (self.me, self.members.len());
        let mut prefix = None;
        if me > 0 {
            let mut p = vec![T::zeroed(); data.len()];
            self.send_recv(tag::SCAN, &[], &mut [In { from: me - 1, out: bytes_of_mut(&mut p) }])?;
            prefix = Some(p);
        }
        if me + 1 < n {
            let mut incl = prefix.clone().unwrap_or_else(|| data.to_vec());
            if prefix.is_some() {
                incl.iter_mut().zip(data).for_each(|(a, b)| f(a, b));
            }
            self.send_recv(tag::SCAN, &[Out { to: me + 1, data: bytes_of(&incl) }], &mut [])?;
        }
        Ok(prefix)
    }
}
