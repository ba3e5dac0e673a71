//! Tenant rate limits shared by gateway instances through Redis: the requests and tokens per
//! minute of `spillway_policy::rate`, kept in one place for the whole fleet.
//!
//! Why (IL-0248): internal workloads skipped the rate limits, and once they did not, a limit
//! enforced by each instance on its own let a tenant take it once per instance, so the fleet
//! admitted the limit times the instance count. Here every instance checks the same buckets in
//! Redis, so a tenant's limits hold across the fleet.
//!
//! One round trip per admission: a Lua script (EVALSHA, loaded when connecting; EVAL if Redis
//! has lost it) checks both dimensions, the request (cost 1) and its estimated tokens, and takes
//! from both only if both admit. The script reads the clock of the Redis server (`TIME`), so the
//! instances' clocks do not matter; Redis >= 5 is needed for that (effect replication).
//!
//! State: one key per tenant and dimension (`spillway:rl:{tenant}:req` and `:tok`, the tenant
//! hash-tagged so that both keys are in one cluster slot) holding `"<level> <at>"`: the units
//! taken and not yet drained as of `<at>`, microseconds of the server's clock. That is the
//! bucket of `spillway_policy::rate::Gcra`, with the same decisions, burst (a minute's allowance
//! by default), debt cap (a day's refill) and `x-ratelimit-*` quotas. A key expires one second
//! after its bucket would be full again, so an idle tenant costs no memory.
//!
//! Precision: Lua numbers are doubles. Every input is clamped so that levels stay below 1.5e15
//! units (a burst <= 1e12, plus a day's debt at <= 1e12 per minute, plus one cost), under 2^53:
//! nothing overflows and whole-unit changes are exact. What drains between two calls
//! (`elapsed_us * per_minute / 6e7`, a fraction) is rounded to doubles, so each call that drains
//! may move the level by a few parts in 2^53 of itself (about 1e-7 units at a level of 1e9,
//! under one unit at the largest debt). Time resolves to the microsecond (the local limiter: the nanosecond), and waits and
//! resets are rounded up to it.
//!
//! When Redis is slow or down, every call here still returns within its timeout, with
//! [`Unavailable`]; the caller then falls back to each instance enforcing its share of the limit
//! (`RateLimit::share`) and reports [`SharedLimits::is_up`] and [`SharedLimits::errors`] in its
//! metrics. Errors are logged at most once per [`LOG_EVERY`], and after [`ERRORS_BEFORE_PAUSE`]
//! in a row Redis is left alone for [`PAUSE`] (`spillway_policy::PauseAfterErrors`, the same rule
//! as the key cache's Redis layer), so that a hung Redis does not add its timeout to every
//! request. A Redis that is down at start is not an error: a background task tries to
//! connect every [`RECONNECT_EVERY`] until it can, and redis's `ConnectionManager` then
//! reconnects by itself.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, RedisError, ToRedisArgs};
use spillway_directory::log_gate::LogGate;
use spillway_policy::rate::MAX_PER_MINUTE;
use spillway_policy::{Dimension, PauseAfterErrors, Quota, RateHeaders, RateLimit};
use tracing::warn;

/// Keys are `spillway:rl:{<tenant>}:req` and `spillway:rl:{<tenant>}:tok`.
pub const KEY_PREFIX: &str = "spillway:rl:";
/// A connection attempt (with loading the script) gives up after this; `start` waits at most
/// this long for the first one.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub use spillway_policy::pause::{ERRORS_BEFORE_PAUSE, PAUSE};
/// Connection attempts are at least this far apart.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(1);
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The Redis URL could not be parsed: a configuration error.
#[derive(Debug, thiserror::Error)]
pub enum SharedLimitsError {
    #[error("redis URL: {0}")]
    InvalidUrl(String),
}

/// Why the shared limits could not answer; the caller falls back to its local share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("redis is left alone for a while after errors in a row")]
    Paused,
    #[error("not connected to redis")]
    NotConnected,
    #[error("redis answered with an error")]
    Failed,
    #[error("redis did not answer in time")]
    TimedOut,
}

/// The fleet-wide answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedDecision {
    pub admitted: bool,
    /// After the request when admitted, as they were when refused.
    pub headers: RateHeaders,
    /// The dimension that refused, and when the same request would pass (`None`: never, its
    /// cost is above the burst). The longer wait wins, requests on a tie, as in
    /// `TenantLimiter::admit`.
    pub refused: Option<(Dimension, Option<Duration>)>,
}

