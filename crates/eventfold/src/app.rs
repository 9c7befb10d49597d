//! A service's entry point: [`App`] owns the standard flags and their `EVENTFOLD_*`
//! environment variables, the embedded or Kafka wiring, topic provisioning, the instance
//! registry, the HTTP API, graceful shutdown and the `views rebuild` subcommand. A
//! service registers its aggregates, views and process managers in the `setup` closure it
//! gives [`App::new`], and may add flags of its own (any `clap::Args` type) next to the
//! standard ones.
//!
// no_run: `App::run` serves HTTP until SIGTERM or Ctrl-C, so this example is only
// compiled; the example of `App::start` runs the same wiring without serving.
//! ```no_run
//! use eventfold::app::{App, NoFlags, Services};
//! use eventfold::{Aggregate, Context, Reject};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Default, Clone, Serialize, Deserialize)]
//! struct Counter {
//!     n: u64,
//! }
//! #[derive(Serialize, Deserialize)]
//! #[serde(tag = "type")]
//! enum Command {
//!     Add,
//! }
//! #[derive(Clone, Serialize, Deserialize)]
//! #[serde(tag = "type")]
//! enum Event {
//!     Added,
//! }
//! #[derive(Debug)]
//! struct Never;
//! impl std::fmt::Display for Never {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str("never")
//!     }
//! }
//! impl Reject for Never {
//!     fn code(&self) -> &'static str {
//!         "never"
//!     }
//! }
//! impl Aggregate for Counter {
//!     const TYPE: &'static str = "counter";
//!     type Command = Command;
//!     type Event = Event;
//!     type Rejection = Never;
//!     type Config = ();
//!     fn handle(&self, _: Command, _: &Context<'_, ()>) -> Result<Vec<Event>, Never> {
//!         Ok(vec![Event::Added])
//!     }
//!     fn apply(&mut self, _: &Event) {
//!         self.n += 1;
//!     }
//! }
//!
//! fn main() -> anyhow::Result<()> {
//!     App::new("counter", |_: &NoFlags, s: &mut Services| {
//!         s.aggregate::<Counter>(());
//!     })
//!     .about("counts")
//!     .run()
//! }
//! ```

mod options;
mod services;

pub use options::ServeOptions;
pub use services::Services;

use crate::rebuild::ProgressDrawTarget;
use anyhow::{Context as _, bail};
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use eventfold_http::HttpOptions;
use eventfold_http::auth::{self, Auth, Role};
use eventfold_log::Log;
use eventfold_log::embedded::{self, EmbeddedLog};
#[cfg(feature = "kafka")]
use eventfold_log::kafka::{KafkaLog, KafkaOptions};
use eventfold_runtime::{RebuildStats, Registry, Runtime, RuntimeOptions, ViewOptions};
use eventfold_store::{Store, StoreOptions};
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How often an instance renews its `_instances` entry; one silent for three of these is
/// taken for gone.
const REGISTRY_HEARTBEAT: Duration = Duration::from_secs(2);

/// A service without flags of its own.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NoFlags {}

type Setup<F> = Box<dyn Fn(&F, &mut Services) + Send + Sync>;
type Hint = Box<dyn Fn(SocketAddr) -> String + Send + Sync>;

/// A service binary: its name, its registrations and its own flags `F`.
pub struct App<F = NoFlags> {
    name: &'static str,
    about: &'static str,
    version: &'static str,
    hint: Option<Hint>,
    setup: Setup<F>,
}

impl<F> std::fmt::Debug for App<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").field("name", &self.name).finish()
    }
}

/// The command line: the standard flags, the service's own, and the subcommands.
#[derive(Parser)]
struct Cli<F: Args> {
    #[command(subcommand)]
    command: Option<Command<F>>,
    #[command(flatten)]
    serve: ServeOptions,
    #[command(flatten)]
    flags: F,
}

