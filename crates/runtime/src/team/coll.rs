//! Collectives over a [`Team`], moved with one-sided operations through the team's channels.
//!
//! | collective | up to `coll_small_bytes` per member | above |
//! |---|---|---|
//! | barrier | dissemination | — |
//! | broadcast | root to all (teams of up to 4, messages of up to 96 bytes), else binomial tree | binomial tree |
//! | reduce | binomial tree | binomial tree |
//! | allreduce | recursive doubling (pairs folded for non-powers of two) | ring: reduce-scatter + allgather |
//! | allgather(v) | one round, all to all | ring |
//! | alltoall(v) | one round, all to all | pairwise exchange |
//! | gather(v), scatter | one round to / from the root | same |
//! | exscan | chain | chain |
//!
//! Every algorithm works for any team size. Reductions combine in an order fixed by the team's
//! size, the root and the length, so floating-point results are the same run after run and
//! (for allreduce) on every member. Lengths and collective kinds are checked on arrival:
//! members that disagree get [`Error::Mismatch`].

use super::channel::{one_way, In, Out, Transfer, INLINE_PEERS};
use super::counts::{check_counts, sum, zeroed_buf};
use super::Core;
use crate::{Error, Pod, Result};
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use weft_fabric::copy::{copy_slice, copy_streaming, to_vec};
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

pub(super) fn builtin<T: Number>(op: ReduceOp) -> impl Fn(&mut T, &T) {
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
pub(super) mod tag {
    pub const BARRIER: u64 = 0xb0;
    pub const BROADCAST: u64 = 0xb1;
    pub const REDUCE: u64 = 0xb2;
    pub const GATHER: u64 = 0xb3;
    pub const ALLGATHER: u64 = 0xb4;
    pub const SCATTER: u64 = 0xb5;
    pub const ALLTOALL: u64 = 0xb6;
    pub const SCAN: u64 = 0xb7;
    pub const ALLREDUCE: u64 = 0xb8;
    pub const SPLIT: u64 = 0xb9;
    pub const SUBSET: u64 = 0xba;
    pub const ALLOC: u64 = 0xbb;
}

/// Looks a member of a small broadcast takes at its message before it waits through a
/// transfer (see [`Core::broadcast_inline`]).
const INLINE_TRIES: u32 = 32;

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

/// `buf` cut into consecutive blocks of the given element counts.
fn carve<'a, T>(mut buf: &'a mut [T], counts: &[usize]) -> Vec<&'a mut [T]> {
    counts
        .iter()
        .map(|&c| {
            let (block, rest) = std::mem::take(&mut buf).split_at_mut(c);
            buf = rest;
            block
        })
        .collect()
}

