//! The `poolgate` command line: parse arguments, load the config, call the
//! library.

use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use poolgate::render::{human_line, json_line};
use poolgate::replay::{self, ReplayError};
use poolgate::Config;

/// The shipped demonstration scenario (`cargo run`).
const DEMO_SCENARIO: &str = include_str!("../examples/scenarios/demo.jsonl");

#[derive(Parser)]
#[command(
    name = "poolgate",
    version,
    about = "Membership and pool-readiness gate"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
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
        /// The scenario file, or `-` for stdin.
        scenario: String,
    },
    /// Replay the shipped demonstration scenario, readably (the default).
    Demo {
        /// The configuration file.
        #[arg(long, default_value = "config.toml")]
        config: PathBuf,
        /// Print JSON events instead of readable lines.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(io::stderr)
        .init();
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Demo {
        config: PathBuf::from("config.toml"),
        json: false,
    });
    match command {
        Command::Replay {
            config,
            human,
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
            replay_to_stdout(&config, input, human, false)
        }
        Command::Demo { config, json } => {
            if !json {
                println!("poolgate demo: the shipped scenario replayed on a virtual clock\n");
            }
            replay_to_stdout(&config, Box::new(DEMO_SCENARIO.as_bytes()), !json, !json)
        }
    }
}

fn replay_to_stdout(config: &Path, input: Box<dyn BufRead>, human: bool, echo: bool) -> ExitCode {
    let config = match Config::load(config) {
        Ok(config) => config,
        Err(e) => return fail(&e.to_string()),
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let result = replay::run_with(&config, input, echo, |event| {
        let line = if human {
            human_line(event)
        } else {
            json_line(event)
        };
        writeln!(out, "{line}")
    });
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(ReplayError::BadLine(bad)), _) => fail(&bad.to_string()),
        (Err(e), _) => fail(&e.to_string()),
        (Ok(()), Err(e)) => fail(&e.to_string()),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}
