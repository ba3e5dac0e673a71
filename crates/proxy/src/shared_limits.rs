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
//! units (burst <= 1e12, plus a day's debt at <= 1e12 per minute, plus one cost), under 2^53, so
//! whole-unit changes are exact; what drains between two calls (`elapsed * per_minute / 6e7`) is
//! rounded once, a relative error of 2^-53 of the amount. Time resolves to the microsecond (the
//! local limiter: the nanosecond), and waits and resets are rounded up to it.
//!
//! When Redis is slow or down, every call here still returns within its timeout, with
//! [`Unavailable`]; the caller then falls back to each instance enforcing its share of the limit
//! (`RateLimit::share`) and reports [`SharedLimits::is_up`] and [`SharedLimits::errors`] in its
//! metrics. Errors are logged at most once per [`LOG_EVERY`], and after [`ERRORS_BEFORE_PAUSE`]
//! in a row Redis is left alone for [`PAUSE`], so that a hung Redis does not add its timeout to
//! every request. A Redis that is down at start is not an error: redis's `ConnectionManager`
//! is made in the background and reconnects by itself.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, RedisError};
use spillway_policy::rate::MAX_PER_MINUTE;
use spillway_policy::{Dimension, Quota, RateHeaders, RateLimit};
use tracing::warn;

/// Keys are `spillway:rl:{<tenant>}:req` and `spillway:rl:{<tenant>}:tok`.
pub const KEY_PREFIX: &str = "spillway:rl:";
/// A connection attempt (with loading the script) gives up after this; `start` waits at most
/// this long for the first one.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// After this many errors in a row, Redis is left alone for [`PAUSE`].
pub const ERRORS_BEFORE_PAUSE: u32 = 3;
pub const PAUSE: Duration = Duration::from_secs(1);
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
    /// [`CONNECT_TIMEOUT`]; if that fails, calls answer [`Unavailable`] until a later attempt,
    /// made in the background, works. `timeout` bounds every call.
    pub async fn start(url: &str, timeout: Duration) -> Result<SharedLimits, SharedLimitsError> {
        let client =
            redis::Client::open(url).map_err(|e| SharedLimitsError::InvalidUrl(e.to_string()))?;
        let inner = Arc::new(Inner {
            client,
            connected: OnceLock::new(),
            connecting: AtomicBool::new(false),
            timeout,
            up: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            health: Mutex::new(Health::default()),
        });
        if let Some(attempt) = inner.begin_connect(Instant::now()) {
            // Spawned, so that it finishes even if this call is dropped (a dropped attempt
            // would leave `connecting` set for good); the attempt bounds itself.
            let _ = tokio::spawn(attempt).await;
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
            let headers = RateHeaders {
                requests: None,
                tokens: None,
            };
            return Ok(SharedDecision {
                admitted: true,
                headers,
                refused: None,
            });
        }
        // Anything above the burst (at most MAX_PER_MINUTE) is refused for good anyway.
        let cost = clamp(i128::from(est_tokens), 0, i128::from(MAX_PER_MINUTE) + 1);
        let reply: Reply = self
            .inner
            .call("admit", tenant, requests, tokens, [cost, 0])
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
        let delta = clamp(i128::from(token_delta), -MAX_DELTA, MAX_DELTA);
        let args = [delta, i64::from(refund_request)];
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

impl std::fmt::Debug for SharedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimits")
            .field("up", &self.is_up())
            .field("errors", &self.errors())
            .finish_non_exhaustive()
    }
}

const MAX_DELTA: i128 = 2_000_000_000_000_000;

/// admitted, refused by (0 none, 1 requests, 2 tokens), retry after (µs; -1 never), then the
/// remaining and reset (µs) of requests and of tokens.
type Reply = (i64, i64, i64, i64, i64, i64, i64);

fn clamp(value: i128, low: i128, high: i128) -> i64 {
    i64::try_from(value.clamp(low, high)).unwrap_or_default()
}

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
    connected: OnceLock<Connected>,
    connecting: AtomicBool,
    timeout: Duration,
    up: AtomicBool,
    errors: AtomicU64,
    health: Mutex<Health>,
}

struct Connected {
    conn: ConnectionManager,
    /// The script's SHA1, as `SCRIPT LOAD` answered.
    sha: String,
}

#[derive(Default)]
struct Health {
    errors_in_a_row: u32,
    skip_until: Option<Instant>,
    next_connect: Option<Instant>,
    last_log: Option<Instant>,
    not_logged: u64,
}

impl Inner {
    /// Runs the script once for `tenant` (EVAL if Redis lost it), within the timeout.
    async fn call<T: FromRedisValue>(
        self: &Arc<Self>,
        op: &'static str,
        tenant: &str,
        requests: Option<RateLimit>,
        tokens: Option<RateLimit>,
        [arg, flag]: [i64; 2],
    ) -> Result<T, Unavailable> {
        let connected = self.usable(Instant::now())?;
        let mut conn = connected.conn.clone();
        let limit = |l: Option<RateLimit>| l.map_or((0, 0), |l| (l.per_minute(), l.burst()));
        let (req_rate, req_burst) = limit(requests);
        let (tok_rate, tok_burst) = limit(tokens);
        let invocation = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script).arg(2);
            cmd.arg(key(tenant, Dimension::Requests));
            cmd.arg(key(tenant, Dimension::Tokens));
            cmd.arg(op)
                .arg(req_rate)
                .arg(req_burst)
                .arg(tok_rate)
                .arg(tok_burst);
            cmd.arg(arg).arg(flag);
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

