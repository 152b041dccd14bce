//! bale's histogram on a distributed array: every rank adds 1 at a million random places of a
//! table spread over the ranks; the adds for each rank travel packed in a few messages.
//!
//! Run: `cargo run --release -- run -n 4 -- target/release/examples/histogram`
use weft::AtomicArray;

fn main() -> Result<(), weft::Error> {
    let world = weft::World::init()?;
    let len = 100_000 * world.size() as usize;
    let table = AtomicArray::<u64>::new(&world, len)?;
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ world.rank() as u64;
    let picks = (0..1_000_000).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % len as u64) as usize
    });
    let t = std::time::Instant::now();
    table.batch_add(picks, 1)?.wait()?; // checked, aggregated, applied at the owners
    world.barrier()?;
    let took = t.elapsed();
    let total = table.sum()?;
    assert_eq!(total, 1_000_000 * world.size() as u64);
    if world.rank() == 0 {
        let s = weft::agg::Agg::get(&world)?.stats();
        println!("{total} updates in {took:?}; {:.0} per message on rank 0", s.mean_batch());
    }
    Ok(())
}
