//! Communication contexts: `shmem_ctx_create`, `shmem_team_create_ctx`, `shmem_ctx_destroy`,
//! `shmem_ctx_get_team`, `shmem_ctx_quiet`/`fence`, and the resolution of a context handle
//! for the `shmem_ctx_*` forms of RMA, atomics and signals.
//!
//! A context is a stream of puts and gets that its own `shmem_ctx_quiet` completes. One PE
//! creates a context alone, but weft creates endpoints collectively: so where some PE is
//! reached over a network, `shmem_init` makes a pool of `WEFT_SHMEM_CONTEXTS` endpoints
//! (default 0: a libfabric endpoint can cost tens of MB, so the program asks for them) of
//! category `WEFT_SHMEM_CTX_CATEGORY` (default `dynamic`: one transmit slot and queue each,
//! in one context), and a context takes one while any is free:
//! - `SHMEM_CTX_PRIVATE` or `SHMEM_CTX_SERIALIZED`: the endpoint is the context's alone, and
//!   its lock is taken by one thread at a time (never contended);
//! - no option (threads share the context): its threads take turns on the endpoint under the
//!   context's lock, the Shared category among them;
//! - `SHMEM_CTX_DEFAULT`, contexts made while the pool is empty, and every context where all
//!   PEs are mapped here: the world's own path.
//!
//! On every context, puts and gets to PEs mapped here are copies (complete at return), and
//! atomics take the world's path, so that they are atomic with respect to each other (a
//! slot's NIC atomics beside the target's CPU atomics would not be). A handle is a slot
//! index and a generation: a forged, stale or destroyed handle is an error, never a pointer
//! followed.

use crate::coll::Set;
use crate::state::{die, st, Shmem};
use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use weft_runtime::{Endpoint, EndpointConfig, EndpointPolicy, EndpointSet};

/// `SHMEM_CTX_SERIALIZED`, `SHMEM_CTX_PRIVATE` and `SHMEM_CTX_NOSTORE` of `shmem.h`.
const OPTIONS: c_long = 1 | 2 | 4;
/// `SHMEM_CTX_DEFAULT` of `shmem.h` (`SHMEM_CTX_INVALID` is null).
pub(crate) const DEFAULT: *mut c_void = std::ptr::without_provenance_mut(1);
/// Contexts a PE holds at once.
const MAX: usize = 256;
/// Low bits of a handle: the slot index + 2 (0 and 1 are `INVALID` and `DEFAULT`).
const INDEX_BITS: u32 = 12;
/// Endpoints of the pool unless `WEFT_SHMEM_CONTEXTS` says otherwise.
const DEFAULT_POOL: usize = 0;

/// Exports routine `shmem_NAME` and its context form `shmem_ctx_NAME` (the context handle
/// first) with one body, in which `$call` names the routine and `$ctx` is the context handle
/// (`SHMEM_CTX_DEFAULT` in the plain form).
macro_rules! with_ctx {
    ($call:ident, $ctx:ident, $name:expr, fn($($a:ident: $t:ty),*) $(-> $r:ty)? $body:block) => {
        const _: () = {
            #[export_name = concat!("shmem_", $name)]
            pub extern "C" fn plain($($a: $t),*) $(-> $r)? {
                let ($call, $ctx) = (concat!("shmem_", $name), $crate::ctx::DEFAULT);
                $body
            }
            #[export_name = concat!("shmem_ctx_", $name)]
            pub extern "C" fn with_ctx($ctx: *mut std::ffi::c_void, $($a: $t),*) $(-> $r)? {
                let $call = concat!("shmem_ctx_", $name);
                $body
            }
        };
    };
}
pub(crate) use with_ctx;

/// One context slot of this PE.
#[derive(Default)]
struct Slot {
    /// The live context's generation; 0 when the slot is free.
    gen: AtomicU64,
    /// Its team, as world PEs, and the team's handle.
    start: AtomicU32,
    stride: AtomicU32,
    size: AtomicU32,
    team: AtomicUsize,
    /// Whether `ep` holds an endpoint (read without the lock).
    has_ep: AtomicBool,
    ep: Mutex<Option<Endpoint<'static>>>,
}

/// The pool of endpoints and the set they came from.
#[derive(Default)]
struct Pool {
    set: Option<EndpointSet<'static>>,
    free: Vec<Endpoint<'static>>,
}

