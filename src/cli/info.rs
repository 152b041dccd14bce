//! `weft info`: what a job of N ranks uses.

use super::bench::report::num;
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
    println!("progress thread   {:?}", info.progress);
    println!("AM ring size      {}", kib(cfg.rings.ring_bytes(cfg.size) as u64));
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
    if let Some(b) = info.shm_in_memory {
        println!("  in /dev/shm now: this rank's inbox and regions, as far as touched{:>12}", kib(b));
    }
}

/// What `threads` endpoints per rank hold under each category (created for real, then
/// closed), and what `Auto` measures and picks.
fn endpoint_table(world: &World, threads: usize) -> Result<Vec<weft::EndpointResources>, weft::Error> {
    let mut out = vec![];
    for policy in weft::EndpointPolicy::CATEGORIES.into_iter().chain([weft::EndpointPolicy::Auto]) {
        let set = world.endpoints(&weft::EndpointConfig::new(policy, threads))?;
        out.push(set.resources().clone());
        set.close()?;
    }
    Ok(out)
}

fn print_endpoints(table: &[weft::EndpointResources], ranks: u32) {
    let Some(first) = table.first() else { return };
    let kind = |r: &weft::EndpointResources| {
        r.slot_kind.clone().unwrap_or_else(|| format!("a ring to each of the {ranks} ranks"))
    };
    println!(
        "endpoints         {} per rank, postlist 32, 1 signaled completion per 64, inline ≤ 64 B; a slot is: {}",
        first.layout.threads,
        kind(first)
    );
    println!(
        "  {:<24} {:>8} {:>7} {:>5} {:>7} {:>12} {:>6} {:>10}",
        "category", "contexts", "slots", "idle", "queues", "completions", "locks", "memory"
    );
    for r in table {
        let name = match (&r.measured[..], r.layout.policy) {
            ([], p) => p.name().to_string(),
            (_, p) => format!("auto -> {}", p.name()),
        };
        println!(
            "  {:<24} {:>8} {:>7} {:>5} {:>7} {:>12} {:>6} {:>10}",
            name,
            r.layout.contexts,
            r.layout.slots(),
            r.layout.idle_slots(),
            r.layout.queues,
            r.layout.cqs,
            r.layout.locks(),
            kib(r.bytes)
        );
        if kind(r) != kind(first) {
            println!("    a slot is: {}", kind(r));
        }
        if let Some(why) = &r.fallback {
            println!("    (AMs on the default path: {why})");
        }
    }
    if let Some(auto) = table.iter().find(|r| !r.measured.is_empty()) {
        let rates: Vec<String> =
            auto.measured.iter().map(|(p, rate)| format!("{} {}", p.name(), num(rate / 1e6))).collect();
        println!("  auto measured (M puts/s, all threads at once): {}", rates.join(", "));
    }
}

/// One rank of `weft info`.
pub fn rank_main(segment_kib: usize, threads: usize) -> Result<(), weft::Error> {
    let world = World::init()?;
    let _seg = world.alloc_segment::<u8>(segment_kib * 1024)?;
    world.barrier()?;
    let table = endpoint_table(&world, threads)?;
    if world.rank() == 0 {
        print(&world.info(), world.config());
        print_endpoints(&table, world.size());
    }
    world.barrier()
}