// Parsed once at start-up: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command<F: Args> {
    /// Serve the HTTP API (the default when no subcommand is given).
    Serve,
    /// Operate on the views in the data directory (the service must be stopped).
    Views {
        #[command(subcommand)]
        command: ViewsCommand<F>,
    },
    /// Bearer tokens for --auth-tokens.
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Read a token on stdin (its first line) and print its line for the --auth-tokens
    /// file: `<name> <role> <sha256 hex of the token>`. The file never holds the token
    /// itself; give the token to its client.
    ///
    /// Example: TOKEN=$(openssl rand -hex 32); echo "$TOKEN" | shop auth hash-token ci write >> tokens
    HashToken {
        /// The entry's name (one word), shown in refusals and logs.
        name: String,
        /// `read` (GETs), `write` (reads and commands) or `admin` (everything).
        #[arg(value_parser = ["read", "write", "admin"])]
        role: String,
    },
}

#[derive(Subcommand)]
enum ViewsCommand<F: Args> {
    /// Rebuild a view from the event log: clear its rows, indexes and checkpoints, then
    /// apply every event again, with a progress bar; prints events/s at the end.
    ///
    /// Run it with the service stopped (the store allows one process) and with the same
    /// --data-dir, --app-id and --partitions as the service. In Kafka mode (--kafka, and
    /// the instance's --instance-id or --data-dir) it reads the events topic
    /// (read_committed) into that instance's local store; it produces nothing and does
    /// not join the consumer group.
    Rebuild {
        /// The view's name (one the service registers).
        view: String,
        #[command(flatten)]
        opts: ServeOptions,
        #[command(flatten)]
        flags: F,
    },
}

