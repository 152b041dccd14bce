//! Multi-process tests: every trial starts real ranks through the launcher (`weft run -n N`),
//! each rank being this same executable with `WEFT_TEST_CASE` naming the case to run.

mod common;

use common::{ck, e2s, Case, Res};

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft::{AmHandler, AtomicOp, Error, World};

fn pattern(seed: u64, i: usize) -> u8 {
    (seed.wrapping_mul(31).wrapping_add(i as u64 * 7 + (i as u64 >> 8))) as u8
}

// ---------------------------------------------------------------- rank programs

/// Put/get of every size 0 B .. 8 MiB at unaligned offsets, to the next rank and to self.
fn put_get_sizes() -> Res {
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let max = 8 << 20;
    let seg = w.alloc_segment::<u8>(max + 64).map_err(e2s)?;
    let mut sizes: Vec<usize> =
        vec![0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 1000, 4095, 4096, 4097, 65535, 65537];
    sizes.extend((17..=23).map(|p| 1usize << p));
    for (k, &size) in sizes.iter().enumerate() {
        for &off in &[0usize, 1, 3, 7] {
            if size > (1 << 20) && off % 2 == 0 && off != 0 {
                continue;
            }
            let seed = (k * 8 + off) as u64 + me as u64 * 1000;
            let src: Vec<u8> = (0..size).map(|i| pattern(seed, i)).collect();
            let to = (me + 1) % n;
            w.put(seg.at(to, off), &src).map_err(e2s)?;
            w.barrier().map_err(e2s)?;
            // Check what the previous rank wrote into us, then read it back remotely too.
            let from = (me + n - 1) % n;
            let theirs = (k * 8 + off) as u64 + from as u64 * 1000;
            let mut local = vec![0u8; size];
            seg.local().copy_out(off, &mut local);
            ck(local.iter().enumerate().all(|(i, &b)| b == pattern(theirs, i)), || {
                format!("put of {size} B at offset {off}: wrong data")
            })?;
            let mut back = vec![0u8; size];
            w.get(seg.at(to, off), &mut back).map_err(e2s)?;
            ck(back == src, || format!("get of {size} B at offset {off} from rank {to}: wrong data"))?;
            w.barrier().map_err(e2s)?;
            // To self.
            w.put(seg.at(me, off), &src).map_err(e2s)?;
            let mut own = vec![0u8; size];
            w.get(seg.at(me, off), &mut own).map_err(e2s)?;
            ck(own == src, || format!("self put/get of {size} B at offset {off}"))?;
            w.barrier().map_err(e2s)?;
        }
    }
    Ok(())
}

/// Non-blocking and implicit completion: the data must be at the target when the handle or
/// sync says so. The target learns that by reading a flag in the *initiator's* memory, a path
/// independent of the data's, so an early return of sync would show up as missing data.
fn completion_semantics() -> Res {
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let len = 1 << 20;
    let data = w.alloc_segment::<u64>(len).map_err(e2s)?;
    let flag = w.alloc_segment::<u64>(1).map_err(e2s)?;
    for round in 1..=3u64 {
        let to = (me + 1) % n;
        let src: Vec<u64> = (0..len as u64).map(|i| i * 3 + round + me as u64).collect();
        match round {
            1 => {
                for chunk in 0..4 {
                    let part = &src[chunk * len / 4..(chunk + 1) * len / 4];
                    w.put_nbi(data.at(to, chunk * len / 4), part).map_err(e2s)?;
                }
                w.sync_nbi().map_err(e2s)?;
            }
            2 => {
                let mut h = w.put_nb(data.at(to, 0), &src).map_err(e2s)?;
                while !h.test().map_err(e2s)? {}
            }
            _ => weft::block_on(w.put_nb(data.at(to, 0), &src).map_err(e2s)?).map_err(e2s)?,
        }
        flag.local().atomic(0).store(round, Ordering::Release);
        // Wait for the previous rank's flag, read remotely, then check our data.
        let from = (me + n - 1) % n;
        let mut f = [0u64];
        let t = Instant::now();
        loop {
            w.get(flag.at(from, 0), &mut f).map_err(e2s)?;
            if f[0] >= round {
                break;
            }
            ck(t.elapsed() < Duration::from_secs(30), || "flag never set".into())?;
        }
        let local = data.local();
        let bad = (0..len).find(|&i| local.read(i) != i as u64 * 3 + round + from as u64);
        ck(bad.is_none(), || {
            format!("round {round}: data at index {bad:?} missing after the initiator completed")
        })?;
        w.barrier().map_err(e2s)?;
    }
    // NBI gets inside a scope.
    let mut a = vec![0u64; 1000];
    let mut b = vec![0u64; 1000];
    let to = (me + 1) % n;
    w.nbi(|s| {
        s.get(data.at(to, 0), &mut a)?;
        s.get(data.at(to, 5000), &mut b)
    })
    .map_err(e2s)?;
    ck(a.iter().enumerate().all(|(i, &v)| v == i as u64 * 3 + 3 + me as u64), || "nbi get a".into())?;
    ck(b.iter().enumerate().all(|(i, &v)| v == (i + 5000) as u64 * 3 + 3 + me as u64), || {
        "nbi get b".into()
    })?;
    w.barrier().map_err(e2s)
}

/// Every rank adds 1 100 000 times to a counter on rank 0 (blocking, NB and NBI mixed), then
/// checks the exact total; also compare-exchange and swap.
/// Put with signal: each rank streams messages of growing size (0 to 100 000 words) to the next
/// rank, each announced by its number in a flag in the data's own segment or in another one;
/// the receiver checks every word once its flag shows the number. The data must be there when
/// the flag is, or the check fails. Then the misuses.
fn put_signal() -> Res {
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    const MAX: usize = 100_000;
    let data = w.alloc_segment::<u64>(MAX + 1).map_err(e2s)?;
    let other = w.alloc_segment::<u64>(2).map_err(e2s)?;
    let fill = |k: u64, len: usize| -> Vec<u64> { (0..len as u64).map(|j| k << 32 | j).collect() };
    for k in 1..=60u64 {
        let len = (k as usize * k as usize * 29) % MAX;
        // Odd messages signal in the data segment's last word, even ones in another segment.
        let flag = if k % 2 == 1 { data.at(next, MAX) } else { other.at(next, 0) };
        w.put_signal(data.at(next, 0), &fill(k, len), flag, k).map_err(e2s)?;
        let arrived = || match k % 2 {
            1 => data.local().atomic(MAX).load(Ordering::Acquire) == k,
            _ => other.local().atomic(0).load(Ordering::Acquire) == k,
        };
        w.wait_until(arrived).map_err(e2s)?;
        let mut got = vec![0u64; len];
        data.local().copy_out(0, &mut got);
        ck(got == fill(k, len), || format!("message {k} of {len} words from rank {prev} differs"))?;
        // Nobody writes the next message before everyone has read this one.
        w.barrier().map_err(e2s)?;
    }
    let e = w.put_signal(data.at(next, 0), &[1u64], other.at(me, 0), 1);
    ck(n == 1 || matches!(e, Err(Error::Misuse(_))), || format!("signal on another rank: {e:?}"))?;
    let e = w.put_signal(data.at(next, 0), &[1u64], other.at(next, 2), 1);
    ck(matches!(e, Err(Error::OutOfBounds { .. })), || format!("signal past the end: {e:?}"))?;
    let e = w.put_signal(data.at(next, MAX), &[0u64; 2], other.at(next, 0), 1);
    ck(matches!(e, Err(Error::OutOfBounds { .. })), || format!("data past the end: {e:?}"))?;
    let e = w.put_signal(data.at(next, 0), &[1u64], data.at(next, 0).byte_add(3), 1);
    ck(matches!(e, Err(Error::Misaligned { .. })), || format!("misaligned signal: {e:?}"))?;
    w.barrier().map_err(e2s)
}

fn atomics() -> Res {
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let seg = w.alloc_segment::<u64>(4).map_err(e2s)?;
    let per_rank: u64 = if std::env::var("WEFT_RMA").as_deref() == Ok("am") { 20_000 } else { 100_000 };
    let counter = seg.at(0, 0);
    for i in 0..per_rank {
        match i % 3 {
            0 => drop(w.fetch_add(counter, 1).map_err(e2s)?),
            1 => drop(w.atomic_nb(counter, AtomicOp::FetchAdd(1)).map_err(e2s)?.wait().map_err(e2s)?),
            _ => w.atomic_nbi(counter, AtomicOp::FetchAdd(1)).map_err(e2s)?,
        }
    }
    w.sync_nbi().map_err(e2s)?;
    // A spin lock built from compare-exchange protects a non-atomic increment of word 2.
    for _ in 0..200 {
        while w.compare_exchange(seg.at(0, 1), 0, me as u64 + 1).map_err(e2s)? != 0 {}
        let mut v = [0u64];
        w.get(seg.at(0, 2), &mut v).map_err(e2s)?;
        w.put(seg.at(0, 2), &[v[0] + 1]).map_err(e2s)?;
        ck(w.swap(seg.at(0, 1), 0).map_err(e2s)? == me as u64 + 1, || "lock stolen".into())?;
    }
    w.barrier().map_err(e2s)?;
    let total = w.atomic_load(counter).map_err(e2s)?;
    ck(total == per_rank * n as u64, || {
        format!("fetch-add total {total}, expected {}", per_rank * n as u64)
    })?;
    let locked = w.atomic_load(seg.at(0, 2)).map_err(e2s)?;
    ck(locked == 200 * n as u64, || format!("lock-protected total {locked}, expected {}", 200 * n as u64))?;
    w.barrier().map_err(e2s)
}

