//! The collectives' engine, on a set of PEs `start + i·stride` (an active set or a team): a
//! dissemination barrier on a symmetric array of counters (a `pSync`, or a team's own), and
//! broadcast, collect, fcollect, alltoall(s) and reductions built from puts, gets and it.
//!
//! The barrier's round k adds 1 to word k on the PE `2^k` further round the set and waits
//! until its own word k is positive, then takes 1 off it: the words count, so a signal of
//! the next call that arrives early is kept, and they are back at 0 (`SHMEM_SYNC_VALUE`)
//! once the call is over, as the specification asks of a `pSync`. The updates are CPU
//! atomics on words mapped here, weft's remote atomics elsewhere: on the hybrid fabric those
//! run on the target's CPU, so the two kinds never meet on one word through a NIC.
//!
//! A broadcast's root puts the data and returns (no barrier: the specification allows it).
//! Over a `pSync` it tells each member through a slot of [`exchange`], with the data when it
//! fits; a team's root may run calls ahead of its members, so it adds 1 to the member's word
//! for that root (`crate::team::root_words`) instead, which the member takes off. A word per
//! root: members of consecutive broadcasts with different roots must not take one root's
//! signal for another's (a member counts, in call order, the calls of each root).
//!
//! Reductions, collects and fcollects whose data fits a slot of [`exchange`] take one
//! exchange: every member's data (a collect's lengths, always) reaches every other member's
//! area, and each builds its result there. A collect where some member's data does not fit
//! then puts the data at the offsets the lengths give, and ends with a barrier, as larger
//! fcollects do. Larger reductions read every member's source (gets in member order)
//! between two barriers; from [`SCATTER_MIN`] bytes of other members' data, each member
//! reduces a share of the elements and then reads the others' shares (three barriers).
//!
//! Every PE folds the members' data in the same order, so all get the same result.

use crate::cabi;
use crate::exchange;
use crate::state::{die, st, Shmem};
use crate::watch;
use std::ffi::c_void;
use weft_runtime::{AtomicOp, GlobalPtr};

/// Words of a `pSync` the engine uses (`SHMEM_*_SYNC_SIZE` in `shmem.h` is 64).
pub(crate) const SYNC_WORDS: usize = 64;
/// Barrier rounds at most: sets of up to 2^31 PEs (a PE number is a C `int`).
const ROUNDS: usize = 31;

/// PEs `start + i·stride`, `i < size` (world PE numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Set {
    pub start: u32,
    pub stride: u32,
    pub size: u32,
}

impl Set {
    /// An active set of the deprecated routines, checked against the job.
    pub fn active(s: &Shmem, call: &str, start: i32, log_stride: i32, size: i32) -> Set {
        let ok = start >= 0 && (0..31).contains(&log_stride) && size >= 1;
        let set =
            Set { start: start as u32, stride: 1u32 << (log_stride.clamp(0, 30)), size: size.max(1) as u32 };
        let last = (set.size as u64 - 1) * set.stride as u64 + set.start as u64;
        if !ok || last >= s.n as u64 {
            die(call, format_args!("active set (PE_start {start}, logPE_stride {log_stride}, PE_size {size}) is not within the job's {} PEs", s.n));
        }
        if set.index_of(s.me).is_none() {
            die(call, format_args!("PE {} is not in the active set it calls for", s.me));
        }
        set
    }
    /// World PE of member `i`.
    pub fn pe(&self, i: u32) -> u32 {
        self.start + i * self.stride
    }
    /// Member index of world PE `pe`.
    pub fn index_of(&self, pe: u32) -> Option<u32> {
        let d = pe.checked_sub(self.start)?;
        (d.is_multiple_of(self.stride) && d / self.stride < self.size).then_some(d / self.stride)
    }
}

/// A symmetric array of counters: this PE's copy at `local`, and its global address.
#[derive(Clone, Copy)]
pub(crate) struct SyncArea {
    pub local: usize,
    pub global: GlobalPtr<u8>,
    /// A team's count of small reductions (their parity picks the slots); `None` for a
    /// `pSync`.
    pub calls: Option<&'static std::sync::atomic::AtomicU64>,
}