/// An alltoall's messages from `(block to member r, block from member r)` for each member `r`
/// in team order: this member's (`me`) own block is copied, the others are described in
/// `outs` and `ins` from the start; returns how many.
fn alltoall_messages<'a, 'b, T: Pod>(
    me: usize,
    blocks: impl Iterator<Item = (&'a [T], &'b mut [T])>,
    outs: &mut [Out<'a>],
    ins: &mut [In<'b>],
) -> usize {
    let mut k = 0;
    for (r, (src, dst)) in blocks.enumerate() {
        if r == me {
            copy_slice(dst, src);
        } else {
            outs[k] = Out { to: r, data: bytes_of(src) };
            ins[k] = In { from: r, out: bytes_of_mut(dst) };
            k += 1;
        }
    }
    k
}

/// Receives for every member's block except `skip`'s (this member's own).
fn receive_into<T: Pod>(blocks: Vec<&mut [T]>, skip: usize) -> Vec<In<'_>> {
    blocks
        .into_iter()
        .enumerate()
        .filter(|&(r, _)| r != skip)
        .map(|(from, b)| In { from, out: bytes_of_mut(b) })
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

/// Element-wise `acc = f(acc, x)`.
fn combine<T>(acc: &mut [T], x: &[T], f: &impl Fn(&mut T, &T)) {
    acc.iter_mut().zip(x).for_each(|(a, b)| f(a, b));
}

/// `theirs[i] = f(mine[i], theirs[i])`: what [`combine`] computes with `mine` as the
/// accumulator (the same operand order, so the same bits), left in `theirs`.
fn combine_into<T: Pod>(theirs: &mut [T], mine: &[T], f: &impl Fn(&mut T, &T)) {
    theirs.iter_mut().zip(mine).for_each(|(t, &m)| {
        let x = *t;
        *t = m;
        f(t, &x);
    });
}

/// Teams up to this size broadcast a small message from the root to every member at once.
pub(super) const FLAT_MEMBERS: usize = 4;
/// Broadcasts up to this many bytes go from the root straight to every member of a team of
/// up to [`FLAT_MEMBERS`] (in flag lines and sub-slots). 4 ranks on 2 cores, against the
/// tree: 512 B 3.1-3.5 -> 1.35-1.49 µs, 4 KiB 2.4-4.9 -> 3.0 µs; larger ones keep the tree,
/// whose root copies the message fewer times.
const FLAT_BYTES: usize = 4 << 10;

/// Bytes of a member's own alltoall block copied per piece while an exchange waits.
const SELF_PIECE: usize = 64 << 10;
/// A member's own alltoall block of this many bytes or more may be copied with
/// cache-bypassing stores ([`copy_streaming`]), where the members' copies of the other blocks
/// run at the same time and share the memory bandwidth and the last-level cache; whether it
/// is, the tuner measures ([`super::tune`]).
pub(super) const SELF_STREAMING: usize = 2 << 20;

/// Polls `fut`; each time it would wait, does a piece of `work` (which answers whether more
/// is left) and polls again; once `fut` is done, finishes the work.
struct WhileWaiting<F, W> {
    fut: F,
    work: W,
    left: bool,
}

impl<F: Future<Output = Result<()>> + Unpin, W: FnMut() -> bool + Unpin> Future for WhileWaiting<F, W> {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        loop {
            match Pin::new(&mut this.fut).poll(cx) {
                Poll::Ready(r) => {
                    while this.left {
                        this.left = (this.work)();
                    }
                    return Poll::Ready(r);
                }
                Poll::Pending if this.left => this.left = (this.work)(),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Words of a [`Scratch`] kept on the stack (256 bytes).
const STACK_SCRATCH_WORDS: usize = 32;

/// A collective's buffer for a peer's operand: on the stack when small (an 8 B allreduce spent
/// a seventh of its instructions in `calloc` and `free`), else on the heap.
struct Scratch<T> {
    stack: [u64; STACK_SCRATCH_WORDS],
    heap: Vec<T>,
}

impl<T: Pod> Scratch<T> {
    fn new() -> Self {
        Scratch { stack: [0; STACK_SCRATCH_WORDS], heap: Vec::new() }
    }
    /// `len` elements (their values are whatever was there: every caller overwrites them).
    fn get(&mut self, len: usize) -> &mut [T] {
        match weft_fabric::pod::words_as_mut(&mut self.stack, len) {
            Some(s) => s,
            None => {
                self.heap.resize(len, T::zeroed());
                &mut self.heap
            }
        }
    }
}

/// `v mod n` for `v < 2n` (no division on the latency paths).
fn wrap(v: usize, n: usize) -> usize {
    if v >= n {
        v - n
    } else {
        v
    }
}

/// Element counts of `n` near-equal blocks of `len` elements.
fn even_blocks(len: usize, n: usize) -> Vec<usize> {
    (0..n).map(|i| len / n + usize::from(i < len % n)).collect()
}

/// The algorithms, as futures over borrowed data: [`Team`]'s blocking collectives run them at
/// once, its non-blocking ones queue them (see [`super::CollHandle`]).
impl Core {
    #[inline]
    pub(super) fn check_root(&self, root: u32) -> Result<usize> {
        (root < self.size() as u32)
            .then_some(root as usize)
            .ok_or(Error::NoSuchRank { rank: root, size: self.size() as u32 })
    }

    /// True if messages of `elems` `T`s take the latency algorithms.
    fn small<T>(&self, elems: usize) -> bool {
        self.small_bytes(elems.saturating_mul(std::mem::size_of::<T>()))
    }

    /// True if collectives of `bytes` per member (or per block) use the latency algorithms.
    pub(super) fn small_bytes(&self, bytes: usize) -> bool {
        bytes <= self.comm.cfg.coll_small_bytes
    }

    fn send_recv<'t, 'o, 'i>(
        &'t self,
        tag: u64,
        outs: &'t [Out<'o>],
        ins: &'t mut [In<'i>],
    ) -> Transfer<'t, 'o, 'i> {
        self.channels.transfer(self, self.tag(tag), outs, ins)
    }

    /// Exchanges `out` with `peer` (both directions at once).
    async fn swap<T: Pod>(&self, tag: u64, peer: usize, out: &[T], inp: &mut [T]) -> Result<()> {
        let mut ins = [In { from: peer, out: bytes_of_mut(inp) }];
        self.send_recv(tag, &[Out { to: peer, data: bytes_of(out) }], &mut ins).await
    }

    /// Dissemination: in round `r` every member signals the one 2^r ahead and waits for the
    /// one 2^r behind; ⌈log2 n⌉ rounds of empty messages.
    pub(super) async fn barrier(&self) -> Result<()> {
        let (me, n) = (self.me, self.size());
        let mut dist = 1;
        while dist < n {
            let outs = [Out { to: wrap(me + dist, n), data: &[] }];
            let mut ins = [In { from: wrap(me + n - dist, n), out: &mut [] }];
            self.send_recv(tag::BARRIER, &outs, &mut ins).await?;
            dist <<= 1;
        }
        Ok(())
    }

    /// True if this member's waits spin (a load/store fabric, cores to spare).
    fn spins(&self) -> bool {
        self.comm.caps().load_store && !self.comm.cfg.spin.is_zero()
    }

    /// The blocking [`Core::broadcast`] of a message that fits a flag line, in a team of up to
    /// [`FLAT_MEMBERS`]: what can move at once moves without a future or a wait loop (the
    /// root's messages whose lines are free, a member's message that has arrived), the rest
    /// through [`Core::run`]. Back-to-back 8 B broadcasts spent most of their time in that
    /// machinery (about 800 instructions a call on the root).
    pub(super) fn broadcast_inline(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        // Written out rather than through `exchange_inline`, which cost a quarter more per
        // back-to-back 8 B broadcast.
        let tag = one_way(self.tag(tag::BROADCAST));
        if self.me != root {
            // A member that caught up with its root looks again a few times before it sets up
            // a transfer and a wait, which cost more than the message takes to come.
            let tries = if self.spins() { INLINE_TRIES } else { 1 };
            for _ in 0..tries {
                if self.channels.try_take_inline(self, tag, root, buf)? {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            let mut ins = [In { from: root, out: buf }];
            return self.run(pin!(self.send_recv(tag, &[], &mut ins)));
        }
        let data: &[u8] = buf;
        for to in (0..self.size()).filter(|&r| r != root) {
            if !self.channels.try_send_inline(self, tag, to, data)? {
                return self.broadcast_inline_rest(root, tag, data, to);
            }
        }
        Ok(())
    }

    /// The rest of a root's [`Core::broadcast_inline`] from the first member `first` whose
    /// line was busy: sends what it can now, then the others in one transfer. Apart, so that
    /// the usual call sets up no list of members.
    #[cold]
    #[inline(never)]
    fn broadcast_inline_rest(&self, root: usize, tag: u64, data: &[u8], first: usize) -> Result<()> {
        let mut later = [Out { to: first, data }; FLAT_MEMBERS];
        let mut k = 1;
        for to in (first + 1..self.size()).filter(|&r| r != root) {
            if !self.channels.try_send_inline(self, tag, to, data)? {
                later[k] = Out { to, data };
                k += 1;
            }
        }
        self.run(pin!(self.send_recv(tag, &later[..k], &mut [])))
    }

    /// Sends `outs` and takes `ins` (at most [`INLINE`] bytes each, to and from at most
    /// [`FLAT_MEMBERS`] members): what can move at once moves without a future or a wait
    /// loop, the rest in one transfer through [`Core::run`]. The messages carry the tag a
    /// transfer of the same `outs` and `ins` gives them, so members that move them through
    /// the non-blocking collectives' transfers match.
    fn exchange_inline(&self, kind: u64, outs: &[Out<'_>], ins: &mut [In<'_>]) -> Result<()> {
        let tag = self.tag(kind);
        let tag = if outs.is_empty() || ins.is_empty() { one_way(tag) } else { tag };
        let mut later_outs = [Out { to: 0, data: &[] }; FLAT_MEMBERS];
        let mut k = 0;
        for o in outs {
            if !self.channels.try_send_inline(self, tag, o.to, o.data)? {
                later_outs[k] = *o;
                k += 1;
            }
        }
        let mut later_ins: [In<'_>; FLAT_MEMBERS] = std::array::from_fn(|_| In { from: 0, out: &mut [] });
        let mut j = 0;
        for i in ins.iter_mut() {
            if !self.channels.try_take_inline(self, tag, i.from, i.out)? {
                later_ins[j] = In { from: i.from, out: &mut *i.out };
                j += 1;
            }
        }
        // Everything sent: look again a few times for what has not come (as a small
        // broadcast's member does) before setting up a transfer and a wait.
        let mut tries = if k == 0 && self.spins() { INLINE_TRIES } else { 0 };
        while j > 0 && tries > 0 {
            tries -= 1;
            std::hint::spin_loop();
            let mut still = 0;
            for x in 0..j {
                let i = &mut later_ins[x];
                if !self.channels.try_take_inline(self, tag, i.from, i.out)? {
                    later_ins.swap(still, x);
                    still += 1;
                }
            }
            j = still;
        }
        if k + j == 0 {
            return Ok(());
        }
        self.run(pin!(self.channels.transfer_tagged(self, tag, &later_outs[..k], &mut later_ins[..j])))
    }

    /// The blocking allreduce of two members whose data fits a flag line: one message each
    /// way through [`Core::exchange_inline`] (the future and recursive doubling's machinery
    /// cost as much as the message), the lower rank's operand first as recursive doubling
    /// takes it, so both members compute the same bits.
    pub(super) fn allreduce_pair_inline<T: Pod>(
        &self,
        data: &[T],
        out: &mut [T],
        f: &impl Fn(&mut T, &T),
    ) -> Result<()> {
        let other = 1 - self.me;
        let mut scratch = Scratch::new();
        let theirs = scratch.get(data.len());
        let outs = [Out { to: other, data: bytes_of(data) }];
        self.exchange_inline(
            tag::ALLREDUCE,
            &outs,
            &mut [In { from: other, out: bytes_of_mut(&mut *theirs) }],
        )?;
        let (lower, higher) = if other < self.me { (&*theirs, data) } else { (data, &*theirs) };
        copy_slice(out, lower);
        combine(out, higher, f);
        Ok(())
    }

    /// The blocking alltoall of a team of up to [`FLAT_MEMBERS`] whose blocks (`block`
    /// elements, at least one byte) fit a flag line, through [`Core::exchange_inline`].
    pub(super) fn alltoall_inline<T: Pod>(&self, data: &[T], out: &mut [T], block: usize) -> Result<()> {
        let mut outs = [Out { to: 0, data: &[] }; FLAT_MEMBERS];
        let mut ins: [In<'_>; FLAT_MEMBERS] = std::array::from_fn(|_| In { from: 0, out: &mut [] });
        let blocks = data.chunks(block).zip(out.chunks_mut(block));
        let k = alltoall_messages(self.me, blocks, &mut outs, &mut ins);
        self.exchange_inline(tag::ALLTOALL, &outs[..k], &mut ins[..k])
    }

    /// Binomial tree from `root`; from the root straight to every member for a message of up
    /// to [`FLAT_BYTES`] in a team of up to [`FLAT_MEMBERS`].
    pub(super) async fn broadcast<T: Pod>(&self, root: u32, buf: &mut [T]) -> Result<()> {
        let root = self.check_root(root)?;
        let n = self.size();
        if n <= FLAT_MEMBERS && std::mem::size_of_val(buf) <= FLAT_BYTES {
            // One hop for everyone: a tree's second hop waits for a member to forward, which
            // with more ranks than cores waits for the scheduler to run it (a 4-rank 8 B
            // broadcast took 3 µs that way on 2 cores, most of it on the grandchild).
            if self.me != root {
                let mut ins = [In { from: root, out: bytes_of_mut(buf) }];
                return self.send_recv(tag::BROADCAST, &[], &mut ins).await;
            }
            let data = bytes_of(buf);
            let mut outs = [Out { to: 0, data }; FLAT_MEMBERS];
            let mut k = 0;
            for to in (0..n).filter(|&r| r != root) {
                outs[k] = Out { to, data };
                k += 1;
            }
            return self.send_recv(tag::BROADCAST, &outs[..k], &mut []).await;
        }
        let vr = wrap(self.me + n - root, n);
        let real = |v: usize| wrap(v + root, n);
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                let mut ins = [In { from: real(vr - mask), out: bytes_of_mut(buf) }];
                self.send_recv(tag::BROADCAST, &[], &mut ins).await?;
                break;
            }
            mask <<= 1;
        }
        // The children, nearest last: on the stack up to 4 (a team of up to 16 members), so a
        // small broadcast does not pay malloc and free.
        let data = bytes_of(buf);
        let (mut inline, mut heap) = ([Out { to: 0, data: &[] }; 4], Vec::new());
        let mut k = 0;
        let mut m = mask >> 1;
        while m > 0 {
            if vr + m < n {
                let out = Out { to: real(vr + m), data };
                match inline.get_mut(k) {
                    Some(slot) => *slot = out,
                    None => {
                        if heap.is_empty() {
                            heap.extend_from_slice(&inline);
                        }
                        heap.push(out);
                    }
                }
                k += 1;
            }
            m >>= 1;
        }
        if k == 0 {
            return Ok(()); // a leaf
        }
        let outs = if k <= inline.len() { &inline[..k] } else { &heap[..] };
        self.send_recv(tag::BROADCAST, outs, &mut []).await
    }

    /// Binomial tree towards `root`.
    pub(super) async fn reduce<T: Pod>(
        &self,
        root: u32,
        data: &[T],
        f: &impl Fn(&mut T, &T),
    ) -> Result<Option<Vec<T>>> {
        let root = self.check_root(root)?;
        let n = self.size();
        let vr = wrap(self.me + n - root, n);
        let real = |v: usize| wrap(v + root, n);
        // A leaf (half the members) sends its data as it is, with no copy and no scratch; a
        // member with children makes its partial result before its first child's data can
        // arrive, while the child still sends.
        let has_children = vr & 1 == 0 && vr + 1 < n;
        let mut acc = has_children.then(|| to_vec(data));
        let mut scratch = Scratch::new();
        let theirs = scratch.get(if has_children { data.len() } else { 0 });
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                let outs = [Out { to: real(vr - mask), data: bytes_of(acc.as_deref().unwrap_or(data)) }];
                self.send_recv(tag::REDUCE, &outs, &mut []).await?;
                return Ok(None);
            }
            if vr + mask < n {
                let mut ins = [In { from: real(vr + mask), out: bytes_of_mut(&mut *theirs) }];
                self.send_recv(tag::REDUCE, &[], &mut ins).await?;
                combine(acc.get_or_insert_with(|| to_vec(data)), &*theirs, f);
            }
            mask <<= 1;
        }
        Ok(Some(acc.unwrap_or_else(|| to_vec(data))))
    }

    /// Recursive doubling up to `data`'s latency limit, a ring (reduce-scatter, then
    /// allgather) above it.
    pub(super) async fn allreduce<T: Pod>(&self, data: &[T], f: &impl Fn(&mut T, &T)) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); data.len()];
        self.allreduce_into(data, &mut out, f).await?;
        Ok(out)
    }

    /// As [`Core::allreduce`], into `out` (as long as `data`). Above the latency limit the
    /// ring reads `data` where it is and builds the result in `out`: no copy of `data` first
    /// and no scratch (for large data, memory traffic is the cost).
    pub(super) async fn allreduce_into<T: Pod>(
        &self,
        data: &[T],
        out: &mut [T],
        f: &impl Fn(&mut T, &T),
    ) -> Result<()> {
        if self.size() > 1 && !self.small::<T>(data.len()) {
            return self.ring_allreduce(data, out, f).await;
        }
        copy_slice(out, data);
        if self.size() > 1 {
            self.recursive_doubling(out, f).await?;
        }
        Ok(())
    }

    /// Recursive doubling on the largest power of two p ≤ n members; the first 2(n - p)
    /// members fold in pairs first (the even one hands its data to the odd one and gets the
    /// result back at the end). Operands are always combined lower rank first, so every
    /// member computes the same bits.
    async fn recursive_doubling<T: Pod>(&self, acc: &mut [T], f: &impl Fn(&mut T, &T)) -> Result<()> {
        let (me, n) = (self.me, self.size());
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - p;
        let mut scratch = Scratch::new();
        let theirs = scratch.get(acc.len());
        // Lower-rank operand first: acc = theirs ∘ acc.
        let combine_lower = |acc: &mut [T], theirs: &mut [T]| {
            combine(theirs, acc, f);
            copy_slice(acc, theirs);
        };
        let folded = if me < 2 * rem {
            if me % 2 == 0 {
                self.send_recv(tag::ALLREDUCE, &[Out { to: me + 1, data: bytes_of(acc) }], &mut []).await?;
                None
            } else {
                let mut ins = [In { from: me - 1, out: bytes_of_mut(&mut *theirs) }];
                self.send_recv(tag::ALLREDUCE, &[], &mut ins).await?;
                combine_lower(acc, &mut *theirs);
                Some(me / 2)
            }
        } else {
            Some(me - rem)
        };
        if let Some(v) = folded {
            let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };
            let mut mask = 1;
            while mask < p {
                let pv = v ^ mask;
                self.swap(tag::ALLREDUCE, real(pv), acc, &mut *theirs).await?;
                if pv < v {
                    combine_lower(acc, &mut *theirs);
                } else {
                    combine(acc, &*theirs, f);
                }
                mask <<= 1;
            }
        }
        if me < 2 * rem {
            if me % 2 == 0 {
                let mut ins = [In { from: me + 1, out: bytes_of_mut(acc) }];
                self.send_recv(tag::ALLREDUCE, &[], &mut ins).await?;
            } else {
                self.send_recv(tag::ALLREDUCE, &[Out { to: me - 1, data: bytes_of(acc) }], &mut []).await?;
            }
        }
        Ok(())
    }

    /// Ring: n - 1 steps of reduce-scatter (each member ends with one block fully combined),
    /// then n - 1 steps of allgather. Each block is combined once, in a fixed order, then
    /// copied: every member gets the same bits.
    ///
    /// `out` is only the output: a block arrives straight in `out` and this member's operand
    /// from `data` joins it there. (A member receives each block at most once in the
    /// reduce-scatter, so the local operand of every block it combines is still `data`'s.)
    async fn ring_allreduce<T: Pod>(&self, data: &[T], out: &mut [T], f: &impl Fn(&mut T, &T)) -> Result<()> {
        let (me, n) = (self.me, self.size());
        let counts = even_blocks(out.len(), n);
        let at = offsets(&counts);
        let block = |b: usize| at[b]..at[b] + counts[b];
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        for step in 0..n - 1 {
            let (send, recv) = ((me + n - step) % n, (me + 2 * n - step - 1) % n);
            let (sent, inp) = read_write(out, block(send), block(recv));
            // The first block out is this member's own, not yet in `out`.
            let sent = if step == 0 { &data[block(send)] } else { sent };
            let mut ins = [In { from: left, out: bytes_of_mut(inp) }];
            self.send_recv(tag::ALLREDUCE, &[Out { to: right, data: bytes_of(sent) }], &mut ins).await?;
            combine_into(inp, &data[block(recv)], f);
        }
        for step in 0..n - 1 {
            let (send, recv) = ((me + 1 + n - step) % n, (me + n - step) % n);
            let (sent, inp) = read_write(out, block(send), block(recv));
            let mut ins = [In { from: left, out: bytes_of_mut(inp) }];
            self.send_recv(tag::ALLREDUCE, &[Out { to: right, data: bytes_of(sent) }], &mut ins).await?;
        }
        Ok(())
    }

    /// Every member sends its block straight to the root, all at once.
    pub(super) async fn gatherv<T: Pod>(
        &self,
        root: u32,
        data: &[T],
        counts: &[usize],
    ) -> Result<Option<Vec<T>>> {
        let root = self.check_root(root)?;
        check_counts(counts, self.size(), self.me, data.len(), "gatherv: one count per member")
            .map_err(|e| self.bad_argument(e))?;
        if self.me != root {
            let outs = [Out { to: root, data: bytes_of(data) }];
            return self.send_recv(tag::GATHER, &outs, &mut []).await.map(|_| None);
        }
        let mut all = zeroed_buf::<T>(sum(counts), "gatherv result").map_err(|e| self.bad_argument(e))?;
        let mut blocks = carve(&mut all, counts);
        copy_slice(blocks[root], data);
        let mut ins = receive_into(blocks, root);
        self.send_recv(tag::GATHER, &[], &mut ins).await?;
        Ok(Some(all))
    }

    /// One round (every member sends its block to every other) up to the latency limit, a
    /// ring above it.
    pub(super) async fn allgatherv<T: Pod>(&self, data: &[T], counts: &[usize]) -> Result<Vec<T>> {
        let (me, n) = (self.me, self.size());
        check_counts(counts, n, me, data.len(), "allgatherv: one count per member")
            .map_err(|e| self.bad_argument(e))?;
        let mut all = zeroed_buf::<T>(sum(counts), "allgatherv result").map_err(|e| self.bad_argument(e))?;
        if self.small::<T>(counts.iter().copied().max().unwrap_or(0)) {
            let mut blocks = carve(&mut all, counts);
            copy_slice(blocks[me], data);
            let outs: Vec<Out<'_>> =
                (0..n).filter(|&r| r != me).map(|to| Out { to, data: bytes_of(data) }).collect();
            let mut ins = receive_into(blocks, me);
            self.send_recv(tag::ALLGATHER, &outs, &mut ins).await?;
            return Ok(all);
        }
        let at = offsets(counts);
        copy_slice(&mut all[at[me]..at[me] + data.len()], data);
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        for step in 0..n - 1 {
            let (send, recv) = ((me + n - step) % n, (me + n - step - 1) % n);
            let (out, inp) =
                read_write(&mut all, at[send]..at[send] + counts[send], at[recv]..at[recv] + counts[recv]);
            let mut ins = [In { from: left, out: bytes_of_mut(inp) }];
            self.send_recv(tag::ALLGATHER, &[Out { to: right, data: bytes_of(out) }], &mut ins).await?;
        }
        Ok(all)
    }

    /// The root sends every member its block, all at once.
    pub(super) async fn scatter<T: Pod>(
        &self,
        root: u32,
        data: Option<&[T]>,
        count: usize,
    ) -> Result<Vec<T>> {
        let root = self.check_root(root)?;
        let n = self.size();
        let mut mine = zeroed_buf::<T>(Some(count), "scatter block").map_err(|e| self.bad_argument(e))?;
        if self.me == root {
            let data =
                data.ok_or_else(|| self.bad_argument(Error::Misuse("scatter: the root passes the data")))?;
            if n.checked_mul(count) != Some(data.len()) {
                return Err(self.bad_argument(Error::Mismatch(format!(
                    "scatter: the root passes {} elements for {n} members of {count}",
                    data.len()
                ))));
            }
            copy_slice(&mut mine, &data[root * count..(root + 1) * count]);
            let outs: Vec<Out<'_>> = (0..n)
                .filter(|&r| r != root)
                .map(|r| Out { to: r, data: bytes_of(&data[r * count..(r + 1) * count]) })
                .collect();
            self.send_recv(tag::SCATTER, &outs, &mut []).await?;
        } else {
            let mut ins = [In { from: root, out: bytes_of_mut(&mut mine) }];
            self.send_recv(tag::SCATTER, &[], &mut ins).await?;
        }
        Ok(mine)
    }

    /// One round (all blocks at once) up to the latency limit, pairwise exchange above it
    /// (step `s`: send to `me + s`, receive from `me - s`).
    pub(super) async fn alltoallv<T: Pod>(
        &self,
        data: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Result<Vec<T>> {
        let mut all =
            zeroed_buf::<T>(sum(recv_counts), "alltoallv result").map_err(|e| self.bad_argument(e))?;
        self.alltoallv_into(data, send_counts, recv_counts, &mut all).await?;
        Ok(all)
    }

    /// As [`Core::alltoallv`], into `all` (as long as the receive counts' sum).
    pub(super) async fn alltoallv_into<T: Pod>(
        &self,
        data: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
        all: &mut [T],
    ) -> Result<()> {
        let (me, n) = (self.me, self.size());
        if send_counts.len() != n
            || recv_counts.len() != n
            || sum(send_counts) != Some(data.len())
            || sum(recv_counts) != Some(all.len())
        {
            return Err(self.bad_argument(Error::Misuse(
                "alltoallv: one count per member, the send counts summing to the data's length and the receive counts to the output's",
            )));
        }
        if send_counts[me] != recv_counts[me] {
            return Err(self.bad_argument(Error::Mismatch(format!(
                "alltoallv: team rank {me} sends itself {} elements but expects {}",
                send_counts[me], recv_counts[me]
            ))));
        }
        let biggest = send_counts.iter().chain(recv_counts).copied().max().unwrap_or(0);
        if self.small::<T>(biggest) {
            // One round. The messages' descriptors sit on the stack for teams of up to
            // INLINE_PEERS members: no allocation, which in a small alltoall would cost as
            // much as the messages.
            let mut outs_inline = [Out { to: 0, data: &[] }; INLINE_PEERS];
            let mut ins_inline: [In<'_>; INLINE_PEERS] =
                std::array::from_fn(|_| In { from: 0, out: &mut [] });
            let (mut outs_heap, mut ins_heap) = (Vec::new(), Vec::new());
            let (outs, ins): (&mut [Out<'_>], &mut [In<'_>]) = if n <= INLINE_PEERS {
                (&mut outs_inline, &mut ins_inline)
            } else {
                outs_heap.resize(n, Out { to: 0, data: &[] });
                ins_heap.resize_with(n, || In { from: 0, out: &mut [] });
                (&mut outs_heap, &mut ins_heap)
            };
            let (mut rest, mut at) = (all, 0);
            let blocks = (0..n).map(|r| {
                let (block, tail) = std::mem::take(&mut rest).split_at_mut(recv_counts[r]);
                rest = tail;
                at += send_counts[r];
                (&data[at - send_counts[r]..at], block)
            });
            let k = alltoall_messages(me, blocks, outs, ins);
            return self.send_recv(tag::ALLTOALL, &outs[..k], &mut ins[..k]).await;
        }
        // Pairwise exchange: in step s, send to me + s and receive from me - s.
        let so = offsets(send_counts);
        let blocks = carve(all, recv_counts);
        let out = |to: usize| Out { to, data: bytes_of(&data[so[to]..so[to] + send_counts[to]]) };
        let mut blocks: Vec<Option<&mut [T]>> = blocks.into_iter().map(Some).collect();
        // This member's own block is copied while the first exchange waits, a piece at a
        // time, and what is left once it is done: the peers are not kept waiting for it.
        let mine = bytes_of_mut(blocks[me].take().unwrap_or_default());
        let own = bytes_of(&data[so[me]..so[me] + send_counts[me]]);
        let mut copied = 0;
        let streaming = own.len() >= SELF_STREAMING && self.stream_own.load(Ordering::Relaxed);
        let mut self_copy = || {
            let end = (copied + SELF_PIECE).min(own.len());
            if streaming {
                copy_streaming(&mut mine[copied..end], &own[copied..end]);
            } else {
                copy_slice(&mut mine[copied..end], &own[copied..end]);
            }
            copied = end;
            copied < own.len()
        };
        for step in 1..n {
            let (to, from) = ((me + step) % n, (me + n - step) % n);
            let b = blocks[from].take().unwrap_or_default();
            let mut ins = [In { from, out: bytes_of_mut(b) }];
            let outs = [out(to)];
            let transfer = self.send_recv(tag::ALLTOALL, &outs, &mut ins);
            if step == 1 {
                WhileWaiting { fut: transfer, work: &mut self_copy, left: true }.await?;
            } else {
                transfer.await?;
            }
        }
        // What is left: all of it in a team of one, else nothing.
        while self_copy() {}
        Ok(())
    }

    /// A chain: member `i` waits for the prefix of `0..i`, combines its own data and passes it
    /// on.
    pub(super) async fn exscan<T: Pod>(&self, data: &[T], f: &impl Fn(&mut T, &T)) -> Result<Option<Vec<T>>> {
        let (me, n) = (self.me, self.size());
        let mut prefix = None;
        if me > 0 {
            let mut p = vec![T::zeroed(); data.len()];
            self.send_recv(tag::SCAN, &[], &mut [In { from: me - 1, out: bytes_of_mut(&mut p) }]).await?;
            prefix = Some(p);
        }
        if me + 1 < n {
            let mut incl = prefix.as_deref().map_or_else(|| to_vec(data), to_vec);
            if prefix.is_some() {
                combine(&mut incl, data, f);
            }
            self.send_recv(tag::SCAN, &[Out { to: me + 1, data: bytes_of(&incl) }], &mut []).await?;
        }
        Ok(prefix)
    }
}