struct AmProbe {
    short: AmHandler,
    medium: AmHandler,
    long: AmHandler,
    replies: Arc<AtomicU64>,
    checksum: Arc<AtomicU64>,
}

fn am_world(b: &mut weft::Builder) -> AmProbe {
    let replies = Arc::new(AtomicU64::new(0));
    let checksum = Arc::new(AtomicU64::new(0));
    let (r, c) = (replies.clone(), checksum.clone());
    let reply = b.handler("test.reply", move |m| {
        let sum: u64 = m.args().iter().sum::<u64>() + m.payload().iter().map(|&x| x as u64).sum::<u64>();
        c.fetch_add(sum, Ordering::AcqRel);
        r.fetch_add(1, Ordering::AcqRel);
    });
    // Each request handler answers with the same kind it received, echoing what it got.
    let short = b.handler("test.short", move |m| m.reply_short(reply, m.args()).expect("short reply"));
    let medium = b
        .handler("test.medium", move |m| m.reply_medium(reply, m.args(), m.payload()).expect("medium reply"));
    let long = b.handler("test.long", move |m| {
        m.reply_long(long_reply_target(m.src()), reply, m.args(), m.payload()).expect("long reply")
    });
    AmProbe { short, medium, long, replies, checksum }
}

/// Where long replies land: segment 0, offset 0 of the requester (set once allocated).
static LONG_SEG: std::sync::OnceLock<weft::GlobalPtr<u64>> = std::sync::OnceLock::new();

fn long_reply_target(rank: u32) -> weft::GlobalPtr<u8> {
    LONG_SEG.get().expect("segment set").on(rank).cast()
}

/// Short, medium and long requests and replies, with payload checks; limits and misuse.
fn am_kinds() -> Res {
    let mut b = World::builder();
    let p = am_world(&mut b);
    let inner = Arc::new(std::sync::Mutex::new(None::<Error>));
    let inner2 = inner.clone();
    let nested = b.handler("test.nested", move |m| {
        // Requests from inside a handler are refused; so is a second reply.
        let e = m.comm().am_request_short(m.src(), m_short(), &[]).err();
        *inner2.lock().unwrap() = e;
    });
    let w = b.init().map_err(e2s)?;
    SHORT.set(p.short).ok();
    let seg = w.alloc_segment::<u64>(1 << 17).map_err(e2s)?;
    LONG_SEG.set(seg.at(0, 0)).ok();
    w.barrier().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let to = (me + 1) % n;
    let mut expect = 0u64;
    let mut sent = 0u64;
    for k in 0..200u64 {
        let args: Vec<u64> = (0..(k % 17)).map(|i| i + k).collect();
        let len = [0usize, 1, 100, 4096, 60_000][k as usize % 5];
        let payload: Vec<u8> = (0..len).map(|i| pattern(k, i)).collect();
        let s: u64 = args.iter().sum::<u64>() + payload.iter().map(|&x| x as u64).sum::<u64>();
        w.am_request_short(to, p.short, &args).map_err(e2s)?;
        expect += args.iter().sum::<u64>();
        w.am_request_medium(to, p.medium, &args, &payload).map_err(e2s)?;
        expect += s;
        w.am_request_long(seg.at(to, 1 << 16).cast(), p.long, &args, &payload).map_err(e2s)?;
        expect += s;
        sent += 3;
        // Long replies land at offset 0 of our segment; wait for each round so they do not overlap.
        w.wait_until(|| p.replies.load(Ordering::Acquire) == sent).map_err(e2s)?;
    }
    ck(p.checksum.load(Ordering::Acquire) == expect, || "reply payloads differ from the requests".into())?;
    // Limits.
    let max = w.caps().am_max_medium;
    let too_big = vec![0u8; max + 1];
    ck(matches!(w.am_request_medium(to, p.medium, &[], &too_big), Err(Error::TooLarge { .. })), || {
        "oversized medium accepted".into()
    })?;
    ck(matches!(w.am_request_short(to, p.short, &[0; 17]), Err(Error::TooLarge { .. })), || {
        "17 args accepted".into()
    })?;
    ck(matches!(w.am_request_short(n + 3, p.short, &[]), Err(Error::NoSuchRank { .. })), || {
        "bad rank accepted".into()
    })?;
    w.am_request_short(to, nested, &[]).map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    let e = inner.lock().unwrap().clone();
    ck(matches!(e, Some(Error::Misuse(_))), || format!("request inside a handler: {e:?}"))?;
    w.barrier().map_err(e2s)
}

static SHORT: std::sync::OnceLock<AmHandler> = std::sync::OnceLock::new();
fn m_short() -> AmHandler {
    *SHORT.get().expect("set")
}

/// Every rank floods every other with medium requests (each answered) for a while.
fn am_flood() -> Res {
    let mut b = World::builder();
    let p = am_world(&mut b);
    let w = b.init().map_err(e2s)?;
    let seg = w.alloc_segment::<u64>(16).map_err(e2s)?;
    LONG_SEG.set(seg.at(0, 0)).ok();
    w.barrier().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let payload = vec![1u8; 2000];
    let t = Instant::now();
    let mut sent = 0u64;
    while t.elapsed() < Duration::from_secs(2) {
        for to in (0..n).filter(|&r| r != me) {
            for _ in 0..100 {
                w.am_request_medium(to, p.medium, &[sent], &payload).map_err(e2s)?;
                sent += 1;
            }
        }
    }
    w.wait_until(|| p.replies.load(Ordering::Acquire) == sent).map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    ck(sent > 1000, || format!("only {sent} messages in 2 s"))
}

/// Errors instead of stray accesses; ranks that disagree get an error, not a hang.
fn bad_input() -> Res {
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let seg = w.alloc_segment::<u64>(100).map_err(e2s)?;
    let oob = w.put(seg.at(0, 99), &[1, 2]);
    ck(matches!(oob, Err(Error::OutOfBounds { .. })), || format!("put past the end: {oob:?}"))?;
    let oob = w.get(seg.at(1, 100), &mut [0u64]);
    ck(matches!(oob, Err(Error::OutOfBounds { .. })), || format!("get past the end: {oob:?}"))?;
    let huge = w.put(seg.at(0, usize::MAX / 8), &[1]);
    ck(matches!(huge, Err(Error::OutOfBounds { .. })), || format!("wrapping offset: {huge:?}"))?;
    let mis = w.fetch_add(seg.at(0, 1).byte_add(3), 1);
    ck(matches!(mis, Err(Error::Misaligned { .. })), || format!("misaligned atomic: {mis:?}"))?;
    let rank = w.put(seg.at(n, 0), &[1]);
    ck(matches!(rank, Err(Error::NoSuchRank { .. })), || format!("bad rank: {rank:?}"))?;
    let big = w.alloc_segment::<u64>(usize::MAX / 4);
    ck(matches!(big, Err(Error::TooLarge { .. })), || format!("overflowing allocation: {big:?}"))?;
    let mismatch = w.alloc_segment::<u64>(10 + me as usize);
    ck(matches!(mismatch, Err(Error::Mismatch(_))), || format!("size mismatch: {mismatch:?}"))?;
    // Still usable afterwards.
    let ok = w.alloc_segment::<u64>(10).map_err(e2s)?;
    w.put(ok.at((me + 1) % n, 9), &[7]).map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    ck(ok.local().read(9) == 7, || "world unusable after errors".into())
}

/// Ranks register different handlers: start-up fails with a clear error everywhere.
fn handler_mismatch() -> Res {
    let mut b = World::builder();
    b.handler("a", |_| {});
    // The rank before init: from `weft run` or from mpirun's PMIx.
    let rank = std::env::var("WEFT_RANK").or_else(|_| std::env::var("PMIX_RANK"));
    if rank.as_deref() == Ok("1") {
        b.handler("b", |_| {});
    }
    match b.init() {
        Err(Error::Mismatch(m)) if m.contains("handler") => Ok(()),
        Err(e) => Err(format!("unexpected error: {e}")),
        Ok(_) => Err("mismatched handler tables accepted".into()),
    }
}

/// CPU time (user + system) this process has used so far, from `/proc/self/stat`.
fn cpu_time() -> Result<Duration, String> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| e.to_string())?;
    // Fields after the command name (which may hold spaces) end with ")"; utime and stime are
    // the 14th and 15th fields, in clock ticks.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or("no ) in /proc/self/stat")?;
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(2).filter_map(|x| x.parse().ok()).collect();
    // Linux reports these in USER_HZ, which is 100 on every architecture it runs on.
    let ticks = f.iter().sum::<u64>();
    Ok(Duration::from_millis(ticks * 10))
}

/// While rank 0 works for 2 s without communicating, the others wait in a barrier: they must
/// sleep, not hold a core (a spinning waiter would take the core its peers need, the lesson of
/// runtimes whose idle ranks busy-poll).
fn idle_waits_sleep() -> Res {
    let w = World::init().map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    if w.rank() == 0 {
        std::thread::sleep(Duration::from_secs(2));
        return w.barrier().map_err(e2s);
    }
    let (t0, c0) = (Instant::now(), cpu_time()?);
    w.barrier().map_err(e2s)?;
    let (wall, cpu) = (t0.elapsed(), cpu_time()? - c0);
    ck(wall >= Duration::from_millis(1500), || format!("the barrier ended after {wall:?}"))?;
    ck(cpu < wall / 5, || format!("waiting {wall:?} in a barrier used {cpu:?} of CPU"))
}

