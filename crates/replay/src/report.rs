//! What every scenario's report is laid out with: aligned tables, number formats, and the
//! histograms read from a gateway's Prometheus page.
//!
//! Each scenario computes its own figures (`scenarios/*/report.rs`) and lays its table out with
//! these, so every replay's tables read alike and a histogram is read one way.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Every `le` bucket of one histogram series on a Prometheus page, in order: the lines
/// `{series}le="BOUND"} COUNT`, where `series` is the metric's `_bucket` name, `{`, and the
/// labels before `le` (each followed by a comma).
pub(crate) fn histogram_buckets(page: &str, series: &str) -> Vec<(f64, u64)> {
    page.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(series)?.strip_prefix("le=\"")?;
            let (le, rest) = rest.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, rest.trim().parse().ok()?))
        })
        .collect()
}

/// The samples between two readings of one series of one process: `later - earlier` (all of
/// `later` when `earlier` had none yet); `None` when they cannot be differenced (the process
/// changed, so a count went down).
pub(crate) fn buckets_between(
    earlier: &[(f64, u64)],
    later: &[(f64, u64)],
) -> Option<Vec<(f64, u64)>> {
    if earlier.is_empty() {
        return Some(later.to_vec());
    }
    if earlier.len() != later.len() || earlier.iter().zip(later).any(|(e, l)| e.1 > l.1) {
        return None;
    }
    Some(
        later
            .iter()
            .zip(earlier)
            .map(|(l, e)| (l.0, l.1 - e.1))
            .collect(),
    )
}

/// The upper bound (ms) of the bucket holding quantile `q`, and the sample count.
pub(crate) fn quantile_ms(buckets: &[(f64, u64)], q: f64) -> (Option<f64>, u64) {
    let total = buckets.last().map_or(0, |b| b.1);
    if total == 0 {
        return (None, 0);
    }
    let rank = (q * total as f64).ceil() as u64;
    let bound = buckets.iter().find(|b| b.1 >= rank).map(|b| b.0 * 1000.0);
    (bound, total)
}

/// `rows` as aligned columns, two spaces apart; columns for which `left_aligned` is false are
/// right-aligned (numbers).
pub(crate) fn layout(rows: &[Vec<String>], left_aligned: impl Fn(usize) -> bool) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, String::len))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let _ = match (left_aligned(c), c == 0) {
                (true, true) => write!(line, "{cell:<w$}", w = widths[c]),
                (true, false) => write!(line, "  {cell:<w$}", w = widths[c]),
                (false, _) => write!(line, "  {cell:>w$}", w = widths[c]),
            };
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

pub(crate) fn error_list(errors: &BTreeMap<String, u64>) -> String {
    if errors.is_empty() {
        return "-".to_owned();
    }
    let parts: Vec<String> = errors.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    parts.join(" ")
}

pub(crate) fn latency(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

pub(crate) fn mebibytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub(crate) fn millis(ms: u128) -> String {
    humantime::format_duration(Duration::from_millis(ms as u64)).to_string()
}

pub(crate) fn trim_float(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}
