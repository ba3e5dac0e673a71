//! One mode's timeline as an SVG: three panels on one time axis (requests per second, the
//! gateway's resident memory, store queries per second), the phases shaded and named across
//! all three, and a legend naming every series.
//!
//! Drawn with `plotters`' SVG backend and no font files: the SVG names a generic font family
//! and the browser lays the text out, so nothing depends on the fonts of the machine that ran
//! the replay. The modes of one replay are drawn on one [`Scale`], so that side by side the
//! same height means the same rate.

use std::error::Error;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::timeline::{Series, Timeline, CLIENT_REQUESTS, OFFERED, RSS, SHED, SUCCEEDED, UPSTREAM};

/// The picture's size in pixels.
pub(crate) const WIDTH: u32 = 800;
pub(crate) const HEIGHT: u32 = 800;
/// Heights of the title and legend, the rates panel and the memory panel; the store panel
/// takes the rest.
const HEAD: u32 = 126;
const RATES: u32 = 364;
const MEMORY: u32 = 140;
/// The bottom of the rates panel's log scale: a rate of zero is drawn on this line.
const FLOOR: f64 = 0.1;
const FONT: &str = "sans-serif";

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = Result<(), Box<dyn Error>>;

/// The tops of the value axes and the end of the time axis shared by a replay's pictures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scale {
    pub(crate) end_s: f64,
    pub(crate) rates_top: f64,
    pub(crate) rss_top: f64,
    pub(crate) store_top: f64,
}

impl Scale {
    /// A scale on which every one of `timelines` fits.
    pub(crate) fn fitting(timelines: &[Timeline]) -> Scale {
        let top = |values: &mut dyn Iterator<Item = Option<f64>>| {
            values.flatten().fold(0.0_f64, f64::max)
        };
        let rates = top(&mut timelines
            .iter()
            .flat_map(|t| t.rates.iter().map(Series::max)));
        let rss = top(&mut timelines.iter().map(|t| t.rss_mib.max()));
        let store = top(&mut timelines.iter().map(|t| t.store.as_ref()?.max()));
        Scale {
            end_s: timelines.iter().map(Timeline::end_s).fold(1.0, f64::max),
            // A whole decade above the largest rate, so the log axis ends on a labelled line.
            rates_top: 10_f64.powf((rates * 1.2).max(10.0).log10().ceil()),
            rss_top: (rss * 1.15).max(1.0),
            store_top: (store * 1.15).max(1.0),
        }
    }
}

/// The picture of `timeline` for `scenario`, on `scale`, as an SVG document.
pub(crate) fn svg(scenario: &str, timeline: &Timeline, scale: &Scale) -> Result<String, String> {
    let mut out = String::new();
    draw(&mut out, scenario, timeline, scale).map_err(|e| e.to_string())?;
    Ok(out)
}

fn draw(out: &mut String, scenario: &str, t: &Timeline, scale: &Scale) -> Drawn {
    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(HEAD);
    let (rates, rest) = body.split_vertically(RATES);
    let (memory, store) = rest.split_vertically(MEMORY);
    heading(&head, scenario, t)?;
    rates_panel(&rates, t, scale)?;
    memory_panel(&memory, t, scale)?;
    store_panel(&store, t, scale)?;
    root.present()?;
    Ok(())
}

/// The colour a series is drawn in, by its name.
fn colour(name: &str) -> RGBColor {
    match name {
        OFFERED => RGBColor(20, 20, 20),
        CLIENT_REQUESTS => RGBColor(150, 150, 150),
        UPSTREAM => RGBColor(214, 39, 40),
        SUCCEEDED => RGBColor(44, 160, 44),
        SHED => RGBColor(255, 127, 14),
        RSS => RGBColor(31, 119, 180),
        _ => RGBColor(148, 103, 189),
    }
}

fn heading(area: &Area<'_>, scenario: &str, t: &Timeline) -> Drawn {
    let title = format!("{scenario}: {} gateway", t.mode);
    area.draw(&Text::new(
        title,
        (14, 10),
        (FONT, 22).into_font().style(FontStyle::Bold),
    ))?;
    let note = format!(
        "one point per {} ms; phases shaded and named",
        t.width.as_millis()
    );
    area.draw(&Text::new(
        note,
        (14, 40),
        (FONT, 14).into_font().color(&BLACK.mix(0.6)),
    ))?;
    let mut names: Vec<&str> = t.rates.iter().map(|s| s.name).collect();
    names.push(RSS);
    let store_name = match &t.store {
        Some(s) => s.name.to_owned(),
        None => "no store queries recorded".to_owned(),
    };
    let (mut x, mut y) = (14_i32, 62_i32);
    for name in names.into_iter().map(str::to_owned).chain([store_name]) {
        // Text is laid out by the browser; this is room for about 7 px a character.
        let room = 34 + 7 * name.len() as i32;
        if x + room > WIDTH as i32 - 10 {
            (x, y) = (14, y + 24);
        }
        let swatch = colour(&name).stroke_width(3);
        area.draw(&PathElement::new(vec![(x, y + 8), (x + 22, y + 8)], swatch))?;
        area.draw(&Text::new(name, (x + 28, y), (FONT, 15)))?;
        x += room + 10;
    }
    Ok(())
}

