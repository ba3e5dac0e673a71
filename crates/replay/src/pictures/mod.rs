//! `--out DIR`: a replay's pictures, an SVG timeline per mode and one `index.html` showing
//! them side by side with the table.
//!
//! A table of per-phase figures says how much; a picture says when, and how fast things
//! turned: the outage's first second, the store storm right after a flush, the memory that
//! climbed and stayed. The page is made to be opened from the disk and read without the replay
//! that made it ([`page`]); the pictures are drawn by [`chart`] from the modes' timelines.

mod chart;
mod page;

use std::io;
use std::path::{Path, PathBuf};

use crate::error::ReplayError;
use crate::plan::Mode;
use crate::timeline::Timeline;
use chart::Scale;
use page::{Page, Picture};

/// The page's file name in the directory.
pub(crate) const INDEX: &str = "index.html";

/// Creates `dir` if it is missing, so that a directory that cannot be made fails the replay
/// before anything starts rather than after every mode has run.
pub(crate) fn prepare(dir: &Path) -> Result<(), ReplayError> {
    std::fs::create_dir_all(dir).map_err(|source| ReplayError::Output {
        path: dir.to_owned(),
        source,
    })
}

/// Writes `{mode}.svg` for each of `timelines` and `index.html` into `dir`, naive first;
/// returns the files written, the page last.
pub(crate) fn write(
    dir: &Path,
    scenario: &str,
    table: Option<&str>,
    timelines: &[Timeline],
    failures: &[(Mode, String)],
) -> Result<Vec<PathBuf>, ReplayError> {
    prepare(dir)?;
    let mut ordered: Vec<&Timeline> = timelines.iter().collect();
    ordered.sort_by_key(|t| match t.mode {
        Mode::Naive => 0,
        Mode::Protected => 1,
    });
    let scale = Scale::fitting(timelines);
    let mut written = Vec::with_capacity(ordered.len() + 1);
    let mut pictures = Vec::with_capacity(ordered.len());
    for t in ordered {
        let file = format!("{}.svg", t.mode);
        let path = dir.join(&file);
        let svg = chart::svg(scenario, t, &scale).map_err(|e| ReplayError::Output {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        save(&path, svg.as_bytes())?;
        written.push(path);
        pictures.push(Picture {
            mode: t.mode,
            file,
            width: chart::WIDTH,
            height: chart::HEIGHT,
            store: match &t.store {
                Some(_) => format!("{} per second", t.store_what),
                None => "none recorded: the gateway's /metrics had no \
                         spillway_store_queries_total during this run"
                    .to_owned(),
            },
        });
    }
    let html = page::html(&Page {
        scenario,
        table,
        pictures: &pictures,
        failures,
    });
    let index = dir.join(INDEX);
    save(&index, html.as_bytes())?;
    written.push(index);
    Ok(written)
}

fn save(path: &Path, bytes: &[u8]) -> Result<(), ReplayError> {
    std::fs::write(path, bytes).map_err(|source| ReplayError::Output {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::example;

    #[test]
    fn each_mode_gets_its_svg_and_the_page_shows_them_naive_first() {
        let dir = std::env::temp_dir().join(format!(
            "spillway-replay-pictures-test-{}",
            std::process::id()
        ));
        let timelines = [example(Mode::Protected, true), example(Mode::Naive, true)];
        let written = write(&dir, "retry-storm", Some("table\n"), &timelines, &[]).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["naive.svg", "protected.svg", "index.html"]);
        let html = std::fs::read_to_string(dir.join(INDEX)).unwrap();
        for name in ["naive.svg", "protected.svg"] {
            let svg = std::fs::read_to_string(dir.join(name)).unwrap();
            assert!(svg.starts_with("<svg"), "{svg}");
            assert!(html.contains(&format!("src=\"{name}\"")), "{html}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
