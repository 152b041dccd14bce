//! Scalable endpoints through the launcher: every sharing category with several threads per
//! rank on 2 and 4 ranks (puts, puts from registered memory, atomics and all AM kinds, each
//! checked exactly), sets created and closed many times, the fabric's limits, bad input, and
//! the AM-based RMA path. Each rank is this test executable with `WEFT_EP_CASE` naming it.

mod common;

use common::{ck, Case, Failure, Res};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use weft::{AtomicOp, CqSharing, EndpointConfig, EndpointPolicy, Error, World};

const THREADS: usize = 3;
const ROUNDS: u64 = 200;
/// Bytes of each (rank, thread)'s block for large puts and gets.
const LARGE: usize = 200 << 10;

/// What each receiving rank counts: AMs, the sum of their first argument, medium bytes.
#[derive(Default)]
struct Tally {
    ams: AtomicU64,
    sum: AtomicU64,
    bytes: AtomicU64,
}

fn value(rank: u32, thread: usize, k: u64) -> u64 {
    (rank as u64) << 40 | (thread as u64) << 20 | k
}

/// Every category (and Auto) with 3 threads per rank, odd postlist and signal intervals.
fn categories() -> Res {
    let tally = Arc::new(Tally::default());
    let mut b = World::builder();
    let t = tally.clone();
    let count = b.handler("ep.count", move |m| {
        t.ams.fetch_add(1, Ordering::AcqRel);
        t.sum.fetch_add(m.args().first().copied().unwrap_or(0), Ordering::AcqRel);
        t.bytes.fetch_add(m.payload().len() as u64, Ordering::AcqRel);
    });
    let w = b.init()?;
    let (me, n) = (w.rank(), w.size());
    let slots = n as usize * THREADS; // one line per (source rank, thread)
    let seg = w.alloc_segment::<u64>(slots * 8 + 8)?;
    let big = w.alloc_segment::<u8>(slots * 128)?;
    let landing = w.alloc_segment::<u8>(4096)?;
    let large = w.alloc_segment::<u8>(slots * LARGE)?;
    let counter = seg.at(0, slots * 8);
    let mut expected_ams = 0;
    let policies = EndpointPolicy::CATEGORIES.into_iter().chain([EndpointPolicy::Auto]);
    for (round, policy) in policies.enumerate() {
        let cq = if round % 2 == 0 { CqSharing::PerThread } else { CqSharing::PerPair };
        let cfg = EndpointConfig::new(policy, THREADS).postlist(5).signal_every(7).static_slots(2).cq(cq);
        let sums_before = tally.sum.load(Ordering::Acquire);
        let off_before = w.stats().off_slot;
        let mut set = w.endpoints(&cfg)?;
        let res = set.resources().clone();
        ck(res.layout.threads == THREADS && res.layout.queues >= 1, || format!("{policy:?}: {res}"))?;
        // Every fabric has transmit slots of its own: nothing may fall back to the default
        // path. A slot on libfabric is an endpoint; on the hybrid it is rings to this host's
        // ranks and an endpoint to the others.
        let fabric = w.info().fabric;
        ck(res.fallback.is_none() && res.slot_kind.is_some(), || format!("{fabric}: {res}"))?;
        let kind = res.slot_kind.clone().unwrap_or_default();
        let wanted: &[&str] = match fabric {
            "ofi" => &["libfabric endpoint"],
            "ofi+shm" => &["ring to each rank", "libfabric endpoint"],
            _ => &[],
        };
        ck(wanted.iter().all(|w| kind.contains(w)), || format!("a slot on {fabric} is {kind:?}"))?;
        // A provider with scalable endpoints (sockets: 16 transmit contexts) carries a
        // context's several slots on its transmit contexts.
        let sep = fabric == "ofi" && std::env::var("WEFT_OFI_PROVIDER").is_ok_and(|p| p == "sockets");
        if sep && res.layout.slots() > res.layout.contexts {
            ck(kind.contains("transmit contexts of its context's scalable endpoint"), || {
                format!(
                    "{policy:?}: {} slots in {} contexts are {kind:?}",
                    res.layout.slots(),
                    res.layout.contexts
                )
            })?;
        }
        let eps = set.endpoints();
        ck(eps.len() == THREADS, || format!("{} endpoints", eps.len()))?;
        let posted: Vec<Result<(usize, u64, u64), Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = eps
                .into_iter()
                .map(|mut ep| {
                    let (seg, big, landing, large) = (&seg, &big, &landing, &large);
                    let long_ams = !w.info().rma_over_am;
                    s.spawn(move || -> Result<(usize, u64, u64), Error> {
                        let i = ep.index();
                        let line = me as usize * THREADS + i;
                        let mut ops = 0;
                        for k in 0..ROUNDS {
                            if k == ROUNDS - 1 {
                                // Posted puts are unordered until a flush: this one must land
                                // last (the AM path over libfabric once let round 197 win).
                                ep.sync_nbi()?;
                            }
                            for d in 0..n {
                                ep.put_nbi(seg.at(d, line * 8), &[value(me, i, k)])?;
                                ep.am_request_short(d, count, &[1])?;
                                ops += 2;
                            }
                            ep.atomic_nbi(counter, AtomicOp::FetchAdd(1))?;
                            ops += 1;
                        }
                        // Above the inline threshold: written before the call returns.
                        let bytes: Vec<u8> = (0..100).map(|j| (line + j) as u8).collect();
                        ep.put_nbi(big.at(me, line * 128), &bytes)?;
                        ep.sync_nbi()?; // the source of the put_from below must be complete
                        for d in 0..n {
                            ep.put_nbi(big.at(d, line * 128), &bytes)?;
                            // From registered memory (referenced, read at publish).
                            ep.put_from_nbi(big.at(d, line * 128 + 100), big.at(me, line * 128), 20)?;
                            ep.am_request_medium(d, count, &[0], &[9; 16])?; // inline
                            ep.am_request_medium(d, count, &[0], &[9; 300])?; // from the caller
                            if long_ams {
                                ep.am_request_long(landing.at(d, line * 8), count, &[0], &[5; 8])?;
                            } else {
                                ep.am_request_medium(d, count, &[0], &[5; 8])?;
                            }
                            ops += 5;
                        }
                        let before = ep.atomic(counter, AtomicOp::Load)?;
                        ops += 1;
                        ep.sync_nbi()?;
                        // Gets, and large puts (the first part staged, the rest, above 128 KiB,
                        // sent in place), read back.
                        let blob: Vec<u8> = (0..LARGE).map(|j| (line * 7 + j / 3) as u8).collect();
                        for d in 0..n {
                            let mut word = [0u64];
                            ep.get(seg.at(d, line * 8), &mut word)?;
                            if word[0] != value(me, i, ROUNDS - 1) {
                                return Err(Error::Misuse("an endpoint get read the wrong line"));
                            }
                            ep.put_nbi(large.at(d, line * LARGE), &blob[..40 << 10])?;
                            ep.put_nbi(large.at(d, line * LARGE + (40 << 10)), &blob[40 << 10..])?;
                            ops += 3;
                        }
                        ep.sync_nbi()?;
                        for d in 0..n {
                            let mut back = vec![0u8; LARGE];
                            ep.get(large.at(d, line * LARGE), &mut back)?;
                            if back != blob {
                                return Err(Error::Misuse(
                                    "an endpoint's large put or get moved the wrong bytes",
                                ));
                            }
                            ops += 1;
                        }
                        Ok((i, ops, before))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let posted: Vec<(usize, u64, u64)> = posted.into_iter().collect::<Result<_, _>>()?;
        set.close()?;
        // Where slots carry RMA (libfabric), every operation left through its endpoint's slot.
        let off = w.stats().off_slot - off_before;
        ck(!fabric.starts_with("ofi") || off == 0, || {
            format!("{policy:?}: {off} operations off their slot")
        })?;
        // Everything of every rank has landed and every AM to this rank has run.
        expected_ams += (n as u64) * THREADS as u64 * (ROUNDS + 3);
        let ams = tally.ams.load(Ordering::Acquire);
        ck(ams == expected_ams, || format!("{policy:?}: {ams} AMs handled, expected {expected_ams}"))?;
        let sums = tally.sum.load(Ordering::Acquire) - sums_before;
        ck(sums == n as u64 * THREADS as u64 * ROUNDS, || format!("{policy:?}: argument sum {sums}"))?;
        for r in 0..n {
            for i in 0..THREADS {
                let line = r as usize * THREADS + i;
                let got = seg.local().read(line * 8);
                ck(got == value(r, i, ROUNDS - 1), || {
                    format!("{policy:?}: line of rank {r} thread {i} holds {got:#x}")
                })?;
                for j in 0..120 {
                    let want = if j < 100 { (line + j) as u8 } else { (line + j - 100) as u8 };
                    let b = big.local().read(line * 128 + j);
                    ck(b == want, || format!("{policy:?}: byte {j} of rank {r} thread {i}: {b}"))?;
                }
            }
        }
        for (i, ops, _) in &posted {
            ck(*ops > 0, || format!("thread {i} posted nothing"))?;
        }
        w.barrier()?;
        if me == 0 {
            let total = seg.local().read(slots * 8);
            let want = (round as u64 + 1) * n as u64 * THREADS as u64 * ROUNDS;
            ck(total == want, || format!("{policy:?}: counter {total}, expected {want}"))?;
        }
        w.barrier()?;
    }
    let bytes = tally.bytes.load(Ordering::Acquire);
    let want = 7 * n as u64 * THREADS as u64 * (16 + 300 + 8);
    ck(bytes == want, || format!("{bytes} payload bytes, expected {want}"))
}

/// Completion counting: a private counter sees exactly its own operations after flush; a
/// shared one (the Shared category) sees every sharer's.
fn completions() -> Res {
    let w = World::init()?;
    let seg = w.alloc_segment::<u64>(64)?;
    for (policy, shared) in [(EndpointPolicy::Dynamic, false), (EndpointPolicy::Shared, true)] {
        let cfg = EndpointConfig::new(policy, 2).postlist(4).signal_every(10);
        let mut set = w.endpoints(&cfg)?;
        let mut eps = set.endpoints();
        let ops = [23u64, 41];
        for (ep, &k) in eps.iter_mut().zip(&ops) {
            for j in 0..k {
                ep.put_nbi(seg.at(0, j as usize % 64), &[j])?;
            }
        }
        // Unflushed, a counter lags by less than one signal interval (plus what is queued).
        for (ep, &k) in eps.iter().zip(&ops) {
            let c = ep.completed();
            ck(shared || (c <= k && k - c < 10 + 4), || format!("{policy:?}: {c} of {k} before flush"))?;
        }
        for ep in eps.iter_mut() {
            ep.sync_nbi()?;
        }
        for (ep, &k) in eps.iter().zip(&ops) {
            let want = if shared { ops.iter().sum() } else { k };
            ck(ep.completed() == want, || {
                format!("{policy:?}: {} completions, expected {want}", ep.completed())
            })?;
        }
        drop(eps);
        set.close()?;
    }
    // A batch whose last operation leaves the slot (an atomic takes the world's path): the
    // flush must complete its puts, not the slot's next use (which never comes before the
    // check below: the set is still open).
    let (me, n) = (w.rank(), w.size());
    let mut set = w.endpoints(&EndpointConfig::new(EndpointPolicy::Dynamic, 1).postlist(8))?;
    let mut eps = set.endpoints();
    for k in 0..3u64 {
        eps[0].put_nbi(seg.at((me + 1) % n, 60), &[1000 * k + me as u64])?;
        eps[0].atomic_nbi(seg.at((me + 1) % n, 61), AtomicOp::FetchAdd(1))?;
        eps[0].sync_nbi()?;
        w.barrier()?;
        let (got, want) = (seg.local().read(60), 1000 * k + ((me + n - 1) % n) as u64);
        ck(got == want, || format!("round {k}: a put before an atomic holds {got}, expected {want}"))?;
        w.barrier()?;
    }
    drop(eps);
    set.close().map_err(Failure::from)
}

/// Sets are released when closed: far more contexts over time than the fabric holds at once.
fn repeated_sets() -> Res {
    let w = World::init()?;
    let seg = w.alloc_segment::<u64>(8)?;
    let held = |what: &str| -> u64 {
        w.info().resources.iter().filter(|r| r.kind.starts_with(what)).map(|r| r.count).sum()
    };
    let (regions, mapped) = (held("registered regions"), held("peer regions"));
    for k in 0..150u64 {
        let mut set = w.endpoints(&EndpointConfig::new(EndpointPolicy::Dedicated, 2).ring_kib(4))?;
        for mut ep in set.endpoints() {
            ep.put_nbi(seg.at((w.rank() + 1) % w.size(), ep.index()), &[k])?;
        }
        set.close()?;
    }
    let rings = held("endpoint slot rings in");
    ck(rings == 0, || format!("{rings} endpoint rings still held after closing every set"))?;
    let auto = w.endpoints(&EndpointConfig::new(EndpointPolicy::Auto, 2))?;
    ck(auto.resources().measured.len() == 6, || "auto measured no categories".into())?;
    auto.close()?;
    let now = (held("registered regions"), held("peer regions"));
    ck(now == (regions, mapped), || format!("regions held went from {:?} to {now:?}", (regions, mapped)))?;
    ck(seg.local().read(0) == 149 && seg.local().read(1) == 149, || "last puts missing".into())
}

/// More contexts than the fabric provides is a clear error on every rank, which keeps working.
fn limits_and_bad_input() -> Res {
    let mut b = World::builder();
    let h = b.handler("ep.nothing", |_| {});
    let w = b.init()?;
    let seg = w.alloc_segment::<u64>(8)?;
    let too_many = w.endpoints(&EndpointConfig::new(EndpointPolicy::Dedicated, 300).ring_kib(4));
    let msg = too_many.err().map(|e| e.to_string()).unwrap_or_default();
    ck(msg.contains("at most 256"), || format!("300 dedicated contexts: {msg:?}"))?;
    for bad in [
        EndpointConfig::new(EndpointPolicy::Dynamic, 0),
        EndpointConfig::new(EndpointPolicy::Dynamic, 1).inline_max(1000),
        EndpointConfig::new(EndpointPolicy::Dynamic, 1).postlist(0),
        EndpointConfig::new(EndpointPolicy::Auto, 1).tolerance(2.0),
    ] {
        ck(matches!(w.endpoints(&bad), Err(Error::Config(_))), || format!("accepted {bad:?}"))?;
    }
    let mut set = w.endpoints(&EndpointConfig::new(EndpointPolicy::SharedDynamic, 2))?;
    let mut eps = set.endpoints();
    let ep = &mut eps[0];
    let peer = (w.rank() + 1) % w.size();
    ck(matches!(ep.put_nbi(seg.at(peer, 8), &[1u64]), Err(Error::OutOfBounds { .. })), || {
        "put past the end".into()
    })?;
    ck(matches!(ep.put_from_nbi(seg.at(peer, 0), seg.at(peer, 1), 1), Err(Error::Misuse(_))), || {
        "put_from a peer".into()
    })?;
    ck(matches!(ep.am_request_short(w.size(), h, &[]), Err(Error::NoSuchRank { .. })), || {
        "AM to no rank".into()
    })?;
    ck(matches!(ep.am_request_short(peer, h, &[0; 17]), Err(Error::TooLarge { .. })), || {
        "17 AM args".into()
    })?;
    ep.put_nbi(seg.at(peer, 0), &[7u64])?;
    drop(eps);
    set.close()?;
    ck(seg.local().read(0) == 7, || "the world stopped working".into())
}

weft::remote! {
    fn add_on_endpoint(a: u64, b: u64) -> u64 {
        a + b
    }
}

weft::remote! {
    fn checksum_on_endpoint(v: Vec<u8>) -> u64 {
        v.iter().map(|&x| x as u64).sum()
    }
}

/// Remote functions through endpoints: small calls (eager) and a 200 KB argument
/// (rendezvous, pulled from the caller's memory) from every thread, in every category.
fn rpc_on_endpoints() -> Res {
    use weft::EndpointRpcExt;
    let w = World::init()?;
    let peer = (w.rank() + 1) % w.size();
    for policy in EndpointPolicy::CATEGORIES {
        let mut set = w.endpoints(&EndpointConfig::new(policy, THREADS))?;
        let eps = set.endpoints();
        let results: Vec<Res> = std::thread::scope(|s| {
            let handles: Vec<_> = eps
                .into_iter()
                .map(|mut ep| {
                    s.spawn(move || -> Res {
                        let i = ep.index() as u64;
                        for k in 0..50u64 {
                            let got = weft::block_on(ep.call(peer, add_on_endpoint, (i, k)))?;
                            ck(got == i + k, || format!("{policy:?}: {i} + {k} = {got}"))?;
                        }
                        let big: Vec<u8> = (0..200_000u32).map(|x| (x % 251) as u8).collect();
                        let want: u64 = big.iter().map(|&x| x as u64).sum();
                        let got = weft::block_on(ep.call(peer, checksum_on_endpoint, (big,)))?;
                        ck(got == want, || format!("{policy:?}: checksum {got}, expected {want}"))?;
                        ep.post(peer, add_on_endpoint, (1, 2))?.wait()?;
                        // Every call and the post went through this endpoint (its completion
                        // counter saw them), not the world's default path.
                        let done = ep.completed();
                        ck(done >= 52, || format!("{policy:?}: the endpoint completed {done} operations"))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        results.into_iter().collect::<Res>()?;
        set.close()?;
    }
    Ok(())
}

const CASES: &[Case] = &[
    Case { name: "categories", run: categories, ranks: &[2, 4], env: &[] },
    Case { name: "categories_am_path", run: categories, ranks: &[2], env: &[("WEFT_RMA", "am")] },
    Case { name: "completions", run: completions, ranks: &[2], env: &[] },
    Case { name: "repeated_sets", run: repeated_sets, ranks: &[2], env: &[] },
    Case { name: "limits_and_bad_input", run: limits_and_bad_input, ranks: &[2], env: &[] },
    Case { name: "rpc_on_endpoints", run: rpc_on_endpoints, ranks: &[2, 4], env: &[] },
];

/// The endpoint applications check their own results: dgemm against direct dot products,
/// stencil against the serial grid's checksum (8 strips over 1, 2 and 4 ranks).
fn applications() -> Result<(), libtest_mimic::Failed> {
    for (suite, ranks, env, rows) in [
        ("dgemm", "2", [("WEFT_DGEMM_N", "128"), ("WEFT_MSGRATE_THREADS", "1,3")], 12),
        ("stencil", "4", [("WEFT_STENCIL_N", "64"), ("WEFT_STENCIL_P", "8")], 18),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["bench", suite, "-n", ranks, "--json"])
            .envs(env)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let got = text.lines().filter(|l| l.contains(&format!("\"suite\":\"{suite}\""))).count();
        if !out.status.success() || got != rows {
            return Err(format!("bench {suite}: {got} rows, expected {rows}\n{}", common::text(&out)).into());
        }
    }
    Ok(())
}

fn main() {
    common::run_rank("WEFT_EP_CASE", CASES, &[]);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = common::trials("WEFT_EP_CASE", CASES);
    trials.push(libtest_mimic::Trial::test("applications_check_their_results", applications));
    libtest_mimic::run(&args, trials).exit();
}
