//! A started gateway's way to ready: the deadline a child has to start, and polling a path until
//! the gateway answers 200 there.
//!
//! Every scenario starts a gateway and must not drive load at it before it serves, nor wait
//! for it forever when it will not: the wait ends when the path answers 200, when the process
//! exits, or at [`START_DEADLINE`], and the last two are start-up errors quoting its stderr.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use crate::error::ReplayError;
use crate::http::{uri, HttpClient};
use crate::process::ChildProcess;

/// Deadline for a child to print its address, and for the gateway to report ready.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(15);
const READY_POLL: Duration = Duration::from_millis(20);

/// Polls `GET /readyz` until it answers 200, the gateway exits, or the deadline passes.
pub(crate) async fn wait_ready(
    gateway: &mut ChildProcess,
    addr: SocketAddr,
    control: &HttpClient,
) -> Result<(), ReplayError> {
    wait_for(gateway, addr, "/readyz", control).await
}

/// Polls `GET PATH` until it answers 200, the gateway exits, or the deadline passes.
pub(crate) async fn wait_for(
    gateway: &mut ChildProcess,
    addr: SocketAddr,
    path: &str,
    control: &HttpClient,
) -> Result<(), ReplayError> {
    let end = Instant::now() + START_DEADLINE;
    loop {
        if let Ok((StatusCode::OK, _)) = control.get(uri(addr, path), READY_POLL * 10).await {
            return Ok(());
        }
        if gateway.exited().is_some() {
            return Err(gateway.startup_error("it exited before it was ready").await);
        }
        if Instant::now() >= end {
            let why = format!(
                "GET {path} did not answer 200 within {}",
                humantime::format_duration(START_DEADLINE)
            );
            return Err(gateway.startup_error(&why).await);
        }
        tokio::time::sleep(READY_POLL).await;
    }
}