/// Rank 1 leaves right after start-up; the others must fail their barrier, not hang.
fn early_exit() -> Res {
    let w = World::init().map_err(e2s)?;
    if w.rank() == 1 {
        return Ok(());
    }
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let r = w.barrier();
    ck(matches!(&r, Err(Error::PeerFailed { .. })), || format!("barrier with a departed rank: {r:?}"))?;
    ck(t.elapsed() < Duration::from_secs(3), || format!("detection took {:?}", t.elapsed()))
}

/// Rank 1 vanishes without finalizing (as with a lost node; its exit status 0 does not make the
/// launcher stop the job): the others' barrier fails within a few seconds, on any host.
fn vanished_rank() -> Res {
    let w = World::init().map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    if w.rank() == 1 {
        // Ends the process without running destructors: the World is never finalized.
        std::process::exit(0);
    }
    let t = Instant::now();
    let r = w.barrier();
    ck(matches!(&r, Err(Error::PeerFailed { .. })), || format!("barrier with a vanished rank: {r:?}"))?;
    ck(t.elapsed() < Duration::from_secs(5), || format!("detection took {:?}", t.elapsed()))
}

/// A wake-up (`notify`) sent to a rank that has already finalized and exited returns at once:
/// the peer reads nothing more. Over libfabric it was retried until the operation timeout
/// (60 s per peer), which is how a rank preempted between a collective's last put and its
/// wake-up hung after the others had left.
fn notify_after_the_peer_left() -> Res {
    let w = World::init().map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    if w.rank() == 0 {
        return Ok(()); // finalizes and exits
    }
    // Time for rank 0 to finalize and exit (if it has not, the wake-ups below simply reach it).
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    for _ in 0..3 {
        w.notify(0).map_err(e2s)?;
    }
    ck(t.elapsed() < Duration::from_secs(10), || {
        format!("3 wake-ups to a rank that left took {:?}", t.elapsed())
    })
}

/// Rank 1 is killed with SIGKILL while the others wait on it (checked by the driver).
fn killed_rank() -> Res {
    let w = World::init().map_err(e2s)?;
    let _seg = w.alloc_segment::<u8>(1 << 20).map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    if w.rank() == 1 {
        // The kill's time on the host's monotonic clock, for the harness to measure from.
        println!("KILLING-MYSELF at {}", weft::fabric::os::now_ns());
        weft::fabric::os::kill(std::process::id(), 9);
    }
    let _ = w.barrier();
    std::thread::sleep(Duration::from_secs(30));
    Ok(())
}

/// A rank that computes without polling still serves AMs and RMA through its progress thread;
/// several threads of each rank communicate at once.
fn threads_and_progress() -> Res {
    let mut b = World::builder();
    let p = am_world(&mut b);
    let w = b.progress_thread(true).init().map_err(e2s)?;
    let seg = w.alloc_segment::<u64>(1024).map_err(e2s)?;
    LONG_SEG.set(seg.at(0, 0)).ok();
    let (me, n) = (w.rank(), w.size());
    let counter = w.alloc_segment::<u64>(1).map_err(e2s)?;
    let threads = 3u64;
    std::thread::scope(|s| -> Res {
        let mut hs = vec![];
        for t in 0..threads {
            let (w, seg, counter, p) = (&w, &seg, &counter, &p);
            hs.push(s.spawn(move || -> Res {
                for i in 0..2000u64 {
                    let to = ((me as u64 + 1 + i) % n as u64) as u32;
                    w.fetch_add(counter.at(0, 0), 1).map_err(e2s)?;
                    w.put(seg.at(to, (me as usize * threads as usize + t as usize) % 1024), &[i])
                        .map_err(e2s)?;
                    w.am_request_short(to, p.short, &[1]).map_err(e2s)?;
                }
                Ok(())
            }));
        }
        hs.into_iter().try_for_each(|h| h.join().map_err(|_| "thread panicked".to_string())?)
    })?;
    let want = threads * 2000;
    w.wait_until(|| p.replies.load(Ordering::Acquire) == want).map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    // Rank 0 now computes without any weft call; the others' requests are served by its
    // progress thread.
    if me == 0 {
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(500) {
            std::hint::black_box(t.elapsed());
        }
    } else {
        for _ in 0..500 {
            let before = p.replies.load(Ordering::Acquire);
            w.am_request_short(0, p.short, &[1]).map_err(e2s)?;
            w.wait_until(|| p.replies.load(Ordering::Acquire) > before).map_err(e2s)?;
        }
    }
    w.barrier().map_err(e2s)?;
    let total = w.atomic_load(counter.at(0, 0)).map_err(e2s)?;
    // Rank 0's memory must outlive the others' reads (it goes with rank 0 on a network).
    w.barrier().map_err(e2s)?;
    ck(total == threads * 2000 * n as u64, || format!("counter {total}"))
}

// ---------------------------------------------------------------- rpc

weft::remote! {
    fn rpc_add(a: u64, b: u64) -> u64 { a + b }
}
weft::remote! {
    fn rpc_greet(name: String) -> String { format!("hello {name} from {}", weft::rpc::world_rank()) }
}
weft::remote! {
    fn rpc_sum(v: weft::SerializeBuffer<f64>) -> (u64, f64) { (v.len() as u64, v.iter().sum()) }
}
weft::remote! {
    /// Doubles every element in place and sends the vector back (an RmaVec both ways).
    fn rpc_double(v: weft::RmaVec<u64>) -> weft::RmaVec<u64> {
        let mut v = v;
        v.iter_mut().for_each(|x| *x *= 2);
        v
    }
}
weft::remote! {
    /// A plain function with a small argument and a result of any size: it runs in the
    /// call's handler, and a result with chunks goes back as a message of its own.
    fn rpc_make(len: u64) -> Vec<u8> { (0..len).map(|i| (i % 251) as u8).collect() }
}
weft::remote! {
    fn rpc_panics(x: u64) -> u64 { if x > 0 { panic!("asked to panic with {x}") } else { x } }
}
weft::remote! {
    async fn rpc_bump(by: u64) { POSTED.fetch_add(by, Ordering::SeqCst); }
}
static POSTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn rpc_calls() -> Res {
    use weft::RpcExt;
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let peer = (me + 1) % n;
    // Eager: small arguments and results, to a peer and to self.
    for dst in [peer, me] {
        let r = w.call(dst, rpc_add, (me as u64, 40)).wait().map_err(e2s)?;
        ck(r == me as u64 + 40, || format!("add gave {r}"))?;
    }
    let g = weft::block_on(w.call(peer, rpc_greet, (format!("rank {me}"),))).map_err(e2s)?;
    ck(g == format!("hello rank {me} from {peer}"), || g.clone())?;
    // Rendezvous: large buffers pulled from the caller's memory, every size around the threshold.
    for len in [0usize, 1, 511, 512, 513, 4096, 100_000, 1 << 20] {
        let data: Vec<f64> = (0..len).map(|i| (i % 7) as f64).collect();
        let want: f64 = data.iter().sum();
        let buf = weft::SerializeBuffer::from(data);
        let (sent, res) = w.call_with(peer, rpc_sum, (buf.clone(),), None);
        sent.wait().map_err(e2s)?;
        ck(buf.is_unique(), || {
            format!("len {len}: the runtime still holds the buffer after the sent signal")
        })?;
        let (got_len, sum) = res.wait().map_err(e2s)?;
        ck(got_len == len as u64 && sum == want, || {
            format!("len {len}: got {got_len} elements summing to {sum}, want {want}")
        })?;
    }
    // Results of every size around the threshold and the medium limit from a function run in
    // the handler.
    for len in [0u64, 100, 4095, 4096, 70_000, 1 << 20] {
        let v = w.call(peer, rpc_make, (len,)).wait().map_err(e2s)?;
        ck(v.len() as u64 == len && v.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8), || {
            format!("made {len} bytes, got {} (or wrong bytes)", v.len())
        })?;
    }
    // RmaVec both ways, through the pools.
    let mut v = weft::RmaVec::<u64>::with_capacity(&w, 10).map_err(e2s)?;
    for i in 0..300_000u64 {
        v.push(i).map_err(e2s)?;
    }
    let back = w.call(peer, rpc_double, (v,)).wait().map_err(e2s)?;
    ck(back.len() == 300_000 && back.iter().enumerate().all(|(i, &x)| x == 2 * i as u64), || {
        "doubled vector differs".into()
    })?;
    // A panic comes back as an error; the target keeps serving.
    let e = w.call(peer, rpc_panics, (7,)).wait();
    ck(matches!(&e, Err(weft::Error::Remote(m)) if m.contains("asked to panic with 7")), || {
        format!("{e:?}")
    })?;
    ck(w.call(peer, rpc_panics, (0,)).wait().map_err(e2s)? == 0, || "no answer after a panic".into())?;
    // Posts: fire-and-forget, counted on the target.
    for _ in 0..100 {
        w.post(peer, rpc_bump, (1,)).map_err(e2s)?;
    }
    w.wait_until(|| POSTED.load(Ordering::SeqCst) >= 100).map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    ck(POSTED.load(Ordering::SeqCst) == 100, || format!("{} posts arrived", POSTED.load(Ordering::SeqCst)))
}

