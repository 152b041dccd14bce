// Fetch-adds to rank 0, timed (built as an example of the weft package for the figures in
// README.md: copy to examples/, `cargo build --features cluster --example atomic_probe`).
use std::time::Instant;
fn main() -> Result<(), weft::Error> {
    let w = weft::World::init()?;
    let seg = w.alloc_segment::<u64>(4)?;
    w.barrier()?;
    for n in [10u32, 100, 1000] {
        let t = Instant::now();
        for _ in 0..n {
            w.fetch_add(seg.at(0, 0), 1)?;
        }
        let e = t.elapsed();
        println!("rank {} {n} fetch_adds to rank 0: {:?} each", w.rank(), e / n);
        w.barrier()?;
    }
    Ok(())
}
