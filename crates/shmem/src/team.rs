//! Teams: `SHMEM_TEAM_WORLD`, `SHMEM_TEAM_SHARED`, `split_strided`, `split_2d`, queries and
//! `destroy`. A team is a strided set of world PEs (every split of a strided set is one) and
//! a slot of weft's own symmetric words for its barrier's counters.
//!
//! A new team's slot must be free on all of its members: the parent's members AND their
//! masks of free slots (a reduction over the parent), and all the teams of one split (the
//! disjoint x- or y-teams of `split_2d`) take the lowest common one. A handle is the team's
//! index + 1, so that a forged or stale handle is an error, never a pointer followed.

use crate::coll::{self, Set, SyncArea, SYNC_WORDS};
use crate::state::{die, st, Shmem};
use std::ffi::{c_int, c_long, c_void};

/// Teams a PE can be in at once (slots of barrier counters).
pub(crate) const SLOTS: usize = 64;
/// Where collect's sizes start among weft's own symmetric words (after the call word's line).
const SIZES: usize = CALL_WORD + 8;

/// The word that says which collective call this PE is in (`crate::watch`), on a cache line
/// of its own: the line after the team counters.
pub(crate) const CALL_WORD: usize = SLOTS * SYNC_WORDS;

/// Where the teams' broadcast words start (see [`root_words`]).
fn roots(n: u32) -> usize {
    SIZES + n as usize + 2
}

/// Words of weft's own symmetric memory for a job of `n` PEs: team counters, the call word
/// (a line), collect's sizes (one per PE), two words for the slot agreement, and per team
/// slot a broadcast word per member that can be root.
pub(crate) fn internal_words(n: u32) -> usize {
    roots(n) + SLOTS * n as usize
}

/// The broadcast words of the team whose sync area is `area` (made by [`sync_area`]): word r
/// counts broadcasts from member r delivered here and not yet taken.
pub(crate) fn root_words(s: &Shmem, call: &str, area: SyncArea) -> SyncArea {
    let slot = (area.local - s.internal_word(0)) / (SYNC_WORDS * 8);
    let local = s.internal_word(roots(s.n) + slot * s.n as usize);
    let global = s.sym(call, local as *const c_void, s.n as usize * 8, s.me as i32);
    SyncArea { local, global, calls: None }
}

/// One team this PE is in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Team {
    pub set: Set,
    slot: usize,
    /// `num_contexts` of the configuration it was made with (0 if none).
    contexts: c_int,
}

/// This PE's teams, by handle − 1; `None` once destroyed.
pub(crate) struct Teams {
    list: Vec<Option<Team>>,
    /// Slots this PE's teams hold.
    used: u64,
}

/// `SHMEM_TEAM_WORLD` and `SHMEM_TEAM_SHARED` in `shmem.h`.
pub(crate) const WORLD: usize = 1;
const SHARED: usize = 2;

impl Teams {
    /// World (`n` PEs) and shared teams (`shared`: the PEs whose memory `shmem_ptr` reaches,
    /// the same set on each of them; the sets of different hosts are disjoint, so all use
    /// slot 1).
    pub fn new(n: u32, shared: Set) -> Teams {
        let world = Team { set: Set { start: 0, stride: 1, size: n }, slot: 0, contexts: 0 };
        let shared = Team { set: shared, slot: 1, contexts: 0 };
        Teams { list: vec![Some(world), Some(shared)], used: 0b11 }
    }
}

/// The team of handle `h`, or the end of the job.
pub(crate) fn team(s: &Shmem, call: &str, h: *const c_void) -> Team {
    let teams = s.teams.lock().unwrap_or_else(|p| p.into_inner());
    let t = (h as usize).checked_sub(1).and_then(|i| teams.list.get(i)).copied().flatten();
    t.unwrap_or_else(|| {
        die(
            call,
            format_args!("{h:p} is not a team of this PE (SHMEM_TEAM_INVALID, destroyed, or never created)"),
        )
    })
}

/// `SHMEM_TEAM_WORLD`'s set and counters (without a look at the list of teams).
pub(crate) fn world(s: &'static Shmem, call: &str) -> (Set, SyncArea) {
    let t = Team { set: Set { start: 0, stride: 1, size: s.n }, slot: 0, contexts: 0 };
    (t.set, sync_area(s, call, t))
}