weft::remote! {
    /// Plain vectors of numbers both ways (blocks in the archive; chunks from the threshold).
    fn rpc_scale(v: Vec<f64>, w: Vec<i32>, b: Vec<u8>) -> (Vec<f64>, Vec<i32>, Vec<u8>) {
        (v.iter().map(|x| x * 2.0).collect(), w.into_iter().rev().collect(), b)
    }
}

/// Plain `Vec`s of numbers of every size around the threshold, to a peer and to self (run with
/// the default staging limit and with every chunk read in place).
///
/// Over libfabric this once hung in about one run in 5-15: a rank that had finished start-up
/// called a peer still allocating its RPC pool, the peer answered with a chunk left in place
/// (no pool yet to stage it into), the caller could not read it and dropped the result.
fn rpc_plain_vecs() -> Res {
    use weft::RpcExt;
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    for dst in [(me + 1) % n, me] {
        for len in [0usize, 1, 511, 512, 1024, 4096, 100_000, 1 << 20] {
            let v: Vec<f64> = (0..len).map(|i| i as f64 - 0.5).collect();
            let ints: Vec<i32> = (0..len as i32 / 2).map(|i| i * -3).collect();
            let bytes: Vec<u8> = (0..len * 3).map(|i| (i % 253) as u8).collect();
            let (v2, i2, b2) =
                w.call(dst, rpc_scale, (v.clone(), ints.clone(), bytes.clone())).wait().map_err(e2s)?;
            ck(v2.len() == len && v2.iter().zip(&v).all(|(a, b)| *a == b * 2.0), || {
                format!("len {len}: f64s differ")
            })?;
            ck(i2.iter().rev().eq(ints.iter()), || format!("len {len}: i32s differ"))?;
            ck(b2 == bytes, || format!("len {len}: bytes differ"))?;
        }
    }
    w.barrier().map_err(e2s)
}

weft::remote! {
    /// A vector of `n` bytes.
    fn rpc_make_bytes(n: u64) -> Vec<u8> {
        (0..n).map(|i| i as u8).collect()
    }
}

/// With a registered pool too small for a chunk (`WEFT_RPC_POOL_MIB=1`, 2 MiB vectors): where
/// the fabric reads peer memory the chunk is read in place and the call works; where it cannot
/// (libfabric), the call fails with an error that names the pool, both for an argument and for
/// a result, instead of a descriptor the target cannot read (before: a dropped result and a
/// caller waiting for ever). The target keeps serving.
fn rpc_small_pool() -> Res {
    use weft::RpcExt;
    let w = World::init().map_err(e2s)?;
    let peer = (w.rank() + 1) % w.size();
    let big: Vec<f64> = (0..1 << 18).map(|i| i as f64).collect();
    let ints: Vec<i32> = vec![1, 2, 3];
    let sent = w.call(peer, rpc_scale, (big.clone(), ints.clone(), vec![])).wait();
    let made = w.call(peer, rpc_make_bytes, (2u64 << 20,)).wait();
    if w.caps().peer_read {
        let (v, _, _) = sent.map_err(e2s)?;
        ck(v.iter().zip(&big).all(|(a, b)| *a == b * 2.0), || "in-place argument differs".into())?;
        let m = made.map_err(e2s)?;
        ck(m.len() == 2 << 20 && m[1000] == 1000u32 as u8, || "in-place result differs".into())?;
    } else {
        ck(matches!(&sent, Err(weft::Error::Encode(m)) if m.contains("WEFT_RPC_POOL_MIB")), || {
            format!("argument larger than the pool: {sent:?}")
        })?;
        ck(
            matches!(&made, Err(weft::Error::Remote(m)) if m.contains("result could not be sent") && m.contains("WEFT_RPC_POOL_MIB")),
            || format!("result larger than the pool: {:?}", made.as_ref().map(Vec::len)),
        )?;
    }
    let (v, i, _) = w.call(peer, rpc_scale, (vec![1.5], ints.clone(), vec![])).wait().map_err(e2s)?;
    ck(v == [3.0] && i == [3, 2, 1], || "no answer after a refused transfer".into())?;
    w.barrier().map_err(e2s)
}

/// Forged RPC messages, sent as raw AMs: each is rejected with a clear error and counted, and
/// the target keeps serving.
fn rpc_bad_input() -> Res {
    use weft::rpc::{archive, proto, RemoteFn, Rpc};
    use weft::RpcExt;
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let peer = (me + 1) % n;
    let rpc = Rpc::of(&w).map_err(e2s)?;
    let h = w.handler_named("weft.rpc.msg").ok_or("no RPC message handler")?;
    let add_id = weft::rpc::fn_id(rpc_add::NAME);
    let wrong_args = archive::encode(&("not two numbers",), 4096, &archive::NoPool).map_err(|e| e.0)?.index;
    // A rendezvous descriptor: no chunks but one declaring 2^60 bytes (the index inline).
    let mut oversized = 1u64.to_le_bytes().to_vec();
    oversized.push(1);
    oversized.extend_from_slice(&0u64.to_le_bytes());
    oversized.push(0);
    for word in [1u64 << 60, 0x1000, 0] {
        oversized.extend_from_slice(&word.to_le_bytes());
    }
    let head = |kind, mode, fn_id, call_id, ack_id| {
        let (w, n) = proto::Header { kind, mode, fn_id, call_id, ack_id }.encode();
        w[..n].to_vec()
    };
    let (call, eager, rdv) = (proto::CALL, proto::EAGER, proto::RENDEZVOUS);
    let sends: [(Vec<u64>, &[u8]); 7] = [
        (head(call, eager, 0xdead_beef, 900_001, 0), &[]), // unknown function
        (head(proto::POST, eager, 0xdead_beef, 0, 0), &[]), // unknown function, posted
        (head(call, eager, add_id, 900_002, 0), &wrong_args), // type mismatch
        (head(call, rdv, add_id, 900_003, 5), &oversized), // oversized declared length
        (head(call, rdv, add_id, 900_004, 6), &[1, 2, 3]), // truncated descriptor
        (vec![call, add_id, 900_005, 0, 0, 0], &[]),       // too many words for a header
        (vec![9, add_id, 900_006], &[]),                   // unknown kind
    ];
    for (args, payload) in &sends {
        w.am_request_medium(peer, h, args, payload).map_err(e2s)?;
    }
    // Messages between two ranks arrive in order: this call is served after all of the above.
    let r = w.call(peer, rpc_add, (2, 3)).wait().map_err(e2s)?;
    ck(r == 5, || format!("add after forged messages gave {r}"))?;
    w.barrier().map_err(e2s)?;
    let s = &rpc.stats;
    let unknown = s.unknown_function.load(Ordering::SeqCst);
    ck(unknown == 2, || format!("{unknown} unknown-function messages counted, want 2"))?;
    // Here: mismatch, oversized, truncated, two bad headers (5); the errors answering this
    // rank's four forged calls, whose ids it never issued (4); the acknowledgements of its
    // two forged rendezvous calls, whose ack ids it never issued either (2).
    w.wait_until(|| s.malformed.load(Ordering::SeqCst) >= 11).map_err(e2s)?;
    let malformed = s.malformed.load(Ordering::SeqCst);
    ck(malformed == 11, || format!("{malformed} malformed messages counted, want 11"))?;
    w.barrier().map_err(e2s)
}

/// Deterministic pseudo-random u64s (splitmix64) for collective tests.
fn random_u64s(seed: u64, len: usize) -> Vec<u64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef;
    (0..len)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
        .collect()
}

