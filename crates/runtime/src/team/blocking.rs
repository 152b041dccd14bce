//! The blocking collectives of a [`Team`]: each numbers its call, then runs the algorithm of
//! [`super::coll`] to completion (the inline paths for messages that fit a flag line).

use super::call::Call;
use super::channel::{INLINE, INLINE_PEERS};
use super::coll::{builtin, tag, Number, ReduceOp, FLAT_MEMBERS};
use super::counts::total_bytes;
use super::Team;
use crate::{Error, Pod, Result};
use std::pin::pin;
use weft_fabric::pod::{bytes_of, bytes_of_mut};

impl Team {
    /// Blocks until every member has called `barrier` (dissemination over the team's channels,
    /// ⌈log2 n⌉ rounds).
    pub fn barrier(&self) -> Result<()> {
        self.core.open(Call::new(tag::BARRIER, None, 0))?;
        self.core.run(pin!(self.core.barrier()))
    }

    /// Copies team rank `root`'s `buf` into every member's `buf` (binomial tree).
    pub fn broadcast<T: Pod>(&self, root: u32, buf: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(buf);
        // Arguments are checked before the call is numbered: a bad one fails on its member
        // alone and leaves the team usable.
        let r = self.core.check_root(root)?;
        self.core.open(Call::new(tag::BROADCAST, Some(root), bytes))?;
        if bytes <= INLINE && self.core.size() <= FLAT_MEMBERS {
            let root = r;
            return self.core.close(self.core.broadcast_inline(root, bytes_of_mut(buf)));
        }
        let tuning = self.core.tuning(tag::BROADCAST, bytes, bytes_of(buf));
        self.core.run_tuned(tuning, pin!(self.core.broadcast(root, buf)))
    }

    /// Combines every member's `data` element-wise with `op`; team rank `root` gets the
    /// result, the others `None`.
    pub fn reduce<T: Number>(&self, root: u32, data: &[T], op: ReduceOp) -> Result<Option<Vec<T>>> {
        self.reduce_with(root, data, builtin::<T>(op))
    }

    /// As [`Team::reduce`], with a user combination `f(acc, x)`, which must be associative and
    /// commutative. It is applied in an order fixed by the team's size, the root and the
    /// length, so floating-point results are the same run after run.
    pub fn reduce_with<T: Pod>(
        &self,
        root: u32,
        data: &[T],
        f: impl Fn(&mut T, &T),
    ) -> Result<Option<Vec<T>>> {
        let bytes = std::mem::size_of_val(data);
        self.core.check_root(root)?;
        self.core.open(Call::new(tag::REDUCE, Some(root), bytes))?;
        let tuning = self.core.tuning(tag::REDUCE, bytes, bytes_of(data));
        self.core.run_tuned(tuning, pin!(self.core.reduce(root, data, &f)))
    }

    /// Every member gets the element-wise combination of every member's `data`: recursive
    /// doubling up to [`crate::Config::coll_small_bytes`], a ring (reduce-scatter + allgather)
    /// above. Every member gets the same bits, run after run.
    ///
    /// ```no_run
    /// # use weft_runtime as weft;
    /// # let world = weft_runtime::World::init()?;
    /// let team = world.world_team()?;
    /// let max = team.allreduce(&[world.rank() as f64], weft::ReduceOp::Max)?;
    /// assert_eq!(max[0], (world.size() - 1) as f64);
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn allreduce<T: Number>(&self, data: &[T], op: ReduceOp) -> Result<Vec<T>> {
        self.allreduce_with(data, builtin::<T>(op))
    }

    /// True if an allreduce of `bytes` per member takes [`Core::allreduce_pair_inline`]: two
    /// members, data that fits a flag line and takes the latency algorithm (whose one
    /// exchange it is; every member decides alike).
    fn pair_inline(&self, bytes: usize) -> bool {
        self.core.size() == 2 && (1..=INLINE).contains(&bytes) && self.core.small_bytes(bytes)
    }

    /// True if an alltoall with blocks of `bytes` takes [`Core::alltoall_inline`]: up to
    /// [`FLAT_MEMBERS`] members, blocks that fit a flag line and take the latency algorithm
    /// (whose one round it is; every member decides alike).
    fn flat_inline(&self, bytes: usize) -> bool {
        (2..=FLAT_MEMBERS).contains(&self.core.size())
            && (1..=INLINE).contains(&bytes)
            && self.core.small_bytes(bytes)
    }