/// The counters of team `t`'s barrier.
pub(crate) fn sync_area(s: &'static Shmem, call: &str, t: Team) -> SyncArea {
    let local = s.internal_word(t.slot * SYNC_WORDS);
    let global = s.sym(call, local as *const c_void, SYNC_WORDS * 8, s.me as i32);
    SyncArea { local, global, calls: Some(&s.team_calls[t.slot]) }
}

/// Tells every member of `set` this PE's `len`, and returns all members' lengths (for
/// `collect`), over counters `area`.
pub(crate) fn sizes(s: &Shmem, call: &str, set: Set, area: SyncArea, len: usize) -> Vec<usize> {
    let slot = s.internal_word(SIZES + s.me as usize) as *const c_void;
    for i in 0..set.size {
        let g = s.sym(call, slot, 8, set.pe(i) as i32);
        s.check(call, s.comm.put(g, &(len as u64).to_le_bytes()));
    }
    coll::barrier(s, call, set, area, (crate::exchange::COLLECT, 0, len));
    (0..set.size)
        .map(|i| crate::cabi::load_local(s.internal_word(SIZES + set.pe(i) as usize), 8) as usize)
        .collect()
}

/// Creates this PE's team `mine` of a split of `parent` (collective over the parent: every
/// member calls, `None` where it joins no team); the new handle, or null.
fn split(s: &'static Shmem, call: &str, parent: Team, mine: Option<Set>, contexts: c_int) -> *mut c_void {
    let area = sync_area(s, call, parent);
    let free = !s.teams.lock().unwrap_or_else(|p| p.into_inner()).used;
    let (src, dst) = (s.internal_word(SIZES + s.n as usize), s.internal_word(SIZES + s.n as usize + 1));
    crate::cabi::dst_bytes(src as *mut c_void, 8).copy_from_slice(&free.to_le_bytes());
    coll::reduce::<u64>(call, parent.set, area, dst as *mut u64, src as *const u64, 1, coll::Op::And);
    let common = crate::cabi::load_local(dst, 8);
    let (Some(set), true) = (mine, common != 0) else {
        return std::ptr::null_mut();
    };
    let slot = common.trailing_zeros() as usize;
    let mut teams = s.teams.lock().unwrap_or_else(|p| p.into_inner());
    teams.used |= 1 << slot;
    teams.list.push(Some(Team { set, slot, contexts }));
    // The new team's members count its reductions from 0 together.
    s.team_calls[slot].store(0, std::sync::atomic::Ordering::Relaxed);
    teams.list.len() as *mut c_void
}

/// `SHMEM_TEAM_NUM_CONTEXTS` of `shmem.h`.
const NUM_CONTEXTS: c_long = 1;

/// The `num_contexts` a caller's configuration asks for (0 without one, or without the mask).
fn contexts_of(call: &str, config: *const TeamConfig, mask: c_long) -> c_int {
    if mask & NUM_CONTEXTS == 0 || config.is_null() {
        return 0;
    }
    let n = crate::cabi::read_at(config, 0).num_contexts;
    if n < 0 {
        die(call, format_args!("num_contexts {n} is negative"));
    }
    n
}

/// Writes `h` to the caller's `*out` (if given).
fn give(out: *mut *mut c_void, h: *mut c_void) {
    if !out.is_null() {
        crate::cabi::write_value(out, h);
    }
}

#[no_mangle]
pub extern "C" fn shmem_team_my_pe(team_h: *mut c_void) -> c_int {
    let s = st("shmem_team_my_pe");
    if team_h.is_null() {
        return -1;
    }
    team(s, "shmem_team_my_pe", team_h).set.index_of(s.me).map_or(-1, |i| i as c_int)
}

#[no_mangle]
pub extern "C" fn shmem_team_n_pes(team_h: *mut c_void) -> c_int {
    let s = st("shmem_team_n_pes");
    if team_h.is_null() {
        return -1;
    }
    team(s, "shmem_team_n_pes", team_h).set.size as c_int
}

/// `shmem_team_config_t`: the number of contexts a team's creator expects to make (a hint:
/// contexts take endpoints from one pool, `crate::ctx`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TeamConfig {
    pub num_contexts: c_int,
}

#[no_mangle]
pub extern "C" fn shmem_team_get_config(team_h: *mut c_void, mask: c_long, config: *mut TeamConfig) -> c_int {
    let s = st("shmem_team_get_config");
    if team_h.is_null() {
        return -1;
    }
    let t = team(s, "shmem_team_get_config", team_h);
    if !config.is_null() && mask & NUM_CONTEXTS != 0 {
        crate::cabi::write_value(config, TeamConfig { num_contexts: t.contexts });
    }
    0
}

