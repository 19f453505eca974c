//! The scenario format of `poolgate replay` (design §5): JSON Lines, one
//! record per line, `at_ms` non-decreasing.
//!
//! [`ScenarioReader`] reads one line at a time with a bounded buffer, so a
//! huge line is reported, not loaded. [`parse_record`] turns a line into a
//! [`Record`] or says what is wrong with it; the records themselves are
//! [`poolgate_actors::replay_format`]'s, which the recording writes.

use std::io::BufRead;

use poolgate_actors::core::Input;
use poolgate_actors::replay_format;
use poolgate_actors::GateError;

pub use replay_format::MAX_AT_MS;

/// The longest line accepted, in bytes (without the newline).
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// A scenario line that is not a valid record: the replay stops here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct BadLine {
    /// The line number (1-based).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// One record: when, and what.
#[derive(Debug)]
pub struct Record {
    /// The record's instant, in milliseconds.
    pub at_ms: u64,
    /// The input, or why the gate refuses it: a well-formed line whose
    /// content is invalid (identity material, a pool definition) is
    /// `rejected`, not a bad line.
    pub input: Result<Input, GateError>,
    /// The pool a command names (design §14), if it names one.
    pub pool: Option<poolgate_actors::core::PoolId>,
}

/// Reads a scenario line by line, never holding more than
/// [`MAX_LINE_BYTES`] + 1 bytes of one line.
pub struct ScenarioReader<R> {
    inner: R,
    line: usize,
    buffer: Vec<u8>,
}

impl<R: BufRead> ScenarioReader<R> {
    /// Reads from `inner`.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            line: 0,
            buffer: Vec::new(),
        }
    }

    /// The next non-blank line with its number, `None` at the end.
    pub fn next_line(&mut self) -> Option<Result<(usize, String), BadLine>> {
        loop {
            self.line += 1;
            self.buffer.clear();
            let limit = MAX_LINE_BYTES as u64 + 2;
            let mut limited = std::io::Read::take(&mut self.inner, limit);
            match limited.read_until(b'\n', &mut self.buffer) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => return Some(Err(self.bad(format!("cannot read: {e}")))),
            };
            if self.buffer.last() == Some(&b'\n') {
                self.buffer.pop();
                if self.buffer.last() == Some(&b'\r') {
                    self.buffer.pop();
                }
            }
            if self.buffer.len() > MAX_LINE_BYTES {
                return Some(Err(
                    self.bad(format!("line is longer than {MAX_LINE_BYTES} bytes"))
                ));
            }
            let text = match std::str::from_utf8(&self.buffer) {
                Ok(text) => text,
                Err(e) => {
                    return Some(Err(self.bad(format!(
                        "not UTF-8 (invalid byte at column {})",
                        e.valid_up_to() + 1
                    ))))
                }
            };
            if text.trim().is_empty() {
                continue;
            }
            return Some(Ok((self.line, text.to_string())));
        }
    }

    fn bad(&self, message: String) -> BadLine {
        BadLine {
            line: self.line,
            message,
        }
    }
}

/// Parses one scenario line (the format is [`replay_format`]'s).
pub fn parse_record(text: &str) -> Result<Record, String> {
    let (at_ms, line) = replay_format::read(text).map_err(|e| {
        // A `restored` record out of its place says so, however wrong it is.
        if replay_format::is_of_type(text, "restored") {
            replay_format::RESTORED_OUT_OF_PLACE.to_string()
        } else {
            e
        }
    })?;
    let pool = line.commanded_pool()?;
    Ok(Record {
        at_ms,
        input: line.into_input()?,
        pool,
    })
}

/// The gate's settings as a recording's first record gives them
/// (`{"at_ms":0,"type":"settings","window_ms":…,"on_readiness_lost":…,
/// "wait_timeout_ms":…|null}`, design §9); `Ok(None)` for any other record.
pub fn parse_settings(text: &str) -> Result<Option<replay_format::RecordedSettings>, String> {
    replay_format::read_settings(text)
}

/// What a recording's gate restored (`{"at_ms":0,"type":"restored",
/// "durable":{…},"restore_grace_ms":…}`, right after `settings`): the
/// state and the restore grace; `Ok(None)` for any other record.
pub fn parse_restored(text: &str) -> Result<Option<replay_format::RecordedRestore>, String> {
    replay_format::read_restored(text)
}
