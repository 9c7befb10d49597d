//! `eventfold`: the ops CLI (load generator, ...).

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::StyledStr;
use clap::builder::styling::Style;
use clap::{Args, Parser, Subcommand, ValueEnum};
use eventfold_tools::drop_app::{self, DropOptions, DropSummary};
use eventfold_tools::load::flows::{self, FlowOptions, FlowSummary};
use eventfold_tools::load::{self, Ids, Limit, LoadOptions, Preset, Summary};
use eventfold_tools::load_topic::flows::FlowTopicSummary;
use eventfold_tools::load_topic::{self, TopicLoadOptions, TopicSummary};

/// mimalloc, as the shop: the load generators share a benchmark machine's cores with the
/// service they measure, and glibc's allocator cost the HTTP generator about 10% more CPU
/// (bench/FINDINGS.md, "Moved from the README").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "eventfold", version, about = "eventfold ops CLI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send commands to an eventfold service and report status codes, throughput and latency.
    ///
    /// Sends `POST {url}/v1/aggregates/{type}/{id}/commands` with a JSON body and a fresh
    /// `Idempotency-Key` per request. Without --body the `shop-orders` preset is used.
    /// `--workload flows` runs the shop's order flow instead: PlaceOrder and ConfirmOrder on
    /// a fresh order, then the order is read until its process manager has shipped it.
    #[command(after_help = "\
Exit status: 0 when the run passed, 1 when more than --max-error-rate of the requests \
failed (200, other 2xx and 422 count as success; with --workload flows: of the flows did \
not end shipped), 2 on invalid options.

Examples:
  eventfold load --url http://127.0.0.1:8080 --duration 30s --concurrency 128
  eventfold load --count 10000 --rate 500 --warmup 2s --json
  eventfold load --type counter --body '{\"type\":\"Add\",\"by\":1}' --ids 100
  eventfold load --workload flows --rate 2000 --concurrency 512 --duration 10s --warmup 1s
  eventfold load --workload flows --concurrency 256 --duration 10s   # most completed flows/s")]
    Load(LoadArgs),

    /// Produce commands straight to `<app>.<type>.commands` on Kafka and measure
    /// command-to-result latency from the results topic.
    ///
    /// Works against any service following eventfold's topic layout (eventfold in Kafka
    /// mode, or the Kafka Streams peer of the benchmark suite). Each command carries
    /// `ef-type` and `ef-command-id` headers and is keyed by a fresh aggregate id
    /// (murmur2-partitioned); its result is matched by key on `<app>.<type>.results`, read
    /// with `isolation.level=read_committed`. `--workload flows` runs the shop's order flow
    /// instead: PlaceOrder and ConfirmOrder on a fresh order, timed from its OrderConfirmed
    /// to its OrderShipped on `<app>.<type>.events` (read_committed).
    #[command(after_help = "\
Exit status: 0 when every result arrived exactly once (flows: every flow ended shipped \
exactly once), 1 when one did not, 2 on invalid options or when the topics cannot be \
reached.

Examples:
  eventfold load-topic --bootstrap 127.0.0.1:9092 --app shop --duration 10s
  eventfold load-topic --rate 5000 --duration 10s --json
  eventfold load-topic --workload flows --rate 500 --duration 10s --json
  eventfold load-topic --workload flows --in-flight 256 --duration 10s   # most completed flows/s")]
    LoadTopic(LoadTopicArgs),

    /// Delete an app's Kafka topics (`<app>.*`) and its consumer group `<app>`.
    ///
    /// Lists what it would delete unless --yes is given. Meant for test and benchmark
    /// apps: the events topics are the app's history, and deleting them loses it. Stop
    /// every instance of the app first (the group of a running app cannot be deleted).
    #[command(after_help = "\
Exit status: 0 when listed (or deleted with --yes), 2 on invalid options or when the \
broker refused.

