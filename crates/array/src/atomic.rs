//! [`AtomicArray`]: integers spread over the ranks, every access atomic.

use crate::batch::{BatchHandle, Outcome, ADD, FETCH_ADD, LOAD, STORE};
use crate::layout::{Distribution, Layout};
use crate::{Arrays, Part};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use weft_agg::{Agg, Kind};
use weft_runtime::layer::Layer;
use weft_runtime::{AtomicOp, Comm, Error, ReduceOp, Result, Team};

mod sealed {
    pub trait Sealed {}
    impl Sealed for u64 {}
    impl Sealed for i64 {}
}

/// An element type of an [`AtomicArray`]: a 64-bit integer (`u64`, `i64`). Arithmetic wraps.
pub trait Element: Copy + Send + Sync + PartialOrd + std::fmt::Debug + 'static + sealed::Sealed {
    /// The element as the 64 bits the array stores.
    fn to_bits(self) -> u64;
    /// The element of 64 stored bits.
    fn from_bits(bits: u64) -> Self;
    #[doc(hidden)]
    type Number: weft_runtime::Number;
    #[doc(hidden)]
    fn number(self) -> Self::Number;
    #[doc(hidden)]
    fn of_number(n: Self::Number) -> Self;
}

impl Element for u64 {
    fn to_bits(self) -> u64 {
        self
    }
    fn from_bits(bits: u64) -> u64 {
        bits
    }
    type Number = u64;
    fn number(self) -> u64 {
        self
    }
    fn of_number(n: u64) -> u64 {
        n
    }
}

impl Element for i64 {
    fn to_bits(self) -> u64 {
        self as u64
    }
    fn from_bits(bits: u64) -> i64 {
        bits as i64
    }
    type Number = i64;
    fn number(self) -> i64 {
        self
    }
    fn of_number(n: i64) -> i64 {
        n
    }
}

/// A request that is closed when dropped unless kept.
struct Opened<'a> {
    requests: &'a crate::batch::Requests,
    id: u32,
    keep: bool,
}

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        if !self.keep {
            self.requests.close(self.id);
        }
    }
}

/// The error of an index iterator that yielded other indices (or more) than its clone, which
/// was checked: what went before it was applied.
#[cold]
fn unlike_its_clone(index: usize, position: usize, len: usize) -> Error {
    if index >= len {
        return Error::IndexOutOfRange { index, position: Some(position), len };
    }
    Error::Misuse(
        "a batch's index iterator yielded more indices than its clone did (Clone must repeat the sequence)",
    )
}

/// `len` integers spread over the ranks of a world by a [`Distribution`]; any rank reads and
/// updates any element atomically, one at a time or in aggregated batches.
///
/// Creating one is collective (every rank, same length and distribution). Operations from
/// different ranks on one element are atomic with respect to each other (relaxed: use a
/// barrier or a handle's completion to order them with other data).
///
/// ```no_run
/// # use weft_runtime as weft;
/// use weft_array::{AtomicArray, Distribution};
/// let world = weft::World::init()?;
/// let a = AtomicArray::<i64>::with_distribution(&world, 1000, Distribution::Cyclic)?;
/// a.add(7, 5)?; // one element, one remote atomic
/// let olds = a.batch_fetch_add([1, 2, 7], -1)?.wait()?; // values before, in input order
/// assert_eq!(olds.len(), 3);
/// # Ok::<(), weft::Error>(())
/// ```
pub struct AtomicArray<T: Element> {
    comm: Arc<Comm>,
    part: Arc<Part>,
    id: u32,
    team: Team,
    dist: Distribution,
    /// 0: the world's `WEFT_ARRAY_MAPPED`, else a `mapped_code`.
    mapped: std::sync::atomic::AtomicU8,
    _t: std::marker::PhantomData<T>,
}