/// Every collective of `team` against a sequential reference, for each element count in `lens`.
fn check_collectives(team: &weft::Team, lens: &[usize]) -> Res {
    use weft::ReduceOp;
    let (n, me) = (team.size() as usize, team.rank() as usize);
    let who = |what: &str, len: usize| format!("team of {n}, rank {me}: {what} of {len} elements");
    for &len in lens {
        let data: Vec<Vec<u64>> =
            (0..n).map(|r| random_u64s(team.members()[r] as u64 * 7919 + len as u64, len)).collect();
        let mine = &data[me];
        for root in [0, n - 1] {
            let mut b = if me == root { data[root].clone() } else { vec![0; len] };
            team.broadcast(root as u32, &mut b).map_err(e2s)?;
            ck(b == data[root], || who(&format!("broadcast from {root}"), len))?;
        }
        let sum: Vec<u64> = (0..len).map(|i| data.iter().fold(0u64, |a, d| a.wrapping_add(d[i]))).collect();
        ck(team.allreduce(mine, ReduceOp::Sum).map_err(e2s)? == sum, || who("allreduce sum", len))?;
        let mut into = vec![7u64; len];
        team.allreduce_into(mine, &mut into, ReduceOp::Sum).map_err(e2s)?;
        ck(into == sum, || who("allreduce_into sum", len))?;
        let max: Vec<u64> = (0..len).map(|i| data.iter().map(|d| d[i]).max().unwrap_or(0)).collect();
        let got = team.reduce(n as u32 - 1, mine, ReduceOp::Max).map_err(e2s)?;
        ck(got == (me == n - 1).then(|| max.clone()), || who("reduce max", len))?;
        let xor = team.allreduce_with(mine, |a: &mut u64, b: &u64| *a ^= *b).map_err(e2s)?;
        ck(xor == (0..len).map(|i| data.iter().fold(0, |a, d| a ^ d[i])).collect::<Vec<_>>(), || {
            who("allreduce with a closure", len)
        })?;
        // Floating point: every member gets the same bits, run after run, close to the sum.
        let f: Vec<f64> = mine.iter().map(|&x| (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5).collect();
        let a = team.allreduce(&f, ReduceOp::Sum).map_err(e2s)?;
        let b = team.allreduce(&f, ReduceOp::Sum).map_err(e2s)?;
        ck(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), || who("reproducible f64 sum", len))?;
        // Into an output (the ring then reads the data in place): the same bits.
        let mut c = vec![1.5f64; len];
        team.allreduce_into(&f, &mut c, ReduceOp::Sum).map_err(e2s)?;
        ck(a.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()), || who("f64 sum into an output", len))?;
        let bits: Vec<u64> = a.iter().map(|x| x.to_bits()).collect();
        let everyone = team.allgather(&bits).map_err(e2s)?;
        ck(everyone.chunks(len.max(1)).take(if len == 0 { 0 } else { n }).all(|c| c == &bits[..]), || {
            who("identical f64 sums on all members", len)
        })?;
        let cat: Vec<u64> = data.concat();
        ck(team.gather(0, mine).map_err(e2s)? == (me == 0).then(|| cat.clone()), || who("gather", len))?;
        ck(everyone.len() == n * len, || who("allgather length", len))?;
        ck(team.allgather(mine).map_err(e2s)? == cat, || who("allgather", len))?;
        // Uneven counts: member r contributes r + len % 5 elements of its data.
        let counts: Vec<usize> = (0..n).map(|r| (r + len % 5).min(len)).collect();
        let v: Vec<u64> = (0..n).flat_map(|r| data[r][..counts[r]].to_vec()).collect();
        ck(team.allgatherv(&mine[..counts[me]], &counts).map_err(e2s)? == v, || who("allgatherv", len))?;
        let g = team.gatherv(n as u32 - 1, &mine[..counts[me]], &counts).map_err(e2s)?;
        ck(g == (me == n - 1).then(|| v.clone()), || who("gatherv", len))?;
        // Blocks of len / n: scatter from the last rank, alltoall, alltoallv.
        let block = len / n;
        let root_data = &data[n - 1][..block * n];
        let sc = team.scatter(n as u32 - 1, (me == n - 1).then_some(root_data), block).map_err(e2s)?;
        ck(sc == root_data[me * block..(me + 1) * block], || who("scatter", len))?;
        let a2a = team.alltoall(&mine[..block * n]).map_err(e2s)?;
        let want: Vec<u64> = (0..n).flat_map(|r| data[r][me * block..(me + 1) * block].to_vec()).collect();
        ck(a2a == want, || who("alltoall", len))?;
        let mut into = vec![7u64; block * n];
        team.alltoall_into(&mine[..block * n], &mut into).map_err(e2s)?;
        ck(into == want, || who("alltoall_into", len))?;
        // Outputs of the wrong length are refused before anything moves.
        let e = team.alltoall_into(&mine[..block * n], &mut vec![0; block * n + 1]).err();
        ck(matches!(e, Some(Error::Misuse(_))), || who("alltoall_into, long output", len))?;
        let e = team.allreduce_into(mine, &mut vec![0; len + 1], ReduceOp::Sum).err();
        ck(matches!(e, Some(Error::Misuse(_))), || who("allreduce_into, long output", len))?;
        // alltoallv: member r sends (r + j) % 3 * block / 2 elements to member j.
        let cnt = |r: usize, j: usize| (r + j) % 3 * block / 2;
        let send: Vec<u64> = (0..n).flat_map(|j| vec![me as u64 * 1000 + j as u64; cnt(me, j)]).collect();
        let sc: Vec<usize> = (0..n).map(|j| cnt(me, j)).collect();
        let rc: Vec<usize> = (0..n).map(|r| cnt(r, me)).collect();
        let want: Vec<u64> = (0..n).flat_map(|r| vec![r as u64 * 1000 + me as u64; cnt(r, me)]).collect();
        ck(team.alltoallv(&send, &sc, &rc).map_err(e2s)? == want, || who("alltoallv", len))?;
        let ex = team.exscan(mine, ReduceOp::Sum).map_err(e2s)?;
        let want = (me > 0).then(|| {
            (0..len).map(|i| data[..me].iter().fold(0u64, |a, d| a.wrapping_add(d[i]))).collect::<Vec<_>>()
        });
        ck(ex == want, || who("exscan", len))?;
        check_nonblocking(team, &data, &sum, &cat)?;
        team.barrier().map_err(e2s)?;
    }
    Ok(())
}

/// Non-blocking collectives: several in flight at once, waited on in reverse order, tested,
/// awaited, and one dropped unwaited; each against the sequential reference.
fn check_nonblocking(team: &weft::Team, data: &[Vec<u64>], sum: &[u64], cat: &[u64]) -> Res {
    use weft::ReduceOp;
    let (n, me, len) = (team.size() as usize, team.rank() as usize, data[0].len());
    let who = |what: &str| format!("team of {n}, rank {me}: non-blocking {what} of {len} elements");
    let mine = data[me].clone();
    let bar = team.barrier_nb().map_err(e2s)?;
    let red = team.allreduce_nb(mine.clone(), ReduceOp::Sum).map_err(e2s)?;
    let root = (n - 1) as u32;
    let bc = team.broadcast_nb(root, if me == n - 1 { mine.clone() } else { vec![0; len] }).map_err(e2s)?;
    let mut ag = team.allgatherv_nb(mine.clone(), vec![len; n]).map_err(e2s)?;
    let dropped = team.exscan_nb(mine.clone(), ReduceOp::Max).map_err(e2s)?;
    drop(dropped);
    let block = len / n;
    let a2a = team.alltoall_nb(mine[..block * n].to_vec()).map_err(e2s)?;
    let want: Vec<u64> = (0..n).flat_map(|r| data[r][me * block..(me + 1) * block].to_vec()).collect();
    ck(a2a.wait().map_err(e2s)? == want, || who("alltoall"))?;
    while !ag.test().map_err(e2s)? {}
    ck(ag.wait().map_err(e2s)? == cat, || who("allgather"))?;
    ck(weft::block_on(bc).map_err(e2s)? == data[n - 1], || who("broadcast"))?;
    ck(red.wait().map_err(e2s)? == sum, || who("allreduce"))?;
    bar.wait().map_err(e2s)?;
    // Members may mix a collective's blocking and non-blocking forms: the small blocking ones
    // take a path without a future, with the same messages.
    let sum_mixed = if me == 0 {
        team.allreduce(&mine, ReduceOp::Sum).map_err(e2s)?
    } else {
        team.allreduce_nb(mine.clone(), ReduceOp::Sum).map_err(e2s)?.wait().map_err(e2s)?
    };
    ck(sum_mixed == sum, || who("allreduce, blocking on rank 0 only"))?;
    let a2a_mixed = if me == 0 {
        team.alltoall(&mine[..block * n]).map_err(e2s)?
    } else {
        team.alltoall_nb(mine[..block * n].to_vec()).map_err(e2s)?.wait().map_err(e2s)?
    };
    ck(a2a_mixed == want, || who("alltoall, blocking on rank 0 only"))?;
    // The forms with equal counts and user combinations, in flight together.
    let g = team.gather_nb(root, mine.clone()).map_err(e2s)?;
    let ag = team.allgather_nb(mine.clone()).map_err(e2s)?;
    let r =
        team.reduce_with_nb(0, mine.clone(), |a: &mut u64, b: &u64| *a = a.wrapping_add(*b)).map_err(e2s)?;
    let ex =
        team.exscan_with_nb(mine.clone(), |a: &mut u64, b: &u64| *a = a.wrapping_add(*b)).map_err(e2s)?;
    let ex_want = (me > 0).then(|| {
        (0..len).map(|i| (0..me).fold(0u64, |acc, r| acc.wrapping_add(data[r][i]))).collect::<Vec<u64>>()
    });
    ck(ex.wait().map_err(e2s)? == ex_want, || who("exscan_with"))?;
    ck(r.wait().map_err(e2s)? == (me == 0).then(|| sum.to_vec()), || who("reduce_with"))?;
    ck(ag.wait().map_err(e2s)? == cat, || who("allgather (equal counts)"))?;
    ck(g.wait().map_err(e2s)? == (me == n - 1).then(|| cat.to_vec()), || who("gather"))?;
    // A blocking collective after non-blocking ones runs after them, on every member.
    let g = team.gather(0, &mine).map_err(e2s)?;
    ck(g == (me == 0).then(|| cat.to_vec()), || who("gather after non-blocking ones"))
}