Examples:
  eventfold drop-app --app bench-run-1
  eventfold drop-app --bootstrap 127.0.0.1:9092 --app bench-run-1 --yes")]
    DropApp(DropAppArgs),
}

#[derive(Debug, Args)]
struct DropAppArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "EVENTFOLD_KAFKA_BOOTSTRAP", default_value = "127.0.0.1:9092")]
    bootstrap: String,

    /// The app id (the service's --app-id): topics `<app>.*` and group `<app>`.
    #[arg(long)]
    app: String,

    /// Delete them; without it only list them.
    #[arg(long)]
    yes: bool,

    /// Bound on each broker request, e.g. 10s.
    #[arg(long, value_parser = load::parse_duration, default_value = "30s")]
    timeout: Duration,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn drop_app(args: DropAppArgs) -> ExitCode {
    let opts = DropOptions {
        bootstrap: args.bootstrap,
        app: args.app,
        yes: args.yes,
        timeout: args.timeout,
    };
    report(
        "drop-app",
        args.json,
        drop_app::run(&opts),
        DropSummary::to_json,
        |_| Ok(()),
    )
}

#[derive(Debug, Args)]
struct LoadTopicArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "EVENTFOLD_KAFKA_BOOTSTRAP", default_value = "127.0.0.1:9092")]
    bootstrap: String,

    /// Topic prefix (the service's --app-id).
    #[arg(long, default_value = "shop")]
    app: String,

    /// Aggregate type: topics `<app>.<type>.commands` and `<app>.<type>.results`.
    #[arg(long = "type", value_name = "TYPE", default_value = "order")]
    aggregate_type: String,

    /// What one unit of load is. commands: one command (--body), timed to its result.
    /// flows: PlaceOrder then ConfirmOrder on a fresh order, timed from its OrderConfirmed
    /// to its OrderShipped on the events topic; --rate = flows started per second,
    /// --in-flight = most flows not yet ended, the rate reported = completed flows/s.
    #[arg(long, value_enum, default_value = "commands")]
    workload: TopicWorkloadArg,

    // The help is built in code: clap turns a literal `{n}` in help text into a line break.
    // Default: the shop-orders preset, `PlaceOrder` on a fresh order.
    #[arg(long, value_name = "JSON", help = body_help())]
    body: Option<String>,

    /// Prefix of every (fresh) aggregate id.
    #[arg(long, value_name = "PREFIX", default_value = "load-")]
    id_prefix: String,

    /// How long to produce after the warm-up, e.g. 10s [default: 10s].
    #[arg(short, long, value_parser = load::parse_duration, conflicts_with = "count")]
    duration: Option<Duration>,

    /// Produce exactly N measured commands after the warm-up instead of running for a
    /// duration.
    #[arg(short = 'n', long, value_name = "N")]
    count: Option<u64>,

    /// Produce without measuring for this long first, e.g. 0s: the commands due then meet
    /// the start of the producer and of the results consumer (their first results took up
    /// to 0.6 s on a local broker). Their results are still awaited and checked.
    #[arg(long, value_parser = load::parse_duration, default_value = "1s")]
    warmup: Duration,

    /// Commands per second (open loop; latency counts from each command's due time)
    /// [default: as fast as --in-flight allows].
    #[arg(short, long, value_name = "R")]
    rate: Option<f64>,

    /// Most commands awaiting their result at once (closed loop).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    in_flight: usize,

    /// How long to wait for outstanding results after producing stopped.
    #[arg(long, value_parser = load::parse_duration, default_value = "30s")]
    result_timeout: Duration,

    /// Producer linger.ms.
    #[arg(long, value_name = "MS", default_value_t = 2)]
    linger_ms: u32,

    /// Print the summary as one JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,

    /// Hide the progress bar (it is also hidden when stderr is not a terminal).
    #[arg(short, long)]
    quiet: bool,
}