impl<F: Args + Send + Sync + 'static> App<F> {
    /// A service called `name` (also its default `--app-id`) whose `setup` registers what
    /// it runs, given its own flags.
    pub fn new(name: &'static str, setup: impl Fn(&F, &mut Services) + Send + Sync + 'static) -> Self {
        Self {
            name,
            about: "",
            version: env!("CARGO_PKG_VERSION"),
            hint: None,
            setup: Box::new(setup),
        }
    }

    /// The one-line description `--help` shows.
    pub fn about(mut self, about: &'static str) -> Self {
        self.about = about;
        self
    }

    /// The version `--version` shows (the service's `env!("CARGO_PKG_VERSION")`).
    pub fn version(mut self, version: &'static str) -> Self {
        self.version = version;
        self
    }

    /// A line printed at start after the address, e.g. a `curl` to try.
    pub fn hint(mut self, hint: impl Fn(SocketAddr) -> String + Send + Sync + 'static) -> Self {
        self.hint = Some(Box::new(hint));
        self
    }

    /// The clap command: the derived one, named after the service, with its app id as
    /// the default of `--app-id` (also in `views rebuild`).
    fn command(&self) -> clap::Command {
        let default_app = |c: clap::Command| c.mut_arg("app_id", |a| a.default_value(self.name));
        let cmd = default_app(Cli::<F>::command())
            .name(self.name)
            .bin_name(self.name)
            .about(self.about)
            .version(self.version);
        let name = self.name;
        let examples = format!(
            "Examples:\n  {name} views rebuild <view> --data-dir /var/lib/{name}\n  {name} views rebuild <view> --kafka 127.0.0.1:9092 --data-dir /var/lib/{name}-kafka-1"
        );
        cmd.mut_subcommand("views", |v| {
            v.mut_subcommand("rebuild", |r| default_app(r).after_help(examples))
        })
    }

    /// Parses the command line and runs the service (or the subcommand) until SIGTERM or
    /// Ctrl-C. Logs go to stderr, filtered by `EVENTFOLD_LOG` (default `info`).
    pub fn run(self) -> anyhow::Result<()> {
        self.run_from(std::env::args_os())
    }

    /// [`App::run`] with the given arguments (the first is the program name).
    pub fn run_from<I, T>(self, args: I) -> anyhow::Result<()>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        init_logging();
        if let Err(e) = crate::process::disable_transparent_huge_pages() {
            tracing::debug!(error = %e, "cannot turn transparent huge pages off; going on with them");
        }
        let matches: ArgMatches = self.command().get_matches_from(args);
        let cli = Cli::<F>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        if matches!(cli.command, Some(Command::Views { .. })) {
            keep_freed_memory();
        }
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => rt.block_on(self.serve(cli.serve, cli.flags)),
            Command::Views {
                command: ViewsCommand::Rebuild { view, opts, flags },
            } => {
                let stats = rt.block_on(self.rebuild_view(&opts, &flags, &view))?;
                println!("{}", crate::rebuild::summary(&view, &stats));
                Ok(())
            }
            Command::Auth {
                command: AuthCommand::HashToken { name, role },
            } => {
                let mut token = String::new();
                std::io::stdin()
                    .read_line(&mut token)
                    .context("cannot read the token on stdin")?;
                let role = Role::parse(&role).expect("clap checked the role");
                println!("{}", auth::entry_line(&name, role, token.trim())?);
                Ok(())
            }
        }
    }

    /// Serves the HTTP API on `opts.http` until SIGTERM or Ctrl-C, then drains: stops
    /// accepting, finishes the requests in flight, leaves the instance registry and
    /// flushes the store.
    pub async fn serve(&self, opts: ServeOptions, flags: F) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        opts.check()?;
        let tls = opts.tls()?;
        let listener = eventfold_http::bind(opts.http)
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}{}", opts.http, bind_hint(&e)))?;
        let addr = listener.local_addr()?;
        // Other instances forward reads to the address really bound (--http may say port 0).
        let mut opts = opts;
        let scheme = opts.scheme();
        opts.advertised_http.get_or_insert_with(|| format!("{scheme}://{addr}"));
        let service = self.start(&opts, &flags)?;
        let name = self.name;
        // Before the service says it serves: a SIGHUP from then on is a reload, never the
        // default action (which ends the process).
        match &service.auth {
            Some(auth) => {
                eprintln!(
                    "{name}: {} bearer tokens from {} (SIGHUP reloads it); /healthz and /readyz are open",
                    auth.len(),
                    auth.path().display()
                );
                reload_on_hangup(name, auth.clone())?;
                if tls.is_none() && !addr.ip().to_canonical().is_loopback() {
                    tracing::warn!(%addr, "bearer tokens cross the network in clear text: give --tls-cert and --tls-key, or serve behind a proxy that terminates TLS");
                }
            }
            None if !addr.ip().to_canonical().is_loopback() => {
                tracing::warn!(%addr, "serving without authentication (--insecure-no-auth) beyond this machine");
            }
            None => {}
        }
        eprintln!(
            "{name}: serving {scheme}://{addr} ({}, {} partitions); restoring, see /readyz",
            match &opts.kafka {
                None => format!("embedded log in {}", opts.data_dir().display()),
                Some(b) => format!("Kafka at {b}, local cache in {}", opts.data_dir().display()),
            },
            opts.partitions,
        );
        if let Some(hint) = self.hint.as_ref().filter(|_| tls.is_none()) {
            eprintln!("{}", hint(addr));
        }
        // The API (and /readyz, which shows restore progress) answers while the partitions
        // restore; commands for a restoring partition wait (bounded) or get 503.
        let runtime = service.runtime.clone();
        tokio::spawn(async move {
            if runtime.wait_restored(Duration::from_secs(24 * 3600)).await {
                let ms = started.elapsed().as_millis();
                let _ = writeln!(std::io::stderr(), "{name}: restored in {ms} ms");
            }
        });
        let shutdown = async move {
            let ctrl_c = tokio::signal::ctrl_c();
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
            // Not `eprintln!`: a closed stderr must not turn a graceful stop into a panic.
            let _ = writeln!(std::io::stderr(), "{name}: shutting down");
        };
        match tls {
            None => eventfold_http::serve_with(listener, service.router, opts.server_limits(), shutdown).await?,
            Some(tls) => {
                eventfold_http::serve_tls(listener, service.router, opts.server_limits(), tls, shutdown).await?
            }
        }
        if let Some(registry) = service.registry {
            // Others stop forwarding here at once rather than after the heartbeats run out.
            registry.leave().await;
        }
        flush_store(service.runtime.log().store().clone()).await;
        Ok(())
    }

    /// Opens the store and the log, provisions the topics and starts the runtime and the
    /// HTTP router (inside a multi-threaded tokio runtime), without serving: for running
    /// a service in-process, e.g. in its tests.
    ///
    /// ```
    /// use clap::Parser;
    /// use eventfold::app::{App, NoFlags, ServeOptions, Services};
    /// use eventfold::core::Outcome;
    /// use eventfold::core::testing::Counter;
    /// use eventfold::runtime::CommandRequest;
    ///
    /// /// The standard flags alone, parsed from a list rather than the command line.
    /// #[derive(Parser)]
    /// struct Cli {
    ///     #[command(flatten)]
    ///     serve: ServeOptions,
    /// }
    ///
    /// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
    /// # async fn main() -> anyhow::Result<()> {
    /// let dir = std::env::temp_dir().join(format!("eventfold-doc-app-start-{}", std::process::id()));
    /// let opts = Cli::try_parse_from(["counter", "--data-dir", dir.to_str().unwrap()])?.serve;
    /// let app = App::new("counter", |_: &NoFlags, s: &mut Services| {
    ///     s.aggregate::<Counter>(());
    /// });
    /// let running = app.start(&opts, &NoFlags {})?;
    /// let request = CommandRequest {
    ///     aggregate_id: "c-1".into(),
    ///     body: br#"{"type": "Add", "n": 2}"#.to_vec(),
    ///     ..Default::default()
    /// };
    /// let outcome = running.runtime.aggregate("counter")?.submit(request).await?;
    /// assert!(matches!(outcome, Outcome::Accepted(a) if a.version == 1));
    /// # drop(running);
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// # Ok(())
    /// # }
    /// ```
    pub fn start(&self, opts: &ServeOptions, flags: &F) -> anyhow::Result<Running> {
        opts.check()?;
        let forward_tls = opts.forward_tls()?;
        let dir = opts.data_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create data directory {}", dir.display()))?;
        let store_bytes = opts.store_memory_mb << 20;
        let store_options = StoreOptions {
            background_nice: opts.background_nice,
            // In Kafka mode the store is a cache whose writes are never synced one by one.
            spare_journals: opts.kafka.is_none(),
            // Unflushed writes and cached blocks were most of a long run's memory
            // (bench/FINDINGS.md, "Memory of the embedded shop").
            cache_bytes: store_bytes / 4,
            journal_bytes: store_bytes - store_bytes / 4,
            ..StoreOptions::default()
        };
        let store =
            Store::open(&dir, &store_options).with_context(|| format!("cannot open the store in {}", dir.display()))?;
        let log = open_log(opts, store, false)?;
        let advertised = opts
            .advertised_http
            .clone()
            .unwrap_or_else(|| format!("{}://{}", opts.scheme(), opts.http));
        // Kafka mode: announce this instance and the partitions it owns, for routing.
        let registry = match &opts.kafka {
            None => None,
            Some(_) => Some(
                tokio::task::block_in_place(|| {
                    Registry::start(
                        log.clone(),
                        &opts.app_id,
                        &opts.instance_id,
                        &advertised,
                        REGISTRY_HEARTBEAT,
                    )
                })
                .context("cannot announce this instance on the _instances topic")?,
            ),
        };
        let mut builder = Runtime::builder(opts.runtime_options());
        if let Some(r) = &registry {
            let r = r.clone();
            builder = builder.on_ownership(Arc::new(move |owned| r.set_owned(owned)));
        }
        let mut services = Services::new(builder, !opts.no_process_managers);
        (self.setup)(flags, &mut services);
        let builder = services.into_builder().view_options(ViewOptions {
            bulk_catch_up_min_events: opts.bulk_min_records,
            ..Default::default()
        });
        // Kafka mode: every topic is created or checked now, so that one with another
        // partition count or a policy that would lose data stops the start, with the reason.
        let topics = builder.topics();
        if let Some(coordinated) = log.coordination() {
            tokio::task::block_in_place(|| coordinated.provision(&topics))
                .context("the app's Kafka topics cannot be used")?;
        }
        let auth = match &opts.auth_tokens {
            None => None,
            Some(path) => Some(Arc::new(
                Auth::open(path, opts.auth_options()).context("--auth-tokens: the token file cannot be used")?,
            )),
        };
        let runtime = builder.build(log);
        let http = HttpOptions {
            forward_tls,
            max_body_bytes: opts.max_body_bytes,
            advertised_address: advertised,
            registry: registry.clone(),
            auth: auth.clone(),
            max_in_flight: opts.max_concurrent_requests,
            body_read_timeout: Duration::from_secs(opts.body_read_timeout_secs),
            ..Default::default()
        };
        let router = eventfold_http::router(runtime.clone(), http);
        Ok(Running {
            runtime,
            router,
            registry,
            auth,
        })
    }

    /// Rebuilds view `name` in the data directory from its source events, with a progress
    /// bar on stderr (see [`crate::rebuild`]): from the embedded log there, or in Kafka
    /// mode from the events topic (`read_committed`, without producing anything or joining
    /// the consumer group) into the instance's local store. The service must not be
    /// running on that directory.
    pub async fn rebuild_view(&self, opts: &ServeOptions, flags: &F, name: &str) -> anyhow::Result<RebuildStats> {
        let mut services = Services::new(Runtime::builder(opts.runtime_options()), false);
        (self.setup)(flags, &mut services);
        let Some(rebuild) = services.rebuilder(name) else {
            bail!("unknown view `{name}`; views: {}", services.view_names().join(", "));
        };
        let dir = opts.data_dir();
        if !dir.exists() {
            bail!("data directory {} does not exist", dir.display());
        }
        // The rebuild reads the log once, in order: a block cache of the service's size would
        // only take memory (first touched, so zeroed by the kernel: time) and evict.
        let store_options = StoreOptions {
            cache_bytes: 32 << 20,
            background_nice: opts.background_nice,
            ..StoreOptions::default()
        };
        let store = Store::open(&dir, &store_options).with_context(|| {
            format!(
                "cannot open the store in {} (is the service still running on it? stop it first: the store admits one process)",
                dir.display()
            )
        })?;
        let log = open_log(opts, store, true)?;
        rebuild(
            log,
            opts.app_id.clone(),
            ViewOptions::default(),
            ProgressDrawTarget::stderr(),
        )
        .await
    }
}

