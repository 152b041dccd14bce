//! Mismatched collectives (issue 34): members that call different collectives, or the same
//! one with different roots or sizes, get `Err(Mismatch)` naming both calls instead of a hang
//! or a wrong result, and the team is unusable afterwards. Every scenario runs on a fresh
//! team; rank programs are this executable with `WEFT_MISMATCH_CASE` set.

mod common;

use common::{Case, Failure, Res};
use std::time::{Duration, Instant};
use weft::{Error, ReduceOp, Team, World};

/// How long a mismatched call may take to fail (the peer check runs every 10 ms; the bound
/// leaves room for a loaded 2-core machine).
const LIMIT: Duration = Duration::from_secs(10);

/// Runs `call`, which must fail with a mismatch (or, where `may_finish`, succeed: a member
/// that waited for nothing), within [`LIMIT`]; returns what it said.
fn expect_mismatch<R: std::fmt::Debug>(
    what: &str,
    may_finish: bool,
    call: impl FnOnce() -> weft::Result<R>,
) -> Result<String, String> {
    let t = Instant::now();
    let r = call();
    let took = t.elapsed();
    if took > LIMIT {
        return Err(format!("{what}: took {took:?}"));
    }
    match r {
        Err(Error::Mismatch(m)) => Ok(m),
        Ok(_) if may_finish => Ok(String::new()),
        other => Err(format!("{what}: {other:?}")),
    }
}

/// After a mismatch, the team is unusable: a barrier fails at once with the team's error.
fn unusable(t: &Team, what: &str) -> Res {
    let m = expect_mismatch(&format!("{what}, then a barrier"), false, || t.barrier())?;
    if !m.contains("unusable") {
        return Err(format!("{what}, then a barrier: {m}").into());
    }
    let h = t.barrier_nb().and_then(|h| h.wait());
    if !matches!(&h, Err(Error::Mismatch(m)) if m.contains("unusable")) {
        return Err(format!("{what}, then a non-blocking barrier: {h:?}").into());
    }
    Ok(())
}

/// `m` names both calls: it contains each of `words`.
fn names(m: &str, words: &[&str], what: &str) -> Res {
    match words.iter().find(|w| !m.contains(*w)) {
        Some(w) => Err(format!("{what}: {m:?} does not say {w:?}").into()),
        None => Ok(()),
    }
}

/// A barrier on rank 0 against an allreduce elsewhere, for messages in records, lines and
/// slots; the next allreduce fails too instead of returning the earlier call's operand.
fn barrier_vs_allreduce() -> Res {
    let w = World::init()?;
    let me = w.rank();
    for len in [1usize, 512, 128 << 10] {
        let t = w.world_team()?;
        let what = format!("barrier against allreduce of {len} u64");
        let m = expect_mismatch(&what, false, || {
            if me == 0 {
                t.barrier().map(|_| vec![])
            } else {
                t.allreduce(&vec![1u64; len], ReduceOp::Sum)
            }
        })?;
        names(&m, &["barrier", "allreduce", "call #1"], &what)?;
        expect_mismatch(&format!("{what}, the next allreduce"), false, || {
            t.allreduce(&[me as u64 + 1], ReduceOp::Sum)
        })?;
        unusable(&t, &what)?;
    }
    w.barrier().map_err(Failure::from)
}

/// Broadcasts and reduces whose members name different roots: both sides wait (large
/// broadcasts for their chunks to drain, reduces for data), and the check of their calls ends
/// the waits.
fn different_roots() -> Res {
    let w = World::init()?;
    let me = w.rank();
    for len in [512usize << 10, 64 << 10] {
        let t = w.world_team()?;
        let what = format!("broadcast of {len} B from different roots");
        let mut buf = vec![me as u8; len];
        // A member may finish when the root it believes in sent it everything.
        expect_mismatch(&what, true, || t.broadcast(me.min(1), &mut buf))?;
        unusable(&t, &what)?;
    }
    for len in [1usize, 8 << 10] {
        let t = w.world_team()?;
        let what = format!("reduce of {len} u64 to different roots");
        let m = expect_mismatch(&what, true, || t.reduce(me % 2, &vec![1u64; len], ReduceOp::Sum))?;
        if !m.is_empty() {
            names(&m, &["reduce with root 0", "reduce with root 1"], &what)?;
        }
        unusable(&t, &what)?;
    }
    w.barrier().map_err(Failure::from)
}

/// Small broadcasts with different roots: the roots' calls wait for nothing and may return;
/// the messages they left carry their call, so the next call fails instead of reading them.
fn small_broadcast_roots() -> Res {
    let w = World::init()?;
    let me = w.rank();
    let t = w.world_team()?;
    let mut buf = [me as u64 + 100];
    expect_mismatch("8 B broadcast from different roots", true, || t.broadcast(me.min(1), &mut buf))?;
    // The next broadcast from 0: a member that takes a message takes the right one, or fails.
    let mut next = [if me == 0 { 7u64 } else { 0 }];
    let r = t.broadcast(0, &mut next);
    if r.is_ok() && next[0] != 7 {
        return Err(format!("the next broadcast returned Ok with {} (stale data)", next[0]).into());
    }
    unusable(&t, "8 B broadcast from different roots")?;
    w.barrier().map_err(Failure::from)
}

