//! The `poolgate` command line: parse arguments, load the config, call the
//! library.

#![forbid(unsafe_code)]

use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use poolgate::cli::commands::{self, Output, WatchEnd};
use poolgate::cli::{demo, health, node};
use poolgate::core::NodeId;
use poolgate::live::keys::{ClusterKey, NodeKey};
use poolgate::live::LiveError;
use poolgate::replay::{self, ReplayOptions};
use poolgate::{Config, NodeConfig};

#[derive(Parser)]
#[command(
    name = "poolgate",
    version,
    about = "Membership and pool-readiness gate"
)]
struct Cli {
    /// Log format on stderr (`RUST_LOG` sets what is logged).
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a scenario (JSON Lines, `-` for stdin) on a virtual clock and
    /// print one JSON event per line.
    Replay(ReplayArgs),
    /// The live demo (the default): the orchestrator and node agent
    /// processes on 127.0.0.1; a required node is killed after commit and
    /// the run faults.
    Demo(DemoArgs),
    /// Write a key: a node's Ed25519 signing key (prints its public key as
    /// `ed25519:<base64>`), or with `--cluster` a cluster gossip key.
    Keygen(KeygenArgs),
    /// Print shell completions for SHELL (bash, zsh, fish, elvish,
    /// powershell) on stdout, e.g. `poolgate completions bash >
    /// /etc/bash_completion.d/poolgate`.
    Completions(CompletionsArgs),
    /// The agent daemon on a candidate node.
    Node(NodeArgs),
    /// The orchestrator's side alone: gate, SWIM member, agent listener;
    /// prints events.
    Watch(WatchArgs),
    /// Ask the running orchestrator why each node is or is not ready:
    /// exit 0 with its answer, 1 when no orchestrator answered.
    Status(StatusArgs),
    /// Wait for PoolReady, plan, commit, run COMMAND and guard it: exit 1
    /// if not committed within --timeout, 2 on an error or a plan that can
    /// never be committed (a required node not in the pool), 3 if the run
    /// faults (COMMAND's process group gets SIGTERM, SIGKILL after 5 s), 4
    /// if another run is in the way (one restored from the state file: see
    /// --resume and --end; or, beside a watch serving the control socket,
    /// another requester's committed run on the same pool), 5 if COMMAND
    /// was stopped because its run could no longer be confirmed guarded,
    /// 128 + signal if signalled (COMMAND stopped and the run ended
    /// first), else COMMAND's exit code.
    Run(RunArgs),
    /// (internal) Keeps a guarded command: runs it in a process group of
    /// its own and stops the group when the guard dies.
    #[command(name = "guard-exec", hide = true)]
    GuardExec(GuardExecArgs),
}

/// The arguments of `poolgate replay`.
#[derive(clap::Args)]
struct ReplayArgs {
    /// The configuration file (default: `config.toml` here if there is
    /// one, else the shipped one; a recording brings its own pools and
    /// settings).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print readable lines instead of JSON.
    #[arg(long)]
    human: bool,
    /// A readable account: each event, and the pool's state and
    /// blockers whenever they change, then a summary.
    #[arg(long)]
    explain: bool,
    /// Also draw every candidate's state over time into FILE (SVG).
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// A state file (as `[state] path`): restored at start, written as
    /// the gate goes; two replays in a row behave as a restarted gate.
    #[arg(long, value_name = "PATH")]
    state: Option<PathBuf>,
    /// The scenario file, or `-` for stdin.
    scenario: String,
}

/// The arguments of `poolgate demo`.
#[derive(clap::Args, Default)]
struct DemoArgs {
    /// The configuration file (default: `config.toml` here if there is
    /// one, else the shipped one, built in).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print JSON events (and `node_crashed`) instead of readable lines.
    #[arg(long)]
    json: bool,
    /// How many node processes (1 to 64; default `[demo] nodes`).
    #[arg(long)]
    nodes: Option<u32>,
    /// Seed for the agents' delays and keys (random if absent).
    #[arg(long)]
    seed: Option<u64>,
    /// Record every input the gate applies into FILE (the replay
    /// format).
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
}

/// The arguments of `poolgate keygen`.
#[derive(clap::Args)]
struct KeygenArgs {
    /// The key file to create (mode 0600; never overwritten).
    #[arg(long)]
    out: PathBuf,
    /// A 32-byte cluster gossip key instead of a signing key.
    #[arg(long)]
    cluster: bool,
}