/// The rates panel, on a log scale (an outage's resends are hundreds of times the offered
/// load), zero drawn on the floor.
fn rates_panel(area: &Area<'_>, t: &Timeline, scale: &Scale) -> Drawn {
    let mut chart = ChartBuilder::on(area)
        .margin_left(10)
        .margin_right(24)
        .margin_top(6)
        .x_label_area_size(26)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..scale.end_s, (FLOOR..scale.rates_top).log_scale())?;
    phase_bands(&mut chart, t, FLOOR, scale.rates_top, true)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("requests/s (log scale, 0 on the floor)")
        .y_label_formatter(&|v| rate_label(*v))
        .x_label_formatter(&|s| format!("{s:.0} s"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .light_line_style(BLACK.mix(0.05))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    for series in &t.rates {
        lines(&mut chart, t, series, |v| v.max(FLOOR))?;
    }
    Ok(())
}

fn memory_panel(area: &Area<'_>, t: &Timeline, scale: &Scale) -> Drawn {
    let mut chart = ChartBuilder::on(area)
        .margin_left(10)
        .margin_right(24)
        .margin_top(6)
        .x_label_area_size(26)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..scale.end_s, 0.0..scale.rss_top)?;
    phase_bands(&mut chart, t, 0.0, scale.rss_top, false)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_labels(4)
        .y_desc("gateway RSS (MiB)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_label_formatter(&|s| format!("{s:.0} s"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .light_line_style(BLACK.mix(0.05))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    lines(&mut chart, t, &t.rss_mib, |v| v)?;
    Ok(())
}

fn store_panel(area: &Area<'_>, t: &Timeline, scale: &Scale) -> Drawn {
    let mut chart = ChartBuilder::on(area)
        .margin_left(10)
        .margin_right(24)
        .margin_top(6)
        .margin_bottom(6)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..scale.end_s, 0.0..scale.store_top)?;
    phase_bands(&mut chart, t, 0.0, scale.store_top, false)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_labels(4)
        .y_desc("store queries/s")
        .x_desc("seconds since the first phase started")
        .y_label_formatter(&|v| rate_label(*v))
        .x_label_formatter(&|s| format!("{s:.0} s"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .light_line_style(BLACK.mix(0.05))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    match &t.store {
        Some(series) => lines(&mut chart, t, series, |v| v)?,
        None => {
            let note = "no store queries recorded: the gateway's page had no \
                        spillway_store_queries_total during this run";
            let at = (scale.end_s * 0.03, scale.store_top * 0.6);
            chart.draw_series(std::iter::once(Text::new(note, at, (FONT, 14))))?;
        }
    }
    Ok(())
}

type Chart<'a, 'b, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, Y>>;

/// The phases as alternating shaded bands with a line at each boundary, named when `named`.
fn phase_bands<Y>(
    chart: &mut Chart<'_, '_, Y>,
    t: &Timeline,
    low: f64,
    high: f64,
    named: bool,
) -> Drawn
where
    Y: Ranged<ValueType = f64>,
{
    for (i, span) in t.phases.iter().enumerate() {
        let fill = match (span.name, i % 2) {
            ("drain", _) => RGBColor(236, 236, 236),
            (_, 0) => RGBColor(238, 243, 250),
            _ => RGBColor(250, 246, 236),
        };
        let band = Rectangle::new([(span.from_s, low), (span.to_s, high)], fill.filled());
        chart.draw_series(std::iter::once(band))?;
        let edge = PathElement::new(
            vec![(span.from_s, low), (span.from_s, high)],
            BLACK.mix(0.3),
        );
        chart.draw_series(std::iter::once(edge))?;
        if named {
            let at = (span.from_s + chart_pad(t), high);
            let label = Text::new(
                span.name,
                at,
                (FONT, 15).into_font().color(&BLACK.mix(0.75)),
            );
            chart.draw_series(std::iter::once(label))?;
        }
    }
    Ok(())
}

/// A small gap, in seconds, between a band's edge and its name.
fn chart_pad(t: &Timeline) -> f64 {
    t.end_s() * 0.004
}

/// `series` as lines through the middles of its buckets, broken where values are unknown for
/// longer than [`BRIDGED`] (a reading that came late leaves a bucket or two without one; a
/// gateway that was down leaves a gap); a value alone between gaps is drawn across its bucket.
fn lines<Y>(
    chart: &mut Chart<'_, '_, Y>,
    t: &Timeline,
    series: &Series,
    shown: impl Fn(f64) -> f64,
) -> Drawn
where
    Y: Ranged<ValueType = f64>,
{
    let width = t.width.as_secs_f64();
    let bridge = (BRIDGED / width).floor() as usize;
    let style = colour(series.name).stroke_width(2);
    for run in runs(&series.values, bridge) {
        let mut points: Vec<(f64, f64)> = run.iter().map(|&(i, v)| (t.at_s(i), shown(v))).collect();
        if let [(x, y)] = points[..] {
            points = vec![(x - width / 2.0, y), (x + width / 2.0, y)];
        }
        chart.draw_series(LineSeries::new(points, style))?;
    }
    Ok(())
}

/// The longest stretch of unknown values, in seconds, a line is drawn across.
const BRIDGED: f64 = 2.0;

/// The runs of known values, each with its bucket indices; gaps of at most `bridge` unknown
/// values do not end a run.
fn runs(values: &[Option<f64>], bridge: usize) -> Vec<Vec<(usize, f64)>> {
    let mut runs: Vec<Vec<(usize, f64)>> = Vec::new();
    let mut last = None;
    for (i, value) in values.iter().enumerate() {
        let Some(v) = *value else { continue };
        match (runs.last_mut(), last) {
            (Some(run), Some(l)) if i - l <= bridge + 1 => run.push((i, v)),
            _ => runs.push(vec![(i, v)]),
        }
        last = Some(i);
    }
    runs
}

fn rate_label(v: f64) -> String {
    if v <= FLOOR * 1.000_001 && v > 0.0 {
        "0".to_owned()
    } else if v >= 1000.0 {
        format!("{}k", trim(v / 1000.0))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_owned).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mode;
    use crate::timeline::example;

    #[test]
    fn runs_break_at_gaps_longer_than_the_bridge() {
        let values = [
            None,
            Some(1.0),
            Some(2.0),
            None,
            None,
            Some(3.0),
            None,
            Some(4.0),
        ];
        assert_eq!(
            runs(&values, 1),
            [vec![(1, 1.0), (2, 2.0)], vec![(5, 3.0), (7, 4.0)]]
        );
        assert_eq!(runs(&values, 2).len(), 1);
        assert_eq!(runs(&values, 0).len(), 3);
        assert!(runs(&[None, None], 8).is_empty());
    }

    #[test]
    fn the_scale_fits_every_mode_and_ends_on_a_decade() {
        let (a, mut b) = (example(Mode::Naive, true), example(Mode::Protected, false));
        b.rates[2].values[5] = Some(4_000.0);
        let scale = Scale::fitting(&[a, b]);
        assert_eq!(scale.rates_top, 10_000.0);
        assert_eq!(scale.end_s, 10.0);
        assert!(scale.rss_top > 40.0 && scale.store_top > 10.0, "{scale:?}");
        assert_eq!(rate_label(FLOOR), "0");
        assert_eq!(rate_label(2_500.0), "2.5k");
        assert_eq!(rate_label(10.0), "10");
    }

    #[test]
    fn the_svg_is_well_formed_and_names_every_series_and_phase() {
        let timelines = [example(Mode::Naive, true), example(Mode::Protected, false)];
        let scale = Scale::fitting(&timelines);
        for t in &timelines {
            let svg = svg("retry-storm", t, &scale).unwrap();
            let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
            let texts: Vec<&str> = doc
                .descendants()
                .filter(|n| n.has_tag_name("text"))
                .filter_map(|n| n.text().map(str::trim))
                .collect();
            for name in [OFFERED, CLIENT_REQUESTS, UPSTREAM, SUCCEEDED, SHED, RSS] {
                assert!(texts.contains(&name), "{name} not in {texts:?}");
            }
            for phase in ["steady", "outage", "drain"] {
                assert!(texts.contains(&phase), "{phase} not in {texts:?}");
            }
            assert!(texts.contains(&"gateway RSS (MiB)"), "{texts:?}");
            let store_named = texts.contains(&"store queries (gateway)");
            assert_eq!(store_named, t.store.is_some(), "{texts:?}");
            assert_eq!(
                texts
                    .iter()
                    .any(|s| s.starts_with("no store queries recorded")),
                t.store.is_none()
            );
            // Every series is drawn: a line of its colour through a point per bucket.
            let mut series: Vec<&Series> = t.rates.iter().chain([&t.rss_mib]).collect();
            series.extend(&t.store);
            for s in series {
                let RGBColor(r, g, b) = colour(s.name);
                let stroke = format!("#{r:02X}{g:02X}{b:02X}");
                let longest = doc
                    .descendants()
                    .filter(|n| {
                        n.has_tag_name("polyline") && n.attribute("stroke") == Some(&stroke)
                    })
                    .map(|n| {
                        n.attribute("points")
                            .unwrap_or("")
                            .split_whitespace()
                            .count()
                    })
                    .max();
                assert!(longest >= Some(30), "{}: {longest:?} points", s.name);
            }
        }
    }
}