impl SyncArea {
    /// A caller's `pSync` of at least [`SYNC_WORDS`] longs.
    pub fn user(s: &Shmem, call: &str, psync: *const i64) -> SyncArea {
        let global = s.sym(call, psync.cast(), SYNC_WORDS * 8, s.me as i32);
        if !(psync as usize).is_multiple_of(8) {
            die(call, format_args!("pSync {psync:p} is not aligned to 8 bytes"));
        }
        SyncArea { local: psync as usize, global, calls: None }
    }
    fn word(&self, pe: u32, k: usize) -> GlobalPtr<u64> {
        self.global.on(pe).byte_add(8 * k).cast()
    }
}

/// Adds `delta` to word `k` of `area` on world PE `pe`: a CPU atomic where the word is
/// mapped here, else weft's remote atomic.
fn add_word(s: &Shmem, call: &str, area: SyncArea, pe: u32, k: usize, delta: u64) {
    let local = (area.local + 8 * k) as *const c_void;
    match s.direct(local, 8, pe as i32) {
        Some(at) => {
            cabi::atomic_u64(at).fetch_add(delta, std::sync::atomic::Ordering::SeqCst);
        }
        None => {
            s.check(call, s.comm.atomic(area.word(pe, k), AtomicOp::FetchAdd(delta)));
        }
    }
}

/// Signals word `k` of `area` on `pe`: adds 1 and wakes `pe` if it sleeps (atomics ring no
/// doorbell).
fn signal(s: &Shmem, call: &str, area: SyncArea, pe: u32, k: usize) {
    add_word(s, call, area, pe, k, 1);
    s.check(call, s.comm.notify(pe));
}

/// Waits until this PE's word `k` of `area` (of `set`) has `need` signals, which world PE
/// `from` sends, and takes them, in collective call `what`.
fn await_signal(
    s: &Shmem,
    call: &str,
    (set, area, from): (Set, SyncArea, u32),
    k: usize,
    (need, what): (u64, watch::Call),
) {
    let addr = area.local + 8 * k;
    if (cabi::load_local(addr, 8) as i64) < need as i64 {
        watch::wait(s, call, (set, area, from), what, || cabi::load_local(addr, 8) as i64 >= need as i64);
    }
    add_word(s, call, area, s.me, k, need.wrapping_neg());
}

/// `shmem_barrier`, `shmem_sync`, `shmem_team_sync`: a [`barrier`] that is a collective call
/// of its own.
pub(crate) fn sync(s: &Shmem, call: &str, set: Set, area: SyncArea) {
    barrier(s, call, set, area, (watch::SYNC, 0, 0));
}

/// Barrier of `set` on counters `area` (after completing this thread's puts), in collective
/// call `what`.
pub(crate) fn barrier(s: &Shmem, call: &str, set: Set, area: SyncArea, what: watch::Call) {
    s.check(call, s.comm.sync_nbi());
    let me = set.index_of(s.me).unwrap_or_else(|| die(call, "this PE is not in the set"));
    let mut dist = 1u32;
    let mut k = 0;
    while dist < set.size && k < ROUNDS {
        let to = set.pe(((me as u64 + dist as u64) % set.size as u64) as u32);
        let from = set.pe(((me as u64 + set.size as u64 - dist as u64) % set.size as u64) as u32);
        signal(s, call, area, to, k);
        await_signal(s, call, (set, area, from), k, (1, what));
        dist = dist.saturating_mul(2);
        k += 1;
    }
}

/// Puts `len` bytes from `src` to symmetric `dest + at` on world PE `pe`.
pub(crate) fn put_at(call: &str, dest: *const c_void, at: usize, src: *const c_void, len: usize, pe: u32) {
    let to = (dest as usize).checked_add(at).unwrap_or_else(|| die(call, "destination overflows"));
    crate::rma::put(call, crate::ctx::DEFAULT, to as *mut c_void, src, len, pe as i32);
}

/// The root of a broadcast (a member index), and whether its own `dest` gets the data too
/// (teams: yes; the deprecated routines leave it).
#[derive(Clone, Copy)]
pub(crate) struct Root {
    pub index: u32,
    pub to_itself: bool,
}