/// A started service: its runtime and HTTP router.
pub struct Running {
    /// The runtime (for in-process use and tests).
    pub runtime: Runtime,
    /// The HTTP API.
    pub router: eventfold_http::Router,
    /// Kafka mode: this instance's entry in `<app-id>._instances` (leave it on shutdown).
    pub registry: Option<Arc<Registry>>,
    /// The bearer tokens of `--auth-tokens` (`App::serve` reloads them on SIGHUP).
    pub auth: Option<Arc<Auth>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").finish_non_exhaustive()
    }
}

/// Reloads `auth`'s token file at every SIGHUP from now on, and says so on stderr as
/// `<name>: reloaded ...`; a file that does not parse leaves the tokens loaded before in
/// force, and the line says why.
fn reload_on_hangup(name: &'static str, auth: Arc<Auth>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Registered now, before the service says it serves: a SIGHUP sent from then on is
    // a reload, never the default action (which ends the process).
    let mut hangup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            let file = auth.path().display().to_string();
            // Not `eprintln!`: a closed stderr must not panic the reload.
            let _ = match auth.reload() {
                Ok(n) => writeln!(std::io::stderr(), "{name}: reloaded {file}: {n} bearer tokens"),
                Err(e) => writeln!(
                    std::io::stderr(),
                    "{name}: cannot reload the token file, the {} tokens loaded before stay in force: {e}",
                    auth.len()
                ),
            };
        }
    });
    Ok(())
}

