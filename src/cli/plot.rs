//! `weft plot FILE.json [--out DIR]`: PNG figures from `weft bench --json` output, like the
//! figures of Zambre et al.: message rate and resources against threads per endpoint
//! category, the features removed in turn, completion and buffer sharing; dgemm and stencil
//! per category beside their limits. Text is drawn with ab_glyph from a TrueType font on this
//! machine (DejaVu Sans, Debian package `fonts-dejavu-core`; `WEFT_PLOT_FONT` names another).

use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

type Series = BTreeMap<String, Vec<(f64, f64)>>;

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn load_font() -> Result<(), String> {
    let path = std::env::var("WEFT_PLOT_FONT")
        .ok()
        .or_else(|| FONTS.iter().find(|p| Path::new(p).exists()).map(|p| p.to_string()))
        .ok_or("no TrueType font found: install fonts-dejavu-core or set WEFT_PLOT_FONT")?;
    let bytes = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    // The font registry wants 'static bytes; one font for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{path}: not a usable font"))
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key)?.as_f64()
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The metric without its thread count (" T=4"), so rows of one configuration line up.
fn without_threads(metric: &str) -> String {
    let mut words: Vec<&str> = metric.split(' ').filter(|w| !w.starts_with("T=")).collect();
    words.retain(|w| !w.starts_with("n="));
    words.join(" ")
}

/// Groups `suite`'s rows into series named by `name` (None: skip), x from `x`, y from `y`.
fn collect(
    rows: &[Value],
    suite: &str,
    x: &str,
    y: impl Fn(&Value) -> Option<f64>,
    name: impl Fn(&Value) -> Option<String>,
) -> Series {
    let mut s = Series::new();
    for r in rows.iter().filter(|r| text(r, "suite") == suite) {
        if let (Some(n), Some(xv), Some(yv)) = (name(r), num(r, x), y(r)) {
            s.entry(n).or_default().push((xv, yv));
        }
    }
    for pts in s.values_mut() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    s
}

/// One series per endpoint category, plus the rows' limit (measured once per x) as `limit`.
fn by_category_with_limit(rows: &[Value], suite: &str, x: &str, limit: &str) -> Series {
    let mut s = collect(rows, suite, x, |r| num(r, "value"), |r| Some(text(r, "category").to_string()));
    let first = |r: &Value| (text(r, "category") == "dedicated").then(|| limit.to_string());
    s.extend(collect(rows, suite, x, |r| num(r, "limit"), first));
    s
}

/// Draws `series` as lines with markers, x on a log scale.
fn chart(path: &Path, title: &str, xdesc: &str, ydesc: &str, series: &Series) -> Result<(), String> {
    let pts = series.values().flatten();
    let (xmax, ymax) = pts.fold((1.0f64, 0.0f64), |(a, b), &(x, y)| (a.max(x), b.max(y)));
    if series.is_empty() {
        return Ok(());
    }
    // Label the x values that occur (thread or rank counts), not decades.
    let mut xs: Vec<f64> = series.values().flatten().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let e = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d((0.9f64..xmax * 1.15).log_scale().with_key_points(xs), 0.0..ymax * 1.1)
        .map_err(|x| e(&x))?;
    c.configure_mesh()
        .x_desc(xdesc)
        .y_desc(ydesc)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(|x| e(&x))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))
}

