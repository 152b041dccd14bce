//! Benchmark rows: a human table (each figure beside its limit and the ratio) or JSON lines.

use serde::Serialize;
use std::io::IsTerminal;

/// One measured figure.
#[derive(Serialize, Clone, Debug)]
pub struct Row {
    pub suite: &'static str,
    pub metric: String,
    pub bytes: u64,
    pub value: f64,
    pub unit: &'static str,
    /// The machine limit (or peer) measured in the same run, in the same unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// What the limit is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_name: Option<&'static str>,
    /// value / limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Further keys of the JSON object (a suite's own details).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
}

impl Row {
    pub fn new(
        suite: &'static str,
        metric: impl Into<String>,
        bytes: u64,
        value: f64,
        unit: &'static str,
    ) -> Row {
        Row {
            suite,
            metric: metric.into(),
            bytes,
            value,
            unit,
            limit: None,
            limit_name: None,
            ratio: None,
            extra: None,
        }
    }
    /// Adds what a point's endpoints held (category, counts, bytes) and the suite's own
    /// `details` (a JSON object) to the row's JSON.
    pub fn with_resources(mut self, res: &weft::EndpointResources, details: serde_json::Value) -> Row {
        let l = &res.layout;
        let mut extra = serde_json::json!({
            "category": l.policy.name(),
            "contexts": l.contexts, "slots": l.slots(), "idle_slots": l.idle_slots(),
            "queues": l.queues, "completions": l.cqs, "locks": l.locks(),
            "resource_bytes": res.bytes,
        });
        if let (Some(all), serde_json::Value::Object(more)) = (extra.as_object_mut(), details) {
            all.extend(more);
        }
        self.extra = Some(extra);
        self
    }
    pub fn vs(mut self, limit_name: &'static str, limit: f64) -> Row {
        self.limit = Some(limit);
        self.limit_name = Some(limit_name);
        self.ratio = (limit > 0.0).then(|| self.value / limit);
        self
    }
}

pub fn size_name(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

pub fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

pub fn print_table(rows: &[Row]) {
    let mut suite = "";
    for r in rows {
        if r.suite != suite {
            suite = r.suite;
            println!("\n== {suite} ==");
            println!(
                "{:<34} {:>8} {:>12} {:<6} {:>12}  {:<26} {:>7}",
                "metric", "size", "weft", "unit", "limit", "limit is", "ratio"
            );
        }
        let size = if r.bytes > 0 || r.metric.contains("B ") { size_name(r.bytes) } else { "-".into() };
        println!(
            "{:<34} {:>8} {:>12} {:<6} {:>12}  {:<26} {:>7}",
            r.metric,
            size,
            num(r.value),
            r.unit,
            r.limit.map(num).unwrap_or_default(),
            r.limit_name.unwrap_or(""),
            r.ratio.map(|x| format!("{x:.2}x")).unwrap_or_default()
        );
    }
}

pub fn print_json(rows: &[Row]) {
    for r in rows {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
    }
}

/// Progress notes on a terminal (stderr), silent otherwise or with --json.
pub struct Progress {
    on: bool,
}

impl Progress {
    pub fn new(json: bool, rank: u32) -> Self {
        Progress { on: !json && rank == 0 && std::io::stderr().is_terminal() }
    }
    pub fn note(&self, what: &str) {
        if self.on {
            eprint!("\r\x1b[2K  measuring {what} ...");
        }
    }
    pub fn done(&self) {
        if self.on {
            eprint!("\r\x1b[2K");
        }
    }
}

/// Median of a few repetitions (noise on shared machines is one-sided: take the middle).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// ns per call of `f`: the median of `runs` runs of `reps` calls each (the first error ends
/// the measurement). Infallible work uses `E = Infallible` and `let Ok(ns) = …`.
pub fn ns_per_op<E>(runs: usize, reps: u64, mut f: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = weft::fabric::os::now_ns();
        for _ in 0..reps {
            f()?;
        }
        samples.push((weft::fabric::os::now_ns() - t) as f64 / reps as f64);
    }
    Ok(median(samples))
}
