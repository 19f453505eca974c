//! Generations that rise across restarts whatever the wall clock does
//! (design §10).
//!
//! A member's SWIM generation and the high bits of its agent frame
//! sequences (its *life*) must exceed everything an earlier life of the
//! same member used, or SWIM keeps the old identity and the orchestrator
//! refuses the new frames as replays. The boot time in unix milliseconds
//! does that only while the clock never steps back (an NTP step, a VM
//! restored from a snapshot, a clock not yet synchronised at boot). So the
//! last life handed out is kept in a small file, and the next one is
//! `max(boot ms, last + 1)`: it rises across restarts whatever the clock
//! says, and stays near the clock while the clock is sane.
//!
//! The file is one decimal number, replaced atomically (written to a
//! temporary file, synced, renamed) before the life it records is used.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Lives stay below 2^44, so `life << 20 | counter` fits in a `u64` and
/// a SWIM generation below the tracker's 2^48 limit (unix ms reach 2^44
/// in the year 2527).
pub const LIFE_LIMIT: u64 = 1 << 44;

/// Why a generation could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    /// The file could not be read or written.
    #[error("{file}: {source} (its folder must be writable; for a node, `[node] generation_file` moves it)")]
    Io {
        /// The generation file.
        file: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file does not hold a generation.
    #[error(
        "{file}: not a generation file (one decimal number below 2^44); remove it to start afresh"
    )]
    Malformed {
        /// The generation file.
        file: PathBuf,
    },
    /// Every generation is used up (a file at the limit).
    #[error("{file}: generations exhausted (2^44)")]
    Exhausted {
        /// The generation file.
        file: PathBuf,
    },
}

/// Where a member keeps the last life it handed out.
#[derive(Debug, Clone)]
pub struct GenerationFile {
    path: PathBuf,
}

impl GenerationFile {
    /// The generation file at `path`.
    pub fn new(path: PathBuf) -> Self {
        GenerationFile { path }
    }

    /// The generation file beside a key file: `<key>.generation`.
    pub fn beside(key: &Path) -> Self {
        let mut name = key.as_os_str().to_owned();
        name.push(".generation");
        GenerationFile::new(PathBuf::from(name))
    }

    /// The last life recorded (0 when there is no file yet).
    pub fn last(&self) -> Result<u64, GenerationError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(source) => return Err(self.io(source)),
        };
        text.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n < LIFE_LIMIT)
            .ok_or_else(|| GenerationError::Malformed {
                file: self.path.clone(),
            })
    }

    /// Takes the next life, `max(now_ms, last + 1)`, and records it before
    /// returning it.
    pub fn next(&self, now_ms: u64) -> Result<u64, GenerationError> {
        let next = now_ms.max(self.last()? + 1);
        if next >= LIFE_LIMIT {
            return Err(GenerationError::Exhausted {
                file: self.path.clone(),
            });
        }
        self.record(next)?;
        Ok(next)
    }

    fn record(&self, life: u64) -> Result<(), GenerationError> {
        let mut temporary = self.path.as_os_str().to_owned();
        temporary.push(".tmp");
        let temporary = PathBuf::from(temporary);
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&temporary)?;
            writeln!(file, "{life}")?;
            file.sync_all()?;
            std::fs::rename(&temporary, &self.path)?;
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                // The rename itself is durable once the folder is synced.
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|source| self.io(source))
    }

    fn io(&self, source: std::io::Error) -> GenerationError {
        GenerationError::Io {
            file: self.path.clone(),
            source,
        }
    }
}

/// The wall clock in unix milliseconds (0 before 1970).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Agent frame sequences: `life << 20 | counter`, a new life (from the
/// generation file) each time the counter would wrap, so sequences never
/// repeat or fall within one process nor across its restarts.
#[cfg(feature = "cli")]
#[derive(Debug)]
pub struct Sequences {
    file: GenerationFile,
    life: u64,
    counter: u64,
}