/// Logs to stderr, filtered by `EVENTFOLD_LOG`.
fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EVENTFOLD_LOG")
                .unwrap_or_else(|_| "info,fjall=warn,lsm_tree=warn".into()),
        )
        .with_writer(std::io::stderr)
        // The service's log is best effort: with stderr closed (a supervisor that stopped
        // reading it), tracing's own "unable to write" report would be an `eprintln!`,
        // which panics on EPIPE, in whichever thread logged: a request handler's
        // connection then closed without an answer.
        .log_internal_errors(false)
        .try_init();
}

/// The log over `store`: the embedded log, or in Kafka mode the Kafka log, read-only for
/// `reader` (a rebuild: no producer, no group; see `KafkaLog::open_reader`).
fn open_log(opts: &ServeOptions, store: Store, reader: bool) -> anyhow::Result<Arc<dyn Log>> {
    #[cfg(not(feature = "kafka"))]
    let _ = reader;
    Ok(match &opts.kafka {
        None => Arc::new(EmbeddedLog::open(
            store,
            embedded::Options {
                partitions: opts.partitions,
                fsync: !opts.no_fsync,
                committer_nice: opts.committer_nice,
                ..Default::default()
            },
        )?),
        #[cfg(not(feature = "kafka"))]
        Some(_) => bail!("--kafka: this build has no Kafka support (build eventfold with its `kafka` feature)"),
        #[cfg(feature = "kafka")]
        Some(bootstrap) if reader => {
            let kafka = opts.kafka_options(bootstrap);
            let log = tokio::task::block_in_place(|| KafkaLog::open_reader(kafka, store))
                .with_context(|| format!("cannot read the Kafka log at {bootstrap}"))?;
            Arc::new(log)
        }
        #[cfg(feature = "kafka")]
        Some(bootstrap) => {
            // One instance per transactional id: a restarted instance fences its previous
            // incarnation. Opening connects and initializes transactions (blocking).
            let kafka: KafkaOptions = opts.kafka_options(bootstrap);
            let log = tokio::task::block_in_place(|| KafkaLog::open(kafka, store))
                .with_context(|| format!("cannot start the Kafka log at {bootstrap}"))?;
            Arc::new(log)
        }
    })
}

