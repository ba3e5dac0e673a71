//! The page of a replay's `--out` directory: the pictures side by side, naive against
//! protected, then the table, then what each line means.
//!
//! It must open from the disk, anywhere, years later: one HTML file with its style inline and no
//! script, font or stylesheet from anywhere else; the pictures are the SVG files beside it,
//! referenced by their names.

use std::fmt::Write as _;

use crate::plan::Mode;
use crate::timeline::{CLIENT_REQUESTS, OFFERED, RSS, SHED, SUCCEEDED, UPSTREAM};

/// One picture on the page.
#[derive(Debug, Clone)]
pub(crate) struct Picture {
    pub(crate) mode: Mode,
    /// The SVG's file name, beside the page.
    pub(crate) file: String,
    pub(crate) width: u32,
    pub(crate) height: u32,
    /// What the store line counts, or why there is none.
    pub(crate) store: String,
}

/// What the page shows.
pub(crate) struct Page<'a> {
    pub(crate) scenario: &'a str,
    /// The replay's table as printed, if any mode completed.
    pub(crate) table: Option<&'a str>,
    pub(crate) pictures: &'a [Picture],
    /// The modes that did not complete, with why.
    pub(crate) failures: &'a [(Mode, String)],
}

const STYLE: &str = "\
body { font-family: sans-serif; margin: 16px 20px; color: #222; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 17px; margin: 22px 0 8px; }
p.summary { margin: 0 0 14px; max-width: 90em; }
div.pictures { display: grid; grid-template-columns: repeat(var(--columns), minmax(0, 1fr)); gap: 14px; }
figure { margin: 0; }
figcaption { font-weight: bold; margin-bottom: 4px; }
figure img { width: 100%; height: auto; border: 1px solid #ccc; }
pre { font-size: 12px; background: #f6f6f6; padding: 10px; overflow-x: auto; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; }
dt { font-weight: bold; }
dd { margin: 0; }
p.failed { color: #a00; }
";

/// The page as HTML.
pub(crate) fn html(page: &Page<'_>) -> String {
    let scenario = escape(page.scenario);
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>spillway replay {scenario}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <h1>spillway replay {scenario}</h1>\n"
    );
    if let Some(summary) = page.table.and_then(|t| t.lines().next()) {
        let _ = writeln!(out, "<p class=\"summary\">{}</p>", escape(summary));
    }
    let _ = writeln!(
        out,
        "<div class=\"pictures\" style=\"--columns: {}\">",
        page.pictures.len().max(1)
    );
    for p in page.pictures {
        let _ = writeln!(
            out,
            "<figure><figcaption>{mode} gateway</figcaption>\
             <img src=\"{file}\" width=\"{w}\" height=\"{h}\" \
             alt=\"{scenario}, {mode} gateway: requests per second, RSS and store queries over time\">\
             </figure>",
            mode = p.mode,
            file = escape(&p.file),
            w = p.width,
            h = p.height,
        );
    }
    out += "</div>\n";
    for (mode, why) in page.failures {
        let _ = writeln!(
            out,
            "<p class=\"failed\">The {mode} run did not complete: {}</p>",
            escape(why)
        );
    }
    if let Some(table) = page.table {
        // The table's first line is the summary above the pictures.
        let rows = table.split_once('\n').map_or("", |(_, rest)| rest);
        let _ = write!(
            out,
            "<h2>Per phase</h2>\n<pre>{}</pre>\n",
            escape(rows.trim_matches('\n').trim_end())
        );
    }
    out += &legend(page.pictures);
    out += "</body>\n</html>\n";
    out
}

/// What each line of the pictures is, and where it was measured.
fn legend(pictures: &[Picture]) -> String {
    let mut out = String::from("<h2>Reading the pictures</h2>\n<dl>\n");
    let mut item = |name: &str, meaning: &str| {
        let _ = writeln!(out, "<dt>{}</dt><dd>{}</dd>", escape(name), escape(meaning));
    };
    item(
        OFFERED,
        "new requests the callers offered per second (started or dropped), counted by the \
         replay's load client when it offered them",
    );
    item(
        CLIENT_REQUESTS,
        "HTTP requests the callers sent per second, their immediate resends included, when \
         they were sent",
    );
    item(
        UPSTREAM,
        "attempts the gateway sent to its backends per second \
         (spillway_upstream_attempts_total on its /metrics, read every point)",
    );
    item(
        SUCCEEDED,
        "2xx answers the callers received per second, when they arrived",
    );
    item(
        SHED,
        "requests the gateway refused itself per second, before any backend: answered 429 or \
         503 with backend=\"none\" in spillway_requests_total",
    );
    item(
        RSS,
        "the gateway's resident memory (spillway_process_resident_memory_bytes), MiB",
    );
    for p in pictures {
        item(&format!("store ({} run)", p.mode), &p.store);
    }
    out += "</dl>\n<p>The modes share their axes, so the same height is the same rate in both. \
            A gap in a line is a point at which the gateway's /metrics did not answer (a \
            restart, say); a rate of zero is drawn on the floor of the log scale.</p>\n";
    out
}

/// `text` with the characters HTML gives a meaning escaped.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picture(mode: Mode) -> Picture {
        Picture {
            mode,
            file: format!("{mode}.svg"),
            width: 960,
            height: 780,
            store: "store queries (gateway)".to_owned(),
        }
    }

    #[test]
    fn the_page_shows_every_picture_the_table_and_the_failures_and_loads_nothing_else() {
        let pictures = [picture(Mode::Naive), picture(Mode::Protected)];
        let failures = [(Mode::Naive, "gateway <exited>".to_owned())];
        let html = html(&Page {
            scenario: "retry-storm",
            table: Some("retry-storm (IL-0248): a & b\n\nphase  gateway\nfault  <naive>\n"),
            pictures: &pictures,
            failures: &failures,
        });
        assert!(html.contains("<img src=\"naive.svg\""), "{html}");
        assert!(html.contains("<img src=\"protected.svg\""), "{html}");
        assert!(html.find("naive.svg") < html.find("protected.svg"));
        assert!(html.contains("--columns: 2"), "{html}");
        assert!(html.contains("<p class=\"summary\">retry-storm (IL-0248): a &amp; b</p>"));
        assert!(
            html.contains("<pre>phase  gateway\nfault  &lt;naive&gt;</pre>"),
            "{html}"
        );
        assert!(
            html.contains("did not complete: gateway &lt;exited&gt;"),
            "{html}"
        );
        for outside in ["<script", "<link", "http://", "https://", "@import", "url("] {
            assert!(!html.contains(outside), "{outside} in {html}");
        }
    }
}