/// With `WEFT_COLL_CHECK=strict` every member of a mismatched call fails in that call, roots
/// of small broadcasts included (blocking and not); correct calls still give their results.
fn strict() -> Res {
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let t = w.world_team()?;
    let mut buf = [me as u64 + 100];
    let what = "strict: 8 B broadcast from different roots";
    let m = expect_mismatch(what, false, || t.broadcast(me.min(1), &mut buf))?;
    names(&m, &["broadcast with root 0", "broadcast with root 1"], what)?;
    unusable(&t, what)?;
    let t = w.world_team()?;
    let what = "strict: non-blocking 8 B broadcast from different roots";
    expect_mismatch(what, false, || t.broadcast_nb(me.min(1), vec![me as u64]).and_then(|h| h.wait()))?;
    unusable(&t, what)?;
    // Agreeing calls, blocking and not, and a split, give what they should.
    let t = w.world_team()?;
    for round in 0..50u64 {
        let mut b = [if me == 1 { round } else { 0 }];
        t.broadcast(1, &mut b)?;
        let s = t.allreduce(&[round + me as u64], ReduceOp::Sum)?;
        let h = t.broadcast_nb(0, vec![if me == 0 { round + 7 } else { 0 }])?;
        t.barrier()?;
        let v = h.wait()?;
        let want = round * n as u64 + (0..n as u64).sum::<u64>();
        if b[0] != round || s[0] != want || v[0] != round + 7 {
            return Err(format!("strict, round {round}: broadcast {b:?}, allreduce {s:?}, nb {v:?}").into());
        }
    }
    let half = t.split(Some(me % 2), me)?.ok_or("strict: split gave no team")?;
    let s = half.allreduce(&[1u64], ReduceOp::Sum)?;
    if s[0] != half.size() as u64 {
        return Err(format!("strict: allreduce on a split half of {} gave {s:?}", half.size()).into());
    }
    w.barrier().map_err(Failure::from)
}

/// `split` against `subset`, against a barrier, against `alloc_segment`, and splits at
/// different places in the call sequence.
fn splits() -> Res {
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let scenarios: [(&str, &[&str]); 4] = [
        ("split against subset", &["split", "subset"]),
        ("split against barrier", &["split", "barrier"]),
        ("split against alloc_segment", &["split", "alloc_segment"]),
        ("barrier then split against split then barrier", &["split", "barrier"]),
    ];
    for (k, (what, words)) in scenarios.iter().enumerate() {
        let t = w.world_team()?;
        let m = expect_mismatch(what, false, || -> weft::Result<()> {
            match (k, me == 0) {
                (0, true) | (1, true) | (2, true) => t.split(Some(0), me).map(drop),
                (0, false) => t.subset(0, 1, n).map(drop),
                (1, false) => t.barrier(),
                (2, false) => t.alloc_segment::<u64>(8).map(drop),
                (_, true) => t.barrier().and_then(|()| t.split(Some(0), me).map(drop)),
                (_, false) => t.split(Some(0), me).map(drop).and_then(|()| t.barrier()),
            }
        })?;
        names(&m, words, what)?;
        unusable(&t, what)?;
    }
    w.barrier().map_err(Failure::from)
}

/// Non-blocking forms: an allreduce against a barrier; both handles fail, and the queue
/// behind them too.
fn nonblocking() -> Res {
    let w = World::init()?;
    let me = w.rank();
    let t = w.world_team()?;
    let h = if me == 0 {
        t.allreduce_nb(vec![1u64; 4], ReduceOp::Sum)?.wait().map(drop)
    } else {
        t.barrier_nb()?.wait()
    };
    if !matches!(h, Err(Error::Mismatch(_))) {
        return Err(format!("allreduce_nb against barrier_nb: {h:?}").into());
    }
    unusable(&t, "allreduce_nb against barrier_nb")?;
    w.barrier().map_err(Failure::from)
}

