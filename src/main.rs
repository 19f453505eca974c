//! The `poolgate` command line: parse arguments, load the config, call the
//! library.

#![forbid(unsafe_code)]

use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use poolgate::demo::{self, DemoLine};
use poolgate::render::{describe_event, human_line, json_line, timed};
use poolgate::replay::{self, ReplayError, ReplayOptions};
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
    match command {
        Command::Replay {
            config,
            human,
            explain,
            timeline,
            scenario,
        } => {
            let input: Box<dyn BufRead> = if scenario == "-" {
                Box::new(io::stdin().lock())
            } else {
                match std::fs::File::open(&scenario) {
                    Ok(file) => Box::new(BufReader::new(file)),
                    Err(e) => return fail(&format!("{scenario}: {e}")),
                }
            };
            let options = ReplayOptions {
                echo_inputs: false,
                explain,
                timeline: timeline.is_some(),
            };
            replay_to_stdout(
                &config,
                input,
                human || explain,
                options,
                timeline.as_deref(),
            )
        }
        Command::Demo { config, json, seed } => live_demo(&config, json, seed),
    }
}

fn live_demo(config: &Path, json: bool, seed: Option<u64>) -> ExitCode {
    let config = match Config::load(config) {
        Ok(config) => config,
        Err(e) => return fail(&e.to_string()),
    };
    let seed = seed.unwrap_or_else(rand::random);
    if !json {
        println!(
            "poolgate live demo: {} nodes and the orchestrator on 127.0.0.1 (SWIM over UDP), window {}, seed {seed}\n",
            config.demo.nodes,
            humantime::format_duration(config.convergence_window)
        );
    }
    let system = actix::System::new();
    let result = system.block_on(demo::run(&config, seed, |line| {
        let text = match (line, json) {
            (DemoLine::Note { .. }, true) => return,
            (DemoLine::Note { at, text }, false) => timed(*at, &format!("· {text}")),
            (DemoLine::Event(event), false) => timed(event.at(), &describe_event(event)),
            (DemoLine::Crashed(crash), false) => timed(
                crash.at,
                &format!(
                    "demo: {}'s SWIM member crashed (its socket stops answering)",
                    crash.node
                ),
            ),
            (line, true) => serde_json::to_string(line).unwrap_or_default(),
        };
        println!("{text}");
    }));
    match result {
        Ok(outcome) => {
            if !json {
                println!(
                    "\nPoolReady after {}; the run faulted {:.3}s after the crash.",
                    outcome.ready_at,
                    (outcome.faulted_at - outcome.crashed_at).as_secs_f64()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e.to_string()),
    }
}

fn replay_to_stdout(
    config: &Path,
    input: Box<dyn BufRead>,
    human: bool,
    options: ReplayOptions,
    timeline_file: Option<&Path>,
) -> ExitCode {
    let config = match Config::load(config) {
        Ok(config) => config,
        Err(e) => return fail(&e.to_string()),
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let result = replay::run_with_timeline(&config, input, options, |event| {
        let line = if human {
            human_line(event)
        } else {
            json_line(event)
        };
        writeln!(out, "{line}")
    });
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(timeline), Ok(())) => match (timeline, timeline_file) {
            (Some(timeline), Some(file)) => match std::fs::write(file, timeline.svg()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&format!("{}: {e}", file.display())),
            },
            _ => ExitCode::SUCCESS,
        },
        (Err(ReplayError::BadLine(bad)), _) => fail(&bad.to_string()),
        (Err(e), _) => fail(&e.to_string()),
        (Ok(_), Err(e)) => fail(&e.to_string()),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}