/// This PE's contexts.
pub(crate) struct Contexts {
    slots: Box<[Slot]>,
    next_gen: AtomicU64,
    /// Taken to create and destroy (slot choice, the pool).
    pool: Mutex<Pool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Contexts {
    pub fn new() -> Contexts {
        Contexts {
            slots: (0..MAX).map(|_| Slot::default()).collect(),
            next_gen: AtomicU64::new(1),
            pool: Mutex::new(Pool::default()),
        }
    }
}

/// Makes the pool of endpoints where some PE is not mapped here (collective: at `shmem_init`
/// on every PE).
pub(crate) fn open_pool(s: &'static Shmem, call: &str) {
    // The variables are checked on every fabric, also where no pool is made.
    let count = match std::env::var("WEFT_SHMEM_CONTEXTS") {
        Ok(v) => v.trim().parse::<usize>().ok().filter(|n| *n <= MAX).unwrap_or_else(|| {
            die(call, format_args!("WEFT_SHMEM_CONTEXTS={v:?} is not a count of endpoints from 0 to {MAX}"))
        }),
        Err(_) => DEFAULT_POOL,
    };
    let policy = match std::env::var("WEFT_SHMEM_CTX_CATEGORY") {
        Ok(v) => EndpointPolicy::parse(v.trim()).unwrap_or_else(|| {
            let names: Vec<_> = EndpointPolicy::CATEGORIES.iter().map(|p| p.name()).collect();
            die(
                call,
                format_args!("WEFT_SHMEM_CTX_CATEGORY={v:?} is not one of {} or auto", names.join(", ")),
            )
        }),
        Err(_) => EndpointPolicy::Dynamic,
    };
    let remote = (0..s.n).any(|pe| s.direct(s.local_addr(0), 1, pe as c_int).is_none());
    if s.allreduce_max(call, &[(remote && count > 0) as u64])[0] == 0 {
        return;
    }
    // Every operation published at once: a context's puts complete without its quiet (as
    // the default context's do), its quiet only waits for them.
    let cfg = EndpointConfig::new(policy, count).postlist(1);
    let mut set = s.check(call, s.comm.endpoints(&cfg));
    let free = set.lend();
    *lock(&s.ctxs.pool) = Pool { set: Some(set), free };
}

/// Destroys every context and closes the pool (collective: at `shmem_finalize`).
pub(crate) fn close(s: &Shmem) {
    for slot in s.ctxs.slots.iter() {
        slot.gen.store(0, Ordering::Release);
        slot.has_ep.store(false, Ordering::Release);
        drop(lock(&slot.ep).take());
    }
    let mut pool = lock(&s.ctxs.pool);
    pool.free.clear();
    if let Some(set) = pool.set.take() {
        if let Err(e) = set.close() {
            eprintln!("weft shmem: PE {}: shmem_finalize: closing the contexts' endpoints: {e}", s.me);
        }
    }
}

/// A resolved context: which PEs its PE numbers name, and its slot (none: the default).
#[derive(Clone, Copy)]
pub(crate) struct Ctx {
    slot: Option<&'static Slot>,
}

impl Ctx {
    /// The world PE of `pe`: a member's number in the context's team; the end of the job when
    /// the team has no such member. (The default context's PEs are world PEs, checked later.)
    #[inline]
    pub fn pe(self, call: &str, pe: c_int) -> c_int {
        let Some(slot) = self.slot else { return pe };
        let size = slot.size.load(Ordering::Relaxed);
        match u32::try_from(pe) {
            Ok(p) if p < size => {
                let (start, stride) =
                    (slot.start.load(Ordering::Relaxed), slot.stride.load(Ordering::Relaxed));
                (start + p * stride) as c_int
            }
            _ => die(
                call,
                format_args!("PE {pe} is not in the context's team (its PEs are 0 to {})", size as i64 - 1),
            ),
        }
    }