/// The arguments of `poolgate completions`.
#[derive(clap::Args)]
struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// The arguments of `poolgate node`.
#[derive(clap::Args)]
struct NodeArgs {
    /// The node's configuration (`node.toml`).
    #[arg(long)]
    config: PathBuf,
    /// Serve /metrics, /healthz, /readyz (200 while its connection to
    /// an orchestrator is up) and /status on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

/// The arguments of `poolgate watch`.
#[derive(clap::Args)]
struct WatchArgs {
    /// The configuration file.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// One JSON event per line (the replay format).
    #[arg(long, conflicts_with = "explain")]
    json: bool,
    /// Events and, whenever they change, the pool's state and blockers.
    #[arg(long)]
    explain: bool,
    /// Exit 0 at PoolReady.
    #[arg(long)]
    until_ready: bool,
    /// Give up after this long (exit 1 with `--until-ready`).
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<std::time::Duration>,
    /// Serve /metrics (Prometheus text format), /healthz, /readyz (200
    /// while it leads) and /status on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Record every input the gate applies into FILE (the replay
    /// format); `poolgate replay FILE` prints the same events.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
}

/// The arguments of `poolgate status`.
#[derive(clap::Args)]
struct StatusArgs {
    /// The orchestrator's configuration file (its `[agents] listen`).
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// The answer as one JSON object.
    #[arg(long)]
    json: bool,
    /// One pool only (default: every pool).
    #[arg(long, value_name = "ID")]
    pool: Option<String>,
}

/// The arguments of `poolgate run`.
#[derive(clap::Args)]
struct RunArgs {
    /// The configuration file.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// The pool to run on (default: the only pool).
    #[arg(long, value_name = "ID")]
    pool: Option<String>,
    /// The nodes the run requires (default: every member).
    #[arg(long, value_delimiter = ',')]
    require: Option<Vec<String>>,
    /// One JSON event per line (the replay format).
    #[arg(long)]
    json: bool,
    /// Serve /metrics (Prometheus text format), /healthz, /readyz (200
    /// while it leads) and /status on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Record every input the gate applies into FILE (the replay
    /// format).
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Give up waiting for PoolReady after this long (exit 1, saying
    /// what blocks the pool); the run, once committed, is not bounded.
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<std::time::Duration>,
    /// Guard RUN, a committed run restored from the state file whose
    /// `poolgate run` is gone, with COMMAND, instead of planning anew.
    #[arg(long, value_name = "RUN", conflicts_with = "require")]
    resume: Option<String>,
    /// End RUN, a committed run restored from the state file whose
    /// `poolgate run` is gone, and exit (no COMMAND).
    #[arg(long, value_name = "RUN", conflicts_with_all = ["resume", "require"])]
    end: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, required_unless_present = "end")]
    command: Vec<String>,
}

/// The arguments of `poolgate guard-exec`.
#[derive(clap::Args)]
struct GuardExecArgs {
    /// The guard's pid (this process's parent).
    #[arg(long)]
    guard: u32,
    /// SIGTERM to SIGKILL, in milliseconds.
    #[arg(long)]
    grace_ms: u64,
    /// Stop the command when the guard gives no sign (SIGUSR1) for
    /// this long, in milliseconds.
    #[arg(long)]
    watchdog_ms: Option<u64>,
    /// The command.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The orchestrator holds a descriptor per agent connection: the soft
/// limit (often 1,024, as `[agents] max_connections`) is raised to the
/// hard one, so the listener's own limits are what hold.
fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::GuardExec(keeper)) = cli.command {
        // Before any logging: the command's stderr is the keeper's.
        return keeper.execute();
    }
    if let Ok(me) = std::env::current_exe() {
        poolgate::cli::guard::set_keeper(me);
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()));
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => {
            logs.json().init();
            poolgate::cli::say::as_json(true);
        }
    }
    let command = cli
        .command
        .unwrap_or_else(|| Command::Demo(DemoArgs::default()));
    if matches!(
        command,
        Command::Watch(_) | Command::Run(_) | Command::Demo(_)
    ) {
        raise_open_files();
    }
    let result = match command {
        Command::Replay(args) => args.execute(),
        Command::Demo(args) => args.execute(),
        Command::Keygen(args) => args.execute(),
        Command::Completions(args) => args.execute(),
        Command::Node(args) => args.execute(),
        Command::Watch(args) => args.execute(),
        Command::Status(args) => args.execute(),
        Command::Run(args) => args.execute(),
        // Kept before logging started.
        Command::GuardExec(_) => Ok(0),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            poolgate::say!(error, "error: {message}");
            ExitCode::from(2)
        }
    }
}

