//! `weft info`: what a job of N ranks uses.

use weft::{Info, World};

fn kib(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

fn print(info: &Info, cfg: &weft::Config) {
    println!("fabric            {}", info.fabric);
    println!("ranks             {} (this is rank {})", info.size, info.rank);
    let c = info.caps;
    println!(
        "capabilities      rma={} atomics={} load/store={} max AM args={} max medium={} B",
        c.rma, c.atomics, c.load_store, c.am_max_args, c.am_max_medium
    );
    println!("RMA and atomics   {}", if info.rma_over_am { "over active messages" } else { "native" });
    println!("progress thread   {}", if info.progress_thread { "yes" } else { "no" });
    println!("AM ring size      {}", kib(cfg.ring_bytes as u64));
    println!("wait policy       spin {:?}, then yield 1 ms, then sleep on the doorbell (≤ 2 ms)", cfg.spin);
    println!("AM handlers       {}", info.handlers.join(", "));
    println!("segments          {}", info.segments.len());
    for (id, bytes) in &info.segments {
        println!("  segment {id:<6}  {} on each rank", kib(*bytes as u64));
    }
    println!("resources of rank {}:", info.rank);
    let mut total = 0;
    for r in &info.resources {
        println!("  {:>4} × {:<58} {:>10}", r.count, r.kind, kib(r.bytes));
        total += r.bytes;
    }
    println!("  total{:>71}", kib(total));
}

/// One rank of `weft info`.
pub fn rank_main(segment_kib: usize) -> Result<(), weft::Error> {
    let world = World::init()?;
    let _seg = world.alloc_segment::<u8>(segment_kib * 1024)?;
    world.barrier()?;
    if world.rank() == 0 {
        print(&world.info(), world.config());
    }
    world.barrier()
}
