//! The gateway's resident memory over a run, sampled from `/proc/PID/status`.
//!
//! IL-0248's routing layer died of memory exhaustion, so how much memory the gateway holds
//! while it is hammered is one of the figures that matter. The kernel's own high-water mark
//! (`VmHWM`) covers the whole life of the process; per-phase peaks need sampling, so `VmRSS`
//! is read every 250 ms and the largest value seen is kept per phase. On systems without
//! `/proc` the figures are simply absent.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::tally::Schedule;

const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Peak resident set sizes, in bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct RssPeaks {
    /// Sampled once before the first phase.
    pub(crate) baseline: Option<u64>,
    /// Per phase, then the drain slot.
    pub(crate) per_slot: Vec<Option<u64>>,
    /// The largest sample of the whole run.
    pub(crate) overall: Option<u64>,
}

/// A running sampler; [`RssSampler::stop`] ends it and returns the peaks.
pub(crate) struct RssSampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<RssPeaks>,
}

impl RssSampler {
    /// Starts sampling process `pid` now, attributing samples to phases by `schedule`.
    pub(crate) fn start(pid: u32, schedule: Schedule) -> RssSampler {
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut peaks = RssPeaks {
                baseline: resident_bytes(pid),
                per_slot: vec![None; schedule.drain() + 1],
                overall: None,
            };
            let mut ticks = tokio::time::interval(SAMPLE_EVERY);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticks.tick() => {}
                }
                let Some(bytes) = resident_bytes(pid) else {
                    continue;
                };
                let slot = schedule.slot(Instant::now());
                for peak in [&mut peaks.per_slot[slot], &mut peaks.overall] {
                    *peak = Some(peak.map_or(bytes, |p| p.max(bytes)));
                }
            }
            peaks
        });
        RssSampler { stop, task }
    }

    pub(crate) async fn stop(self) -> RssPeaks {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

/// `VmRSS` of process `pid` in bytes, if it can be read.
///
/// The one reader of a process's RSS in the workspace: the replay's reports need it, so it is
/// product code, and the black-box tests that bound the gateway's memory call this one too
/// rather than keeping a copy in the dev-only testkit (which the replay cannot depend on).
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    vm_rss(&status)
}

fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut fields = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => Some(value * 1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status = "Name:\tspillway\nVmHWM:\t   20000 kB\nVmRSS:\t   12345 kB\nThreads:\t4\n";
        assert_eq!(vm_rss(status), Some(12345 * 1024));
        assert_eq!(vm_rss("Name:\tx\n"), None);
        assert_eq!(vm_rss("VmRSS:\tlots\n"), None);
    }

    #[test]
    fn this_process_has_a_resident_size_where_proc_exists() {
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(resident_bytes(std::process::id()).is_some_and(|b| b > 0));
        }
    }
}