impl GuardExecArgs {
    fn execute(self) -> ExitCode {
        let grace = std::time::Duration::from_millis(self.grace_ms);
        let watchdog = self.watchdog_ms.map(std::time::Duration::from_millis);
        match poolgate::cli::guard::keep(self.guard, grace, watchdog, &self.command) {
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => {
                eprintln!("poolgate: {e}");
                ExitCode::from(127)
            }
        }
    }
}

impl ReplayArgs {
    fn execute(self) -> Result<u8, String> {
        let config = config_or_shipped(self.config.as_deref())?;
        let input: Box<dyn BufRead> = if self.scenario == "-" {
            Box::new(io::stdin().lock())
        } else {
            let scenario = &self.scenario;
            let file = std::fs::File::open(scenario).map_err(|e| format!("{scenario}: {e}"))?;
            Box::new(BufReader::new(file))
        };
        let options = ReplayOptions {
            state: self.state,
            explain: self.explain,
            timeline: self.timeline.is_some(),
        };
        let human = self.human || self.explain;
        let stdout = io::BufWriter::new(io::stdout().lock());
        let timeline =
            replay::to_writer(&config, input, human, options, stdout).map_err(|e| e.to_string())?;
        if let (Some(timeline), Some(file)) = (timeline, self.timeline) {
            std::fs::write(&file, timeline.svg())
                .map_err(|e| format!("{}: {e}", file.display()))?;
        }
        Ok(0)
    }
}

impl DemoArgs {
    fn execute(self) -> Result<u8, String> {
        let config = config_or_shipped(self.config.as_deref())?;
        let seed = self.seed.unwrap_or_else(rand::random);
        let record = commands::recording(self.record.as_deref()).map_err(|e| e.to_string())?;
        demo::print(&config, self.json, self.nodes, seed, record)
            .map(|_| 0)
            .map_err(|e| e.to_string())
    }
}

impl KeygenArgs {
    fn execute(self) -> Result<u8, String> {
        if self.cluster {
            ClusterKey::generate()
                .save(&self.out)
                .map_err(|e| e.to_string())?;
        } else {
            let key = NodeKey::generate();
            key.save(&self.out).map_err(|e| e.to_string())?;
            println!("{}", key.public());
        }
        Ok(0)
    }
}

impl CompletionsArgs {
    fn execute(self) -> Result<u8, String> {
        use clap::CommandFactory;
        let mut script = Vec::new();
        // The hidden subcommand (the keeper's) is not offered.
        let full = Cli::command();
        let mut shown = clap::Command::new("poolgate")
            .about(full.get_about().cloned().unwrap_or_default())
            .version(env!("CARGO_PKG_VERSION"));
        for arg in full.get_arguments() {
            shown = shown.arg(arg.clone());
        }
        for sub in full.get_subcommands().filter(|s| !s.is_hide_set()) {
            shown = shown.subcommand(sub.clone());
        }
        clap_complete::generate(self.shell, &mut shown, "poolgate", &mut script);
        // A closed stdout (`| head`) is no reason to panic.
        let _ = io::stdout().write_all(&script);
        Ok(0)
    }
}

impl NodeArgs {
    fn execute(self) -> Result<u8, String> {
        let config = NodeConfig::load(&self.config).map_err(|e| e.to_string())?;
        live_system(node::run(config, &self.config, self.metrics)).map(|()| 0)
    }
}

impl WatchArgs {
    fn execute(self) -> Result<u8, String> {
        let loaded = load(&self.config)?;
        let output = output(self.json, self.explain);
        let end = live_system(async move {
            if let Some(addr) = self.metrics {
                let listener = poolgate::live::status::address(&loaded);
                health::serve(addr, health::Face::Orchestrator(listener))?;
            }
            commands::watch(
                &loaded,
                &self.config,
                output,
                self.until_ready,
                self.timeout,
                self.record.as_deref(),
            )
            .await
        })?;
        Ok(match end {
            WatchEnd::TimedOut if self.until_ready => 1,
            // Stopped first: not the answer `--until-ready` asks for.
            WatchEnd::Stopped if self.until_ready => {
                poolgate::say!(warn, "poolgate: stopped before the pool was ready");
                1
            }
            _ => 0,
        })
    }
}

