//! Black-box tests of `spillway replay`: the real binary replays IL-0248 (`retry-storm`) and
//! IL-0136 (`cache-flush`, against the tests' PostgreSQL: `spillway_testkit::postgres_url`),
//! IL-0248 and IL-0110 (`noisy-neighbor`) and IL-0235 (`bad-rollout`) with its own child
//! processes on 127.0.0.1, and the figures are read back from its `--json` file.
//!
//! The replay bounds its own run time; the tests bound it again from outside (the process is
//! killed past a deadline) so a hang fails the test instead of stalling the suite.
//!
//! The pictures of `--out` are checked as files (well-formed SVG naming every series, a page
//! referencing every picture) and as a reader sees them: the page opened in headless Chromium
//! (Debian's `chromium`), its screenshot decoded and checked not to be blank, and every image
//! checked to have loaded with a size. Without Chromium that part is skipped, unless
//! `SPILLWAY_REQUIRE_CHROMIUM=1` (as `.ci/run` sets) makes it a failure.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Far above what the short runs below need (11 s of phases, start-up, a 5 s drain at most).
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `spillway ARGS`, killing it if it outlives `deadline`.
fn run(args: &[&str], deadline: Duration) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spillway"));
    command.env("SPILLWAY_LOG", "warn");
    run_program(command, args, deadline)
}

/// Runs `command` with `args`, killing it if it outlives `deadline`.
fn run_program(mut command: Command, args: &[&str], deadline: Duration) -> Output {
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spillway");
    // Read both pipes on their own threads so a full pipe can never stall the child.
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = r.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = pipe(Box::new(child.stdout.take().unwrap()));
    let stderr = pipe(Box::new(child.stderr.take().unwrap()));
    let Some(status) = spillway_testkit::wait_exit(&mut child, deadline) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{command:?} still running after {deadline:?}");
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn json_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "spillway-replay-test-{}-{name}.json",
        std::process::id()
    ))
}

/// Runs `spillway replay ARGS --json FILE` (killed past `deadline`), asserts it succeeded, and
/// returns its JSON figures and its stdout table.
fn replay_json(args: &[&str], name: &str, deadline: Duration) -> (Value, String) {
    let path = json_path(name);
    let mut all: Vec<&str> = args.to_vec();
    let path_arg = path.to_str().unwrap().to_owned();
    all.extend(["--json", &path_arg]);
    let out = run(&all, deadline);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{all:?} failed: {stderr}\n{table}");
    let json = std::fs::read(&path).unwrap_or_else(|e| panic!("no JSON at {path:?}: {e}"));
    let _ = std::fs::remove_file(&path);
    (serde_json::from_slice(&json).unwrap(), table)
}

/// The completed run of `mode` in a replay's figures.
fn run_of(report: &Value, mode: &str) -> Value {
    let run = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["mode"] == mode)
        .unwrap_or_else(|| panic!("no {mode} run in {report}"))
        .clone();
    assert_eq!(run["completed"], true, "{run}");
    run
}

/// Runs a short retry storm (2 s steady, 3 s fault, 3 s outage, 3 s recovery at 50 requests/s)
/// with the given mode flag and returns the JSON figures and the stdout table.
fn short_storm(mode_flag: Option<&str>, name: &str) -> (Value, String) {
    let mut args = vec!["replay", "retry-storm"];
    args.extend(mode_flag);
    args.extend([
        "--steady",
        "2s",
        "--fault",
        "3s",
        "--outage",
        "3s",
        "--recovery",
        "3s",
        "--rate",
        "50",
    ]);
    replay_json(&args, name, RUN_DEADLINE)
}

fn phase<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == name)
        .unwrap_or_else(|| panic!("no phase {name} in {run}"))
}

