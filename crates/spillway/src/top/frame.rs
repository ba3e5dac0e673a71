//! One frame of `spillway top` as lines of text: a header with the amplification ratio and the
//! totals, then the tenants (sorted by who drives the load), the models and the backends, each
//! table in fixed-width columns, every line cut to the terminal's width and the tenants to its
//! height. Pure, so the widths are tested with injected views.

use super::rates::{Counter, View};

/// A column: its heading, width, and whether text is aligned left (names) or right (numbers).
struct Column {
    heading: &'static str,
    width: usize,
    left: bool,
}

const fn left(heading: &'static str, width: usize) -> Column {
    Column {
        heading,
        width,
        left: true,
    }
}

const fn right(heading: &'static str, width: usize) -> Column {
    Column {
        heading,
        width,
        left: false,
    }
}

const TENANTS: [Column; 10] = [
    left("TENANT", 16),
    right("OFFERED/s", 10),
    right("ADMITTED/s", 10),
    right("SHED/s", 8),
    right("QUEUED", 7),
    right("UPSTREAM/s", 10),
    right("AMPL", 7),
    right("CALLER-RETRY/s", 14),
    right("UP-RETRY/s", 10),
    left("SHED BY REASON", 0),
];

const MODELS: [Column; 6] = [
    left("MODEL", 16),
    right("OFFERED/s", 10),
    right("UPSTREAM/s", 10),
    right("UP-RETRY/s", 10),
    right("AMPL", 7),
    right("AMPL-ALL", 9),
];

const BACKENDS: [Column; 10] = [
    left("MODEL", 16),
    left("BACKEND", 16),
    left("REGION", 10),
    left("STATE", 8),
    right("OUT", 5),
    right("LIMIT", 6),
    right("MAX", 6),
    left("ENGINE", 6),
    right("RUNNING", 8),
    right("WAITING", 8),
];

/// The fewest rows the tenants' table keeps on a short terminal (the last one may say how many
/// more there are).
const MIN_TENANT_ROWS: usize = 5;

/// Lines no wider than `width`; with `height`, the tenants' table is cut so the frame fits.
pub fn render(v: &View, width: usize, height: Option<usize>) -> Vec<String> {
    let rates = match v.interval_seconds {
        Some(s) => format!("rates over {s:.1}s"),
        None => "rates from the next read".to_owned(),
    };
    let mut lines = vec![
        format!(
            "spillway top  {}  up {}  {rates}  amplification {} (since start {})",
            v.admin_url,
            uptime(v.uptime_seconds),
            ratio(v.amplification),
            ratio(v.amplification_since_start),
        ),
        format!(
            "per second: offered {}  admitted {}  shed {}  upstream {} (retries {})  callers' retries {}  queued now {}",
            rate(v.totals.offered),
            rate(v.totals.admitted),
            rate(v.totals.shed),
            rate(v.totals.upstream_attempts),
            rate(v.totals.upstream_retries),
            rate(v.totals.client_retries),
            v.totals.queued,
        ),
        String::new(),
        row(&TENANTS, TENANTS.iter().map(|c| c.heading.to_owned()).collect()),
    ];
    let mut tenants: Vec<String> = v
        .tenants
        .iter()
        .map(|t| {
            row(
                &TENANTS,
                vec![
                    t.tenant.clone(),
                    rate(t.offered),
                    rate(t.admitted),
                    rate(t.shed_total),
                    t.queued.to_string(),
                    rate(t.upstream_attempts),
                    ratio(t.amplification),
                    rate(t.client_retries),
                    rate(t.upstream_retries),
                    shed_reasons(t),
                ],
            )
        })
        .collect();
    let mut rest = vec![
        String::new(),
        row(
            &MODELS,
            MODELS.iter().map(|c| c.heading.to_owned()).collect(),
        ),
    ];
    rest.extend(v.models.iter().map(|m| {
        row(
            &MODELS,
            vec![
                m.model.clone(),
                rate(m.offered),
                rate(m.upstream_attempts),
                rate(m.upstream_retries),
                ratio(m.amplification),
                ratio(m.amplification_since_start),
            ],
        )
    }));
    rest.push(String::new());
    rest.push(row(
        &BACKENDS,
        BACKENDS.iter().map(|c| c.heading.to_owned()).collect(),
    ));
    let or_dash = |n: Option<u32>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    rest.extend(v.backends.iter().map(|b| {
        row(
            &BACKENDS,
            vec![
                b.model.clone(),
                b.backend.clone(),
                b.region.clone(),
                b.state.clone(),
                b.outstanding.to_string(),
                b.limit.to_string(),
                b.max_concurrency.to_string(),
                b.engine.clone(),
                or_dash(b.engine_running),
                or_dash(b.engine_waiting),
            ],
        )
    }));
    if let Some(height) = height {
        // The tenants give way to the models and backends below them, the last ones first (the
        // ones driving the load are at the top), but only down to a few: on a terminal too
        // short for those, the tables below are cut instead.
        let room = height
            .saturating_sub(lines.len() + rest.len())
            .max(MIN_TENANT_ROWS);
        if tenants.len() > room {
            // At least two are hidden: the line saying so takes the place of one.
            let hidden = tenants.len() + 1 - room;
            tenants.truncate(room - 1);
            tenants.push(format!("... {hidden} more tenants"));
        }
    }
    lines.extend(tenants);
    lines.extend(rest);
    if let Some(height) = height {
        lines.truncate(height);
    }
    lines.into_iter().map(|l| fit(&l, width)).collect()
}