/// Broadcast of `len` bytes from the root's `source` to every member's `dest`.
pub(crate) fn broadcast(
    call: &str,
    set: Set,
    area: SyncArea,
    dest: *mut c_void,
    source: *const c_void,
    len: usize,
    root: Root,
) {
    let s = st(call);
    if root.index >= set.size {
        die(call, format_args!("root {} is not a member index (the set has {} PEs)", root.index, set.size));
    }
    s.sym(call, dest, len, s.me as i32);
    // A `pSync`'s broadcast tells its members through a slot, with the data when it fits; a
    // team's calls may run ahead of its members, so they count on a word per root.
    let slot = area.calls.is_none();
    let inline = slot && len <= exchange::broadcast_room();
    if set.pe(root.index) != s.me {
        if !slot {
            let roots = crate::team::root_words(s, call, area);
            let what = (exchange::BROADCAST, root.index as u8, len);
            let from = set.pe(root.index);
            return await_signal(s, call, (set, roots, from), root.index as usize, (1, what));
        }
        return exchange::from_root(s, call, (set, area), root.index, len, |data| {
            if let Some(d) = data {
                cabi::dst_bytes(dest, len).copy_from_slice(d);
            }
        });
    }
    s.sym(call, source, len, s.me as i32);
    if root.to_itself {
        put_at(call, dest, 0, source, len, s.me);
    }
    if slot {
        // Each member's data, then its head, so that the first members start at once.
        let data = inline.then(|| cabi::src_bytes(source, len));
        return exchange::to_members(s, call, (set, area), root.index, (len, data), |pe| {
            if !inline {
                put_at(call, dest, 0, source, len, pe);
            }
        });
    }
    let roots = crate::team::root_words(s, call, area);
    for i in (0..set.size).filter(|&i| i != root.index) {
        put_at(call, dest, 0, source, len, set.pe(i));
        signal(s, call, roots, set.pe(i), root.index as usize);
    }
}

/// Every member's `len` bytes of `source` at member-order offsets of every member's `dest`
/// (`var`: `collect`, whose members' lengths differ, each a whole number of elements of
/// this many bytes; `None`: `fcollect`, every member's `len` the same).
pub(crate) fn collect(
    call: &str,
    set: Set,
    area: SyncArea,
    dest: *mut c_void,
    source: *const c_void,
    len: usize,
    var: Option<usize>,
) {
    let s = st(call);
    let fixed = var.is_none();
    let kind = if fixed { exchange::FCOLLECT } else { exchange::COLLECT };
    let me = set.index_of(s.me).unwrap_or_else(|| die(call, "this PE is not in the set"));
    s.sym(call, source, len, s.me as i32);
    let share = exchange::share(area, set);
    let room = exchange::room(share);
    // A slot must hold a head word at least; past 32 members (16 for a team) it cannot.
    let sizes = if share < 8 || (fixed && len > room) {
        (!fixed).then(|| crate::team::sizes(s, call, set, area, len))
    } else {
        // One exchange: the lengths, and the data where every member's fits.
        let mut sizes = Vec::with_capacity(set.size as usize);
        let kind = (if fixed { exchange::FCOLLECT } else { exchange::COLLECT }, 0);
        let mine = (len <= room).then(|| cabi::src_bytes(source, len));
        let done = SCRATCH.with_borrow_mut(|(buf, _)| {
            buf.clear();
            let mut whole = true;
            exchange::all(s, call, (set, area), kind, (len, mine), |_, l, data| {
                sizes.push(l);
                match data {
                    Some(d) if whole => reserve(call, buf, d.len()).extend_from_slice(d),
                    _ => whole = false,
                }
            });
            check_lengths(call, set, &sizes, len, var);
            if whole {
                s.sym(call, dest, buf.len(), s.me as i32);
                cabi::dst_bytes(dest, buf.len()).copy_from_slice(buf);
            }
            whole
        });
        if done {
            return;
        }
        Some(sizes)
    };
    if let Some(z) = &sizes {
        check_lengths(call, set, z, len, var);
    }
    let (at, total) = match &sizes {
        Some(z) => {
            (z[..me as usize].iter().sum::<usize>(), z.iter().try_fold(0usize, |a, &b| a.checked_add(b)))
        }
        None => (
            (me as usize).checked_mul(len).unwrap_or_else(|| die(call, "size overflows")),
            len.checked_mul(set.size as usize),
        ),
    };
    let total = total.unwrap_or_else(|| die(call, "the collected size overflows"));
    s.sym(call, dest, total, s.me as i32);
    for i in 0..set.size {
        put_at(call, dest, at, source, len, set.pe(i));
    }
    barrier(s, call, set, area, (kind, 0, len));
}