/// The Redis key of a tenant's dimension. Tenant names are validated elsewhere; any byte other
/// than ASCII letters, digits, `-`, `_` and `.` is escaped as `%XX`, so no name can reach
/// another tenant's keys or break the hash tag.
pub fn key(tenant: &str, dimension: Dimension) -> String {
    let mut key = String::with_capacity(KEY_PREFIX.len() + tenant.len() + 6);
    key.push_str(KEY_PREFIX);
    key.push('{');
    for b in tenant.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            key.push(char::from(b));
        } else {
            let _ = write!(key, "%{b:02X}");
        }
    }
    key.push_str(match dimension {
        Dimension::Requests => "}:req",
        Dimension::Tokens => "}:tok",
    });
    key
}

/// A handle on the shared limits; clones share the connection and the error counts.
#[derive(Clone)]
pub struct SharedLimits {
    inner: Arc<Inner>,
}

impl SharedLimits {
    /// Parses the URL (a bad one is the only error) and tries to connect for up to
    /// [`CONNECT_TIMEOUT`]; if that fails, calls answer [`Unavailable`] while a background task
    /// tries again every [`RECONNECT_EVERY`]. `timeout` bounds every call.
    pub async fn start(url: &str, timeout: Duration) -> Result<SharedLimits, SharedLimitsError> {
        let client =
            redis::Client::open(url).map_err(|e| SharedLimitsError::InvalidUrl(e.to_string()))?;
        let inner = Arc::new(Inner {
            client,
            connected: OnceLock::new(),
            timeout,
            up: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            pause: Mutex::new(PauseAfterErrors::default()),
            log_gate: LogGate::new(LOG_EVERY),
        });
        if !inner.connect().await {
            tokio::spawn(reconnect(Arc::downgrade(&inner)));
        }
        Ok(SharedLimits { inner })
    }

    /// Checks one request of `tenant` costing `est_tokens` against both limits, in one round
    /// trip, taking from both only if both admit. Limits that are `None` are not checked.
    pub async fn admit(
        &self,
        tenant: &str,
        requests: Option<RateLimit>,
        tokens: Option<RateLimit>,
        est_tokens: u64,
    ) -> Result<SharedDecision, Unavailable> {
        if requests.is_none() && tokens.is_none() {
            let (requests, tokens) = (None, None);
            let headers = RateHeaders { requests, tokens };
            let refused = None;
            return Ok(SharedDecision {
                admitted: true,
                headers,
                refused,
            });
        }
        // Anything above the burst (at most MAX_PER_MINUTE) is refused for good anyway.
        let cost = (est_tokens.min(MAX_PER_MINUTE + 1), 0);
        let reply: Reply = self
            .inner
            .call("admit", tenant, requests, tokens, cost)
            .await?;
        decision(reply, requests, tokens).ok_or_else(|| {
            self.inner.went_wrong("admit", "unexpected reply");
            Unavailable::Failed
        })
    }

    /// Charges (positive) or refunds (negative) `token_delta` tokens once usage is known, and
    /// gives back the request when `refund_request`. Best effort, bounded by the timeout; the
    /// caller may run it in a spawned task.
    pub async fn adjust(
        &self,
        tenant: &str,
        requests: Option<RateLimit>,
        tokens: Option<RateLimit>,
        token_delta: i64,
        refund_request: bool,
    ) -> Result<(), Unavailable> {
        let requests = requests.filter(|_| refund_request);
        let tokens = tokens.filter(|_| token_delta != 0);
        if requests.is_none() && tokens.is_none() {
            return Ok(());
        }
        // Beyond the highest debt cap either way, and exact in a double.
        let delta = token_delta.clamp(-MAX_DELTA, MAX_DELTA);
        let args = (delta, u8::from(refund_request));
        let _: redis::Value = self
            .inner
            .call("adjust", tenant, requests, tokens, args)
            .await?;
        Ok(())
    }

    /// False before the first connection and after an error or timeout, until a call succeeds.
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Relaxed)
    }

    /// Errors and timeouts so far, connection attempts included.
    pub fn errors(&self) -> u64 {
        self.inner.errors.load(Ordering::Relaxed)
    }
}

const MAX_DELTA: i64 = 2_000_000_000_000_000;

