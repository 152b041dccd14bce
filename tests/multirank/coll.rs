//! Teams and collectives against sequential references, channels, tuning.

use super::*;

/// Deterministic pseudo-random u64s (splitmix64) for collective tests.
pub(crate) fn random_u64s(seed: u64, len: usize) -> Vec<u64> {
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
pub(crate) fn check_collectives(team: &weft::Team, lens: &[usize]) -> Res {
    use weft::ReduceOp;
    let (n, me) = (team.size() as usize, team.rank() as usize);
    let who = |what: &str, len: usize| format!("team of {n}, rank {me}: {what} of {len} elements");
    for &len in lens {
        let data: Vec<Vec<u64>> =
            (0..n).map(|r| random_u64s(team.members()[r] as u64 * 7919 + len as u64, len)).collect();
        let mine = &data[me];
        for root in [0, n - 1] {
            let mut b = if me == root { data[root].clone() } else { vec![0; len] };
            team.broadcast(root as u32, &mut b)?;
            ck(b == data[root], || who(&format!("broadcast from {root}"), len))?;
        }
        let sum: Vec<u64> = (0..len).map(|i| data.iter().fold(0u64, |a, d| a.wrapping_add(d[i]))).collect();
        ck(team.allreduce(mine, ReduceOp::Sum)? == sum, || who("allreduce sum", len))?;
        let mut into = vec![7u64; len];
        team.allreduce_into(mine, &mut into, ReduceOp::Sum)?;
        ck(into == sum, || who("allreduce_into sum", len))?;
        let max: Vec<u64> = (0..len).map(|i| data.iter().map(|d| d[i]).max().unwrap_or(0)).collect();
        let got = team.reduce(n as u32 - 1, mine, ReduceOp::Max)?;
        ck(got == (me == n - 1).then(|| max.clone()), || who("reduce max", len))?;
        let xor = team.allreduce_with(mine, |a: &mut u64, b: &u64| *a ^= *b)?;
        ck(xor == (0..len).map(|i| data.iter().fold(0, |a, d| a ^ d[i])).collect::<Vec<_>>(), || {
            who("allreduce with a closure", len)
        })?;
        // Floating point: every member gets the same bits, run after run, close to the sum.
        let f: Vec<f64> = mine.iter().map(|&x| (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5).collect();
        let a = team.allreduce(&f, ReduceOp::Sum)?;
        let b = team.allreduce(&f, ReduceOp::Sum)?;
        ck(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), || who("reproducible f64 sum", len))?;
        // Into an output (the ring then reads the data in place): the same bits.
        let mut c = vec![1.5f64; len];
        team.allreduce_into(&f, &mut c, ReduceOp::Sum)?;
        ck(a.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()), || who("f64 sum into an output", len))?;
        let bits: Vec<u64> = a.iter().map(|x| x.to_bits()).collect();
        let everyone = team.allgather(&bits)?;
        ck(everyone.chunks(len.max(1)).take(if len == 0 { 0 } else { n }).all(|c| c == &bits[..]), || {
            who("identical f64 sums on all members", len)
        })?;
        let cat: Vec<u64> = data.concat();
        ck(team.gather(0, mine)? == (me == 0).then(|| cat.clone()), || who("gather", len))?;
        ck(everyone.len() == n * len, || who("allgather length", len))?;
        ck(team.allgather(mine)? == cat, || who("allgather", len))?;
        // Uneven counts: member r contributes r + len % 5 elements of its data.
        let counts: Vec<usize> = (0..n).map(|r| (r + len % 5).min(len)).collect();
        let v: Vec<u64> = (0..n).flat_map(|r| data[r][..counts[r]].to_vec()).collect();
        ck(team.allgatherv(&mine[..counts[me]], &counts)? == v, || who("allgatherv", len))?;
        let g = team.gatherv(n as u32 - 1, &mine[..counts[me]], &counts)?;
        ck(g == (me == n - 1).then(|| v.clone()), || who("gatherv", len))?;
        // Blocks of len / n: scatter from the last rank, alltoall, alltoallv.
        let block = len / n;
        let root_data = &data[n - 1][..block * n];
        let sc = team.scatter(n as u32 - 1, (me == n - 1).then_some(root_data), block)?;
        ck(sc == root_data[me * block..(me + 1) * block], || who("scatter", len))?;
        let a2a = team.alltoall(&mine[..block * n])?;
        let want: Vec<u64> = (0..n).flat_map(|r| data[r][me * block..(me + 1) * block].to_vec()).collect();
        ck(a2a == want, || who("alltoall", len))?;
        let mut into = vec![7u64; block * n];
        team.alltoall_into(&mine[..block * n], &mut into)?;
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
        ck(team.alltoallv(&send, &sc, &rc)? == want, || who("alltoallv", len))?;
        let ex = team.exscan(mine, ReduceOp::Sum)?;
        let want = (me > 0).then(|| {
            (0..len).map(|i| data[..me].iter().fold(0u64, |a, d| a.wrapping_add(d[i]))).collect::<Vec<_>>()
        });
        ck(ex == want, || who("exscan", len))?;
        check_nonblocking(team, &data, &sum, &cat)?;
        team.barrier()?;
    }
    Ok(())
}