/// How batch operations reach elements whose owner's memory this process maps (ranks of this
/// node on shared memory). Elsewhere items always travel to their owners, aggregated.
///
/// Measured here (2 and 4 ranks on 2 cores, `bench-results/2026-11-29-bale/`): gathers read
/// straight from mapped memory 4.5-7.6x faster than through messages in every run. Histogram
/// updates by direct CPU atomics were 2.4-4.8x the owners applying messages in 10 quiet runs,
/// but 0.6-0.8x in runs beside other work, and owners that apply updates themselves keep their
/// cache lines as ranks and sockets grow: the default reads directly and sends updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mapped {
    /// Loads straight from the mapped memory, updates as messages to the owners.
    #[default]
    Loads,
    /// Loads and atomics straight on the mapped memory: no message.
    Direct,
    /// Everything as aggregated messages that the owners apply.
    Messages,
}

pub(crate) const MAPPED_LOADS: u8 = 1;
pub(crate) const MAPPED_DIRECT: u8 = 2;
pub(crate) const MAPPED_MESSAGES: u8 = 3;

pub(crate) fn mapped_code(how: Mapped) -> u8 {
    match how {
        Mapped::Loads => MAPPED_LOADS,
        Mapped::Direct => MAPPED_DIRECT,
        Mapped::Messages => MAPPED_MESSAGES,
    }
}

impl<T: Element> std::fmt::Debug for AtomicArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AtomicArray {{ len: {}, {:?}, id: {} }}", self.len(), self.dist, self.id)
    }
}

impl<T: Element> Drop for AtomicArray<T> {
    fn drop(&mut self) {
        if let Ok(a) = Arrays::of(&self.comm) {
            a.remove(self.id);
        }
    }
}

impl<T: Element> AtomicArray<T> {
    /// A zeroed array of `len` elements in blocks (collective).
    pub fn new(comm: &Comm, len: usize) -> Result<Self> {
        Self::with_distribution(comm, len, Distribution::Block)
    }