/// Ends the job where a member's collected length is not this PE's (`fcollect`: `var` is
/// `None`) or not a whole number of elements (`collect`: `var` the element's bytes).
fn check_lengths(call: &str, set: Set, sizes: &[usize], len: usize, var: Option<usize>) {
    for (i, &l) in sizes.iter().enumerate() {
        let pe = set.pe(i as u32);
        match var {
            None if l != len => {
                die(call, format_args!("PE {pe} collects {l} bytes where this PE collects {len}"))
            }
            Some(e) if !l.is_multiple_of(e) => {
                die(call, format_args!("PE {pe} collects {l} bytes, not a whole number of elements"))
            }
            _ => {}
        }
    }
}

/// `buf`, with room for `more` bytes, or the end of the job.
fn reserve<'a>(call: &str, buf: &'a mut Vec<u8>, more: usize) -> &'a mut Vec<u8> {
    if buf.try_reserve(more).is_err() {
        die(call, format_args!("no memory for {more} bytes"));
    }
    buf
}

/// `buf` as `len` zero bytes (a scratch buffer kept between calls), or the end of the job.
fn zeroed(call: &str, buf: &mut Vec<u8>, len: usize) {
    buf.clear();
    reserve(call, buf, len).resize(len, 0);
}

/// Member j's block `j` of this PE's `source` lands as block `me` of member j's `dest`
/// (blocks `len` bytes).
pub(crate) fn alltoall(
    call: &str,
    set: Set,
    area: SyncArea,
    dest: *mut c_void,
    source: *const c_void,
    len: usize,
) {
    let s = st(call);
    let me = set.index_of(s.me).unwrap_or_else(|| die(call, "this PE is not in the set")) as usize;
    let blocks = len.checked_mul(set.size as usize).unwrap_or_else(|| die(call, "size overflows"));
    s.sym(call, dest, blocks, s.me as i32);
    for j in 0..set.size as usize {
        let src = (source as usize + j * len) as *const c_void;
        put_at(call, dest, me * len, src, len, set.pe(j as u32));
    }
    barrier(s, call, set, area, (watch::ALLTOALL, 0, len));
}

/// The strided all-to-all: element `k` of this PE's block for member j, at source element
/// `(j·n + k)·sst`, lands at element `(me·n + k)·dst` of member j's `dest` (elements of
/// `elem` bytes; strides of at least 1).
pub(crate) fn alltoalls(
    call: &str,
    (set, area): (Set, SyncArea),
    dest: *mut c_void,
    source: *const c_void,
    strides: (isize, isize),
    n: usize,
    elem: usize,
) {
    let s = st(call);
    // Checked as the program passed them: a negative stride is named as it was given.
    let (dst, sst) = match (usize::try_from(strides.0), usize::try_from(strides.1)) {
        (Ok(d), Ok(s)) if d > 0 && s > 0 => (d, s),
        _ => die(call, format_args!("strides {} and {} must be at least 1", strides.0, strides.1)),
    };
    let me = set.index_of(s.me).unwrap_or_else(|| die(call, "this PE is not in the set")) as usize;
    let at = |block: usize, k: usize, stride: usize| -> usize {
        block
            .checked_mul(n)
            .and_then(|b| b.checked_add(k))
            .and_then(|i| i.checked_mul(stride))
            .and_then(|i| i.checked_mul(elem))
            .unwrap_or_else(|| die(call, "an element's offset overflows"))
    };
    if n > 0 {
        // The whole extents are symmetric before anything moves.
        let last = set.size as usize - 1;
        s.sym(call, (dest as usize).saturating_add(at(last, n - 1, dst)) as *const c_void, elem, s.me as i32);
        s.sym(
            call,
            (source as usize).saturating_add(at(last, n - 1, sst)) as *const c_void,
            elem,
            s.me as i32,
        );
    }
    for j in 0..set.size as usize {
        for k in 0..n {
            let src = (source as usize + at(j, k, sst)) as *const c_void;
            put_at(call, dest, at(me, k, dst), src, elem, set.pe(j as u32));
        }
    }
    barrier(s, call, set, area, (watch::ALLTOALLS, 0, n.saturating_mul(elem)));
}

/// A reduction's element type and operation.
pub(crate) trait Reduce: Copy + Default {
    const SIZE: usize;
    /// The kind of number, an index of [`CLASSES`].
    const CLASS: u8;
    fn combine(op: Op, a: Self, b: Self) -> Self;
    fn from_b(b: &[u8]) -> Self;
    fn to_b(self, out: &mut [u8]);
}