#[test]
fn retry_storm_protected_reports_every_phase_and_a_finite_fault_amplification() {
    let (report, table) = short_storm(Some("--protected"), "protected");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{report}");
    let run = &runs[0];
    assert_eq!(run["mode"], "protected");
    assert_eq!(run["completed"], true, "{run}");
    for name in ["steady", "fault", "outage", "recovery"] {
        let p = phase(run, name);
        assert!(p["new_requests"].as_u64().unwrap() > 0, "{name}: {p}");
        assert!(p["client_requests"].as_u64().unwrap() > 0, "{name}: {p}");
        assert!(table.contains(name), "{table}");
    }
    let steady = phase(run, "steady");
    let success = steady["success_rate"].as_f64().unwrap();
    assert!(success >= 0.99, "steady success rate {success}: {steady}");
    let fault = phase(run, "fault");
    let amplification = fault["amplification"].as_f64();
    assert!(
        amplification.is_some_and(|a| a.is_finite() && a > 0.0),
        "fault amplification not reported: {fault}"
    );
    assert!(fault["upstream_attempts"].as_u64().unwrap() > 0, "{fault}");
    assert!(
        run["gateway_peak_rss_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{run}"
    );
    assert!(table.contains("protected"), "{table}");
}

/// The comparison the replay exists for: while region-a answers 500, the naive gateway
/// (every 5xx retried at once, up to 5 attempts) multiplies the load on the failing region,
/// and the protected one does not: it ejects or avoids the failing backends, serves from
/// region-b, and adds at most its retry budget.
#[test]
fn retry_storm_naive_gateway_amplifies_the_fault_and_the_protected_one_does_not() {
    let (report, table) = short_storm(None, "both");
    let runs = report["runs"].as_array().unwrap();
    let fault = |mode: &str, name: &str| {
        let run = runs
            .iter()
            .find(|r| r["mode"] == mode)
            .unwrap_or_else(|| panic!("no {mode} run in {report}"));
        assert_eq!(run["completed"], true, "{run}");
        phase(run, name).clone()
    };
    let (protected, naive) = (fault("protected", "fault"), fault("naive", "fault"));
    let amplification = |p: &Value| p["amplification"].as_f64().unwrap();
    assert!(amplification(&naive) >= 2.0, "{table}");
    assert!(amplification(&protected) <= 1.25, "{table}");
    assert!(
        protected["success_rate"].as_f64().unwrap() >= 0.95,
        "{table}"
    );
    // Every backend failing: nothing to fail over to. The naive gateway passes the callers'
    // resends on, multiplied; the protected one refuses nearly all of them locally.
    let (protected, naive) = (fault("protected", "outage"), fault("naive", "outage"));
    assert!(amplification(&naive) >= 10.0, "{table}");
    assert!(amplification(&protected) <= 1.1, "{table}");
}

#[test]
fn retry_storm_refuses_bad_flags_on_one_line_without_starting_anything() {
    let out = run(
        &["replay", "retry-storm", "--rate", "0", "--fault", "0s"],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--rate") && stderr.contains("--fault"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// A whole cache-flush replay takes two runs of 66 s of phases, plus start-ups.
const FLUSH_RUN_DEADLINE: Duration = Duration::from_secs(360);

/// IL-0136 end to end, in PostgreSQL mode: 10,000 keys in the store, requests spread across
/// them, then a flush and a restart at peak and the store gone for 15 s. With its protections
/// the gateway's store load after a flush or a restart stays within twice the steady rate,
/// requests for known keys keep succeeding while the store is gone, `/livez` never fails and
/// the supervisor never restarts it; the naive gateway's store probe fails and it is restarted.
#[test]
fn cache_flush_at_peak_and_a_store_outage_leave_the_protected_gateway_serving() {
    let store = spillway_testkit::postgres_url();
    let args = [
        "replay",
        "cache-flush",
        "--store",
        &store,
        "--keys",
        "10000",
        "--rate",
        "500",
        "--steady",
        "20s",
        "--flush",
        "8s",
        "--restart",
        "8s",
        "--outage",
        "15s",
        "--recovery",
        "5s",
    ];
    let (report, table) = replay_json(&args, "flush", FLUSH_RUN_DEADLINE);
    let (protected, naive) = (run_of(&report, "protected"), run_of(&report, "naive"));
    let f = |run: &Value, name: &str, field: &str| phase(run, name)[field].clone();

    let steady = f(&protected, "steady", "store_statements_per_s");
    assert!(steady.as_f64().unwrap() > 0.0, "{table}");
    for name in ["flush", "restart"] {
        let ratio = f(&protected, name, "store_vs_steady").as_f64().unwrap();
        assert!(ratio <= 2.0, "{name}: store at {ratio:.2}x steady\n{table}");
    }
    let outage = phase(&protected, "outage");
    assert!(outage["offered"].as_u64().unwrap() > 0, "{table}");
    assert_eq!(outage["succeeded"], outage["offered"], "{table}");
    assert_eq!(outage["livez"]["failed"], 0, "{table}");
    assert!(outage["livez"]["probes"].as_u64().unwrap() > 100, "{table}");
    for p in protected["phases"].as_array().unwrap() {
        assert_eq!(p["supervisor_restarts"], 0, "{table}");
        // Only the deliberate restart may leave /livez unanswered, between two processes.
        if p["phase"] != "restart" {
            assert_eq!(p["livez"]["failed"], 0, "{table}");
        }
    }
    // The restart phase's one restart is the deliberate one.
    assert_eq!(f(&protected, "restart", "restarts"), 1, "{table}");

    let naive_outage = phase(&naive, "outage");
    assert!(
        naive_outage["supervisor_restarts"].as_u64().unwrap() >= 1,
        "the naive gateway's store probe should have had it restarted\n{table}"
    );
    assert!(
        naive_outage["error_rate"].as_f64().unwrap() > 0.5,
        "{table}"
    );
}

/// IL-0248 and IL-0110 at the gate: a tenant flooding at 50x its limit and resending every
/// refusal at once does not cost a quiet tenant on the same pool a single request with
/// spillway's admission; without it (one unbounded first-come-first-served queue) the quiet
/// tenant's requests wait behind the flood until they time out.
#[test]
fn noisy_neighbor_flood_is_shed_and_the_quiet_tenant_keeps_succeeding() {
    let args = [
        "replay",
        "noisy-neighbor",
        "--steady",
        "2s",
        "--flood",
        "8s",
        "--recovery",
        "2s",
    ];
    let (report, table) = replay_json(&args, "neighbor", RUN_DEADLINE);
    let tenant = |mode: &str, phase_name: &str, tenant: &str| {
        let run = run_of(&report, mode);
        phase(&run, phase_name)["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tenant"] == tenant)
            .unwrap()
            .clone()
    };
    for name in ["steady", "flood", "recovery"] {
        let quiet = tenant("protected", name, "quiet");
        let success = quiet["success_rate"].as_f64().unwrap();
        assert!(success >= 0.99, "{name}: quiet at {success}\n{table}");
    }
    let flood = tenant("protected", "flood", "flood");
    assert!(flood["shed"].as_u64().unwrap() > 0, "{table}");
    // The quiet tenant's waits for a seat stayed under `admission.queue_wait` (5 s by default),
    // the bound docs/admission.md gives, while the flood was queued and shed beside it.
    let wait = tenant("protected", "flood", "quiet")["queue_wait_p99_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("no queue wait figure\n{table}"));
    assert!(wait <= 5000.0, "quiet waited {wait} ms\n{table}");
    let naive_quiet = tenant("naive", "flood", "quiet")["success_rate"]
        .as_f64()
        .unwrap();
    assert!(naive_quiet < 0.9, "naive quiet at {naive_quiet}\n{table}");
}

/// Two short bad-rollout runs at 40 requests/s and their start-ups fit well within this.
const ROLLOUT_RUN_DEADLINE: Duration = Duration::from_secs(240);

/// IL-0235: a new version that refuses `tools` (400) and has a fraction of the capacity is
/// rolled out by a reload. Staged, the comparator halts it during the rollout phase, and
/// afterwards its callers see no errors and the new version gets no request; replacing the old
/// version at once, nothing halts it, and a share of requests keeps failing in both phases: the
/// tools share with 400, and the new version's backends refusing with 429 what they cannot take.
#[test]
fn bad_rollout_staged_halts_and_recovers_while_replace_keeps_failing() {
    let args = [
        "replay",
        "bad-rollout",
        "--steady",
        "2s",
        // Long enough for the first step (10 % of 40/s, 30 % with tools: 1.2 refusals a second)
        // to show five, or for the 50 % step after it to show more.
        "--rollout",
        "12s",
        "--after",
        "8s",
        "--rate",
        "40",
    ];
    let (report, table) = replay_json(&args, "rollout", ROLLOUT_RUN_DEADLINE);
    let (staged, replace) = (run_of(&report, "protected"), run_of(&report, "naive"));
    let n = |run: &Value, name: &str, field: &str| {
        phase(run, name)[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}.{field}\n{table}"))
    };
    for run in [&staged, &replace] {
        assert_eq!(n(run, "steady", "failed"), 0, "{table}");
        assert_eq!(n(run, "steady", "new_version_received"), 0, "{table}");
        assert!(n(run, "rollout", "new_version_received") > 0, "{table}");
        assert!(n(run, "rollout", "status_400") > 0, "{table}");
    }

    assert_eq!(staged["rollout_mode"], "staged");
    let watched = &staged["watched"];
    assert_eq!(watched["status_at_end"], "halted", "{table}");
    assert!(!watched["halt_reason"].is_null(), "{table}");
    assert!(watched["halted_after_ms"].as_u64().is_some(), "{table}");
    assert_eq!(watched["share_percent_at_end"], 0.0, "{table}");
    assert_eq!(watched["new_version_serving_at_end"], false, "{table}");
    // Halted before `after` began: not one request reached the new version in it, and the old
    // version, with room to spare, served (almost) every caller.
    assert_eq!(n(&staged, "after", "new_version_received"), 0, "{table}");
    let offered = n(&staged, "after", "offered");
    assert!(offered > 100, "{table}");
    assert!(n(&staged, "after", "failed") * 100 <= offered, "{table}");

    assert_eq!(replace["rollout_mode"], "replace");
    let watched = &replace["watched"];
    assert!(watched["halted_after_ms"].is_null(), "{table}");
    assert_eq!(watched["share_percent_at_end"], 100.0, "{table}");
    assert_eq!(watched["new_version_serving_at_end"], true, "{table}");
    for name in ["rollout", "after"] {
        assert!(n(&replace, name, "failed") > 0, "{name}\n{table}");
        assert!(n(&replace, name, "status_400") > 0, "{name}\n{table}");
        assert!(
            n(&replace, name, "new_version_received") > 0,
            "{name}\n{table}"
        );
        assert!(n(&replace, name, "new_version_429") > 0, "{name}\n{table}");
    }
    // The callers see the new version's 429s as the gateway's 503 once no backend is left to
    // try (429 is kept for a tenant over its own quota).
    assert!(n(&replace, "rollout", "status_503") > 0, "{table}");
    assert!(
        n(&replace, "rollout", "failed") > 2 * n(&staged, "rollout", "failed").max(1),
        "{table}"
    );
}

/// `--out DIR` on a short retry storm (both modes): an SVG per mode, well-formed and naming
/// every series and phase, and an index.html that shows each of them. Opened in headless
/// Chromium, the page renders: its screenshot is not blank, and every picture loaded with a
/// size.
#[test]
fn retry_storm_out_draws_a_picture_per_mode_and_a_page_chromium_renders() {
    let dir = std::env::temp_dir().join(format!("spillway-replay-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_str().unwrap().to_owned();
    let args = [
        "replay",
        "retry-storm",
        "--steady",
        "1s",
        "--fault",
        "1s",
        "--outage",
        "1s",
        "--recovery",
        "1s",
        "--rate",
        "20",
        "--out",
        &out,
    ];
    let (report, table) = replay_json(&args, "pictures", RUN_DEADLINE);
    run_of(&report, "protected");
    run_of(&report, "naive");

    let html = std::fs::read_to_string(dir.join("index.html")).expect("index.html");
    let mut svgs: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".svg"))
        .collect();
    svgs.sort();
    assert_eq!(svgs, ["naive.svg", "protected.svg"]);
    for name in &svgs {
        assert!(
            html.contains(&format!("src=\"{name}\"")),
            "{name} not on the page"
        );
        check_svg(&std::fs::read_to_string(dir.join(name)).unwrap(), name);
    }
    assert_eq!(html.matches("<img ").count(), svgs.len(), "{html}");
    assert!(html.contains("<pre>"), "the table is on the page: {html}");
    assert!(html.contains("fault") && table.contains("fault"));

    let Some(chromium) = chromium() else {
        let required = std::env::var("SPILLWAY_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "SPILLWAY_REQUIRE_CHROMIUM=1 but no chromium on PATH"
        );
        eprintln!("skipping the page's rendering check: no chromium on PATH");
        return;
    };
    let shot = dir.join("screenshot.png");
    let page = format!("file://{}", dir.join("index.html").display());
    chromium_run(
        &chromium,
        &dir,
        &[&format!("--screenshot={}", shot.display()), &page],
    );
    check_not_blank(&std::fs::read(&shot).expect("a screenshot"));

    // The same page with a script that reports every image's state once the page has loaded.
    let probe = html.replace("</body>", &format!("{IMAGE_PROBE}</body>"));
    std::fs::write(dir.join("probe.html"), probe).unwrap();
    let probe = format!("file://{}", dir.join("probe.html").display());
    let dom = chromium_run(
        &chromium,
        &dir,
        &["--virtual-time-budget=10000", "--dump-dom", &probe],
    );
    let dom = String::from_utf8_lossy(&dom.stdout);
    let report = dom
        .split_once("id=\"image-probe\">")
        .and_then(|(_, rest)| rest.split_once('<'))
        .map(|(report, _)| report)
        .unwrap_or_else(|| panic!("no image report in the page: {dom}"));
    assert!(report.starts_with("images=2 broken= "), "{report}");
    let sizes = report.split_once("sizes=").unwrap().1.trim();
    for size in sizes.split(',') {
        let (w, h) = size.split_once('x').unwrap();
        let (w, h): (u32, u32) = (w.parse().unwrap(), h.parse().unwrap());
        assert!(w >= 400 && h >= 400, "a picture shown at {w}x{h}: {report}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reports, on load, how many images the page has, which did not load, and each one's size on
/// the page, in an element the DOM dump shows.
const IMAGE_PROBE: &str = "<script>window.addEventListener('load', () => {\
  const images = Array.from(document.images);\
  const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));\
  const sizes = images.map(i => { const r = i.getBoundingClientRect(); return Math.round(r.width) + 'x' + Math.round(r.height); });\
  const p = document.createElement('p'); p.id = 'image-probe';\
  p.textContent = 'images=' + images.length + ' broken=' + broken.join(',') + ' sizes=' + sizes.join(',');\
  document.body.appendChild(p);\
});</script>";

/// A picture is well-formed XML, names every series and phase, and draws lines through a point
/// per time bucket.
fn check_svg(svg: &str, name: &str) {
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg", "{name}");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(str::trim))
        .collect();
    for expected in [
        "offered (new requests)",
        "client requests (resends included)",
        "upstream attempts",
        "successes (2xx to callers)",
        "shed by the gateway",
        "gateway RSS",
        "store queries (gateway)",
        "steady",
        "fault",
        "outage",
        "recovery",
        "requests/s (log scale, 0 on the floor)",
        "gateway RSS (MiB)",
        "store queries/s",
        "seconds since the first phase started",
    ] {
        assert!(
            texts.contains(&expected),
            "{name}: no {expected:?} in {texts:?}"
        );
    }
    // 4 s of phases in 250 ms buckets: every series is a line of a dozen points or more.
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter(|n| {
            n.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count()
                >= 12
        })
        .count();
    assert!(lines >= 7, "{name}: {lines} lines of 12 points or more");
}

/// A screenshot of a rendered page: a PNG of the window's size with text and pictures on it,
/// not one colour (a page that failed to render is white from edge to edge).
fn check_not_blank(png_bytes: &[u8]) {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).expect("a frame");
    assert_eq!((info.width, info.height), (1400, 2000));
    let channels = info.color_type.samples();
    let pixels = &pixels[..info.buffer_size()];
    let mut colours = std::collections::HashSet::new();
    let mut inked = 0_usize;
    for px in pixels.chunks(channels) {
        colours.insert(px[..3.min(channels)].to_vec());
        inked += usize::from(px.iter().take(3).any(|&c| c < 200));
    }
    let share = inked as f64 / (pixels.len() / channels) as f64;
    assert!(
        colours.len() >= 32,
        "{} colours in the screenshot",
        colours.len()
    );
    assert!(
        share >= 0.01,
        "{:.2} % of the screenshot inked",
        share * 100.0
    );
}

/// Debian's headless Chromium, if it is on PATH.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Runs headless Chromium with `args` and a profile of its own in `dir`, and asserts it
/// succeeded. `--no-sandbox`: CI runs as root, where Chromium's sandbox will not start.
fn chromium_run(chromium: &PathBuf, dir: &std::path::Path, args: &[&str]) -> Output {
    let profile = format!("--user-data-dir={}", dir.join("chromium-profile").display());
    let mut all = vec![
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1400,2000",
        &profile,
    ];
    all.extend_from_slice(args);
    let out = run_program(Command::new(chromium), &all, Duration::from_secs(90));
    assert!(
        out.status.success(),
        "chromium {all:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