#[no_mangle]
pub extern "C" fn shmem_team_translate_pe(
    src_team: *mut c_void,
    src_pe: c_int,
    dest_team: *mut c_void,
) -> c_int {
    let call = "shmem_team_translate_pe";
    let s = st(call);
    if src_team.is_null() || dest_team.is_null() {
        return -1;
    }
    let (a, b) = (team(s, call, src_team), team(s, call, dest_team));
    match u32::try_from(src_pe) {
        Ok(p) if p < a.set.size => b.set.index_of(a.set.pe(p)).map_or(-1, |i| i as c_int),
        _ => -1,
    }
}

#[no_mangle]
pub extern "C" fn shmem_team_split_strided(
    parent: *mut c_void,
    start: c_int,
    stride: c_int,
    size: c_int,
    config: *const TeamConfig,
    mask: c_long,
    new_team: *mut *mut c_void,
) -> c_int {
    let call = "shmem_team_split_strided";
    let s = st(call);
    give(new_team, std::ptr::null_mut());
    if parent.is_null() {
        return -1;
    }
    let p = team(s, call, parent);
    // One PE: any stride names it (OpenSHMEM 1.6 says so of 0 and negative strides).
    let stride = if size == 1 { 1 } else { stride };
    // A set that does not fit the parent (or a stride below 1, which weft's teams do not
    // take) makes no team: every PE still takes part in the split, which is collective over
    // the parent, and gets non-zero and SHMEM_TEAM_INVALID, as the specification asks.
    let fits = start >= 0
        && stride >= 1
        && size >= 1
        && (start as u64 + (size as u64 - 1) * stride as u64) < p.set.size as u64;
    let set = fits.then(|| Set {
        start: p.set.pe(start as u32),
        stride: p.set.stride * stride as u32,
        size: size as u32,
    });
    let mine = set.filter(|set| set.index_of(s.me).is_some());
    let h = split(s, call, p, mine, contexts_of(call, config, mask));
    give(new_team, h);
    if !fits || (mine.is_some() && h.is_null()) {
        return -1;
    }
    0
}

#[no_mangle]
pub extern "C" fn shmem_team_split_2d(
    parent: *mut c_void,
    xrange: c_int,
    xconfig: *const TeamConfig,
    xmask: c_long,
    xteam: *mut *mut c_void,
    yconfig: *const TeamConfig,
    ymask: c_long,
    yteam: *mut *mut c_void,
) -> c_int {
    let call = "shmem_team_split_2d";
    let s = st(call);
    give(xteam, std::ptr::null_mut());
    give(yteam, std::ptr::null_mut());
    if parent.is_null() {
        return -1;
    }
    let p = team(s, call, parent);
    if xrange < 1 {
        die(call, format_args!("xrange {xrange} is not positive"));
    }
    let Some(me) = p.set.index_of(s.me) else { return -1 };
    let x = (xrange as u32).min(p.set.size);
    let (row, col) = (me / x, me % x);
    let xs = Set { start: p.set.pe(row * x), stride: p.set.stride, size: x.min(p.set.size - row * x) };
    let ys = Set { start: p.set.pe(col), stride: p.set.stride * x, size: (p.set.size - col).div_ceil(x) };
    let (xc, yc) = (contexts_of(call, xconfig, xmask), contexts_of(call, yconfig, ymask));
    let (xh, yh) = (split(s, call, p, Some(xs), xc), split(s, call, p, Some(ys), yc));
    give(xteam, xh);
    give(yteam, yh);
    if xh.is_null() || yh.is_null() {
        return -1;
    }
    0
}

#[no_mangle]
pub extern "C" fn shmem_team_destroy(team_h: *mut c_void) {
    let call = "shmem_team_destroy";
    let s = st(call);
    let i = team_h as usize;
    if i == WORLD || i == SHARED {
        die(call, "SHMEM_TEAM_WORLD and SHMEM_TEAM_SHARED cannot be destroyed");
    }
    let t = team(s, call, team_h);
    crate::ctx::destroy_team_contexts(s, call, i);
    let mut teams = s.teams.lock().unwrap_or_else(|p| p.into_inner());
    teams.used &= !(1 << t.slot);
    teams.list[i - 1] = None;
}

#[no_mangle]
pub extern "C" fn shmem_team_sync(team_h: *mut c_void) -> c_int {
    let call = "shmem_team_sync";
    let s = st(call);
    let t = team(s, call, team_h);
    coll::sync(s, call, t.set, sync_area(s, call, t));
    0
}
