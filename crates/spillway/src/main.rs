//! The `spillway` binary: parses the command line, sets up logging, and hands off to the crates.
//!
//! This is the only place that uses `anyhow`: libraries return typed errors, and here each one
//! becomes a one-line message and a non-zero exit status.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use spillway_config::{Config, ConfigError, QUICKSTART_KEY, QUICKSTART_TOML};
use spillway_proxy::reload::{Loaded, Startup};
use spillway_proxy::BoundGateway;

mod audit;
mod manage;
mod remote;
mod top;

// glibc's allocator took about a tenth of the request path's CPU in profiles (arena locking and
// consolidation on many small short-lived buffers); mimalloc's thread-local free lists do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "spillway",
    version,
    about = "An OpenAI-compatible inference gateway that sheds, queues fairly and retries within a budget."
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter, in `RUST_LOG` syntax (e.g. `info`, `spillway_proxy=debug`).
    #[arg(long, global = true, env = "SPILLWAY_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway. Without --config, runs the quickstart: 127.0.0.1:8080, two in-process
    /// mock backends for model `mock-small` in regions `region-a` and `region-b`, and a demo key.
    Serve {
        /// TOML configuration file (see docs/config.md).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Listen here instead of `server.listen` (e.g. 127.0.0.1:0 for any free port).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Serve the admin API and metrics here instead of `server.admin_listen`.
        #[arg(long)]
        admin_listen: Option<std::net::SocketAddr>,
        /// Where the gateway keeps its own state: the last-known-good config.
        #[arg(long, env = "SPILLWAY_DATA_DIR", default_value = "spillway-data")]
        data_dir: PathBuf,
        /// When the config file does not pass its checks, serve the last-known-good config
        /// saved in the data directory instead of refusing to start (and say so loudly).
        #[arg(long)]
        fallback_to_last_known_good: bool,
    },
    /// Make a running gateway reload its config file (through its admin API): the file is
    /// checked whole and swapped in, or nothing changes and the problems are printed.
    Reload(remote::AdminArgs),
    /// Look at or roll back a running gateway's config (through its admin API).
    Config {
        #[command(subcommand)]
        command: remote::ConfigCommand,
    },
    /// Show or steer a running gateway's staged rollouts (through its admin API).
    Rollout {
        #[command(subcommand)]
        command: remote::RolloutCommand,
    },
    /// A live view of a running gateway, like `top`: who drives its load, what it sheds and
    /// retries, and its backends (through its admin API).
    ///
    /// Per tenant the requests offered, admitted, queued and shed (by reason), callers' retries
    /// and upstream attempts, sorted by who drives the load; per model the amplification ratio
    /// (upstream attempts ÷ requests offered); per backend its state, load and limit. Reads
    /// `GET /admin/top` at --admin-url, by default the quickstart's admin listener; `q` or
    /// Ctrl-C quits. `--once` prints one frame, `--json` as JSON (docs/top.md).
    Top(top::TopArgs),
    /// Run the simulated OpenAI-compatible inference server on its own.
    MockBackend(spillway_mock::MockArgs),
    /// Replay an incident with real processes on 127.0.0.1 and print what callers and backends
    /// saw, with spillway's protections and with a naive gateway (e.g. `replay retry-storm`).
    Replay(spillway_replay::ReplayArgs),
    /// Manage tenants in the configured store (`add`, `list`, `show`, `update`, `disable`).
    Tenants {
        #[command(subcommand)]
        command: manage::TenantsCommand,
        #[command(flatten)]
        store: manage::StoreArgs,
    },
    /// Manage API keys in the configured store (`create`, `list`, `revoke`).
    Keys {
        #[command(subcommand)]
        command: manage::KeysCommand,
        #[command(flatten)]
        store: manage::StoreArgs,
    },
    /// Check a spillway config and Kubernetes manifests (of spillway and of the inference
    /// servers behind it) against the lessons of the incidents spillway comes from: each
    /// finding with its severity, file and key, the lesson and the incident (docs/audit.md).
    Audit(audit::AuditArgs),
    /// Check a configuration file and print every problem with its location: everything
    /// `serve` would refuse the file for, including environment variables named for keys that
    /// are unset, without opening the store or binding a port.
    CheckConfig {
        /// TOML configuration file.
        file: PathBuf,
        /// Do not look at the environment variables the file names (to check a file away from
        /// the secrets it will run with).
        #[arg(long)]
        no_env: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log);
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("spillway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::CheckConfig { file, no_env } => Ok(check_config(&file, !no_env)),
        Command::Audit(args) => Ok(audit::run(args)),
        Command::Serve {
            config,
            listen,
            admin_listen,
            data_dir,
            fallback_to_last_known_good,
        } => {
            let quickstart = config.is_none();
            let (loaded, last_known_good) =
                match starting_config(config.as_deref(), &data_dir, fallback_to_last_known_good) {
                    Some(found) => found,
                    None => return Ok(ExitCode::FAILURE),
                };
            let startup = Startup {
                loaded,
                path: config,
                last_known_good,
                listen,
                admin_listen,
                data_dir,
            };
            let workers = startup.loaded.config.server.worker_threads;
            runtime(workers)?.block_on(serve(startup, quickstart))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Reload(admin) => {
            let ok = runtime(Some(1))?.block_on(remote::reload(admin))?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Rollout { command } => {
            let ok = runtime(Some(1))?.block_on(remote::rollout(command))?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Config { command } => {
            let ok = runtime(Some(1))?.block_on(remote::config(command))?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Top(args) => {
            runtime(Some(1))?.block_on(top::run(args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::MockBackend(args) => {
            runtime(None)?.block_on(async {
                let shutdown = shutdown_signal()?;
                anyhow::Ok(spillway_mock::run(args, shutdown).await?)
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Tenants { command, store } => {
            runtime(Some(1))?.block_on(manage::tenants(command, store))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Keys { command, store } => {
            runtime(Some(1))?.block_on(manage::keys(command, store))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Replay(args) => {
            runtime(None)?.block_on(async {
                let shutdown = shutdown_signal()?;
                anyhow::Ok(spillway_replay::run(args, shutdown).await?)
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The tokio runtime; `workers` overrides its default of one worker thread per CPU (or
/// `TOKIO_WORKER_THREADS`).
///
/// One worker is the current-thread scheduler on the calling thread, not the multi-threaded
/// one with a single worker: the same one thread runs the request path, without the
/// work-stealing queues, their atomics and the hand-off between the thread that waits in
/// `block_on` and the worker.
fn runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    Ok(builder.enable_all().build()?)
}

/// The config `serve` starts with, and whether it is the last-known-good one; `None` (the
/// problems printed) when there is none to start with.
fn starting_config(
    path: Option<&std::path::Path>,
    data_dir: &std::path::Path,
    fallback: bool,
) -> Option<(Loaded, bool)> {
    let Some(path) = path else {
        return match Loaded::from_text(QUICKSTART_TOML.to_owned()) {
            Ok(l) => Some((l, false)),
            Err(e) => {
                print_config_error("quickstart", &e);
                None
            }
        };
    };
    let e = match Loaded::from_file(path) {
        Ok(l) => return Some((l, false)),
        Err(e) => e,
    };
    print_config_error(&path.display().to_string(), &e);
    if !fallback {
        return None;
    }
    match spillway_proxy::reload::saved::load(data_dir) {
        Ok(Some((loaded, saved))) => {
            tracing::error!(
                file = %path.display(),
                last_known_good = %loaded.hash,
                saved_from = saved.source.as_deref().unwrap_or("?"),
                "THE CONFIG FILE DOES NOT PASS ITS CHECKS: SERVING THE LAST-KNOWN-GOOD CONFIG \
                 INSTEAD (--fallback-to-last-known-good); fix the file and reload"
            );
            eprintln!(
                "spillway: {}: does not pass its checks; serving the last-known-good config {} saved in {}",
                path.display(),
                loaded.hash,
                spillway_proxy::reload::saved::path(data_dir).display()
            );
            Some((loaded, true))
        }
        Ok(None) => {
            eprintln!(
                "spillway: no last-known-good config to fall back to in {}",
                data_dir.display()
            );
            None
        }
        Err(e) => {
            eprintln!("spillway: cannot fall back to the last-known-good config: {e}");
            None
        }
    }
}

async fn serve(startup: Startup, quickstart: bool) -> anyhow::Result<()> {
    // Before the listeners: from their first connection on, a signal is a shutdown.
    let shutdown = shutdown_signal()?;
    let gateway = BoundGateway::bind(startup).await?;
    let addr = gateway.local_addr();
    // One line on stdout that scripts and tests can read the bound addresses from.
    println!(
        "spillway listening on http://{addr} (admin on http://{})",
        gateway.admin_addr()
    );
    if quickstart {
        println!(
            "quickstart: model mock-small on two in-process mock backends (region-a, region-b)\n\
             API key: {QUICKSTART_KEY}\n\
             Try:\n  curl -s http://{addr}/v1/chat/completions \\\n    \
             -H 'Authorization: Bearer {QUICKSTART_KEY}' -H 'Content-Type: application/json' \\\n    \
             -d '{{\"model\":\"mock-small\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'\n\
             Metrics: curl -s http://{admin}/metrics",
            admin = gateway.admin_addr()
        );
    }
    gateway.serve(shutdown).await?;
    Ok(())
}

/// An environment variable's value, for [`spillway_proxy::preflight`].
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn check_config(file: &std::path::Path, with_env: bool) -> ExitCode {
    let env: Option<spillway_proxy::preflight::Env<'_>> = with_env.then_some(&env_var);
    let checked =
        Config::load(file).and_then(|c| match spillway_proxy::preflight::preflight(&c, env) {
            problems if problems.is_empty() => Ok(c),
            problems => Err(ConfigError::Invalid(problems)),
        });
    match checked {
        Ok(c) => {
            let backends: usize = c.models.iter().map(|m| m.backends.len()).sum();
            println!(
                "{}: ok ({} model(s), {backends} backend(s), {} tenant(s))",
                file.display(),
                c.models.len(),
                c.tenants.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            print_config_error(&file.display().to_string(), &e);
            ExitCode::FAILURE
        }
    }
}

fn print_config_error(file: &str, e: &ConfigError) {
    match e {
        ConfigError::Invalid(problems) => {
            for p in problems {
                eprintln!("{file}: {p}");
            }
            eprintln!("{file}: {} problem(s)", problems.len());
        }
        ConfigError::Parse(errors) => {
            // One line per error, however many lines the parser spread it over.
            for msg in errors {
                let one_line = msg
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                eprintln!("{file}: {one_line}");
            }
            if errors.len() > 1 {
                eprintln!("{file}: {} problem(s)", errors.len());
            }
        }
        ConfigError::Read { .. } => eprintln!("spillway: {e}"),
    }
}

/// A future that resolves on the first SIGINT or SIGTERM. The handlers are set here, when it is
/// made, not when it is first awaited: made before the listeners are bound, a signal that comes
/// as soon as they accept is a shutdown, not the end of the process by the signal's default
/// action. Made inside the runtime.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = interrupt.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

fn init_logging(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