    /// As [`Team::allreduce`], with a user combination (associative and commutative).
    pub fn allreduce_with<T: Pod>(&self, data: &[T], f: impl Fn(&mut T, &T)) -> Result<Vec<T>> {
        let bytes = std::mem::size_of_val(data);
        self.core.open(Call::new(tag::ALLREDUCE, None, bytes))?;
        if self.pair_inline(bytes) {
            let mut out = vec![T::zeroed(); data.len()];
            self.core.close(self.core.allreduce_pair_inline(data, &mut out, &f))?;
            return Ok(out);
        }
        let tuning = self.core.tuning(tag::ALLREDUCE, bytes, bytes_of(data));
        self.core.run_tuned(tuning, pin!(self.core.allreduce(data, &f)))
    }

    /// As [`Team::allreduce`], into `out` (as long as `data`): no allocation for the result, as
    /// `MPI_Allreduce` into a buffer the program keeps.
    ///
    /// ```no_run
    /// # use weft_runtime as weft;
    /// # let world = weft_runtime::World::init()?;
    /// let team = world.world_team()?;
    /// let mut sum = vec![0u64; 4];
    /// team.allreduce_into(&[1, 2, 3, 4], &mut sum, weft::ReduceOp::Sum)?;
    /// assert_eq!(sum[3], 4 * world.size() as u64);
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn allreduce_into<T: Number>(&self, data: &[T], out: &mut [T], op: ReduceOp) -> Result<()> {
        self.allreduce_with_into(data, out, builtin::<T>(op))
    }

    /// As [`Team::allreduce_with`], into `out` (as long as `data`).
    pub fn allreduce_with_into<T: Pod>(
        &self,
        data: &[T],
        out: &mut [T],
        f: impl Fn(&mut T, &T),
    ) -> Result<()> {
        if out.len() != data.len() {
            return Err(Error::Misuse("allreduce_into: the output must be as long as the data"));
        }
        let bytes = std::mem::size_of_val(data);
        self.core.open(Call::new(tag::ALLREDUCE, None, bytes))?;
        if self.pair_inline(bytes) {
            return self.core.close(self.core.allreduce_pair_inline(data, out, &f));
        }
        let tuning = self.core.tuning(tag::ALLREDUCE, bytes, bytes_of(data));
        self.core.run_tuned(tuning, pin!(self.core.allreduce_into(data, out, &f)))
    }

    /// Team rank `root` gets every member's `data` (all the same length), in team order.
    pub fn gather<T: Pod>(&self, root: u32, data: &[T]) -> Result<Option<Vec<T>>> {
        self.gatherv(root, data, &vec![data.len(); self.core.size()])
    }

    /// Team rank `root` gets member `i`'s `counts[i]` elements, concatenated in team order.
    /// Every member passes the same `counts`.
    pub fn gatherv<T: Pod>(&self, root: u32, data: &[T], counts: &[usize]) -> Result<Option<Vec<T>>> {
        self.core.check_root(root)?;
        self.core.open(Call::new(tag::GATHER, Some(root), total_bytes::<T>(counts)))?;
        self.core.run(pin!(self.core.gatherv(root, data, counts)))
    }

    /// Every member gets every member's `data` (all the same length), in team order.
    pub fn allgather<T: Pod>(&self, data: &[T]) -> Result<Vec<T>> {
        self.allgatherv(data, &vec![data.len(); self.core.size()])
    }

    /// Every member gets member `i`'s `counts[i]` elements, concatenated in team order (one
    /// round up to the latency limit, a ring above).
    pub fn allgatherv<T: Pod>(&self, data: &[T], counts: &[usize]) -> Result<Vec<T>> {
        self.core.open(Call::new(tag::ALLGATHER, None, total_bytes::<T>(counts)))?;
        self.core.run(pin!(self.core.allgatherv(data, counts)))
    }

    /// Team rank `root` passes `Some(data)` with `count` elements for each member, in team
    /// order; every member gets its `count`.
    pub fn scatter<T: Pod>(&self, root: u32, data: Option<&[T]>, count: usize) -> Result<Vec<T>> {
        self.core.check_root(root)?;
        self.core.open(Call::new(tag::SCATTER, Some(root), count.saturating_mul(size_of::<T>())))?;
        self.core.run(pin!(self.core.scatter(root, data, count)))
    }