/// Non-blocking collectives: several in flight at once, waited on in reverse order, tested,
/// awaited, and one dropped unwaited; each against the sequential reference.
pub(crate) fn check_nonblocking(team: &weft::Team, data: &[Vec<u64>], sum: &[u64], cat: &[u64]) -> Res {
    use weft::ReduceOp;
    let (n, me, len) = (team.size() as usize, team.rank() as usize, data[0].len());
    let who = |what: &str| format!("team of {n}, rank {me}: non-blocking {what} of {len} elements");
    let mine = data[me].clone();
    let bar = team.barrier_nb()?;
    let red = team.allreduce_nb(mine.clone(), ReduceOp::Sum)?;
    let root = (n - 1) as u32;
    let bc = team.broadcast_nb(root, if me == n - 1 { mine.clone() } else { vec![0; len] })?;
    let mut ag = team.allgatherv_nb(mine.clone(), vec![len; n])?;
    let dropped = team.exscan_nb(mine.clone(), ReduceOp::Max)?;
    drop(dropped);
    let block = len / n;
    let a2a = team.alltoall_nb(mine[..block * n].to_vec())?;
    let want: Vec<u64> = (0..n).flat_map(|r| data[r][me * block..(me + 1) * block].to_vec()).collect();
    ck(a2a.wait()? == want, || who("alltoall"))?;
    while !ag.test()? {}
    ck(ag.wait()? == cat, || who("allgather"))?;
    ck(weft::block_on(bc)? == data[n - 1], || who("broadcast"))?;
    ck(red.wait()? == sum, || who("allreduce"))?;
    bar.wait()?;
    // Members may mix a collective's blocking and non-blocking forms: the small blocking ones
    // take a path without a future, with the same messages.
    let sum_mixed = if me == 0 {
        team.allreduce(&mine, ReduceOp::Sum)?
    } else {
        team.allreduce_nb(mine.clone(), ReduceOp::Sum)?.wait()?
    };
    ck(sum_mixed == sum, || who("allreduce, blocking on rank 0 only"))?;
    let a2a_mixed = if me == 0 {
        team.alltoall(&mine[..block * n])?
    } else {
        team.alltoall_nb(mine[..block * n].to_vec())?.wait()?
    };
    ck(a2a_mixed == want, || who("alltoall, blocking on rank 0 only"))?;
    // The forms with equal counts and user combinations, in flight together.
    let g = team.gather_nb(root, mine.clone())?;
    let ag = team.allgather_nb(mine.clone())?;
    let r = team.reduce_with_nb(0, mine.clone(), |a: &mut u64, b: &u64| *a = a.wrapping_add(*b))?;
    let ex = team.exscan_with_nb(mine.clone(), |a: &mut u64, b: &u64| *a = a.wrapping_add(*b))?;
    let ex_want = (me > 0).then(|| {
        (0..len).map(|i| (0..me).fold(0u64, |acc, r| acc.wrapping_add(data[r][i]))).collect::<Vec<u64>>()
    });
    ck(ex.wait()? == ex_want, || who("exscan_with"))?;
    ck(r.wait()? == (me == 0).then(|| sum.to_vec()), || who("reduce_with"))?;
    ck(ag.wait()? == cat, || who("allgather (equal counts)"))?;
    ck(g.wait()? == (me == n - 1).then(|| cat.to_vec()), || who("gather"))?;
    // A blocking collective after non-blocking ones runs after them, on every member.
    let g = team.gather(0, &mine)?;
    ck(g == (me == 0).then(|| cat.to_vec()), || who("gather after non-blocking ones"))
}