    /// A zeroed array of `len` elements spread by `dist` (collective).
    pub fn with_distribution(comm: &Comm, len: usize, dist: Distribution) -> Result<Self> {
        let layout = Layout::new(len, comm.size(), dist)?;
        let arrays = Arrays::of(comm)?;
        let seg = comm.alloc_segment::<u64>(layout.local_max)?;
        let id = seg.id();
        // A segment's memory may be a dropped one's, recycled: zero this rank's part.
        let view = seg.local();
        for a in view.atomics() {
            a.store(0, Relaxed);
        }
        let part = Arc::new(Part { seg, layout });
        arrays.add(id, part.clone());
        let team = comm.world_team()?;
        // Every rank knows the array before any operation on it can arrive.
        team.barrier()?;
        Ok(AtomicArray {
            comm: comm.arc(),
            part,
            id,
            team,
            dist,
            mapped: std::sync::atomic::AtomicU8::new(0),
            _t: std::marker::PhantomData,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.part.layout.len
    }

    /// True if the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The distribution.
    pub fn distribution(&self) -> Distribution {
        self.dist
    }

    /// The rank that holds global index `i` and its offset in that rank's part.
    pub fn locate(&self, i: usize) -> Result<(u32, usize)> {
        self.check(i)
    }

    #[inline]
    fn check(&self, i: usize) -> Result<(u32, usize)> {
        if i >= self.len() {
            return Err(Error::IndexOutOfRange { index: i, position: None, len: self.len() });
        }
        Ok(self.part.layout.locate(i))
    }

    /// How many elements this rank holds.
    pub fn local_len(&self) -> usize {
        self.part.layout.local_len(self.comm.rank())
    }

    /// The global index of this rank's element at `offset`.
    pub fn global_index(&self, offset: usize) -> usize {
        self.part.layout.global(self.comm.rank(), offset)
    }

    /// This rank's elements as (global index, value), read atomically one by one.
    pub fn local_iter(&self) -> impl Iterator<Item = (usize, T)> + '_ {
        let view = self.part.seg.local();
        let me = self.comm.rank();
        (0..self.local_len()).map(move |off| {
            (self.part.layout.global(me, off), T::from_bits(view.atomics()[off].load(Relaxed)))
        })
    }

    /// One operation on element `i`: on this rank a CPU atomic, elsewhere a remote atomic.
    fn op(&self, i: usize, op: AtomicOp) -> Result<u64> {
        let (rank, off) = self.check(i)?;
        if rank == self.comm.rank() {
            return Ok(op.apply(&self.part.seg.local().atomics()[off]));
        }
        self.comm.atomic(self.part.seg.at(rank, off), op)
    }

    /// Reads element `i`.
    pub fn load(&self, i: usize) -> Result<T> {
        self.op(i, AtomicOp::Load).map(T::from_bits)
    }
    /// Writes element `i`.
    pub fn store(&self, i: usize, v: T) -> Result<()> {
        self.op(i, AtomicOp::Store(v.to_bits())).map(drop)
    }
    /// Adds `v` to element `i`.
    pub fn add(&self, i: usize, v: T) -> Result<()> {
        self.fetch_add(i, v).map(drop)
    }
    /// Adds `v` to element `i`; returns the value before.
    pub fn fetch_add(&self, i: usize, v: T) -> Result<T> {
        self.op(i, AtomicOp::FetchAdd(v.to_bits())).map(T::from_bits)
    }
    /// Replaces element `i` with `v`; returns the value before.
    pub fn swap(&self, i: usize, v: T) -> Result<T> {
        self.op(i, AtomicOp::Swap(v.to_bits())).map(T::from_bits)
    }
    /// Writes `new` to element `i` if it holds `current`; returns the value before (equal to
    /// `current` exactly when the write happened).
    pub fn compare_exchange(&self, i: usize, current: T, new: T) -> Result<T> {
        let op = AtomicOp::CompareSwap { expected: current.to_bits(), new: new.to_bits() };
        self.op(i, op).map(T::from_bits)
    }
    /// Bitwise and of element `i` with `v`; returns the value before.
    pub fn fetch_and(&self, i: usize, v: T) -> Result<T> {
        self.op(i, AtomicOp::FetchAnd(v.to_bits())).map(T::from_bits)
    }
    /// Bitwise or of element `i` with `v`; returns the value before.
    pub fn fetch_or(&self, i: usize, v: T) -> Result<T> {
        self.op(i, AtomicOp::FetchOr(v.to_bits())).map(T::from_bits)
    }
    /// Bitwise xor of element `i` with `v`; returns the value before.
    pub fn fetch_xor(&self, i: usize, v: T) -> Result<T> {
        self.op(i, AtomicOp::FetchXor(v.to_bits())).map(T::from_bits)
    }

    /// Whether batches apply items straight to owners' memory this process maps
    /// ([`AtomicArray::set_mapped`], else `WEFT_ARRAY_MAPPED`).
    fn direct(&self, update: bool) -> bool {
        let how = match self.mapped.load(Relaxed) {
            0 => Arrays::of(&self.comm).map_or(0, |a| a.mapped.load(Relaxed)),
            m => m,
        };
        match how {
            MAPPED_DIRECT => true,
            MAPPED_MESSAGES => false,
            _ => !update,
        }
    }

    /// How this array's batches treat elements whose owner's memory this process maps (shared
    /// memory), overriding `WEFT_ARRAY_MAPPED` (default [`Mapped::Loads`]).
    ///
    /// ```no_run
    /// # use weft_runtime as weft;
    /// use weft_array::{AtomicArray, Mapped};
    /// let world = weft::World::init()?;
    /// let a = AtomicArray::<u64>::new(&world, 1 << 20)?;
    /// a.set_mapped(Mapped::Messages); // owners apply every batch item themselves
    /// # Ok::<(), weft::Error>(())
    /// ```
    pub fn set_mapped(&self, how: Mapped) {
        self.mapped.store(mapped_code(how), Relaxed);
    }

    /// Checks every index (the iterator is walked twice: `Clone`).
    fn check_all<I: Iterator<Item = usize>>(&self, it: I) -> Result<usize> {
        let len = self.len();
        let mut n = 0usize;
        for (position, i) in it.enumerate() {
            if i >= len {
                return Err(Error::IndexOutOfRange { index: i, position: Some(position), len });
            }
            n = position + 1;
        }
        if n > u32::MAX as usize {
            return Err(Error::TooLarge { what: "batch (indices)", len: n, max: u32::MAX as usize });
        }
        Ok(n)
    }

    /// Runs a batch. Where this process maps an owner's memory and `direct` says the CPU's
    /// own instruction beats a message (see the callers), `op` applies the item there at once;
    /// every other item goes to its owner through the aggregation buffers (this rank's own
    /// ones too, applied when its buffer fills or the batch ends: no branch on locality).
    #[allow(clippy::too_many_arguments)]
    fn run<R: Outcome, I>(
        &self,
        indices: I,
        kind: &'static Kind,
        prefix: Option<u64>,
        positioned: bool,
        direct: bool,
        op: impl Fn(&AtomicU64) -> u64,
    ) -> Result<BatchHandle<R>>
    where
        I: IntoIterator<Item = usize>,
        I::IntoIter: Clone,
    {
        let it = indices.into_iter();
        let n = self.check_all(it.clone())?;
        let comm = &*self.comm;
        // A finalized world (or a child of fork) refuses batches here, whatever their path.
        comm.poll()?;
        if n == 0 {
            return Ok(BatchHandle::new(self.comm.clone(), None, None));
        }
        let size = comm.size();
        let mapped: Vec<Option<&[AtomicU64]>> = if direct {
            (0..size).map(|r| comm.mapped_words(&self.part.seg, r)).collect()
        } else {
            vec![None; size as usize]
        };
        let layout = self.part.layout;
        if mapped.iter().all(Option::is_some) {
            // Every owner's memory is here: no message at all.
            let mut results = if positioned { vec![0u64; n] } else { Vec::new() };
            for (pos, i) in it.enumerate() {
                // The checked walk's clone must have yielded the same indices.
                if i >= layout.len || pos >= n {
                    return Err(unlike_its_clone(i, pos, layout.len));
                }
                let (rank, off) = layout.locate(i);
                let v = op(&mapped[rank as usize].unwrap_or(&[])[off]);
                if positioned {
                    results[pos] = v;
                }
            }
            return Ok(BatchHandle::new(self.comm.clone(), None, Some(results)));
        }
        let agg = Agg::get(comm)?;
        let requests = &Arrays::of(comm)?.requests;
        let mut sent = vec![0u64; size as usize];
        let id = requests.open(size, if positioned { n } else { 0 });
        // Closed on every way out but success (an error, a panic in the user's iterator).
        let mut opened = Opened { requests, id, keep: false };
        let key = (self.id as u64) << 32 | id as u64;
        let kind_id = kind.id();
        let pre = prefix.map(u64::to_le_bytes);
        let pre: &[u8] = pre.as_ref().map_or(&[], |p| p);
        let mut here = if positioned && direct { vec![0u64; n] } else { Vec::new() };
        let r = agg.batch(comm, |b| {
            for (pos, i) in it.enumerate() {
                if i >= layout.len || pos >= n {
                    return Err(unlike_its_clone(i, pos, layout.len));
                }
                let (rank, off) = layout.locate(i);
                if let Some(words) = mapped[rank as usize] {
                    let v = op(&words[off]);
                    if positioned {
                        here[pos] = v;
                    }
                    continue;
                }
                sent[rank as usize] += 1;
                if positioned {
                    let mut item = [0u8; 12];
                    item[..4].copy_from_slice(&(pos as u32).to_le_bytes());
                    item[4..].copy_from_slice(&(off as u64).to_le_bytes());
                    b.item_after(rank, kind_id, key, pre, &item)?;
                } else {
                    b.item_after(rank, kind_id, key, pre, &(off as u64).to_le_bytes())?;
                }
            }
            // This rank's own items now (they need no wait to leave).
            b.send_own()
        });
        r?;
        opened.keep = true;
        requests.seal(id, &sent);
        Ok(BatchHandle::new(self.comm.clone(), Some(id), (!here.is_empty()).then_some(here)))
    }

    /// Adds `v` to the element at each index (an index may repeat: each occurrence adds).
    /// Every index is checked first, on a clone of the iterator (which must yield the same
    /// indices again); nothing is applied if one is out of range. The handle completes once
    /// all were applied.
    pub fn batch_add<I>(&self, indices: I, v: T) -> Result<BatchHandle<()>>
    where
        I: IntoIterator<Item = usize>,
        I::IntoIter: Clone,
    {
        let bits = v.to_bits();
        self.run(indices, &ADD, Some(bits), false, self.direct(true), |a| a.fetch_add(bits, Relaxed))
    }

    /// Writes `v` to the element at each index (a scatter of one value).
    pub fn batch_store<I>(&self, indices: I, v: T) -> Result<BatchHandle<()>>
    where
        I: IntoIterator<Item = usize>,
        I::IntoIter: Clone,
    {
        let bits = v.to_bits();
        self.run(indices, &STORE, Some(bits), false, self.direct(true), |a| {
            a.store(bits, Relaxed);
            0
        })
    }

    /// Adds `v` to the element at each index; the handle gives the values before, in input
    /// order.
    pub fn batch_fetch_add<I>(&self, indices: I, v: T) -> Result<BatchHandle<Vec<T>>>
    where
        I: IntoIterator<Item = usize>,
        I::IntoIter: Clone,
    {
        let bits = v.to_bits();
        self.run(indices, &FETCH_ADD, Some(bits), true, self.direct(true), |a| a.fetch_add(bits, Relaxed))
    }

    /// Reads the element at each index (an index gather); the handle gives the values in
    /// input order.
    pub fn batch_load<I>(&self, indices: I) -> Result<BatchHandle<Vec<T>>>
    where
        I: IntoIterator<Item = usize>,
        I::IntoIter: Clone,
    {
        self.run(indices, &LOAD, None, true, self.direct(false), |a| a.load(Relaxed))
    }

    /// Collective: sets every element to `v` (each rank its part), then a barrier.
    pub fn fill(&self, v: T) -> Result<()> {
        let view = self.part.seg.local();
        for a in &view.atomics()[..self.local_len()] {
            a.store(v.to_bits(), Relaxed);
        }
        self.team.barrier()
    }

    fn reduce(&self, op: ReduceOp, start: T, f: impl Fn(T, T) -> T) -> Result<T> {
        let mine = self.local_iter().fold(start, |acc, (_, v)| f(acc, v));
        let all = self.team.allreduce(&[mine.number()], op)?;
        Ok(T::of_number(all[0]))
    }

    /// Collective: the sum of every element (wrapping).
    pub fn sum(&self) -> Result<T> {
        self.reduce(ReduceOp::Sum, T::from_bits(0), |a, b| {
            T::from_bits(a.to_bits().wrapping_add(b.to_bits()))
        })
    }

    /// Collective: the smallest element (`None` for an empty array).
    pub fn min(&self) -> Result<Option<T>> {
        if self.is_empty() {
            return Ok(None);
        }
        let first = self.load_any()?;
        self.reduce(ReduceOp::Min, first, |a, b| if b < a { b } else { a }).map(Some)
    }

    /// Collective: the largest element (`None` for an empty array).
    pub fn max(&self) -> Result<Option<T>> {
        if self.is_empty() {
            return Ok(None);
        }
        let first = self.load_any()?;
        self.reduce(ReduceOp::Max, first, |a, b| if b > a { b } else { a }).map(Some)
    }

    /// An element every rank can start a min or max from: element 0.
    fn load_any(&self) -> Result<T> {
        self.load(0)
    }

    /// The whole array in global order, read by this rank alone (one get per rank's part).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let layout = self.part.layout;
        let mut out = vec![T::from_bits(0); self.len()];
        let mut buf = vec![0u64; layout.local_max];
        for r in 0..self.comm.size() {
            let n = layout.local_len(r);
            if n == 0 {
                continue;
            }
            self.comm.get(self.part.seg.at(r, 0), &mut buf[..n])?;
            for (off, &v) in buf[..n].iter().enumerate() {
                out[layout.global(r, off)] = T::from_bits(v);
            }
        }
        Ok(out)
    }
}