/// admitted, refused by (0 none, 1 requests, 2 tokens), retry after (µs; -1 never), then the
/// remaining and reset (µs) of requests and of tokens.
type Reply = (i64, i64, i64, i64, i64, i64, i64);

fn decision(
    reply: Reply,
    requests: Option<RateLimit>,
    tokens: Option<RateLimit>,
) -> Option<SharedDecision> {
    let (admitted, which, retry, req_left, req_reset, tok_left, tok_reset) = reply;
    let micros = |us: i64| Duration::from_micros(u64::try_from(us).unwrap_or(0));
    let quota = |limit: Option<RateLimit>, left: i64, reset: i64| {
        limit.map(|l| Quota {
            limit: l.per_minute(),
            remaining: u64::try_from(left).unwrap_or(0),
            reset: micros(reset),
        })
    };
    let which = match (admitted, which) {
        (1, 0) => None,
        (0, 1) => Some(Dimension::Requests),
        (0, 2) => Some(Dimension::Tokens),
        _ => return None,
    };
    Some(SharedDecision {
        admitted: which.is_none(),
        headers: RateHeaders {
            requests: quota(requests, req_left, req_reset),
            tokens: quota(tokens, tok_left, tok_reset),
        },
        refused: which.map(|d| (d, (retry >= 0).then(|| micros(retry)))),
    })
}

struct Inner {
    client: redis::Client,
    /// Set once; `ConnectionManager` then reconnects by itself.
    connected: OnceLock<Connected>,
    timeout: Duration,
    up: AtomicBool,
    errors: AtomicU64,
    /// Whether Redis is left alone after errors in a row.
    pause: Mutex<PauseAfterErrors>,
    /// Errors are logged at most once per [`LOG_EVERY`].
    log_gate: LogGate,
}

struct Connected {
    conn: ConnectionManager,
    /// The script's SHA1, as `SCRIPT LOAD` answered.
    sha: String,
}

impl Inner {
    /// Runs the script once for `tenant` (EVAL if Redis lost it), within the timeout.
    async fn call<T: FromRedisValue>(
        &self,
        op: &'static str,
        tenant: &str,
        requests: Option<RateLimit>,
        tokens: Option<RateLimit>,
        last: impl ToRedisArgs,
    ) -> Result<T, Unavailable> {
        let connected = self.usable(crate::clock::now())?;
        let mut conn = connected.conn.clone();
        let limit = |l: Option<RateLimit>| l.map_or([0, 0], |l| [l.per_minute(), l.burst()]);
        let (req, tok) = (limit(requests), limit(tokens));
        let keys = [Dimension::Requests, Dimension::Tokens].map(|d| key(tenant, d));
        let invocation = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script).arg(2).arg(&keys).arg(op).arg(&req[..]);
            cmd.arg(&tok[..]).arg(&last);
            cmd
        };
        let round_trip = async {
            let sent = invocation("EVALSHA", &connected.sha);
            match sent.query_async::<T>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    invocation("EVAL", SCRIPT).query_async(&mut conn).await
                }
                answered => answered,
            }
        };
        match tokio::time::timeout(self.timeout, round_trip).await {
            Ok(Ok(value)) => {
                self.went_well();
                Ok(value)
            }
            Ok(Err(e)) => {
                self.went_wrong(op, &e.to_string());
                Err(Unavailable::Failed)
            }
            Err(_) => {
                self.went_wrong(op, &format!("no answer within {:?}", self.timeout));
                Err(Unavailable::TimedOut)
            }
        }
    }

    /// The connection, unless Redis is left alone after errors or not connected yet.
    fn usable(&self, now: Instant) -> Result<&Connected, Unavailable> {
        let pause = self.pause.lock().unwrap_or_else(|e| e.into_inner());
        if pause.is_paused(now) {
            return Err(Unavailable::Paused);
        }
        self.connected.get().ok_or(Unavailable::NotConnected)
    }

    /// One try, bounded by [`CONNECT_TIMEOUT`]; our own timeouts bound every command after.
    async fn connect(&self) -> bool {
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_connection_timeout(CONNECT_TIMEOUT);
        let client = self.client.clone();
        let made = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let mut conn = ConnectionManager::new_with_config(client, config).await?;
            let mut load = redis::cmd("SCRIPT");
            let sha: String = load.arg("LOAD").arg(SCRIPT).query_async(&mut conn).await?;
            Ok::<_, RedisError>(Connected { conn, sha })
        });
        match made.await {
            Ok(Ok(connected)) => {
                let _ = self.connected.set(connected);
                self.went_well();
                return true;
            }
            Ok(Err(e)) => self.went_wrong("connect", &e.to_string()),
            Err(_) => self.went_wrong("connect", "no connection within 1s"),
        }
        false
    }

    fn went_well(&self) {
        let mut pause = self.pause.lock().unwrap_or_else(|e| e.into_inner());
        pause.succeeded();
        self.up.store(true, Ordering::Relaxed);
    }

    fn went_wrong(&self, op: &'static str, error: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let now = crate::clock::now();
        {
            let mut pause = self.pause.lock().unwrap_or_else(|e| e.into_inner());
            self.up.store(false, Ordering::Relaxed);
            pause.failed(now);
        }
        if let Some(held_back) = self.log_gate.pass(now) {
            warn!(
                op,
                error,
                similar_errors_not_logged = held_back,
                "shared rate limits unavailable: each instance enforces its share"
            );
        }
    }
}

