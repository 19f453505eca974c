//! What a command tells its user on stderr (a run not committed, its
//! command stopped, a run ended): one line each, as text, or under
//! `--log-format json` one JSON object per line as the log's own lines
//! are, so that whatever reads the process's stderr as JSON reads these
//! too. Said whatever `RUST_LOG` filters: they are the command's answer.

use std::sync::atomic::{AtomicBool, Ordering};

static JSON: AtomicBool = AtomicBool::new(false);

/// Says the lines that follow as JSON objects (`--log-format json`).
pub fn as_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// How much a line matters, as a log level says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// What became of a run, as asked (it ended, it waits).
    Info,
    /// Not as asked: not committed, refused, its command stopped.
    Warn,
    /// The command failed (its exit code says how).
    Error,
}

/// Says `line` on stderr.
pub fn say(level: Level, line: &str) {
    if JSON.load(Ordering::Relaxed) {
        eprintln!("{}", json_line(level, line, std::time::SystemTime::now()));
    } else {
        eprintln!("{line}");
    }
}

/// `line` as the JSON log says a line (timestamp, level, fields.message,
/// target).
fn json_line(level: Level, line: &str, at: std::time::SystemTime) -> String {
    let level = match level {
        Level::Info => "INFO",
        Level::Warn => "WARN",
        Level::Error => "ERROR",
    };
    serde_json::json!({
        "timestamp": humantime::format_rfc3339_micros(at).to_string(),
        "level": level,
        "fields": { "message": line },
        "target": "poolgate",
    })
    .to_string()
}

/// Says a line of the command's answer: `say!(warn, "...", args)`,
/// `say!(info, ...)` or `say!(error, ...)`.
#[macro_export]
#[doc(hidden)]
macro_rules! say {
    (warn, $($arg:tt)*) => {
        $crate::cli::say::say($crate::cli::say::Level::Warn, &format!($($arg)*))
    };
    (info, $($arg:tt)*) => {
        $crate::cli::say::say($crate::cli::say::Level::Info, &format!($($arg)*))
    };
    (error, $($arg:tt)*) => {
        $crate::cli::say::say($crate::cli::say::Level::Error, &format!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_said_as_json_is_one_object_with_the_logs_fields() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_765_000_000_123);
        let line = json_line(
            Level::Warn,
            "poolgate: run r1 was not committed within 5s: \"quoted\"\nand more",
            at,
        );
        assert!(!line.contains('\n'), "{line}");
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["level"], "WARN");
        assert_eq!(value["target"], "poolgate");
        assert_eq!(
            value["fields"]["message"],
            "poolgate: run r1 was not committed within 5s: \"quoted\"\nand more"
        );
        assert_eq!(value["timestamp"], "2025-12-06T05:46:40.123000Z");
    }
}