#[cfg(feature = "cli")]
impl Sequences {
    /// Sequences starting in `life` (taken from `file`).
    pub fn new(file: GenerationFile, life: u64) -> Self {
        Sequences {
            file,
            life,
            counter: 0,
        }
    }

    /// The next sequence.
    pub fn take(&mut self) -> u64 {
        use super::wire::COUNTER_BITS;
        self.counter += 1;
        if self.counter >= 1 << COUNTER_BITS {
            self.renew();
            self.counter = 1;
        }
        self.life << COUNTER_BITS | self.counter
    }

    /// Starts a new life, above every earlier one (the generation file's
    /// next), and returns it: when this life's counter is spent, and when
    /// the agent takes its node back from another process that signed
    /// ahead of it (its SWIM generation takes the same number).
    pub fn renew(&mut self) -> u64 {
        self.life = match self.file.next(unix_ms()) {
            Ok(life) => life,
            Err(e) => {
                // Still above every sequence of this life; only a restart
                // before the file is writable again could meet it.
                tracing::error!(error = %e, "a new life for agent frames was not recorded");
                self.life + 1
            }
        };
        self.counter = 0;
        self.life
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> GenerationFile {
        let dir =
            std::env::temp_dir().join(format!("poolgate-generation-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        GenerationFile::beside(&dir.join("node.key"))
    }

    #[test]
    fn generations_rise_when_the_clock_steps_back_and_follow_it_forward() {
        let file = scratch("steps");
        let hour = 3_600_000;
        let boot = 1_800_000_000_000;
        assert_eq!(file.next(boot).unwrap(), boot);
        // Restarted an hour in the past: still above the earlier life.
        assert_eq!(file.next(boot - hour).unwrap(), boot + 1);
        assert_eq!(file.next(0).unwrap(), boot + 2);
        // The clock forward again: the generation follows it.
        assert_eq!(file.next(boot + hour).unwrap(), boot + hour);
        assert_eq!(file.last().unwrap(), boot + hour);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let file = scratch("damaged");
        std::fs::write(&file.path, "not a number").unwrap();
        let error = file.next(1).unwrap_err().to_string();
        assert!(error.contains("node.key.generation"), "{error}");
        std::fs::write(&file.path, format!("{LIFE_LIMIT}")).unwrap();
        assert!(file.next(1).is_err());
        std::fs::write(&file.path, format!("{}", LIFE_LIMIT - 1)).unwrap();
        assert!(matches!(
            file.next(1),
            Err(GenerationError::Exhausted { .. })
        ));
    }

    #[test]
    #[cfg(feature = "cli")]
    fn sequences_never_wrap_a_life_but_take_a_new_one() {
        use crate::live::wire::COUNTER_BITS;
        let file = scratch("wrap");
        let life = file.next(1_000).unwrap();
        let mut sequences = Sequences::new(file.clone(), life);
        let mut last = 0;
        for _ in 0..(1u64 << COUNTER_BITS) + 5 {
            let seq = sequences.take();
            assert!(seq > last, "{seq} after {last}");
            last = seq;
        }
        assert!(last >> COUNTER_BITS > life);
        // A restart, even with the clock at 0, starts above all of them.
        let restarted = file.next(0).unwrap();
        assert!(restarted << COUNTER_BITS > last);
    }

    #[test]
    #[cfg(feature = "cli")]
    fn a_renewed_life_is_above_what_another_process_took_from_the_file() {
        let file = scratch("renew");
        let life = file.next(1_000).unwrap();
        let mut sequences = Sequences::new(file.clone(), life);
        let before = sequences.take();
        // A copy of the node, started later on the same file, far ahead
        // of the wall clock.
        let copy = file.next(2_000_000_000_000).unwrap();
        let renewed = sequences.renew();
        assert!(renewed > copy, "{renewed} after the copy's {copy}");
        let after = sequences.take();
        assert!(after > before && after >> crate::live::wire::COUNTER_BITS == renewed);
        assert_eq!(file.last().unwrap(), renewed);
    }
}