/// Members that pass the same bad arguments all fail alone and keep the team; a member that
/// passes bad ones where the others do not makes it unusable for all of them.
fn bad_arguments() -> Res {
    let w = World::init()?;
    let me = w.rank();
    let t = w.world_team()?;
    let n = t.size() as usize;
    let r = t.gatherv(0, &[1u64; 3], &vec![2; n]);
    if !matches!(r, Err(Error::Mismatch(_))) {
        return Err(format!("gatherv whose counts disagree with every member's data: {r:?}").into());
    }
    let sum = t.allreduce(&[1u64], ReduceOp::Sum)?;
    if sum[0] != n as u64 {
        return Err(format!("the team after a shared bad call: {sum:?}").into());
    }
    // Counts whose sum overflows, or that ask for more memory than there is, passed alike by
    // every member: an error on each (never a panic or an abort), and the team stays usable.
    let mut huge = vec![1usize; n];
    huge[n - 1] = usize::MAX;
    let mut vast = vec![1usize; n];
    vast[n - 1] = 1 << 40;
    let one = [1u64];
    let results = [
        ("gatherv, overflowing counts", t.gatherv(0, &one, &huge).map(|_| ())),
        ("allgatherv, overflowing counts", t.allgatherv(&one, &huge).map(|_| ())),
        ("alltoallv, 8 TiB to receive", t.alltoallv(&vec![1u64; n], &vec![1; n], &vast).map(|_| ())),
        ("scatter of 8 TiB blocks", t.scatter(0, None::<&[u64]>, 1 << 40).map(|_| ())),
    ];
    for (what, r) in results {
        if r.is_ok() {
            return Err(format!("{what}: Ok").into());
        }
        let sum = t.allreduce(&[1u64], ReduceOp::Sum).map_err(|e| format!("after {what}: {e}"))?;
        if sum[0] != n as u64 {
            return Err(format!("the team after {what}: {sum:?}").into());
        }
    }
    let counts = vec![2; n];
    let mine = if me == 1 { vec![1u64; 3] } else { vec![1u64; 2] };
    // Members that wait for nothing (not the root, not rank 1) may finish.
    expect_mismatch("gatherv with bad counts on rank 1 only", me > 1, || t.gatherv(0, &mine, &counts))?;
    unusable(&t, "gatherv with bad counts on rank 1 only")?;
    w.barrier().map_err(Failure::from)
}

/// The world's own collectives (barrier, and the exchanges behind `alloc_segment` and
/// `world_team`) against one another: every rank gets `Err(Mismatch)` naming both, where
/// they used to wait for ever (or until a peer left). Rank 0 calls one, the others the other.
fn world_calls() -> Res {
    let w = World::init()?;
    let first = w.rank() == 0;
    let m = expect_mismatch("barrier against alloc_segment", false, || {
        if first {
            w.barrier()
        } else {
            w.alloc_segment::<u64>(4).map(drop)
        }
    })?;
    names(&m, &["world collective call", "barrier", "alloc_segment"], "barrier against alloc_segment")?;
    // The world is then unusable, on every rank (its calls are out of step): no barrier may
    // pass unmatched.
    for _ in 0..2 {
        let m = expect_mismatch("a barrier after the mismatch", false, || w.barrier())?;
        names(&m, &["unusable"], "a barrier after the mismatch")?;
    }
    let m =
        expect_mismatch("alloc_segment after the mismatch", false, || w.alloc_segment::<u8>(8).map(drop))?;
    names(&m, &["unusable"], "alloc_segment after the mismatch")
}

/// As [`world_calls`], `world_team` against a barrier (each run is a fresh job: the world's
/// collectives are out of step after a mismatch).
fn world_team_vs_barrier() -> Res {
    let w = World::init()?;
    let m = expect_mismatch("world_team against barrier", false, || {
        if w.rank() == 0 {
            w.world_team().map(drop)
        } else {
            w.barrier()
        }
    })?;
    names(&m, &["world collective call", "barrier", "exchange"], "world_team against barrier")
}

/// `alloc_segment` against `world_team` (both exchanges underneath): the mismatch names both
/// (it used to say only that a segment descriptor was malformed).
fn segment_vs_team() -> Res {
    let w = World::init()?;
    let m = expect_mismatch("alloc_segment against world_team", false, || {
        if w.rank() == 0 {
            w.alloc_segment::<u64>(8).map(drop)
        } else {
            w.world_team().map(drop)
        }
    })?;
    names(&m, &["world collective call", "alloc_segment", "world_team"], "alloc_segment against world_team")
}

const CASES: &[Case] = &[
    Case { name: "segment_vs_team", run: segment_vs_team, ranks: &[2, 3], env: &[] },
    Case { name: "world_calls", run: world_calls, ranks: &[2, 4], env: &[] },
    Case { name: "world_team_vs_barrier", run: world_team_vs_barrier, ranks: &[2, 3], env: &[] },
    Case { name: "barrier_vs_allreduce", run: barrier_vs_allreduce, ranks: &[2, 4], env: &[] },
    Case { name: "different_roots", run: different_roots, ranks: &[2, 4], env: &[] },
    Case {
        name: "different_roots_direct_reads",
        run: different_roots,
        ranks: &[2],
        env: &[("WEFT_COLL_DIRECT_BYTES", "32768")],
    },
    Case { name: "small_broadcast_roots", run: small_broadcast_roots, ranks: &[2, 4], env: &[] },
    Case { name: "splits", run: splits, ranks: &[2, 3], env: &[] },
    Case { name: "nonblocking", run: nonblocking, ranks: &[2], env: &[] },
    Case { name: "bad_arguments", run: bad_arguments, ranks: &[2, 3], env: &[] },
    Case { name: "strict", run: strict, ranks: &[2, 4], env: &[("WEFT_COLL_CHECK", "strict")] },
];

fn main() {
    common::run_rank("WEFT_MISMATCH_CASE", CASES, &[]);
    let args = libtest_mimic::Arguments::from_args();
    libtest_mimic::run(&args, common::trials("WEFT_MISMATCH_CASE", CASES)).exit();
}
