//! Active messages: every kind, floods, malformed input, handler tables.

use super::*;

pub(crate) struct AmProbe {
    pub(crate) short: AmHandler,
    pub(crate) medium: AmHandler,
    pub(crate) long: AmHandler,
    pub(crate) replies: Arc<AtomicU64>,
    pub(crate) checksum: Arc<AtomicU64>,
}

pub(crate) fn am_world(b: &mut weft::Builder) -> AmProbe {
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
pub(crate) static LONG_SEG: std::sync::OnceLock<weft::GlobalPtr<u64>> = std::sync::OnceLock::new();

pub(crate) fn long_reply_target(rank: u32) -> weft::GlobalPtr<u8> {
    LONG_SEG.get().expect("segment set").on(rank).cast()
}

/// Short, medium and long requests and replies, with payload checks; limits and misuse.
pub(crate) fn am_kinds() -> Res {
    let mut b = World::builder();
    let p = am_world(&mut b);
    let inner = Arc::new(std::sync::Mutex::new(None::<Error>));
    let inner2 = inner.clone();
    let nested = b.handler("test.nested", move |m| {
        // Requests from inside a handler are refused; so is a second reply.
        let e = m.comm().am_request_short(m.src(), m_short(), &[]).err();
        *inner2.lock().unwrap() = e;
    });
    let w = b.init()?;
    SHORT.set(p.short).ok();
    let seg = w.alloc_segment::<u64>(1 << 17)?;
    LONG_SEG.set(seg.at(0, 0)).ok();
    w.barrier()?;
    let (me, n) = (w.rank(), w.size());
    let to = (me + 1) % n;
    let mut expect = 0u64;
    let mut sent = 0u64;
    for k in 0..200u64 {
        let args: Vec<u64> = (0..(k % 17)).map(|i| i + k).collect();
        let len = [0usize, 1, 100, 4096, 60_000][k as usize % 5];
        let payload: Vec<u8> = (0..len).map(|i| pattern(k, i)).collect();
        let s: u64 = args.iter().sum::<u64>() + payload.iter().map(|&x| x as u64).sum::<u64>();
        w.am_request_short(to, p.short, &args)?;
        expect += args.iter().sum::<u64>();
        w.am_request_medium(to, p.medium, &args, &payload)?;
        expect += s;
        w.am_request_long(seg.at(to, 1 << 16).cast(), p.long, &args, &payload)?;
        expect += s;
        sent += 3;
        // Long replies land at offset 0 of our segment; wait for each round so they do not overlap.
        w.wait_until(|| p.replies.load(Ordering::Acquire) == sent)?;
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
    w.am_request_short(to, nested, &[])?;
    w.barrier()?;
    w.barrier()?;
    let e = inner.lock().unwrap().clone();
    ck(matches!(e, Some(Error::Misuse(_))), || format!("request inside a handler: {e:?}"))?;
    w.barrier().map_err(Failure::from)
}

pub(crate) static SHORT: std::sync::OnceLock<AmHandler> = std::sync::OnceLock::new();
pub(crate) fn m_short() -> AmHandler {
    *SHORT.get().expect("set")
}

/// Every rank floods every other with medium requests (each answered) for a while.
pub(crate) fn am_flood() -> Res {
    let mut b = World::builder();
    let p = am_world(&mut b);
    let w = b.init()?;
    let seg = w.alloc_segment::<u64>(16)?;
    LONG_SEG.set(seg.at(0, 0)).ok();
    w.barrier()?;
    let (me, n) = (w.rank(), w.size());
    let payload = vec![1u8; 2000];
    let t = Instant::now();
    let mut sent = 0u64;
    while t.elapsed() < Duration::from_secs(2) {
        for to in (0..n).filter(|&r| r != me) {
            for _ in 0..100 {
                w.am_request_medium(to, p.medium, &[sent], &payload)?;
                sent += 1;
            }
        }
    }
    w.wait_until(|| p.replies.load(Ordering::Acquire) == sent)?;
    w.barrier()?;
    ck(sent > 1000, || format!("only {sent} messages in 2 s"))
}

/// Errors instead of stray accesses; ranks that disagree get an error, not a hang.
pub(crate) fn bad_input() -> Res {
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let seg = w.alloc_segment::<u64>(100)?;
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
    let ok = w.alloc_segment::<u64>(10)?;
    w.put(ok.at((me + 1) % n, 9), &[7])?;
    w.barrier()?;
    ck(ok.local().read(9) == 7, || "world unusable after errors".into())
}

/// Ranks register different handlers: start-up fails with a clear error everywhere.
pub(crate) fn handler_mismatch() -> Res {
    let mut b = World::builder();
    b.handler("a", |_| {});
    // The rank before init: from `weft run` or from mpirun's PMIx.
    let rank = std::env::var("WEFT_RANK").or_else(|_| std::env::var("PMIX_RANK"));
    if rank.as_deref() == Ok("1") {
        b.handler("b", |_| {});
    }
    match b.init() {
        Err(Error::Mismatch(m)) if m.contains("handler") => Ok(()),
        Err(e) => Err(format!("unexpected error: {e}").into()),
        Ok(_) => Err("mismatched handler tables accepted".into()),
    }
}