/// Makes this process keep the memory it frees, for a batch command such as `views
/// rebuild` under mimalloc: it allocates and frees gigabytes, and mimalloc returns freed
/// pages to the OS after 10 ms, then faults them in again (zeroed) for the next
/// allocations. Unless `MIMALLOC_PURGE_DELAY` is set already, the process re-executes
/// itself once with it set to -1 (never return freed memory; the command exits when
/// done). A failed exec is logged and the command goes on as it is.
fn keep_freed_memory() {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                tracing::debug!(error = %e, "cannot find the executable to set MIMALLOC_PURGE_DELAY");
                return;
            }
        };
        let e = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("MIMALLOC_PURGE_DELAY", "-1")
            .exec();
        tracing::debug!(error = %e, "cannot re-execute with MIMALLOC_PURGE_DELAY=-1; going on without");
    }
}

/// Writes the store's memtables to table files on a graceful stop, so that the next start
/// does not replay the journals. Failing here loses nothing: the journal still holds every
/// write. Logged through `tracing`, which, unlike `eprintln!`, does not panic when stderr
/// has been closed meanwhile (a supervisor gone, a test that stopped reading).
async fn flush_store(store: Store) {
    let started = std::time::Instant::now();
    match tokio::task::spawn_blocking(move || store.flush()).await {
        Ok(Ok(())) => tracing::info!(ms = started.elapsed().as_millis() as u64, "store flushed"),
        Ok(Err(e)) => tracing::warn!(error = %e, "could not flush the store; the next start replays its journal"),
        Err(e) => tracing::warn!(error = %e, "the store flush failed; the next start replays its journal"),
    }
}

impl ServeOptions {
    /// The runtime's options from the flags.
    fn runtime_options(&self) -> RuntimeOptions {
        RuntimeOptions {
            app_id: self.app_id.clone(),
            instance_id: self.instance_id.clone(),
            dedup_window: Duration::from_secs(self.dedup_window_secs),
            command_timeout: Duration::from_secs(self.command_timeout_secs),
            restore_bulk_min_records: self.bulk_min_records,
            cache_limit: self.cache_limit,
            ..Default::default()
        }
    }
}

/// The likely cause of a failed bind, for the start-up error.
fn bind_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            " (another process listens there, perhaps another instance of this service: stop it, or give this one another --http)"
        }
        std::io::ErrorKind::AddrNotAvailable => " (the address is not one of this machine's)",
        std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privilege)",
        _ => "",
    }
}