/// `acc[i] = f(acc[i], part[i])` over elements stored as bytes.
#[inline(always)]
fn fold_with<T: Reduce>(acc: &mut [u8], part: &[u8], f: impl Fn(T, T) -> T) {
    for (a, b) in acc.chunks_exact_mut(T::SIZE).zip(part.chunks_exact(T::SIZE)) {
        f(T::from_b(a), T::from_b(b)).to_b(a);
    }
}

/// Combines `part` into `acc` with `op` (the operation fixed per loop, so that it vectorizes).
fn fold<T: Reduce>(op: Op, acc: &mut [u8], part: &[u8]) {
    match op {
        Op::And => fold_with::<T>(acc, part, |a, b| T::combine(Op::And, a, b)),
        Op::Or => fold_with::<T>(acc, part, |a, b| T::combine(Op::Or, a, b)),
        Op::Xor => fold_with::<T>(acc, part, |a, b| T::combine(Op::Xor, a, b)),
        Op::Max => fold_with::<T>(acc, part, |a, b| T::combine(Op::Max, a, b)),
        Op::Min => fold_with::<T>(acc, part, |a, b| T::combine(Op::Min, a, b)),
        Op::Sum => fold_with::<T>(acc, part, |a, b| T::combine(Op::Sum, a, b)),
        Op::Prod => fold_with::<T>(acc, part, |a, b| T::combine(Op::Prod, a, b)),
    }
}

macro_rules! bytes_of {
    () => {
        const SIZE: usize = std::mem::size_of::<Self>();
        #[inline(always)]
        fn from_b(b: &[u8]) -> Self {
            let mut a = [0u8; std::mem::size_of::<Self>()];
            a.copy_from_slice(b);
            Self::from_ne_bytes(a)
        }
        #[inline(always)]
        fn to_b(self, out: &mut [u8]) {
            out.copy_from_slice(&self.to_ne_bytes());
        }
    };
}

thread_local! {
    /// A reduction's accumulator and the part it reads, kept between calls (fresh pages
    /// for each call cost more than the reduction).
    static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The kinds of number reductions take (by [`Reduce::CLASS`]).
const CLASSES: [&str; 4] =
    ["signed integers", "unsigned integers", "floating-point numbers", "complex numbers"];
/// The operations by index (`Op as u8`).
const OPS: [&str; 7] = ["and", "or", "xor", "max", "min", "sum", "prod"];

/// What a reduction's exchange head says of it besides its length: operation, kind and size
/// of number, so that members that differ there are told so.
fn reduction_detail<T: Reduce>(op: Op) -> u8 {
    (op as u8) << 5 | T::CLASS << 3 | T::SIZE.trailing_zeros() as u8
}

/// The words for a reduction's [`reduction_detail`].
pub(crate) fn describe_reduction(detail: u8) -> String {
    let op = OPS.get((detail >> 5) as usize).unwrap_or(&"an unknown operation");
    let class = CLASSES[(detail >> 3 & 3) as usize];
    format!("{op} of {}-byte {class}", 1u32 << (detail & 7).min(31))
}

/// Reduction operations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Op {
    And,
    Or,
    Xor,
    Max,
    Min,
    Sum,
    Prod,
}

macro_rules! int_reduce {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            bytes_of!();
            const CLASS: u8 = if <$t>::MIN == 0 { 1 } else { 0 };
            #[inline(always)]
            fn combine(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::And => a & b,
                    Op::Or => a | b,
                    Op::Xor => a ^ b,
                    Op::Max => a.max(b),
                    Op::Min => a.min(b),
                    Op::Sum => a.wrapping_add(b),
                    Op::Prod => a.wrapping_mul(b),
                }
            }
        }
    )*};
}
int_reduce!(i8, i16, i32, i64, u8, u16, u32, u64, isize, usize);

macro_rules! float_reduce {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            bytes_of!();
            const CLASS: u8 = 2;
            #[inline(always)]
            fn combine(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Max => a.max(b),
                    Op::Min => a.min(b),
                    Op::Sum => a + b,
                    Op::Prod => a * b,
                    // The C routines of these types do not exist for bitwise operations.
                    Op::And | Op::Or | Op::Xor => a,
                }
            }
        }
    )*};
}
float_reduce!(f32, f64);

