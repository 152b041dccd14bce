//! A token travels around the ring of ranks by one-sided puts: each rank waits for the token in
//! its own segment, then puts it (incremented) into the next rank's segment and raises a flag.
//! Run: `cargo run --release -- run -n 4 -- target/release/examples/ring_put`
use std::sync::atomic::Ordering;

fn main() -> Result<(), weft::Error> {
    let world = weft::World::init()?;
    let (me, n) = (world.rank(), world.size());
    // [0] = token, [1] = flag (lap number), on every rank.
    let seg = world.alloc_segment::<u64>(2)?;
    let next = (me + 1) % n;
    let laps = 3;
    for lap in 1..=laps {
        if !(me == 0 && lap == 1) {
            let flag = seg.local();
            let expect = if me == 0 { lap - 1 } else { lap };
            world.wait_until(|| flag.atomic(1).load(Ordering::Acquire) >= expect)?;
        }
        let token = seg.local().read(0) + 1;
        world.put(seg.at(next, 0), &[token])?;
        world.atomic_store(seg.at(next, 1), lap)?; // release: the token is visible first
    }
    world.barrier()?;
    if me == 0 {
        println!("token after {laps} laps of {n} ranks: {}", seg.local().read(0));
        assert_eq!(seg.local().read(0), laps * n as u64);
    }
    world.barrier()
}