/// Tries to connect every [`RECONNECT_EVERY`] until it works or the limits are dropped.
async fn reconnect(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(RECONNECT_EVERY).await;
        match inner.upgrade() {
            Some(inner) if !inner.connect().await => {}
            _ => return,
        }
    }
}

/// The buckets' arithmetic, as in `spillway_policy::rate::Gcra` (see the module doc).
/// KEYS: the tenant's request and token buckets, each `"<level> <at>"` (units, server µs).
/// ARGV: `admit` or `adjust`; per_minute and burst of requests, then of tokens (per_minute 0:
/// not limited); then the estimated tokens (admit) or the tokens to charge, negative to refund,
/// and 1 to give back a request (adjust).
const SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local US_PER_MINUTE, DEBT_MINUTES = 60000000, 1440
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local function open(key, per_minute, burst)
  if per_minute <= 0 then return nil end
  local b = {key = key, per_minute = per_minute, burst = burst, level = 0, at = now,
             ceiling = burst + per_minute * DEBT_MINUTES}
  local level, at = string.match(redis.call('GET', key) or '', '^(%S+) (%S+)$')
  level, at = tonumber(level), tonumber(at)
  if level and at then
    local drained = math.max(0, now - at) * per_minute / US_PER_MINUTE
    b.level = math.min(b.ceiling, math.max(0, level - drained))
    b.at = math.max(at, now)
  end
  return b
end

-- Microseconds until `excess` units have drained (b.at > now if the clock went back).
local function wait(b, excess)
  if excess <= 0 then return 0 end
  return (b.at - now) + math.ceil(excess * US_PER_MINUTE / b.per_minute)
end

-- nil: `cost` fits now; -1: it never will; otherwise the wait.
local function shortfall(b, cost)
  if not b then return nil end
  if cost > b.burst then return -1 end
  local excess = b.level + cost - b.burst
  if excess > 0 then return wait(b, excess) end
end

local function save(b)
  if b.level <= 0 then return redis.call('DEL', b.key) end
  local value = string.format('%.17g %.0f', b.level, b.at)
  redis.call('SET', b.key, value, 'PX', math.ceil(wait(b, b.level) / 1000) + 1000)
end

local req = open(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
local tok = open(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
local amount = tonumber(ARGV[6])
if ARGV[1] == 'adjust' then
  if req and ARGV[7] == '1' then req.level = math.max(0, req.level - 1); save(req) end
  if tok and amount ~= 0 then
    tok.level = math.max(0, math.min(tok.ceiling, tok.level + amount)); save(tok)
  end
  return 1
end

local function quota(out, i, b)
  if b then out[i], out[i + 1] = math.floor(math.max(0, b.burst - b.level)), wait(b, b.level) end
end
local function reply(admitted, which, retry)
  local out = {admitted, which, retry, 0, 0, 0, 0}
  quota(out, 4, req); quota(out, 6, tok)
  return out
end
local function severity(s) if s == -1 then return math.huge end return s end
local r, t = shortfall(req, 1), shortfall(tok, amount)
if t and (not r or severity(t) > severity(r)) then return reply(0, 2, t) end
if r then return reply(0, 1, r) end
if req then req.level = req.level + 1; save(req) end
if tok then tok.level = tok.level + amount; save(tok) end
return reply(1, 0, 0)
"#;
