//! What sets a reload off besides the admin API, and what saves the last-known-good config:
//! `SIGHUP`, the file watch (`reload.watch`), and the timer that saves a config once it has
//! served `reload.last_known_good_after` without an anomaly.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{reload, saved, From};
use crate::gateway::{Gateway, StartError};

/// Takes `SIGHUP` over from its default (ending the process). Done while the gateway binds, before
/// it says it listens, so no hangup sent once it is up can end it.
pub(crate) fn hangups() -> Result<Signal, StartError> {
    signal(SignalKind::hangup())
        .map_err(|e| StartError::Setup(format!("cannot handle SIGHUP: {e}")))
}

/// Starts the three tasks; they end when `stop` turns true.
pub(crate) fn spawn(gw: &Arc<Gateway>, mut hangups: Signal, stop: &watch::Receiver<bool>) {
    let (g, mut s) = (gw.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                got = hangups.recv() => if got.is_none() { return },
                _ = s.wait_for(|s| *s) => return,
            }
            info!("SIGHUP: reloading the config file");
            reload(&g, From::File).await;
        }
    });
    tokio::spawn(until(stop.clone(), watch_file(gw.clone())));
    tokio::spawn(until(stop.clone(), keep_last_known_good(gw.clone())));
}

async fn until(mut stop: watch::Receiver<bool>, task: impl std::future::Future<Output = ()>) {
    tokio::select! {
        () = task => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

/// Reloads each time the file's content changes: when it differs from what was read last (by
/// the watch or by any reload), not merely from what runs, so a content that was rejected is not
/// tried again, and a rollback to the last-known-good config is not undone by the file it
/// replaced.
async fn watch_file(gw: Arc<Gateway>) {
    let Some(path) = gw.changes.path().map(|p| p.to_path_buf()) else {
        return;
    };
    if gw.changes.seen().is_none() {
        if let Ok(bytes) = read_capped(&path) {
            gw.changes.saw(super::hash(&bytes));
        }
    }
    loop {
        let reload_config = gw.live().config.reload.clone();
        tokio::time::sleep(reload_config.watch_interval).await;
        if !reload_config.watch {
            continue;
        }
        metrics::counter!(super::WATCH_CHECKS).increment(1);
        let bytes = match read_capped(&path) {
            Ok(b) => b,
            // An editor's save or a ConfigMap's swap may leave no file for a moment.
            Err(_) => continue,
        };
        let hash = super::hash(&bytes);
        if gw.changes.seen().as_ref() == Some(&hash) {
            continue;
        }
        gw.changes.saw(hash);
        info!(path = %path.display(), "config file changed: reloading");
        reload(&gw, From::File).await;
    }
}

fn read_capped(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    crate::files::read_capped(path, super::MAX_CONFIG_BYTES)
}

/// Saves the running config as last-known-good once it has served
/// `reload.last_known_good_after` with no anomaly counted; an anomaly starts the wait again.
async fn keep_last_known_good(gw: Arc<Gateway>) {
    let dir = gw.changes.data_dir().to_path_buf();
    let mut saved_hash = match saved::read(&dir) {
        Ok(s) => s.map(|s| s.hash),
        Err(e) => {
            warn!("last-known-good config unreadable (it will be replaced): {e}");
            None
        }
    };
    let mut watching = gw.live();
    let mut since = tokio::time::Instant::now();
    let mut anomalies = gw.changes.anomalies();
    loop {
        let after = watching.config.reload.last_known_good_after;
        let tick = (after / 10).clamp(Duration::from_millis(100), Duration::from_secs(5));
        tokio::time::sleep(tick).await;
        let live = gw.live();
        let now = tokio::time::Instant::now();
        if !Arc::ptr_eq(&live, &watching) || gw.changes.anomalies() != anomalies {
            (watching, since, anomalies) = (live, now, gw.changes.anomalies());
            continue;
        }
        let source = &live.source;
        if source.path.is_none() || saved_hash.as_ref() == Some(&source.hash) {
            continue;
        }
        if now.duration_since(since) < after {
            continue;
        }
        match saved::save(&dir, &source.text, &source.hash, source.path.as_deref()) {
            Ok(()) => {
                info!(hash = %source.hash, dir = %dir.display(), "config saved as last-known-good");
                saved_hash = Some(source.hash.clone());
            }
            Err(e) => {
                warn!(dir = %dir.display(), "last-known-good config not saved: {e}");
                // Try again after another full stretch, not at every tick.
                since = now;
            }
        }
    }
}