    /// Member `i` sends block `j` of its `data` (`data.len() / n` elements each) to member `j`,
    /// and gets block `i` of every member, in team order.
    pub fn alltoall<T: Pod>(&self, data: &[T]) -> Result<Vec<T>> {
        let c = self.alltoall_counts(data.len())?;
        let bytes = c.first().map_or(0, |&b| b * std::mem::size_of::<T>());
        // Every member passes blocks of the same size: part of the call (not so alltoallv's).
        self.core.open(Call::new(tag::ALLTOALL, None, bytes))?;
        if self.flat_inline(bytes) {
            let mut out = vec![T::zeroed(); data.len()];
            self.core.close(self.core.alltoall_inline(data, &mut out, c[0]))?;
            return Ok(out);
        }
        let tuning = self.core.tuning(tag::ALLTOALL, bytes, bytes_of(data));
        let r = self.core.run_tuned(tuning, pin!(self.core.alltoallv(data, &c, &c)));
        r
    }

    /// As [`Team::alltoall`], into `out` (as long as `data`): no allocation for the result.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let team = world.world_team()?;
    /// let n = world.size() as usize;
    /// let mine = vec![world.rank(); n];
    /// let mut from_each = vec![0u32; n];
    /// team.alltoall_into(&mine, &mut from_each)?;
    /// assert_eq!(from_each, (0..n as u32).collect::<Vec<_>>());
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn alltoall_into<T: Pod>(&self, data: &[T], out: &mut [T]) -> Result<()> {
        let n = self.core.size();
        let block = self.alltoall_block(data.len())?;
        // The counts on the stack for up to INLINE_PEERS members: no allocation per call.
        let (inline, heap);
        let counts: &[usize] = if n <= INLINE_PEERS {
            inline = [block; INLINE_PEERS];
            &inline[..n]
        } else {
            heap = vec![block; n];
            &heap
        };
        let bytes = block * std::mem::size_of::<T>();
        self.core.open(Call::new(tag::ALLTOALL, None, bytes))?;
        if self.flat_inline(bytes) && out.len() == data.len() {
            return self.core.close(self.core.alltoall_inline(data, out, block));
        }
        let tuning = self.core.tuning(tag::ALLTOALL, bytes, bytes_of(data));
        let r = self.core.run_tuned(tuning, pin!(self.core.alltoallv_into(data, counts, counts, out)));
        r
    }

    /// Elements per member of an alltoall of `len` elements.
    fn alltoall_block(&self, len: usize) -> Result<usize> {
        let n = self.core.size();
        if !len.is_multiple_of(n) {
            return Err(Error::Misuse("alltoall: the data must be n equal blocks"));
        }
        Ok(len / n)
    }

    pub(super) fn alltoall_counts(&self, len: usize) -> Result<Vec<usize>> {
        Ok(vec![self.alltoall_block(len)?; self.core.size()])
    }

    /// As [`Team::alltoall`] with blocks of `send_counts[j]` elements to member `j` and of
    /// `recv_counts[j]` from member `j` (one round up to the latency limit, pairwise exchange
    /// above).
    pub fn alltoallv<T: Pod>(
        &self,
        data: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Result<Vec<T>> {
        self.core.open(Call::new(tag::ALLTOALL, None, 0))?;
        self.core.run(pin!(self.core.alltoallv(data, send_counts, recv_counts)))
    }

    /// Exclusive prefix reduction: team rank `i > 0` gets the combination of ranks `0..i`'s
    /// `data`; rank 0 gets `None`.
    pub fn exscan<T: Number>(&self, data: &[T], op: ReduceOp) -> Result<Option<Vec<T>>> {
        self.exscan_with(data, builtin::<T>(op))
    }

    /// As [`Team::exscan`], with a user combination (applied in rank order).
    pub fn exscan_with<T: Pod>(&self, data: &[T], f: impl Fn(&mut T, &T)) -> Result<Option<Vec<T>>> {
        self.core.open(Call::new(tag::SCAN, None, size_of_val(data)))?;
        self.core.run(pin!(self.core.exscan(data, &f)))
    }
}