impl StatusArgs {
    fn execute(self) -> Result<u8, String> {
        let loaded = load(&self.config)?;
        let addr = poolgate::live::status::address(&loaded);
        let control = loaded.control.clone();
        let pool = self.pool;
        let answer = live_system(async move {
            // `[control] socket`: the watch serving it answers for every
            // pool; otherwise the agent listener.
            if let Some(path) = control.filter(|p| poolgate::live::control::is_served(p)) {
                return Ok(poolgate::live::control::status(&path, pool.as_deref()).await);
            }
            Ok(poolgate::live::status::ask_pool(addr, pool.as_deref()).await)
        })?;
        // A closed stdout (`| head`) is no reason to panic.
        Ok(match answer {
            Ok(answer) if self.json => {
                let _ = writeln!(io::stdout(), "{answer}");
                0
            }
            Ok(answer) => {
                let _ = write!(io::stdout(), "{}", poolgate::live::status::render(&answer));
                0
            }
            Err(why) => {
                poolgate::say!(error, "poolgate status: {why}");
                1
            }
        })
    }
}

impl RunArgs {
    fn execute(self) -> Result<u8, String> {
        let loaded = load(&self.config)?;
        let loaded = match (&loaded.control, &self.end, &self.pool) {
            // A running watch serving it knows every pool.
            (Some(path), ..) if poolgate::live::control::is_served(path) => loaded,
            // `--end RUN` alone finds the pool whose run it is.
            (_, Some(_), None) => loaded,
            _ => loaded.with_only_pool(self.pool.as_deref())?,
        };
        let run_id = |flag: &str, name: Option<String>| {
            name.map(|n| poolgate::core::RunId::new(&n).map_err(|e| format!("{flag}: {e}")))
                .transpose()
        };
        let resume = run_id("--resume", self.resume)?;
        let end = run_id("--end", self.end)?;
        let require = self
            .require
            .map(|names| names.iter().map(|n| NodeId::new(n.trim())).collect())
            .transpose()
            .map_err(|e| format!("--require: {e}"))?;
        let code = live_system(async move {
            if let Some(addr) = self.metrics {
                let listener = poolgate::live::status::address(&loaded);
                health::serve(addr, health::Face::Orchestrator(listener))?;
            }
            if let Some(run) = end {
                return commands::end_run(&loaded, self.pool.as_deref(), &run).await;
            }
            let output = output(self.json, false);
            let request = commands::RunRequest {
                pool: self.pool,
                require,
                resume,
                timeout: self.timeout,
            };
            poolgate::cli::run::run(
                &loaded,
                &self.config,
                request,
                output,
                &self.command,
                self.record.as_deref(),
            )
            .await
        })?;
        Ok(u8::try_from(code).unwrap_or(1))
    }
}

fn output(json: bool, explain: bool) -> Output {
    match (json, explain) {
        (true, _) => Output::Json,
        (false, true) => Output::Explain,
        (false, false) => Output::Human,
    }
}

/// Runs `work` in a new actix `System`.
fn live_system<T>(
    work: impl std::future::Future<Output = Result<T, LiveError>>,
) -> Result<T, String> {
    actix::System::new()
        .block_on(work)
        .map_err(|e| e.to_string())
}

/// The shipped `config.toml`, built in: `poolgate demo` works from any
/// folder.
const SHIPPED_CONFIG: &str = include_str!("../config.toml");

/// The demo's configuration: `path`; else `config.toml` here; else the
/// shipped one.
fn config_or_shipped(path: Option<&Path>) -> Result<Config, String> {
    match path {
        Some(path) => load(path),
        None if Path::new("config.toml").exists() => load(Path::new("config.toml")),
        None => Config::parse(SHIPPED_CONFIG, "the shipped config.toml").map_err(|e| e.to_string()),
    }
}

fn load(config: &Path) -> Result<Config, String> {
    Config::load(config).map_err(|e| e.to_string())
}