/// The cells of one row in their columns, one space apart; the last column takes the rest.
fn row(columns: &[Column], cells: Vec<String>) -> String {
    let mut line = String::new();
    for (i, (c, text)) in columns.iter().zip(cells).enumerate() {
        if i > 0 {
            line.push(' ');
        }
        if c.width == 0 {
            line.push_str(&text);
            continue;
        }
        let text = fit(&text, c.width);
        let pad = " ".repeat(c.width - text.chars().count());
        if c.left {
            line.push_str(&text);
            line.push_str(&pad);
        } else {
            line.push_str(&pad);
            line.push_str(&text);
        }
    }
    line.trim_end().to_owned()
}

/// `text` cut to `width` characters, its last one `~` when cut.
pub fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        cut.push('~');
    }
    cut
}

/// The tenant's refusals by reason, the largest first: rates, or totals with one read.
fn shed_reasons(t: &super::rates::TenantRow) -> String {
    let mut reasons: Vec<(&String, &Counter)> =
        t.shed.iter().filter(|(_, c)| c.total > 0).collect();
    let key = |c: &Counter| c.per_second.unwrap_or(c.total as f64);
    reasons.sort_by(|a, b| key(b.1).total_cmp(&key(a.1)).then_with(|| a.0.cmp(b.0)));
    reasons
        .iter()
        .filter(|(_, c)| key(c) > 0.0)
        .map(|(why, c)| match c.per_second {
            Some(_) => format!("{why} {}", rate(**c)),
            None => format!("{why} {}", c.total),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A rate per second, short: `-` without one.
pub fn rate(c: Counter) -> String {
    match c.per_second {
        None => "-".to_owned(),
        Some(0.0) => "0".to_owned(),
        Some(x) if x < 10.0 => format!("{x:.1}"),
        Some(x) if x < 10_000.0 => format!("{x:.0}"),
        Some(x) if x < 10_000_000.0 => format!("{:.1}k", x / 1000.0),
        Some(x) => format!("{:.1}M", x / 1_000_000.0),
    }
}

/// An amplification ratio: `1.05x`, or `-` when nothing was offered.
pub fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"))
}

/// An uptime, in its two largest units: `45s`, `3m05s`, `2h07m`, `3d04h`.
pub fn uptime(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests;