    /// The connection, unless Redis is left alone after errors or not connected yet (then a
    /// connection attempt is started, if none was started recently).
    fn usable(self: &Arc<Self>, now: Instant) -> Result<&Connected, Unavailable> {
        {
            let health = self.health.lock().unwrap_or_else(|e| e.into_inner());
            if health.skip_until.is_some_and(|until| now < until) {
                return Err(Unavailable::Paused);
            }
        }
        if let Some(connected) = self.connected.get() {
            return Ok(connected);
        }
        if let Some(attempt) = self.begin_connect(now) {
            tokio::spawn(attempt);
        }
        Err(Unavailable::NotConnected)
    }

    /// A connection attempt to run, unless one is running or one started less than
    /// [`RECONNECT_EVERY`] ago.
    fn begin_connect(
        self: &Arc<Self>,
        now: Instant,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        {
            let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
            if health.next_connect.is_some_and(|at| now < at)
                || self.connecting.swap(true, Ordering::AcqRel)
            {
                return None;
            }
            health.next_connect = Some(now + RECONNECT_EVERY);
        }
        let inner = self.clone();
        Some(async move {
            // One try per attempt; our own timeouts bound every command.
            let config = ConnectionManagerConfig::new()
                .set_number_of_retries(0)
                .set_connection_timeout(CONNECT_TIMEOUT);
            let client = inner.client.clone();
            let made = tokio::time::timeout(CONNECT_TIMEOUT, async {
                let mut conn = ConnectionManager::new_with_config(client, config).await?;
                let mut load = redis::cmd("SCRIPT");
                let sha: String = load.arg("LOAD").arg(SCRIPT).query_async(&mut conn).await?;
                Ok::<_, RedisError>(Connected { conn, sha })
            });
            match made.await {
                Ok(Ok(connected)) => {
                    let _ = inner.connected.set(connected);
                    inner.went_well();
                }
                Ok(Err(e)) => inner.went_wrong("connect", &e.to_string()),
                Err(_) => inner.went_wrong("connect", "no connection within 1s"),
            }
            inner.connecting.store(false, Ordering::Release);
        })
    }

    fn went_well(&self) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        health.errors_in_a_row = 0;
        health.skip_until = None;
        self.up.store(true, Ordering::Relaxed);
    }

    fn went_wrong(&self, op: &'static str, error: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let log = {
            let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
            self.up.store(false, Ordering::Relaxed);
            health.errors_in_a_row = health.errors_in_a_row.saturating_add(1);
            if health.errors_in_a_row >= ERRORS_BEFORE_PAUSE {
                health.skip_until = Some(now + PAUSE);
            }
            let due = health
                .last_log
                .is_none_or(|at| now.saturating_duration_since(at) >= LOG_EVERY);
            if due {
                health.last_log = Some(now);
                Some(std::mem::take(&mut health.not_logged))
            } else {
                health.not_logged += 1;
                None
            }
        };
        if let Some(held_back) = log {
            warn!(
                op,
                error,
                similar_errors_not_logged = held_back,
                "shared rate limits unavailable: each instance enforces its share"
            );
        }
    }
}

/// The buckets' arithmetic, as in `spillway_policy::rate::Gcra` (see the module doc).
const SCRIPT: &str = r#"
-- KEYS: the tenant's request and token buckets, each "<level> <at>" (units, server µs).
-- ARGV: "admit" | "adjust"; per_minute and burst of requests, then of tokens (per_minute 0:
-- not limited); admit: the estimated tokens; adjust: tokens to charge (negative: refund) and
-- 1 to give back a request.
if redis.replicate_commands then redis.replicate_commands() end
local US_PER_MINUTE, DEBT_MINUTES = 60000000, 1440
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local function open(key, per_minute, burst)
  if per_minute <= 0 then return nil end
  local b = {key = key, per_minute = per_minute, burst = burst, level = 0, at = now,
             ceiling = burst + per_minute * DEBT_MINUTES}
  local stored = redis.call('GET', key)
  if stored then
    local level, at = string.match(stored, '^(%S+) (%S+)$')
    level, at = tonumber(level), tonumber(at)
    if level and at then
      local drained = math.max(0, now - at) * per_minute / US_PER_MINUTE
      b.level = math.min(b.ceiling, math.max(0, level - drained))
      b.at = math.max(at, now)
    end
  end
  return b
end

-- Microseconds until `excess` units have drained (the clock may have gone back: b.at > now).
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
  return nil
end

local function save(b)
  if b.level <= 0 then
    redis.call('DEL', b.key)
  else
    local ttl = math.ceil(wait(b, b.level) / 1000) + 1000
    redis.call('SET', b.key, string.format('%.17g %.0f', b.level, b.at), 'PX', ttl)
  end
end

local req = open(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
local tok = open(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
local amount = tonumber(ARGV[6])

if ARGV[1] == 'adjust' then
  if req and ARGV[7] == '1' then
    req.level = math.max(0, req.level - 1)
    save(req)
  end
  if tok and amount ~= 0 then
    tok.level = math.max(0, math.min(tok.ceiling, tok.level + amount))
    save(tok)
  end
  return 1
end

local function reply(admitted, which, retry)
  local out = {admitted, which, retry, 0, 0, 0, 0}
  if req then out[4], out[5] = math.floor(math.max(0, req.burst - req.level)), wait(req, req.level) end
  if tok then out[6], out[7] = math.floor(math.max(0, tok.burst - tok.level)), wait(tok, tok.level) end
  return out
end

local r, t = shortfall(req, 1), shortfall(tok, amount)
local function severity(s) if s == -1 then return math.huge end return s end
if t and (not r or severity(t) > severity(r)) then return reply(0, 2, t) end
if r then return reply(0, 1, r) end
if req then req.level = req.level + 1; save(req) end
if tok then tok.level = tok.level + amount; save(tok) end
return reply(1, 0, 0)
"#;