    /// Runs `f` on the context's endpoint, if it has one (`None` then: use the world's path).
    #[inline]
    pub fn with_ep<R>(self, f: impl FnOnce(&mut Endpoint<'static>) -> R) -> Option<R> {
        let slot = self.slot.filter(|s| s.has_ep.load(Ordering::Acquire))?;
        lock(&slot.ep).as_mut().map(f)
    }

    /// Completes the context's puts: `shmem_ctx_quiet` (and `fence`, which weft's completion
    /// orders as well).
    pub fn quiet(self, s: &Shmem, call: &str) {
        let r = self.with_ep(|ep| ep.sync_nbi()).unwrap_or_else(|| s.comm.sync_nbi());
        s.check(call, r);
    }
}

/// The state, context `ctx` (a handle) and the world PE of `pe` (a member of the context's
/// team) of a routine on a context, checked; the end of the job otherwise.
#[inline]
pub(crate) fn target(call: &str, ctx: *mut c_void, pe: c_int) -> (&'static Shmem, Ctx, c_int) {
    let s = st(call);
    let c = resolve(s, call, ctx);
    (s, c, c.pe(call, pe))
}

/// The context of handle `h`, or the end of the job.
#[inline]
pub(crate) fn resolve(s: &'static Shmem, call: &str, h: *mut c_void) -> Ctx {
    if h == DEFAULT {
        return Ctx { slot: None };
    }
    let v = h as usize;
    let index = (v & ((1 << INDEX_BITS) - 1)).wrapping_sub(2);
    let gen = (v >> INDEX_BITS) as u64;
    match s.ctxs.slots.get(index) {
        Some(slot) if gen != 0 && slot.gen.load(Ordering::Acquire) == gen => Ctx { slot: Some(slot) },
        _ => die(
            call,
            format_args!(
                "{h:p} is not a context of this PE (SHMEM_CTX_INVALID, destroyed, or never created)"
            ),
        ),
    }
}

/// Creates a context on `set` (team handle `team`) with `options`; its handle, or null when
/// this PE holds [`MAX`] contexts or `options` has bits that are not options.
fn create(s: &'static Shmem, set: Set, team: usize, options: c_long) -> *mut c_void {
    if options & !OPTIONS != 0 {
        return std::ptr::null_mut();
    }
    let mut pool = lock(&s.ctxs.pool);
    let Some((index, slot)) =
        s.ctxs.slots.iter().enumerate().find(|(_, sl)| sl.gen.load(Ordering::Acquire) == 0)
    else {
        return std::ptr::null_mut();
    };
    let gen = (s.ctxs.next_gen.fetch_add(1, Ordering::Relaxed) & (u64::MAX >> INDEX_BITS)).max(1);
    slot.start.store(set.start, Ordering::Relaxed);
    slot.stride.store(set.stride, Ordering::Relaxed);
    slot.size.store(set.size, Ordering::Relaxed);
    slot.team.store(team, Ordering::Relaxed);
    let ep = pool.free.pop();
    slot.has_ep.store(ep.is_some(), Ordering::Relaxed);
    *lock(&slot.ep) = ep;
    slot.gen.store(gen, Ordering::Release);
    ((gen as usize) << INDEX_BITS | (index + 2)) as *mut c_void
}

/// Checks the caller's pointer for the new handle (a context made with nowhere to put its
/// handle could never be destroyed).
fn out_pointer(call: &str, ctx: *mut *mut c_void) {
    if ctx.is_null() {
        die(call, "the ctx pointer is NULL");
    }
}

/// Writes `h` to the caller's `*out` (if given).
fn give(out: *mut *mut c_void, h: *mut c_void) {
    if !out.is_null() {
        crate::cabi::write_value(out, h);
    }
}

#[no_mangle]
pub extern "C" fn shmem_ctx_create(options: c_long, ctx: *mut *mut c_void) -> c_int {
    let call = "shmem_ctx_create";
    let s = st(call);
    out_pointer(call, ctx);
    let h = create(s, Set { start: 0, stride: 1, size: s.n }, crate::team::WORLD, options);
    give(ctx, h);
    -(h.is_null() as c_int)
}

#[no_mangle]
pub extern "C" fn shmem_team_create_ctx(team: *mut c_void, options: c_long, ctx: *mut *mut c_void) -> c_int {
    let call = "shmem_team_create_ctx";
    let s = st(call);
    out_pointer(call, ctx);
    give(ctx, std::ptr::null_mut());
    if team.is_null() {
        return -1;
    }
    let t = crate::team::team(s, call, team);
    let h = create(s, t.set, team as usize, options);
    give(ctx, h);
    -(h.is_null() as c_int)
}

#[no_mangle]
pub extern "C" fn shmem_ctx_destroy(ctx: *mut c_void) {
    let call = "shmem_ctx_destroy";
    let s = st(call);
    if ctx.is_null() {
        return;
    }
    if ctx == DEFAULT {
        die(call, "SHMEM_CTX_DEFAULT cannot be destroyed");
    }
    destroy(s, call, resolve(s, call, ctx));
}

/// Completes context `c`'s operations (the implicit quiet), returns its endpoint to the pool
/// and frees its slot.
fn destroy(s: &Shmem, call: &str, c: Ctx) {
    c.quiet(s, call);
    let Some(slot) = c.slot else { return };
    let mut pool = lock(&s.ctxs.pool);
    slot.gen.store(0, Ordering::Release);
    slot.has_ep.store(false, Ordering::Release);
    if let Some(ep) = lock(&slot.ep).take() {
        pool.free.push(ep);
    }
}

/// Destroys the contexts made on team handle `team` (at `shmem_team_destroy`: the
/// specification destroys its shareable contexts; a private one left is an error to use, so
/// it goes too rather than outlive its team).
pub(crate) fn destroy_team_contexts(s: &'static Shmem, call: &str, team: usize) {
    for slot in s.ctxs.slots.iter() {
        if slot.gen.load(Ordering::Acquire) != 0 && slot.team.load(Ordering::Relaxed) == team {
            destroy(s, call, Ctx { slot: Some(slot) });
        }
    }
}

#[no_mangle]
pub extern "C" fn shmem_ctx_get_team(ctx: *mut c_void, team: *mut *mut c_void) -> c_int {
    let call = "shmem_ctx_get_team";
    let s = st(call);
    if team.is_null() {
        die(call, "the team pointer is NULL");
    }
    if ctx.is_null() {
        give(team, std::ptr::null_mut());
        return -1;
    }
    let h = match resolve(s, call, ctx).slot {
        None => crate::team::WORLD,
        Some(slot) => slot.team.load(Ordering::Relaxed),
    };
    give(team, h as *mut c_void);
    0
}

#[no_mangle]
pub extern "C" fn shmem_ctx_quiet(ctx: *mut c_void) {
    let call = "shmem_ctx_quiet";
    let s = st(call);
    resolve(s, call, ctx).quiet(s, call)
}

#[no_mangle]
pub extern "C" fn shmem_ctx_fence(ctx: *mut c_void) {
    let call = "shmem_ctx_fence";
    let s = st(call);
    resolve(s, call, ctx).quiet(s, call)
}