/// Teams of every size from 1 to the world's (world, colour split, strided subset, nested),
/// every collective against a sequential reference, and a parameter mismatch reported.
/// Team channels send ahead: rank 0 broadcasts eight 1 KiB messages while rank 1 sleeps (they
/// fit sub-slots and must not wait), then one through the whole slot, then eight more, which
/// must wait until rank 1 (asleep again) has read the big one instead of overwriting it.
fn channel_send_ahead() -> Res {
    let w = World::init().map_err(e2s)?;
    let team = w.world_team().map_err(e2s)?;
    let small: Vec<Vec<u64>> = (0..16).map(|k| random_u64s(k + 10, 128)).collect();
    let big = random_u64s(3, 100_000 / 8);
    let nap = Duration::from_millis(400);
    if w.rank() == 0 {
        let t = Instant::now();
        for s in &small[..8] {
            team.broadcast(0, &mut s.clone()).map_err(e2s)?;
        }
        let ahead = t.elapsed();
        ck(ahead < nap / 2, || format!("eight small broadcasts took {ahead:?}: no send-ahead"))?;
        team.broadcast(0, &mut big.clone()).map_err(e2s)?;
        for s in &small[8..] {
            team.broadcast(0, &mut s.clone()).map_err(e2s)?;
        }
    } else {
        std::thread::sleep(nap);
        for (k, s) in small[..8].iter().enumerate() {
            let mut got = vec![0; s.len()];
            team.broadcast(0, &mut got).map_err(e2s)?;
            ck(&got == s, || format!("small message {k}"))?;
        }
        std::thread::sleep(nap);
        let mut got = vec![0; big.len()];
        team.broadcast(0, &mut got).map_err(e2s)?;
        ck(got == big, || "the whole-slot message was overwritten".into())?;
        for (k, s) in small[8..].iter().enumerate() {
            let mut got = vec![0; s.len()];
            team.broadcast(0, &mut got).map_err(e2s)?;
            ck(&got == s, || format!("small message {}", k + 8))?;
        }
    }
    team.barrier().map_err(e2s)
}