/// C's `float _Complex` and `double _Complex` (real part first), for sum and product.
macro_rules! complex_reduce {
    ($($c:ident $t:ty),*) => {$(
        #[derive(Clone, Copy, Default, Debug, PartialEq)]
        pub(crate) struct $c(pub $t, pub $t);
        impl Reduce for $c {
            const SIZE: usize = 2 * std::mem::size_of::<$t>();
            const CLASS: u8 = 3;
            #[inline(always)]
            fn combine(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Prod => $c(a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0),
                    // Only sum and product exist for complex types.
                    _ => $c(a.0 + b.0, a.1 + b.1),
                }
            }
            #[inline(always)]
            fn from_b(b: &[u8]) -> Self {
                let h = b.len() / 2;
                $c(<$t>::from_b(&b[..h]), <$t>::from_b(&b[h..]))
            }
            #[inline(always)]
            fn to_b(self, out: &mut [u8]) {
                let h = out.len() / 2;
                self.0.to_b(&mut out[..h]);
                self.1.to_b(&mut out[h..]);
            }
        }
    )*};
}
complex_reduce!(ComplexF f32, ComplexD f64);

/// C's `long double` (x86-64: x87 80-bit values in 16 bytes), combined on the x87 unit.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub(crate) struct LongDouble(pub [u8; 16]);

#[cfg(target_arch = "x86_64")]
impl Reduce for LongDouble {
    const SIZE: usize = 16;
    const CLASS: u8 = 2;
    #[inline(always)]
    fn combine(op: Op, a: Self, b: Self) -> Self {
        use crate::cabi::x87;
        match op {
            Op::Sum => LongDouble(x87::arith(&a.0, &b.0, false)),
            Op::Prod => LongDouble(x87::arith(&a.0, &b.0, true)),
            // As for float and double, a NaN loses to a number.
            Op::Max | Op::Min => match x87::less(&a.0, &b.0) {
                Some(a_less) => {
                    if a_less == (op == Op::Max) {
                        b
                    } else {
                        a
                    }
                }
                None if x87::less(&a.0, &a.0).is_none() => b,
                None => a,
            },
            // No bitwise routines exist for long double.
            _ => a,
        }
    }
    #[inline(always)]
    fn from_b(b: &[u8]) -> Self {
        let mut a = [0u8; 16];
        a.copy_from_slice(b);
        LongDouble(a)
    }
    #[inline(always)]
    fn to_b(self, out: &mut [u8]) {
        out.copy_from_slice(&self.0);
    }
}

/// Reduces `n` elements of every member's `source` with `op` into every member's `dest`.
pub(crate) fn reduce<T: Reduce>(
    call: &str,
    set: Set,
    area: SyncArea,
    dest: *mut T,
    source: *const T,
    n: usize,
    op: Op,
) {
    let s = st(call);
    let bytes = n.checked_mul(T::SIZE).unwrap_or_else(|| die(call, format_args!("{n} elements overflow")));
    if bytes == 0 {
        return;
    }
    let what = (exchange::REDUCE, reduction_detail::<T>(op), bytes);
    s.sym(call, dest.cast(), bytes, s.me as i32);
    s.sym(call, source.cast(), bytes, s.me as i32);
    if bytes <= exchange::room(exchange::share(area, set)) {
        return reduce_small::<T>(s, call, (set, area), (dest, source), bytes, op);
    }
    // Two members save least by splitting (a half of the data read, half the folding).
    let min = if set.size == 2 { 4 * SCATTER_MIN } else { SCATTER_MIN };
    if (bytes as u64).saturating_mul(set.size as u64 - 1) >= min && bytes / set.size as usize >= 64 {
        return reduce_scatter::<T>(s, call, set, area, (dest, source), n, op);
    }
    SCRATCH.with_borrow_mut(|(acc, part)| {
        for v in [&mut *acc, &mut *part] {
            zeroed(call, v, bytes);
        }
        // Every member's source is ready.
        barrier(s, call, set, area, what);
        for i in 0..set.size {
            let into = if i == 0 { &mut acc[..] } else { &mut part[..] };
            crate::rma::get(
                call,
                crate::ctx::DEFAULT,
                into.as_mut_ptr().cast(),
                source.cast(),
                bytes,
                set.pe(i) as i32,
            );
            if i > 0 {
                fold::<T>(op, acc, part);
            }
        }
        // Nobody reads a source any more: the destination (which may be it) can change.
        barrier(s, call, set, area, what);
        cabi::dst_bytes(dest.cast(), bytes).copy_from_slice(acc);
    });
}