/// Teams of every size from 1 to the world's (world, colour split, strided subset, nested),
/// every collective against a sequential reference, and a parameter mismatch reported.
/// Team channels send ahead: rank 0 broadcasts eight 1 KiB messages while rank 1 sleeps (they
/// fit sub-slots and must not wait), then one through the whole slot, then eight more, which
/// must wait until rank 1 (asleep again) has read the big one instead of overwriting it.
pub(crate) fn channel_send_ahead() -> Res {
    let w = World::init()?;
    let team = w.world_team()?;
    let small: Vec<Vec<u64>> = (0..16).map(|k| random_u64s(k + 10, 128)).collect();
    let big = random_u64s(3, 100_000 / 8);
    let nap = Duration::from_millis(400);
    if w.rank() == 0 {
        let t = Instant::now();
        for s in &small[..8] {
            team.broadcast(0, &mut s.clone())?;
        }
        let ahead = t.elapsed();
        ck(ahead < nap / 2, || format!("eight small broadcasts took {ahead:?}: no send-ahead"))?;
        team.broadcast(0, &mut big.clone())?;
        for s in &small[8..] {
            team.broadcast(0, &mut s.clone())?;
        }
    } else {
        std::thread::sleep(nap);
        for (k, s) in small[..8].iter().enumerate() {
            let mut got = vec![0; s.len()];
            team.broadcast(0, &mut got)?;
            ck(&got == s, || format!("small message {k}"))?;
        }
        std::thread::sleep(nap);
        let mut got = vec![0; big.len()];
        team.broadcast(0, &mut got)?;
        ck(got == big, || "the whole-slot message was overwritten".into())?;
        for (k, s) in small[8..].iter().enumerate() {
            let mut got = vec![0; s.len()];
            team.broadcast(0, &mut got)?;
            ck(&got == s, || format!("small message {}", k + 8))?;
        }
    }
    team.barrier().map_err(Failure::from)
}

