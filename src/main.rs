//! The `poolgate` command line: parse arguments, load the config, call the
//! library.

#![forbid(unsafe_code)]

use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use poolgate::live::demo;
use poolgate::replay::{self, ReplayOptions};
use poolgate::Config;

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
    Replay {
        /// The configuration file.
        #[arg(long, default_value = "config.toml")]
        config: PathBuf,
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
        /// The scenario file, or `-` for stdin.
        scenario: String,
    },
    /// The live demo (the default): a SWIM cluster on 127.0.0.1 feeding
    /// the gate; a required node crashes after commit and the run faults.
    Demo {
        /// The configuration file.
        #[arg(long, default_value = "config.toml")]
        config: PathBuf,
        /// Print JSON events (and `node_crashed`) instead of readable lines.
        #[arg(long)]
        json: bool,
        /// Seed for the agents' delays and keys (random if absent).
        #[arg(long)]
        seed: Option<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let command = cli.command.unwrap_or(Command::Demo {
        config: PathBuf::from("config.toml"),
        json: false,
        seed: None,
    });
    let result = match command {
        Command::Replay {
            config,
            human,
            explain,
            timeline,
            scenario,
        } => replay(
            &config,
            &scenario,
            human || explain,
            explain,
            timeline.as_deref(),
        ),
        Command::Demo { config, json, seed } => load(&config).and_then(|config| {
            let seed = seed.unwrap_or_else(rand::random);
            demo::print(&config, json, seed)
                .map(drop)
                .map_err(|e| e.to_string())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn load(config: &Path) -> Result<Config, String> {
    Config::load(config).map_err(|e| e.to_string())
}

fn replay(
    config: &Path,
    scenario: &str,
    human: bool,
    explain: bool,
    timeline_file: Option<&Path>,
) -> Result<(), String> {
    let config = load(config)?;
    let input: Box<dyn BufRead> = if scenario == "-" {
        Box::new(io::stdin().lock())
    } else {
        let file = std::fs::File::open(scenario).map_err(|e| format!("{scenario}: {e}"))?;
        Box::new(BufReader::new(file))
    };
    let options = ReplayOptions {
        explain,
        timeline: timeline_file.is_some(),
    };
    let stdout = io::BufWriter::new(io::stdout().lock());
    let timeline =
        replay::to_writer(&config, input, human, options, stdout).map_err(|e| e.to_string())?;
    match (timeline, timeline_file) {
        (Some(timeline), Some(file)) => {
            std::fs::write(file, timeline.svg()).map_err(|e| format!("{}: {e}", file.display()))
        }
        _ => Ok(()),
    }
}