/// Bytes that the other members' sources add up to from which a reduction is split into
/// shares (four times as many for two members): below it, every member reading every source
/// costs less than the third barrier (measured: see the commit that set it).
const SCATTER_MIN: u64 = 32 * 1024;

/// A large reduction: every member reduces its share of the elements (about 1/size of them,
/// contiguous) from every member's source, in member order, into its own destination, then
/// reads the other shares from their owners' destinations. A member reads about twice its
/// data and folds 1/size of it, whatever the number of members (reading every source would
/// be size times its data). A member reads only its own share of the others' sources, never
/// the share an owner writes, so the destination may be the source.
fn reduce_scatter<T: Reduce>(
    s: &Shmem,
    call: &str,
    set: Set,
    area: SyncArea,
    (dest, source): (*mut T, *const T),
    n: usize,
    op: Op,
) {
    let me = set.index_of(s.me).unwrap_or_else(|| die(call, "this PE is not in the set"));
    // Member k's share: its first byte and its length.
    let share = |k: u32| {
        let first = |k: u32| (n as u128 * k as u128 / set.size as u128) as usize * T::SIZE;
        (first(k), first(k + 1) - first(k))
    };
    let at = |base: usize, off: usize| (base + off) as *mut c_void;
    let (off, len) = share(me);
    let what = (exchange::REDUCE, reduction_detail::<T>(op), n * T::SIZE);
    // Every member's source is ready.
    barrier(s, call, set, area, what);
    SCRATCH.with_borrow_mut(|(acc, part)| {
        for v in [&mut *acc, &mut *part] {
            zeroed(call, v, len);
        }
        for i in 0..set.size {
            let (from, pe) = (at(source as usize, off), set.pe(i));
            match s.direct(from, len, pe as i32) {
                // A mapped source folds in place.
                Some(mapped) if i > 0 => fold::<T>(op, acc, cabi::src_bytes(mapped as *const c_void, len)),
                _ => {
                    let into = if i == 0 { &mut acc[..] } else { &mut part[..] };
                    crate::rma::get(
                        call,
                        crate::ctx::DEFAULT,
                        into.as_mut_ptr().cast(),
                        from,
                        len,
                        pe as i32,
                    );
                    if i > 0 {
                        fold::<T>(op, acc, part);
                    }
                }
            }
        }
        cabi::dst_bytes(at(dest as usize, off), len).copy_from_slice(acc);
    });
    // Every share is reduced.
    barrier(s, call, set, area, what);
    for k in (0..set.size).filter(|&k| k != me) {
        let (o, l) = share(k);
        let to = at(dest as usize, o);
        crate::rma::get(call, crate::ctx::DEFAULT, to, to, l, set.pe(k) as i32);
    }
    // Nobody reads this PE's share any more: its destination may change.
    barrier(s, call, set, area, what);
}

/// A reduction whose data fits a slot of [`exchange`]: one exchange, then every member folds
/// the members' data in member order.
fn reduce_small<T: Reduce>(
    s: &Shmem,
    call: &str,
    (set, area): (Set, SyncArea),
    (dest, source): (*mut T, *const T),
    bytes: usize,
    op: Op,
) {
    let mine = cabi::src_bytes(source.cast(), bytes);
    SCRATCH.with_borrow_mut(|(acc, _)| {
        zeroed(call, acc, bytes);
        exchange::all(
            s,
            call,
            (set, area),
            (exchange::REDUCE, reduction_detail::<T>(op)),
            (bytes, Some(mine)),
            |i, len, data| {
                let data = match (len == bytes, data) {
                    (true, Some(d)) => d,
                    (false, _) => die(
                        call,
                        format_args!("PE {} reduces {len} bytes where this PE reduces {bytes}", set.pe(i)),
                    ),
                    (true, None) => {
                        die(call, format_args!("PE {}'s slot says its data is not there", set.pe(i)))
                    }
                };
                match i {
                    0 => acc.copy_from_slice(data),
                    _ => fold::<T>(op, acc, data),
                }
            },
        );
        // The destination may be the source.
        cabi::dst_bytes(dest.cast(), bytes).copy_from_slice(acc);
    });
}
