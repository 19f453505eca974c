//! How `watch` and `run` print the gate's events: one JSON object per
//! line (`--json`, the replay format), the explain view (`--explain`), or
//! readable lines, through a stdout that never blocks the guard.

use std::path::Path;
use std::time::Duration;

use poolgate_actors::core::Event;
use poolgate_actors::Gate;

use crate::live::LiveError;
use crate::replay::explain::Explainer;
use crate::replay::{render, ReplayEvent};

/// How events are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// One JSON object per line (the replay format).
    Json,
    /// Readable lines, and the pool's state and blockers when they change.
    Explain,
    /// Readable lines.
    Human,
}

/// A recording into a new file at `path` (`--record`).
pub fn recording(path: Option<&Path>) -> Result<Option<poolgate_actors::Recording>, LiveError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let file = std::fs::File::create(path)
        .map_err(|e| LiveError::Io(std::io::Error::other(format!("{}: {e}", path.display()))))?;
    Ok(Some(poolgate_actors::Recording::new(Box::new(
        std::io::BufWriter::new(file),
    ))))
}

pub(crate) struct Printer {
    output: Output,
    explainer: Explainer,
    out: Stdout,
}

impl Printer {
    pub(crate) fn new(output: Output) -> Self {
        Printer {
            output,
            explainer: Explainer::default(),
            out: Stdout::start(),
        }
    }

    pub(crate) async fn print(&mut self, gate: &Gate, event: Event) {
        let at = event.at();
        self.explainer.saw(&event);
        let event = ReplayEvent::Gate(event);
        match self.output {
            Output::Json => self.out.line(render::json_line(&event)),
            Output::Human => self.out.line(render::human_line(&event)),
            Output::Explain => {
                self.out.line(render::human_line(&event));
                self.state(gate, at).await;
            }
        }
    }

    /// An event another process published (the leader, through etcd);
    /// `--explain` prints it as `human` does.
    pub(crate) fn print_told(&mut self, event: Option<Event>) {
        let Some(event) = event else { return };
        let event = ReplayEvent::Gate(event);
        match self.output {
            Output::Json => self.out.line(render::json_line(&event)),
            Output::Human | Output::Explain => self.out.line(render::human_line(&event)),
        }
    }

    pub(crate) async fn state(&mut self, gate: &Gate, at: poolgate_actors::core::Time) {
        if let Ok(report) = gate.report().await {
            if let Some(line) = self.explainer.after_input(at, &report) {
                self.out.line(render::timed(at, &format!("· {line}")));
            }
        }
    }
}

/// How many lines may wait for a slow stdout.
pub const STDOUT_QUEUE: usize = 65_536;

/// How long a process about to exit waits for stdout to take its last
/// lines.
const STDOUT_LAST: Duration = Duration::from_secs(1);

/// stdout on a thread of its own: a reader that stops reading (a stuck
/// log pipe, `| less`, a terminal paused with Ctrl-S) blocks that thread,
/// never the guard's (faults are still acted on at once), and a closed
/// stdout (`| head -1`) is no reason to panic nor to stop the command.
/// Lines beyond [`STDOUT_QUEUE`] waiting are dropped and counted.
struct Stdout {
    lines: Option<std::sync::mpsc::SyncSender<String>>,
    done: std::sync::mpsc::Receiver<()>,
    dropped: u64,
}

impl Stdout {
    fn start() -> Self {
        let (lines, queued) = std::sync::mpsc::sync_channel::<String>(STDOUT_QUEUE);
        let (finished, done) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("stdout".into())
            .spawn(move || {
                use std::io::Write;
                let mut stdout = std::io::stdout().lock();
                let mut open = true;
                for line in queued {
                    // Closed: the rest is read by nobody; keep draining.
                    open = open
                        && writeln!(stdout, "{line}")
                            .and_then(|()| stdout.flush())
                            .is_ok();
                }
                let _ = finished.send(());
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "no stdout thread: events are not printed");
        }
        Stdout {
            lines: Some(lines),
            done,
            dropped: 0,
        }
    }

    fn line(&mut self, line: String) {
        let Some(lines) = &self.lines else { return };
        if lines.try_send(line).is_err() {
            if self.dropped == 0 {
                tracing::warn!(
                    queue = STDOUT_QUEUE,
                    "stdout is not read: event lines are dropped until it is"
                );
            }
            self.dropped += 1;
        }
    }
}

impl Drop for Stdout {
    fn drop(&mut self) {
        // The last lines out before the process exits, unless stdout is
        // stuck.
        self.lines = None;
        let _ = self.done.recv_timeout(STDOUT_LAST);
    }
}