impl LoadTopicArgs {
    fn into_options(self) -> TopicLoadOptions {
        TopicLoadOptions {
            bootstrap: self.bootstrap,
            app: self.app,
            aggregate_type: self.aggregate_type,
            body: self.body.unwrap_or_else(|| Preset::SHOP_ORDERS_BODY.to_owned()),
            id_prefix: self.id_prefix,
            limit: match (self.count, self.duration) {
                (Some(count), _) => Limit::Count(count),
                (None, duration) => Limit::Duration(duration.unwrap_or(Duration::from_secs(10))),
            },
            warmup: self.warmup,
            rate: self.rate,
            in_flight: self.in_flight,
            result_timeout: self.result_timeout,
            linger_ms: self.linger_ms,
            progress: !self.quiet && std::io::stderr().is_terminal(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TopicWorkloadArg {
    Commands,
    Flows,
}

fn load_topic(args: LoadTopicArgs) -> ExitCode {
    let json = args.json;
    match args.workload {
        TopicWorkloadArg::Commands => report(
            "load-topic",
            json,
            load_topic::run(args.into_options()),
            TopicSummary::to_json,
            TopicSummary::check,
        ),
        TopicWorkloadArg::Flows => {
            if args.body.is_some() {
                eprintln!("eventfold load-topic: error: --body does not apply to --workload flows");
                return ExitCode::from(2);
            }
            report(
                "load-topic",
                json,
                load_topic::flows::run(&args.into_options()),
                FlowTopicSummary::to_json,
                FlowTopicSummary::check,
            )
        }
    }
}

/// Prints a run's summary (text, or one JSON object) and turns it into the exit status:
/// 0 passed, 1 failed its checks, 2 could not run.
fn report<S: std::fmt::Display>(
    tool: &str,
    json: bool,
    result: anyhow::Result<S>,
    to_json: impl Fn(&S) -> serde_json::Value,
    check: impl Fn(&S) -> anyhow::Result<()>,
) -> ExitCode {
    let summary = match result {
        Ok(summary) => summary,
        Err(e) => {
            eprintln!("eventfold {tool}: error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if json {
        println!("{}", to_json(&summary));
    } else {
        println!("{summary}");
    }
    match check(&summary) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("eventfold {tool}: failed: {e}");
            ExitCode::from(1)
        }
    }
}

#[derive(Debug, Args)]
struct LoadArgs {
    /// Base URL of the eventfold service (plain HTTP, no TLS).
    #[arg(long, env = "EVENTFOLD_URL", default_value = "http://127.0.0.1:8080")]
    url: String,

    /// What one unit of load is. commands: one command per request (--preset, --body,
    /// --get). flows: the shop's order flow, PlaceOrder and ConfirmOrder on a fresh order
    /// and then GET /v1/aggregates/order/{id} every --poll-interval until it reads shipped;
    /// latency = ConfirmOrder answer to that read, rate = completed flows/s, --concurrency =
    /// most flows in flight (without --rate: that many flows back to back).
    #[arg(long, value_enum, default_value = "commands")]
    workload: WorkloadArg,

    /// --workload flows: a flow whose order is not shipped this long after its ConfirmOrder
    /// answer did not complete [default: 10s].
    #[arg(long, value_parser = load::parse_duration)]
    flow_timeout: Option<Duration>,

    /// --workload flows: time between two reads of a confirmed order; a flow's latency is
    /// over-stated by at most this much [default: 2ms].
    #[arg(long, value_parser = load::parse_duration)]
    poll_interval: Option<Duration>,

    /// Built-in workload; the default when no --body is given.
    /// shop-orders: `PlaceOrder` on a fresh `order` aggregate per request.
    #[arg(long, value_enum, conflicts_with = "body")]
    preset: Option<PresetArg>,

    /// Aggregate type in the command path (required with --body; overrides the preset's).
    #[arg(long = "type", value_name = "TYPE")]
    aggregate_type: Option<String>,

    // The help is built in code: clap turns a literal `{n}` in help text into a line break.
    #[arg(long, value_name = "JSON", requires = "aggregate_type", help = body_help())]
    body: Option<String>,

    /// Number of distinct aggregate ids, named `{id-prefix}{k}` with k in 0..N
    /// [default: a fresh id per request].
    #[arg(long, value_name = "N")]
    ids: Option<u64>,

    /// Prefix of every aggregate id.
    #[arg(long, value_name = "PREFIX", default_value = "load-")]
    id_prefix: String,

    /// Choose k = n mod N instead of uniformly at random (requires --ids).
    #[arg(long, requires = "ids")]
    sequential_ids: bool,

    /// Number of concurrent workers (and pooled connections).
    #[arg(short, long, value_name = "N", default_value_t = 64)]
    concurrency: usize,

    /// How long to send after warmup, e.g. 500ms, 10s, 2m [default: 10s].
    #[arg(short, long, value_parser = load::parse_duration, conflicts_with = "count")]
    duration: Option<Duration>,

    /// Send exactly N measured requests instead of running for a duration.
    #[arg(short = 'n', long, value_name = "N")]
    count: Option<u64>,

    /// Target requests per second across all workers (open loop; latency is measured from
    /// each request's intended send time, and the summary adds the start lag: how late
    /// requests left against that schedule) [default: as fast as possible].
    #[arg(short, long, value_name = "R")]
    rate: Option<f64>,

    /// Send without measuring for this long first, e.g. 1s.
    #[arg(long, value_parser = load::parse_duration, default_value = "0s")]
    warmup: Duration,

    /// Retries per request on connection errors, timeouts and 503, with the same
    /// idempotency key.
    #[arg(long, value_name = "N", default_value_t = 3)]
    retries: u32,

    /// Longest wait before a retry, capping the server's Retry-After.
    #[arg(long, value_parser = load::parse_duration, default_value = "5s")]
    retry_after_max: Duration,

    /// Timeout of one HTTP attempt.
    #[arg(long, value_parser = load::parse_duration, default_value = "30s")]
    timeout: Duration,

    /// Fail (exit 1) when more than this fraction of requests failed.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.01)]
    max_error_rate: f64,

    /// Seed of the random id choice, for reproducible runs.
    #[arg(long)]
    seed: Option<u64>,

    /// Print the summary as one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,

    /// Send `GET {url}{PATH}` instead of commands (query load), e.g.
    /// `/v1/views/orders/load-{id}` with --ids N; the placeholders of --body apply.
    #[arg(long, value_name = "PATH", conflicts_with = "body")]
    get: Option<String>,

    /// Bearer token to send with every request, for a service with --auth-tokens (a
    /// token of role write for commands and flows, read for --get).
    #[arg(long, env = "EVENTFOLD_TOKEN", hide_env_values = true)]
    token: Option<String>,

    /// Hide the progress bar (it is also hidden when stderr is not a terminal).
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PresetArg {
    ShopOrders,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WorkloadArg {
    Commands,
    Flows,
}

/// Help of `--body`. Each placeholder name is styled, which keeps clap from reading `{n}`
/// as a line break; the styling is stripped when colour is off, leaving plain `{n}`.
fn body_help() -> StyledStr {
    let name = Style::new().bold();
    let placeholder = |text: &str| format!("{{{name}{text}{name:#}}}");
    let mut help = StyledStr::new();
    write!(
        help,
        "JSON command body; {} (aggregate id), {} (global request number) and {} \
         (worker index) are substituted per request",
        placeholder("id"),
        placeholder("n"),
        placeholder("worker"),
    )
    .expect("writing to a StyledStr cannot fail");
    help
}

impl LoadArgs {
    /// The flags given that `workload` does not use, as they are spelled.
    fn misplaced_flags(&self) -> Vec<&'static str> {
        let given = match self.workload {
            WorkloadArg::Commands => vec![
                ("--flow-timeout", self.flow_timeout.is_some()),
                ("--poll-interval", self.poll_interval.is_some()),
            ],
            WorkloadArg::Flows => vec![
                ("--preset", self.preset.is_some()),
                ("--type", self.aggregate_type.is_some()),
                ("--body", self.body.is_some()),
                ("--ids", self.ids.is_some()),
                ("--sequential-ids", self.sequential_ids),
                ("--get", self.get.is_some()),
            ],
        };
        given
            .into_iter()
            .filter(|(_, given)| *given)
            .map(|(flag, _)| flag)
            .collect()
    }

    fn into_flow_options(self) -> FlowOptions {
        let defaults = FlowOptions::default();
        FlowOptions {
            url: self.url,
            id_prefix: self.id_prefix,
            concurrency: self.concurrency,
            limit: match (self.count, self.duration) {
                (Some(count), _) => Limit::Count(count),
                (None, duration) => Limit::Duration(duration.unwrap_or(Duration::from_secs(10))),
            },
            rate: self.rate,
            warmup: self.warmup,
            retries: self.retries,
            retry_after_max: self.retry_after_max,
            timeout: self.timeout,
            flow_timeout: self.flow_timeout.unwrap_or(defaults.flow_timeout),
            poll_interval: self.poll_interval.unwrap_or(defaults.poll_interval),
            max_error_rate: self.max_error_rate,
            seed: self.seed,
            progress: !self.quiet && std::io::stderr().is_terminal(),
            token: self.token,
        }
    }

    fn into_options(self) -> LoadOptions {
        let mut opts = LoadOptions {
            url: self.url,
            id_prefix: self.id_prefix,
            concurrency: self.concurrency,
            limit: match (self.count, self.duration) {
                (Some(count), _) => Limit::Count(count),
                (None, duration) => Limit::Duration(duration.unwrap_or(Duration::from_secs(10))),
            },
            rate: self.rate,
            warmup: self.warmup,
            retries: self.retries,
            retry_after_max: self.retry_after_max,
            timeout: self.timeout,
            max_error_rate: self.max_error_rate,
            seed: self.seed,
            progress: !self.quiet && std::io::stderr().is_terminal(),
            get: self.get,
            token: self.token,
            ..LoadOptions::default()
        };
        match (self.body, self.preset) {
            (Some(body), _) => {
                opts.body = body;
                opts.ids = Ids::Fresh;
            }
            (None, Some(PresetArg::ShopOrders) | None) => Preset::ShopOrders.apply(&mut opts),
        }
        if let Some(aggregate_type) = self.aggregate_type {
            opts.aggregate_type = aggregate_type;
        }
        if let Some(count) = self.ids {
            opts.ids = if self.sequential_ids {
                Ids::Sequential { count }
            } else {
                Ids::Random { count }
            };
        }
        opts
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Load(args) => load_http(args),
        Command::LoadTopic(args) => load_topic(args),
        Command::DropApp(args) => drop_app(args),
    }
}

#[tokio::main]
async fn load_http(args: LoadArgs) -> ExitCode {
    let json = args.json;
    let misplaced = args.misplaced_flags();
    if !misplaced.is_empty() {
        let workload = args.workload.to_possible_value().expect("no variant is skipped");
        eprintln!(
            "eventfold load: error: {} not used by --workload {}",
            misplaced.join(", "),
            workload.get_name()
        );
        return ExitCode::from(2);
    }
    let workload = args.workload;
    let shutdown = async {
        if tokio::signal::ctrl_c().await.is_err() {
            // Without a signal handler the run simply goes to its limit.
            std::future::pending::<()>().await;
        }
        eprintln!("eventfold load: interrupted, finishing requests in flight (Ctrl-C again to abort)");
        tokio::spawn(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        });
    };
    match workload {
        WorkloadArg::Commands => report(
            "load",
            json,
            load::run_until(args.into_options(), shutdown).await,
            Summary::to_json,
            Summary::check,
        ),
        WorkloadArg::Flows => report(
            "load",
            json,
            flows::run_until(args.into_flow_options(), shutdown).await,
            FlowSummary::to_json,
            FlowSummary::check,
        ),
    }
}