/// Renders every figure the rows allow into `out`; returns the files written.
pub fn plot(input: &Path, out: &Path) -> Result<Vec<PathBuf>, String> {
    let data = std::fs::read_to_string(input).map_err(|e| format!("{}: {e}", input.display()))?;
    let rows: Vec<Value> = data.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    load_font()?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let value = |r: &Value| num(r, "value");
    let kib = |r: &Value| num(r, "resource_bytes").map(|b| b / 1024.0);
    let plain = |op: &'static str| {
        move |r: &Value| {
            let m = without_threads(text(r, "metric"));
            (m == format!("{} {op} All", text(r, "category"))).then(|| text(r, "category").to_string())
        }
    };
    let mut figures: Vec<(&str, &str, &str, &str, Series)> = vec![
        (
            "msgrate-put8.png",
            "8 B puts: message rate by endpoint category",
            "threads",
            "million messages/s",
            collect(&rows, "msgrate", "threads", value, plain("put 8 B")),
        ),
        (
            "msgrate-am.png",
            "Short AMs: message rate by endpoint category",
            "threads",
            "million messages/s",
            collect(&rows, "msgrate", "threads", value, plain("short AM")),
        ),
        (
            "msgrate-resources.png",
            "Memory held by the endpoints of one rank",
            "threads",
            "KiB",
            collect(&rows, "msgrate", "threads", kib, plain("put 8 B")),
        ),
    ];
    let features = |r: &Value| {
        let m = without_threads(text(r, "metric"));
        let cat = text(r, "category");
        (["dynamic", "shared-dynamic", "shared"].contains(&cat)
            && m.starts_with(&format!("{cat} put 8 B "))
            && !m.contains("cq=")
            && !m.contains("buffers"))
        .then(|| format!("{cat}: {}", text(r, "feature")))
    };
    figures.push((
        "msgrate-features.png",
        "8 B puts with each feature removed",
        "threads",
        "million messages/s",
        collect(&rows, "msgrate", "threads", value, features),
    ));
    let sharing = |r: &Value| {
        let m = without_threads(text(r, "metric"));
        let named = [
            ("dynamic put 8 B All", "CQ per thread"),
            ("dynamic put 8 B All cq=PerPair", "CQ per pair"),
            ("dynamic put 8 B All cq=All", "one CQ"),
            ("dedicated put 8 B All", "buffers 128 B apart"),
            ("dedicated put 8 B All buffers on adjacent lines", "buffers on adjacent lines"),
            ("dedicated put 8 B All buffers packed", "buffers packed in lines"),
        ];
        named.iter().find(|(k, _)| *k == m).map(|(_, n)| n.to_string())
    };
    figures.push((
        "msgrate-sharing.png",
        "8 B puts: completion and buffer sharing",
        "threads",
        "million messages/s",
        collect(&rows, "msgrate", "threads", value, sharing),
    ));
    figures.push((
        "dgemm.png",
        "dgemm (global-array kernel) by endpoint category",
        "threads",
        "GFLOP/s",
        by_category_with_limit(&rows, "dgemm", "threads", "compute + local copies"),
    ));
    figures.push((
        "stencil.png",
        "5-point stencil, ranks x threads = P: time per iteration",
        "ranks (threads = P / ranks)",
        "microseconds per iteration",
        by_category_with_limit(&rows, "stencil", "ranks", "no exchange"),
    ));
    for (kind, file, title, y) in [
        ("startup", "scale-startup.png", "Start-up: init + barrier + exit, ranks of one node", "ms"),
        ("shm", "scale-shm.png", "/dev/shm per rank", "KiB"),
        ("rtt", "scale-rtt.png", "Round trip rank 0 - rank N-1", "microseconds"),
        ("barrier", "scale-barrier.png", "Barrier", "microseconds"),
        ("team_shm", "scale-team-shm.png", "/dev/shm per rank for a team of all ranks", "KiB"),
        ("team_barrier", "scale-team-barrier.png", "Barrier of a team of all ranks", "microseconds"),
    ] {
        let mine = |r: &Value| (text(r, "kind") == kind).then(|| "weft".to_string());
        let mut series = collect(&rows, "scale", "ranks", value, mine);
        let peer = |r: &Value| (text(r, "kind") == kind).then(|| text(r, "limit_name").to_string());
        series.extend(collect(&rows, "scale", "ranks", |r| num(r, "limit"), peer));
        figures.push((file, title, "ranks", y, series));
    }
    let mut written = vec![];
    for (file, title, x, y, s) in figures {
        if s.is_empty() {
            continue;
        }
        let path = out.join(file);
        chart(&path, title, x, y, &s)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_one_configuration_form_one_series() {
        let rows: Vec<Value> = [
            r#"{"suite":"msgrate","metric":"dynamic put 8 B T=1 All","category":"dynamic","threads":1,"value":20.0}"#,
            r#"{"suite":"msgrate","metric":"dynamic put 8 B T=2 All","category":"dynamic","threads":2,"value":38.0}"#,
            r#"{"suite":"msgrate","metric":"dynamic put 8 B T=2 w/o Postlist","category":"dynamic","threads":2,"value":9.0}"#,
            r#"{"suite":"am","metric":"dynamic put 8 B T=2 All","category":"dynamic","threads":2,"value":1.0}"#,
        ]
        .iter()
        .map(|s| serde_json::from_str(s).expect("json"))
        .collect();
        let s = collect(
            &rows,
            "msgrate",
            "threads",
            |r| num(r, "value"),
            |r| (without_threads(text(r, "metric")) == "dynamic put 8 B All").then(|| "dynamic".to_string()),
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s["dynamic"], vec![(1.0, 20.0), (2.0, 38.0)]);
        assert_eq!(without_threads("dedicated T=16 n=512"), "dedicated");
    }
}
