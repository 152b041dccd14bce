//! Segment lifetime: dropped segments give their memory back, and allocations reuse them.

use super::*;

/// A dropped segment: accesses to it are errors, the next allocation of its size reuses its id
/// (zeroed); where one rank still holds it, the next allocation is a new segment; team
/// segments likewise. Then 1000 `world_team()` + drop cycles keep segments and memory flat.
pub(crate) fn segments_recycled() -> Res {
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let next = (me + 1) % n;
    let a = w.alloc_segment::<u64>(1 << 16)?;
    let id = a.id();
    for i in 0..1 << 16 {
        a.local().write(i, 0xA5A5 + i as u64);
    }
    let stale = a.at(next, 7);
    w.put(stale, &[1])?;
    let mut set = w.endpoints(&weft::EndpointConfig::new(weft::EndpointPolicy::Dynamic, 1))?;
    let mut ep = set.endpoints().pop().ok_or("no endpoint")?;
    ep.put_nbi(stale, &[1])?;
    ep.sync_nbi()?;
    w.barrier()?;
    let held_shm = w.info().shm_in_memory;
    let held = common::rss_kib()?;
    drop(a);
    let freed = held.saturating_sub(common::rss_kib()?);
    // (Less what the heap grew meanwhile.)
    ck(freed >= 400, || format!("dropping a 512 KiB segment gave back {freed} KiB"))?;
    // What `weft info` reports of this rank's /dev/shm falls alike (shared memory only).
    if let (Some(before), Some(after)) = (held_shm, w.info().shm_in_memory) {
        let gone = before.saturating_sub(after) >> 10;
        ck(gone >= 512, || format!("weft info: {before} -> {after} bytes in /dev/shm after the drop"))?;
    }
    let e = w.put(stale, &[1]);
    ck(matches!(e, Err(Error::NoSuchSegment(s)) if s == id), || {
        format!("put into a dropped segment: {e:?}")
    })?;
    ck(w.info().segments.iter().all(|&(s, _)| s != id), || "a dropped segment is still listed".into())?;

    let b = w.alloc_segment::<u64>(1 << 16)?;
    // Nor through an endpoint that cached the segment before the drop (it wrote into the
    // reuse).
    let r = ep.put_nbi(stale, &[0xdead]).and_then(|()| ep.sync_nbi());
    ck(matches!(r, Err(Error::NoSuchSegment(s)) if s == id), || {
        format!("stale address through an endpoint: {r:?}")
    })?;
    // The same slot (the id's low 12 bits), the next generation.
    ck(b.id() % 4096 == id % 4096 && b.id() != id, || {
        format!("segment {id} dropped everywhere, but the next one is {}", b.id())
    })?;
    // An address kept from the dropped segment names no segment, not the one reusing its slot.
    let e = w.put(stale, &[1]);
    ck(matches!(e, Err(Error::NoSuchSegment(s)) if s == id), || format!("stale address after reuse: {e:?}"))?;
    let dirty = (0..1 << 16).find(|&i| b.local().read(i) != 0);
    ck(dirty.is_none(), || format!("reused segment not zeroed at element {dirty:?}"))?;
    w.barrier()?;
    drop(ep);
    set.close()?;
    w.put(b.at(next, 3), &[me as u64 + 10])?;
    w.barrier()?;
    ck(b.local().read(3) == ((me + n - 1) % n) as u64 + 10, || "put into the reused segment".into())?;

    // Rank 0 keeps its segment: the others' offers do not match, so the next one is new.
    let b_id = b.id();
    w.barrier()?;
    let kept = if me == 0 {
        Some(b)
    } else {
        drop(b);
        None
    };
    let c = w.alloc_segment::<u64>(1 << 16)?;
    ck(c.id() % 4096 != b_id % 4096, || format!("rank 0 still holds segment {b_id}, yet it was reused"))?;
    w.put(c.at(next, 0), &[5])?;
    w.barrier()?;
    ck(c.local().read(0) == 5, || "put into a new segment beside a kept one".into())?;
    if let Some(k) = &kept {
        ck(k.local().read(3) == (n - 1) as u64 + 10, || "the kept segment changed".into())?;
    }
    drop((kept, c));
    w.barrier()?;

    // A large RmaVec's pool memory goes back once it stayed free for the pool's decay, as the
    // world makes progress (what `weft info` counts).
    let before = w.info().shm_in_memory;
    let v = weft::RmaVec::<u8>::from_slice(&w, &vec![1u8; 16 << 20])?;
    ck(v.in_pool(), || "a 16 MiB RmaVec outside the pool".into())?;
    let during = w.info().shm_in_memory;
    drop(v);
    let t0 = std::time::Instant::now();
    while t0.elapsed() < weft::fabric::pool::DECAY * 3 {
        w.poll()?;
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if let (Some(b), Some(d), Some(a)) = (before, during, w.info().shm_in_memory) {
        ck(d >= b + (16 << 20) && a + (15 << 20) <= d, || {
            format!("RmaVec of 16 MiB: {b} bytes in /dev/shm before, {d} while held, {a} after")
        })?;
    }
    // And the pool takes it again, backed.
    let again = weft::RmaVec::<u8>::from_slice(&w, &vec![2u8; 16 << 20])?;
    ck(again.in_pool() && again[(16 << 20) - 1] == 2, || "the pool after giving memory back".into())?;
    drop(again);
    w.barrier()?;

    // Team segments and team scratch: flat over 1000 teams.
    let segs = w.info().segments.len();
    let mut base = 0;
    let t0 = Instant::now();
    for i in 0..1000 {
        let t = w.world_team()?;
        let s = t.allreduce(&[1u64], weft::ReduceOp::Sum)?;
        ck(s[0] == n as u64, || format!("team {i}: sum {}", s[0]))?;
        if i % 100 == 0 {
            let ts = t.alloc_segment::<u8>(100_000)?;
            w.put(ts.at(next, 99_999), &[1u8])?;
            t.barrier()?;
        }
        drop(t);
        // The AM rings' pages fill in over the first few hundred teams (they are bounded).
        if i == 500 {
            base = common::rss_kib()?;
        }
    }
    let (now, after) = (w.info().segments.len(), common::rss_kib()?);
    ck(now == segs, || format!("{segs} segments before 1000 teams, {now} after"))?;
    // Over libfabric, staging and receive buffers (tens of MiB, registered at start-up) take
    // their pages at first touch, over some 100k messages: a slack for that.
    let slack = if w.info().fabric == "shm" { 512 } else { 2048 };
    ck(after <= base + slack, || {
        format!("resident memory {base} KiB after 500 teams, {after} KiB after 1000")
    })?;
    eprintln!("rank {me}: 1000 teams in {:.2?}, resident {base} -> {after} KiB", t0.elapsed());
    Ok(w.barrier()?)
}