/// Small broadcasts (a flag line or a sub-slot each) back to back, more of them than a sender
/// may be ahead (32 lines, 8 sub-slots per source): the root sends what fits at once and waits for the rest,
/// while the others sleep first. Roots change, lengths up to a full line, a non-blocking
/// collective in between (it must be finished first), and every value checked in order.
fn small_broadcasts_back_to_back() -> Res {
    let w = World::init().map_err(e2s)?;
    let team = w.world_team().map_err(e2s)?;
    let (me, n) = (team.rank() as usize, team.size() as usize);
    // Up to 12 words in a flag line; 64 and 500 words through sub-slots (8 per source).
    for (round, len) in [(0u64, 1usize), (1, 12), (2, 0), (3, 5), (4, 64), (5, 500)] {
        let root = (round as usize) % n;
        let msgs: Vec<Vec<u64>> = (0..100).map(|k| random_u64s(round * 1000 + k, len)).collect();
        if me != root {
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut bar = team.barrier_nb().map_err(e2s)?;
        for (k, m) in msgs.iter().enumerate() {
            let mut b = if me == root { m.clone() } else { vec![u64::MAX; len] };
            team.broadcast(root as u32, &mut b).map_err(e2s)?;
            ck(&b == m, || format!("rank {me}, round {round}: broadcast {k} of {len} words from {root}"))?;
        }
        ck(bar.test().map_err(e2s)?, || "a non-blocking barrier called first is not done".into())?;
    }
    team.barrier().map_err(e2s)
}

/// Collectives whose data lies in registered memory (an `RmaVec`, from the world's pool
/// segment): long messages are read through the receivers' mappings of the senders' parts.
/// Also a root buffer in a segment that only some receivers hold: those get the data
/// another way. Every result against the reference.
fn collectives_on_segments() -> Res {
    let w = World::init().map_err(e2s)?;
    let team = w.world_team().map_err(e2s)?;
    let (me, n) = (team.rank() as usize, team.size() as usize);
    for block in [5_000usize, 70_000] {
        // alltoall: 40 KB and 560 KB blocks, from registered memory into a Vec.
        let mine: Vec<u64> = (0..n * block).map(|i| (me * 1_000_000 + i) as u64).collect();
        let data = weft::RmaVec::from_slice(&w, &mine).map_err(e2s)?;
        let mut out = vec![0u64; n * block];
        team.alltoall_into(&data, &mut out).map_err(e2s)?;
        let want: Vec<u64> =
            (0..n).flat_map(|r| (0..block).map(move |i| (r * 1_000_000 + me * block + i) as u64)).collect();
        ck(out == want, || format!("rank {me}: alltoall of {block}-word blocks from an RmaVec"))?;
        // broadcast from the last rank, in place in registered memory on every rank.
        let root = n - 1;
        let src: Vec<u64> = (0..block).map(|i| (i * 3 + 7) as u64).collect();
        let init = if me == root { src.clone() } else { vec![0; block] };
        let mut buf = weft::RmaVec::from_slice(&w, &init).map_err(e2s)?;
        team.broadcast(root as u32, &mut buf).map_err(e2s)?;
        ck(buf[..] == src[..], || format!("rank {me}: broadcast of {block} words in an RmaVec"))?;
        // allreduce (a ring above the small limit) reading from registered memory.
        let sum = team.allreduce(&data[..block], weft::ReduceOp::Sum).map_err(e2s)?;
        let want: Vec<u64> = (0..block).map(|i| (0..n).map(|r| (r * 1_000_000 + i) as u64).sum()).collect();
        ck(sum == want, || format!("rank {me}: allreduce of {block} words from an RmaVec"))?;
    }
    // Rank 0's buffer in a segment of the even ranks only: the odd ones cannot map it.
    let evens = team.subset(0, 2, n.div_ceil(2) as u32).map_err(e2s)?;
    let seg = match &evens {
        Some(t) => Some(t.alloc_segment::<u64>(50_000).map_err(e2s)?),
        None => None,
    };
    let src: Vec<u64> = (0..50_000).map(|i| i * 5 + 1).collect();
    let mut got = vec![0u64; 50_000];
    if me == 0 {
        let seg = seg.as_ref().ok_or("rank 0 is even")?;
        let local = seg.local();
        local.copy_in(0, &src);
        // SAFETY: only this broadcast touches rank 0's part of the segment while the slice
        // lives, and a broadcast's root only reads its buffer.
        let part = unsafe { local.as_mut_slice() };
        team.broadcast(0, part).map_err(e2s)?;
        got.copy_from_slice(part);
    } else {
        team.broadcast(0, &mut got).map_err(e2s)?;
    }
    ck(got == src, || format!("rank {me}: broadcast from a segment of the even ranks"))?;
    team.barrier().map_err(e2s)
}

/// Collectives of 160 KiB and 1 MiB called again and again: the team's tuner tries both ways
/// of moving them (slots, direct read), then keeps the faster and explores the other.
fn collectives_tuned() -> Res {
    let w = World::init().map_err(e2s)?;
    let world = w.world_team().map_err(e2s)?;
    for _ in 0..3 {
        check_collectives(&world, &[20_000, 1 << 17])?;
    }
    Ok(())
}

fn teams_and_collectives() -> Res {
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    let world = w.world_team().map_err(e2s)?;
    ck(world.size() == n && world.rank() == me, || "world team".into())?;
    // Element counts from none to 4 MiB (8-byte elements), crossing the 256 KiB chunk size.
    check_collectives(&world, &[0, 1, 5, 1000, 40_000, 1 << 19])?;
    // Rank 0 alone, the others together (sizes 1 and n - 1), ordered by descending world rank.
    let split = world.split(Some((me != 0) as u32), n - me).map_err(e2s)?.ok_or("no team")?;
    let want: Vec<u32> = if me == 0 { vec![0] } else { (1..n).rev().collect() };
    ck(split.members() == want, || format!("split members {:?}, want {want:?}", split.members()))?;
    ck(split.team_rank(me) == Some(split.rank()), || "team rank translation".into())?;
    check_collectives(&split, &[0, 3, 70_000])?;
    // Every second rank, then a nested split of that team.
    let sub = world.subset(0, 2, n.div_ceil(2)).map_err(e2s)?;
    ck(sub.is_some() == (me % 2 == 0), || "subset membership".into())?;
    if let Some(sub) = &sub {
        check_collectives(sub, &[2, 33_000])?;
        let nested = sub.split(Some(0), 0).map_err(e2s)?.ok_or("nested")?;
        ck(nested.members() == sub.members(), || "nested split".into())?;
        check_collectives(&nested, &[9])?;
        // A team segment is held by the members only.
        let seg = sub.alloc_segment::<u64>(16).map_err(e2s)?;
        let next = sub.members()[(sub.rank() as usize + 1) % sub.size() as usize];
        w.put(seg.at(next, 1), &[me as u64 + 100]).map_err(e2s)?;
        sub.barrier().map_err(e2s)?;
        let prev = sub.members()[(sub.rank() as usize + sub.size() as usize - 1) % sub.size() as usize];
        ck(seg.local().read(1) == prev as u64 + 100, || "team segment put".into())?;
        if n > 1 {
            let outsider = 1; // odd: not a member
            ck(matches!(w.put(seg.at(outsider, 0), &[1]), Err(Error::NotMember { .. })), || {
                "put to a non-member of a team segment".into()
            })?;
        }
    }
    w.barrier().map_err(e2s)?;
    // World segments still line up after team segments moved some ranks' ids ahead.
    let seg = w.alloc_segment::<u64>(4).map_err(e2s)?;
    w.put(seg.at((me + 1) % n, 0), &[me as u64]).map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    ck(seg.local().read(0) == ((me + n - 1) % n) as u64, || "world segment after team segments".into())?;
    // A member that disagrees on a broadcast's length reports it: within the flag lines (80
    // against 88 bytes), and across the packed records and the lines (8 against 16, 16
    // against 8), each on a fresh team. The others may have finished their part (rank 1 is a
    // leaf of the tree from 0); the team is unusable on every member afterwards.
    if n > 1 {
        for (theirs, mine) in [(80, 88), (8, 16), (16, 8), (0, 1)] {
            let t = w.world_team().map_err(e2s)?;
            let mut buf = vec![0u8; if me == 1 { mine } else { theirs }];
            let r = t.broadcast(0, &mut buf);
            ck(matches!(r, Err(Error::Mismatch(_))) || (me != 1 && r.is_ok()), || {
                format!("{theirs} B against {mine} B: {r:?}")
            })?;
            let after = t.barrier();
            ck(matches!(&after, Err(Error::Mismatch(m)) if m.contains("unusable")), || {
                format!("{theirs} B against {mine} B, the next call: {after:?}")
            })?;
        }
    }
    w.barrier().map_err(e2s)
}

// ---------------------------------------------------------------- driver

/// Element offsets of a strided shape, one by one (the reference for non-contiguous
/// transfers; independent of weft's run computation).
fn strided_offsets(counts: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut offs = vec![0usize];
    for d in 1..counts.len() {
        offs = (0..counts[d]).flat_map(|k| offs.iter().map(move |o| o + k * strides[d - 1])).collect();
    }
    offs.into_iter().flat_map(|o| (0..counts[0]).map(move |i| o + i)).collect()
}

/// A random strided shape of `dims` dimensions with non-overlapping runs.
fn random_shape(
    r: &mut impl FnMut(usize) -> usize,
    dims: usize,
    counts: Option<&[usize]>,
) -> (Vec<usize>, Vec<usize>) {
    let counts: Vec<usize> = counts
        .map(<[usize]>::to_vec)
        .unwrap_or_else(|| (0..dims).map(|d| [1 + r(40), 1 + r(6), 1 + r(4)][d]).collect());
    let mut strides = vec![];
    let mut extent = counts[0];
    for &c in &counts[1..] {
        let s = extent + r(6);
        strides.push(s);
        extent = s * c;
    }
    (counts, strides)
}

/// Strided and indexed puts and gets of random shapes against an element-by-element
/// reference, in the three completion styles; bad piece lists rejected with nothing written.
fn vis_transfers() -> Res {
    use weft::Pieces;
    let w = World::init().map_err(e2s)?;
    let (me, n) = (w.rank(), w.size());
    const LEN: usize = 4096;
    let seg = w.alloc_segment::<u64>(LEN).map_err(e2s)?;
    let init = |r: u32, i: usize| r as u64 * 1_000_000 + i as u64;
    (0..LEN).for_each(|i| seg.local().write(i, init(me, i)));
    w.barrier().map_err(e2s)?;
    // Only this rank writes to `to`'s segment: `model` is what it must hold.
    let to = (me + 1) % n;
    let mut model: Vec<u64> = (0..LEN).map(|i| init(to, i)).collect();
    let rnd = random_u64s(me as u64 + 17, 10_000);
    let mut k = 0;
    let mut r = |m: usize| {
        k += 1;
        rnd[k % rnd.len()] as usize % m.max(1)
    };
    let check_remote = |model: &[u64], what: &str| -> Res {
        let mut all = vec![0u64; LEN];
        w.get(seg.at(to, 0), &mut all).map_err(e2s)?;
        let bad = (0..LEN).find(|&i| all[i] != model[i]);
        ck(bad.is_none(), || format!("{what}: element {bad:?} differs"))
    };
    for trial in 0..40 {
        let dims = 1 + trial % 3;
        let (counts, dst_strides) = random_shape(&mut r, dims, None);
        let (_, src_strides) = random_shape(&mut r, dims, Some(&counts));
        let (db, sb) = (r(1000), r(100));
        let dst_offs = strided_offsets(&counts, &dst_strides);
        let src_offs = strided_offsets(&counts, &src_strides);
        let src: Vec<u64> =
            (0..sb + src_offs.last().map_or(0, |o| o + 1)).map(|i| (trial * 10_000 + i) as u64).collect();
        let dp = Pieces::Strided { counts: &counts, strides: &dst_strides };
        let sp = Pieces::Strided { counts: &counts, strides: &src_strides };
        match trial % 3 {
            0 => w.put_strided(seg.at(to, db), &dst_strides, &src[sb..], &src_strides, &counts),
            1 => w.put_pieces_nb(seg.at(to, db), dp, &src[sb..], sp).and_then(|h| h.wait()),
            _ => w.put_pieces_nbi(seg.at(to, db), dp, &src[sb..], sp).and_then(|()| w.sync_nbi()),
        }
        .map_err(e2s)?;
        for (d, s) in dst_offs.iter().zip(&src_offs) {
            model[db + d] = src[sb + s];
        }
        check_remote(&model, &format!("strided put {counts:?} {dst_strides:?} <- {src_strides:?}"))?;
        // Get the same shape back into a strided local buffer.
        let mut back = vec![u64::MAX; src.len()];
        match trial % 3 {
            0 => w.get_strided(seg.at(to, db), &dst_strides, &mut back[sb..], &src_strides, &counts),
            1 => w.get_pieces_nb(seg.at(to, db), dp, &mut back[sb..], sp).and_then(|h| h.wait()),
            _ => w.nbi(|s| s.get_pieces(seg.at(to, db), dp, &mut back[sb..], sp)),
        }
        .map_err(e2s)?;
        let want: Vec<u64> = (0..src.len())
            .map(|i| if i >= sb && src_offs.binary_search(&(i - sb)).is_ok() { src[i] } else { u64::MAX })
            .collect();
        ck(back == want, || format!("strided get {counts:?}"))?;
        // Indexed: a shuffled list of disjoint pieces from one contiguous source.
        let mut pieces = vec![];
        let mut at = r(50);
        while pieces.len() < 1 + r(30) && at < LEN - 64 {
            let len = r(60);
            pieces.push(at..at + len);
            at += len + r(20);
        }
        for i in (1..pieces.len()).rev() {
            pieces.swap(i, r(i + 1));
        }
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let src: Vec<u64> = (0..total).map(|i| (trial * 7 + i * 3) as u64).collect();
        w.put_pieces(seg.at(to, 0), Pieces::List(&pieces), &src, Pieces::Contiguous { start: 0, len: total })
            .map_err(e2s)?;
        let mut i = 0;
        for p in &pieces {
            for e in p.clone() {
                model[e] = src[i];
                i += 1;
            }
        }
        check_remote(&model, &format!("indexed put of {} pieces", pieces.len()))?;
        let mut back = vec![0u64; total];
        w.get_pieces(
            seg.at(to, 0),
            Pieces::List(&pieces),
            &mut back,
            Pieces::Contiguous { start: 0, len: total },
        )
        .map_err(e2s)?;
        ck(back == src, || "indexed get".into())?;
    }
    // Bad pieces: an error, and nothing written.
    let src = vec![7u64; 100];
    let cases: [(&str, weft::Result<()>); 4] = [
        (
            "totals differ",
            w.put_pieces(
                seg.at(to, 0),
                Pieces::Contiguous { start: 0, len: 10 },
                &src,
                Pieces::Contiguous { start: 0, len: 11 },
            ),
        ),
        (
            "local piece outside",
            w.put_pieces(
                seg.at(to, 0),
                Pieces::Contiguous { start: 0, len: 10 },
                &src,
                Pieces::Contiguous { start: 95, len: 10 },
            ),
        ),
        (
            "remote piece outside",
            w.put_pieces(
                seg.at(to, 0),
                Pieces::List(&[0..5, LEN..LEN + 5]),
                &src,
                Pieces::Contiguous { start: 0, len: 10 },
            ),
        ),
        ("strides missing", w.put_strided(seg.at(to, 0), &[], &src, &[], &[2, 2])),
    ];
    for (what, r) in cases {
        ck(matches!(r, Err(Error::BadPieces(_) | Error::OutOfBounds { .. })), || format!("{what}: {r:?}"))?;
    }
    check_remote(&model, "after rejected transfers")?;
    w.barrier().map_err(e2s)
}

const CASES: &[Case] = &[
    Case { name: "put_get_sizes", run: put_get_sizes, ranks: &[2, 4], env: &[] },
    Case { name: "completion_semantics", run: completion_semantics, ranks: &[2, 4], env: &[] },
    Case {
        name: "completion_semantics_am_path",
        run: completion_semantics,
        ranks: &[2, 4],
        env: &[("WEFT_RMA", "am")],
    },
    Case { name: "atomics", run: atomics, ranks: &[2, 4], env: &[] },
    Case { name: "notify_after_the_peer_left", run: notify_after_the_peer_left, ranks: &[2], env: &[] },
    Case { name: "put_signal", run: put_signal, ranks: &[2, 4], env: &[] },
    Case { name: "put_signal_am_path", run: put_signal, ranks: &[2], env: &[("WEFT_RMA", "am")] },
    Case { name: "atomics_am_path", run: atomics, ranks: &[2], env: &[("WEFT_RMA", "am")] },
    Case { name: "am_kinds", run: am_kinds, ranks: &[2, 4], env: &[] },
    Case { name: "am_flood", run: am_flood, ranks: &[2, 4], env: &[("WEFT_AM_RING_KIB", "16")] },
    Case { name: "bad_input", run: bad_input, ranks: &[2, 4], env: &[] },
    Case { name: "handler_mismatch", run: handler_mismatch, ranks: &[2], env: &[] },
    Case { name: "early_exit", run: early_exit, ranks: &[2, 4], env: &[] },
    Case { name: "idle_waits_sleep", run: idle_waits_sleep, ranks: &[2, 4], env: &[] },
    Case { name: "vanished_rank", run: vanished_rank, ranks: &[2, 4], env: &[] },
    Case { name: "threads_and_progress", run: threads_and_progress, ranks: &[2, 4], env: &[] },
    Case { name: "rpc_calls", run: rpc_calls, ranks: &[2, 4], env: &[] },
    Case { name: "rpc_plain_vecs", run: rpc_plain_vecs, ranks: &[2, 4], env: &[] },
    Case {
        name: "rpc_plain_vecs_in_place",
        run: rpc_plain_vecs,
        ranks: &[2],
        env: &[("WEFT_RPC_STAGE_KIB", "0")],
    },
    Case { name: "rpc_bad_input", run: rpc_bad_input, ranks: &[2, 4], env: &[] },
    Case { name: "rpc_small_pool", run: rpc_small_pool, ranks: &[2], env: &[("WEFT_RPC_POOL_MIB", "1")] },
    Case { name: "teams_and_collectives", run: teams_and_collectives, ranks: &[2, 4], env: &[] },
    Case {
        name: "teams_and_collectives_am_path",
        run: teams_and_collectives,
        ranks: &[3],
        env: &[("WEFT_RMA", "am")],
    },
    Case { name: "vis_transfers", run: vis_transfers, ranks: &[2, 4], env: &[] },
    Case { name: "collectives_tuned", run: collectives_tuned, ranks: &[2, 3], env: &[] },
    Case {
        name: "small_broadcasts_back_to_back",
        run: small_broadcasts_back_to_back,
        ranks: &[2, 4],
        env: &[],
    },
    Case { name: "collectives_on_segments", run: collectives_on_segments, ranks: &[2, 3], env: &[] },
    // Messages through the slots only (no direct reads), so the big one uses the whole slot.
    Case {
        name: "channel_send_ahead",
        run: channel_send_ahead,
        ranks: &[2],
        env: &[("WEFT_COLL_DIRECT_BYTES", "100000000")],
    },
    Case {
        name: "vis_transfers_packed",
        run: vis_transfers,
        ranks: &[2],
        env: &[("WEFT_VIS_PACK_BYTES", "1000000"), ("WEFT_AM_RING_KIB", "16")],
    },
    Case { name: "vis_transfers_am_path", run: vis_transfers, ranks: &[3], env: &[("WEFT_RMA", "am")] },
    // Every size through the bandwidth algorithms (ring, pairwise) with every message through
    // the slots (chunked), then through the latency algorithms.
    Case {
        name: "teams_and_collectives_large_algorithms",
        run: teams_and_collectives,
        ranks: &[3],
        env: &[("WEFT_COLL_SMALL_BYTES", "0"), ("WEFT_COLL_DIRECT_BYTES", "100000000")],
    },
    // Messages from 32 KiB up read straight from the senders' buffers (by default only from
    // 16 MiB up, or from 32 KiB in the calls where the tuner tries the direct way).
    Case {
        name: "teams_and_collectives_direct_reads",
        run: teams_and_collectives,
        ranks: &[3],
        env: &[("WEFT_COLL_DIRECT_BYTES", "32768")],
    },
    Case {
        name: "teams_and_collectives_small_algorithms",
        run: teams_and_collectives,
        ranks: &[4],
        env: &[("WEFT_COLL_SMALL_BYTES", "100000000")],
    },
];

/// A rank killed with SIGKILL: the launcher names it within 2 s and nothing stays in /dev/shm.
fn killed_rank_reported(n: u32) -> Result<(), libtest_mimic::Failed> {
    let (out, took, pid) = common::launch("WEFT_TEST_CASE", "killed_rank", n, &[]);
    let ended = weft::fabric::os::now_ns();
    let err = String::from_utf8_lossy(&out.stderr);
    // mpirun words it "process rank 1 ... exited on signal 9 (Killed)", srun "task 1: Killed".
    let reported = match common::launcher() {
        "mpirun" => err.contains("rank 1") && err.contains("signal 9"),
        "srun" => err.contains("task 1: Killed"),
        _ => err.contains("rank 1") && err.contains("SIGKILL"),
    };
    if out.status.success() || !reported {
        return Err(format!("kill not reported ({})\n{}", out.status, common::text(&out)).into());
    }
    // The job ends when the launcher has stopped everyone: within 2 s of the kill under
    // `weft run`, 5 s under mpirun and srun (whose reaction is theirs), where the ranks would
    // otherwise sleep 30 s. Measured from the kill on the host's monotonic clock, not from the
    // launch: srun's start-up alone took over 2 s on a loaded 2-core machine.
    let out_text = String::from_utf8_lossy(&out.stdout);
    let killed_at = out_text
        .lines()
        .find_map(|l| l.split("KILLING-MYSELF at ").nth(1)?.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("no kill time in the output ({took:?})\n{}", common::text(&out)))?;
    let after = Duration::from_nanos(ended.saturating_sub(killed_at));
    let limit = Duration::from_secs(if common::launcher() == "weft run" { 2 } else { 5 });
    if after > limit {
        return Err(format!("job took {after:?} to end after the kill ({took:?} in all)").into());
    }
    let left = common::shm_leftovers(pid);
    if !left.is_empty() {
        return Err(format!("files left in /dev/shm: {left:?}").into());
    }
    Ok(())
}

/// Ranks that a launcher binds to one core each (here `taskset -c 0`) are not oversubscribed
/// when the node has a core per rank: they keep spinning before they yield. They used to judge
/// by their own affinity mask (one processor), stop spinning, and run small collectives 2.5x
/// slower under `mpirun`'s binding.
fn bound_ranks_keep_spinning() -> Result<(), libtest_mimic::Failed> {
    let weft = env!("CARGO_BIN_EXE_weft");
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let want = if cpus >= 2 { "spin 20µs" } else { "spin 0ns" };
    let out = Command::new(weft)
        .args(["run", "-n", "2", "--", "taskset", "-c", "0", weft, "__rank", "info", "--segment-kib", "64"])
        .args(["--threads", "1"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let policies: Vec<&str> = text.lines().filter(|l| l.contains("wait policy")).collect();
    if !out.status.success() || policies.is_empty() || !policies.iter().all(|l| l.contains(want)) {
        return Err(
            format!("2 bound ranks on {cpus} cores, expected \"{want}\": {}", common::text(&out)).into()
        );
    }
    Ok(())
}

fn launcher_errors() -> Result<(), libtest_mimic::Failed> {
    let weft = env!("CARGO_BIN_EXE_weft");
    let out = Command::new(weft).args(["run", "-n", "2"]).output()?;
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("PROGRAM") {
        return Err(format!("`weft run` without a program: {}", common::text(&out)).into());
    }
    let out = Command::new(weft).args(["run", "-n", "2", "--", "/nonexistent/program"]).output()?;
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("cannot start") {
        return Err(format!("missing program: {}", common::text(&out)).into());
    }
    let out = Command::new(weft).args(["run", "-n", "2", "--", "sh", "-c", "exit 3"]).output()?;
    if out.status.code() != Some(3) {
        return Err(format!("exit status not forwarded: {}", common::text(&out)).into());
    }
    // Inside a job, `weft info` reports on that job (once, from its rank 0) instead of
    // starting a job of its own in every rank; `weft bench`, which starts ranks, refuses.
    let out = Command::new(weft).args(["run", "-n", "2", "--", weft, "info", "--threads", "1"]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.matches("2 (this is rank 0)").count() != 1 {
        return Err(format!("`weft info` inside a 2-rank job: {}", common::text(&out)).into());
    }
    let out = Command::new(weft).args(["run", "-n", "1", "--", weft, "bench", "am"]).output()?;
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("outside mpirun") {
        return Err(format!("`weft bench` inside a job: {}", common::text(&out)).into());
    }
    let exe = std::env::current_exe()?;
    let out = Command::new(weft)
        .args(["run", "-n", "2", "--"])
        .arg(exe)
        .env("WEFT_TEST_CASE", "bad_input")
        .env("WEFT_AM_RING_KIB", "lots")
        .output()?;
    let err = String::from_utf8_lossy(&out.stdout);
    if out.status.success() || !err.contains("WEFT_AM_RING_KIB") {
        return Err(format!("bad WEFT_* value: {}", common::text(&out)).into());
    }
    Ok(())
}

fn main() {
    common::run_rank("WEFT_TEST_CASE", CASES, &[("killed_rank", killed_rank)]);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = common::trials("WEFT_TEST_CASE", CASES);
    trials.push(libtest_mimic::Trial::test("killed_rank_reported_2ranks", || killed_rank_reported(2)));
    trials.push(libtest_mimic::Trial::test("killed_rank_reported_4ranks", || killed_rank_reported(4)));
    trials.push(libtest_mimic::Trial::test("launcher_errors", launcher_errors));
    trials.push(libtest_mimic::Trial::test("bound_ranks_keep_spinning", bound_ranks_keep_spinning));
    libtest_mimic::run(&args, trials).exit();
}