/// Small broadcasts (a flag line or a sub-slot each) back to back, more of them than a sender
/// may be ahead (32 lines, 8 sub-slots per source): the root sends what fits at once and waits for the rest,
/// while the others sleep first. Roots change, lengths up to a full line, a non-blocking
/// collective in between (it must be finished first), and every value checked in order.
pub(crate) fn small_broadcasts_back_to_back() -> Res {
    let w = World::init()?;
    let team = w.world_team()?;
    let (me, n) = (team.rank() as usize, team.size() as usize);
    // Up to 12 words in a flag line; 64 and 500 words through sub-slots (8 per source).
    for (round, len) in [(0u64, 1usize), (1, 12), (2, 0), (3, 5), (4, 64), (5, 500)] {
        let root = (round as usize) % n;
        let msgs: Vec<Vec<u64>> = (0..100).map(|k| random_u64s(round * 1000 + k, len)).collect();
        if me != root {
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut bar = team.barrier_nb()?;
        for (k, m) in msgs.iter().enumerate() {
            let mut b = if me == root { m.clone() } else { vec![u64::MAX; len] };
            team.broadcast(root as u32, &mut b)?;
            ck(&b == m, || format!("rank {me}, round {round}: broadcast {k} of {len} words from {root}"))?;
        }
        ck(bar.test()?, || "a non-blocking barrier called first is not done".into())?;
    }
    team.barrier().map_err(Failure::from)
}

/// Collectives whose data lies in registered memory (an `RmaVec`, from the world's pool
/// segment): long messages are read through the receivers' mappings of the senders' parts.
/// Also a root buffer in a segment that only some receivers hold: those get the data
/// another way. Every result against the reference.
pub(crate) fn collectives_on_segments() -> Res {
    let w = World::init()?;
    let team = w.world_team()?;
    let (me, n) = (team.rank() as usize, team.size() as usize);
    for block in [5_000usize, 70_000] {
        // alltoall: 40 KB and 560 KB blocks, from registered memory into a Vec.
        let mine: Vec<u64> = (0..n * block).map(|i| (me * 1_000_000 + i) as u64).collect();
        let data = weft::RmaVec::from_slice(&w, &mine)?;
        let mut out = vec![0u64; n * block];
        team.alltoall_into(&data, &mut out)?;
        let want: Vec<u64> =
            (0..n).flat_map(|r| (0..block).map(move |i| (r * 1_000_000 + me * block + i) as u64)).collect();
        ck(out == want, || format!("rank {me}: alltoall of {block}-word blocks from an RmaVec"))?;
        // broadcast from the last rank, in place in registered memory on every rank.
        let root = n - 1;
        let src: Vec<u64> = (0..block).map(|i| (i * 3 + 7) as u64).collect();
        let init = if me == root { src.clone() } else { vec![0; block] };
        let mut buf = weft::RmaVec::from_slice(&w, &init)?;
        team.broadcast(root as u32, &mut buf)?;
        ck(buf[..] == src[..], || format!("rank {me}: broadcast of {block} words in an RmaVec"))?;
        // allreduce (a ring above the small limit) reading from registered memory.
        let sum = team.allreduce(&data[..block], weft::ReduceOp::Sum)?;
        let want: Vec<u64> = (0..block).map(|i| (0..n).map(|r| (r * 1_000_000 + i) as u64).sum()).collect();
        ck(sum == want, || format!("rank {me}: allreduce of {block} words from an RmaVec"))?;
    }
    // Rank 0's buffer in a segment of the even ranks only: the odd ones cannot map it.
    let evens = team.subset(0, 2, n.div_ceil(2) as u32)?;
    let seg = match &evens {
        Some(t) => Some(t.alloc_segment::<u64>(50_000)?),
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
        team.broadcast(0, part)?;
        got.copy_from_slice(part);
    } else {
        team.broadcast(0, &mut got)?;
    }
    ck(got == src, || format!("rank {me}: broadcast from a segment of the even ranks"))?;
    team.barrier().map_err(Failure::from)
}

/// Collectives of 160 KiB and 1 MiB called again and again: the team's tuner tries both ways
/// of moving them (slots, direct read), then keeps the faster and explores the other.
pub(crate) fn collectives_tuned() -> Res {
    let w = World::init()?;
    let world = w.world_team()?;
    for _ in 0..3 {
        check_collectives(&world, &[20_000, 1 << 17])?;
    }
    Ok(())
}

pub(crate) fn teams_and_collectives() -> Res {
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let world = w.world_team()?;
    ck(world.size() == n && world.rank() == me, || "world team".into())?;
    // Element counts from none to 4 MiB (8-byte elements), crossing the 256 KiB chunk size.
    check_collectives(&world, &[0, 1, 5, 1000, 40_000, 1 << 19])?;
    // Rank 0 alone, the others together (sizes 1 and n - 1), ordered by descending world rank.
    let split = world.split(Some((me != 0) as u32), n - me)?.ok_or("no team")?;
    let want: Vec<u32> = if me == 0 { vec![0] } else { (1..n).rev().collect() };
    ck(split.members() == want, || format!("split members {:?}, want {want:?}", split.members()))?;
    ck(split.team_rank(me) == Some(split.rank()), || "team rank translation".into())?;
    check_collectives(&split, &[0, 3, 70_000])?;
    // Every second rank, then a nested split of that team.
    let sub = world.subset(0, 2, n.div_ceil(2))?;
    ck(sub.is_some() == (me % 2 == 0), || "subset membership".into())?;
    if let Some(sub) = &sub {
        check_collectives(sub, &[2, 33_000])?;
        let nested = sub.split(Some(0), 0)?.ok_or("nested")?;
        ck(nested.members() == sub.members(), || "nested split".into())?;
        check_collectives(&nested, &[9])?;
        // A team segment is held by the members only.
        let seg = sub.alloc_segment::<u64>(16)?;
        let next = sub.members()[(sub.rank() as usize + 1) % sub.size() as usize];
        w.put(seg.at(next, 1), &[me as u64 + 100])?;
        sub.barrier()?;
        let prev = sub.members()[(sub.rank() as usize + sub.size() as usize - 1) % sub.size() as usize];
        ck(seg.local().read(1) == prev as u64 + 100, || "team segment put".into())?;
        if n > 1 {
            let outsider = 1; // odd: not a member
            ck(matches!(w.put(seg.at(outsider, 0), &[1]), Err(Error::NotMember { .. })), || {
                "put to a non-member of a team segment".into()
            })?;
        }
    }
    w.barrier()?;
    // World segments still line up after team segments moved some ranks' ids ahead.
    let seg = w.alloc_segment::<u64>(4)?;
    w.put(seg.at((me + 1) % n, 0), &[me as u64])?;
    w.barrier()?;
    ck(seg.local().read(0) == ((me + n - 1) % n) as u64, || "world segment after team segments".into())?;
    // A member that disagrees on a broadcast's length reports it: within the flag lines (80
    // against 88 bytes), and across the packed records and the lines (8 against 16, 16
    // against 8), each on a fresh team. The others may have finished their part (rank 1 is a
    // leaf of the tree from 0); the team is unusable on every member afterwards.
    if n > 1 {
        for (theirs, mine) in [(80, 88), (8, 16), (16, 8), (0, 1)] {
            let t = w.world_team()?;
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
    w.barrier().map_err(Failure::from)
}

// ---------------------------------------------------------------- driver
