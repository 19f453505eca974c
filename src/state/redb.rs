//! `[state] path`: the orchestrator's durable state in one crash-safe file
//! (redb: pure Rust, ACID, one file). The file holds a format version and
//! the records of [`super`], each write a redb transaction committed
//! durably before the gate goes on. A file that is not a poolgate state
//! file is an error naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use poolgate_actors::core::Durable;
use poolgate_actors::{StateStore, StoreError};
use redb::TableDefinition;

use super::records::{
    checksum, checksum_key, decode_sequences, decode_state, encode_sequences, encode_state,
    verified, FORMAT,
};
use super::{OrchestratorStore, StateError};

const TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("poolgate_state");

/// The durable state in a redb file.
#[derive(Debug)]
pub struct RedbStore {
    db: std::sync::Mutex<Handle>,
    path: PathBuf,
}

impl RedbStore {
    /// Opens (or creates) the state file and reads what it holds.
    pub fn open(path: &Path) -> Result<(Arc<RedbStore>, Durable), StateError> {
        let error = |what: String| StateError {
            file: path.display().to_string(),
            what,
        };
        let db = open_database(path).map_err(error)?;
        let store = RedbStore {
            db: std::sync::Mutex::new(Handle {
                db: Some(db),
                file: file_id(path),
            }),
            path: path.to_path_buf(),
        };
        let durable = store.read().map_err(error)?;
        match durable {
            Some(durable) => Ok((Arc::new(store), durable)),
            None => {
                // A new file: write the format and an empty state now, so a
                // read-only place fails here, not at the first commit.
                let durable = Durable::default();
                store.write(&durable).map_err(error)?;
                Ok((Arc::new(store), durable))
            }
        }
    }

    /// What the file holds; `None` for a new, empty file.
    fn read(&self) -> Result<Option<Durable>, String> {
        let handle = self.handle()?;
        let Some(db) = &handle.db else {
            return Err("the state file is not open".into());
        };
        let read = db.begin_read().map_err(|e| describe(&e.to_string()))?;
        let table = match read.open_table(TABLE) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => {
                let foreign = read
                    .list_tables()
                    .map(|mut tables| tables.next().is_some())
                    .unwrap_or(false);
                if foreign {
                    return Err("not a poolgate state file (it holds other tables)".into());
                }
                return Ok(None);
            }
            Err(e) => return Err(describe(&e.to_string())),
        };
        let format = table
            .get("format")
            .map_err(|e| describe(&e.to_string()))?
            .ok_or("not a poolgate state file (no format version)")?;
        let format = <[u8; 8]>::try_from(format.value())
            .map(u64::from_be_bytes)
            .map_err(|_| "damaged: the format version is not readable")?;
        if format > FORMAT {
            return Err(format!(
                "written by a newer poolgate (state format {format}); this one reads format {FORMAT}"
            ));
        }
        let state = checked(&table, "state", format)?.ok_or("damaged: no state record")?;
        decode_state(&state).map(Some)
    }

    fn write(&self, durable: &Durable) -> Result<(), String> {
        self.put("state", &encode_state(durable)?)
    }

    /// The record under `key`, decoded; `None` if there is none.
    fn read_state(&self, key: &str) -> Result<Option<Durable>, String> {
        self.record(key)?
            .map(|bytes| decode_state(&bytes))
            .transpose()
    }

    /// The record under `key`, checked against its checksum; `None` if
    /// the file holds no table yet or no such record.
    fn record(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let handle = self.handle()?;
        let Some(db) = &handle.db else {
            return Err("the state file is not open".into());
        };
        let read = db.begin_read().map_err(|e| describe(&e.to_string()))?;
        let table = match read.open_table(TABLE) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(describe(&e.to_string())),
        };
        let format = table
            .get("format")
            .map_err(|e| describe(&e.to_string()))?
            .and_then(|f| <[u8; 8]>::try_from(f.value()).ok())
            .map_or(FORMAT, u64::from_be_bytes);
        checked(&table, key, format)
    }

    /// Writes `record` and its checksum under `key` (and the format: a
    /// format 1 file is format 2 from its first write on), durably.
    fn put(&self, key: &str, record: &[u8]) -> Result<(), String> {
        let mut handle = self.handle()?;
        let Some(db) = &handle.db else {
            return Err("the state file is not open".into());
        };
        let written = Self::put_in(db, key, record);
        if written.is_err() {
            // redb refuses every write after an I/O error until the file is
            // opened again: it is, before the next write.
            handle.db = None;
        }
        written
    }

    /// The open database, opened again if the last write failed, or if the
    /// file was removed or replaced while it was open (written anew: the
    /// gate's record holds the whole state).
    fn handle(&self) -> Result<std::sync::MutexGuard<'_, Handle>, String> {
        let mut handle = self
            .db
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = file_id(&self.path);
        if handle.db.is_some() && now != handle.file {
            tracing::warn!(file = %self.path.display(), "the state file was removed or replaced while open: it is written anew");
            handle.db = None;
        }
        if handle.db.is_none() {
            handle.db = Some(open_database(&self.path)?);
            handle.file = file_id(&self.path);
        }
        Ok(handle)
    }

    fn put_in(db: &redb::Database, key: &str, record: &[u8]) -> Result<(), String> {
        let write = db.begin_write().map_err(|e| describe(&e.to_string()))?;
        {
            let mut table = write.open_table(TABLE).map_err(|e| e.to_string())?;
            table
                .insert("format", FORMAT.to_be_bytes().as_slice())
                .map_err(|e| e.to_string())?;
            table.insert(key, record).map_err(|e| e.to_string())?;
            table
                .insert(checksum_key(key).as_str(), checksum(record).as_slice())
                .map_err(|e| e.to_string())?;
        }
        write.commit().map_err(|e| e.to_string())
    }
}

/// The record under `key`, checked against its checksum (from format 2
/// on); `None` if there is none.
fn checked(
    table: &impl redb::ReadableTable<&'static str, &'static [u8]>,
    key: &str,
    format: u64,
) -> Result<Option<Vec<u8>>, String> {
    let Some(record) = table.get(key).map_err(|e| describe(&e.to_string()))? else {
        return Ok(None);
    };
    let record = record.value().to_vec();
    let sum = table
        .get(checksum_key(key).as_str())
        .map_err(|e| describe(&e.to_string()))?;
    verified(key, record, sum.as_ref().map(|s| s.value()), format).map(Some)
}

impl OrchestratorStore for RedbStore {
    fn exclusive(&self) -> bool {
        true
    }

    fn sequences(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let failed = |e: String| StoreError(format!("{}: {e}", self.path.display()));
        match self.record("sequences").map_err(failed)? {
            Some(bytes) => decode_sequences(&bytes).map_err(failed),
            None => Ok(Default::default()),
        }
    }

    fn save_sequences(&self, sequences: &BTreeMap<String, u64>) -> Result<(), StoreError> {
        let failed = |e: String| StoreError(format!("{}: {e}", self.path.display()));
        let record = encode_sequences(sequences).map_err(failed)?;
        self.put("sequences", &record).map_err(failed)
    }

    fn pool_record(
        self: Arc<Self>,
        pool: &poolgate_actors::core::PoolId,
    ) -> Result<(Arc<dyn StateStore>, Durable), StoreError> {
        // Said by the caller with the file's name.
        let failed = StoreError;
        let key = format!("pools/{pool}/state");
        let held = match self.read_state(&key).map_err(failed)? {
            Some(held) => held,
            None => {
                // Before pools were kept apart: epochs go on above it; a
                // run it holds belongs to no pool named here.
                let before = self
                    .read_state("state")
                    .map_err(failed)?
                    .unwrap_or_default();
                if let Some(run) = &before.run {
                    return Err(failed(format!(
                        "it holds run {} of a one-pool configuration ([pool]): end it with that configuration first (poolgate run --config <the [pool] config> --end {}), then start with [pools.<id>]",
                        run.run, run.run
                    )));
                }
                Durable {
                    last_epoch: before.last_epoch,
                    run: None,
                }
            }
        };
        let record: Arc<dyn StateStore> = Arc::new(PoolRecord { store: self, key });
        Ok((record, held))
    }
}

/// One pool's record in the state file (`pools/<id>/state`).
#[derive(Debug)]
struct PoolRecord {
    store: Arc<RedbStore>,
    key: String,
}

impl StateStore for PoolRecord {
    fn save(&self, state: &Durable) -> Result<(), StoreError> {
        let failed = |e: String| StoreError(format!("{}: {e}", self.store.path.display()));
        let record = encode_state(state).map_err(failed)?;
        self.store.put(&self.key, &record).map_err(failed)
    }
}

impl StateStore for RedbStore {
    fn save(&self, state: &Durable) -> Result<(), StoreError> {
        self.write(state)
            .map_err(|e| StoreError(format!("{}: {e}", self.path.display())))
    }
}

/// The open database and which file it is (device, inode).
#[derive(Debug)]
struct Handle {
    db: Option<redb::Database>,
    file: Option<(u64, u64)>,
}

/// The device and inode of `path`, if it exists.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The magic number a redb file starts with.
const REDB_MAGIC: &[u8] = b"redb\x1A\x0A\xA9\x0D\x0A";

/// Opens or creates the database. A file that is not a redb file is
/// refused before redb reads it; redb's own checks of a damaged file run
/// with panics caught (some of them assert), so a bad file is an error,
/// never a crash.
fn open_database(path: &Path) -> Result<redb::Database, String> {
    match std::fs::read(path) {
        Ok(bytes) if !bytes.is_empty() && !bytes.starts_with(REDB_MAGIC) => {
            return Err("not a poolgate state file (not a database file)".into());
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read the state file ({e})")),
    }
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let opened = std::panic::catch_unwind(|| redb::Database::create(path));
    std::panic::set_hook(hook);
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(describe(&e.to_string())),
        Err(_) => Err("damaged: the database file is truncated or corrupt".into()),
    }
}

/// redb's words for a file that is not a database, in ours.
fn describe(message: &str) -> String {
    if message.contains("Permission denied") || message.contains("Read-only") {
        format!("cannot write the state file ({message})")
    } else if message.contains("magic")
        || message.contains("corrupt")
        || message.contains("Corrupt")
        || message.contains("invalid")
        || message.contains("Invalid")
    {
        format!("not a poolgate state file, or damaged ({message})")
    } else {
        message.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("poolgate-state-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn epoch(n: u64) -> Durable {
        Durable {
            last_epoch: n,
            run: None,
        }
    }

    #[test]
    fn a_state_file_removed_or_replaced_while_open_is_written_anew() {
        // Adversary: `rm state.db` under a running watch went unnoticed;
        // writes went to the deleted file and a restart issued epoch 1
        // again.
        let dir = scratch("removed");
        let path = dir.join("state.db");
        let (store, _) = RedbStore::open(&path).unwrap();
        store.save(&epoch(5)).unwrap();
        std::fs::remove_file(&path).unwrap();
        store.save(&epoch(6)).unwrap();
        drop(store);
        let (_, read) = RedbStore::open(&path).unwrap();
        assert_eq!(read.last_epoch, 6);
        // Replaced by an older copy: written over with what is current.
        let (store, _) = RedbStore::open(&path).unwrap();
        std::fs::copy(&path, dir.join("old.db")).unwrap();
        store.save(&epoch(9)).unwrap();
        std::fs::rename(dir.join("old.db"), &path).unwrap();
        store.save(&epoch(10)).unwrap();
        drop(store);
        let (_, read) = RedbStore::open(&path).unwrap();
        assert_eq!(read.last_epoch, 10);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_write_that_failed_is_tried_on_a_reopened_file_once_it_can_be() {
        // Adversary: after one I/O error redb refused every later write
        // until a restart, so a new epoch was never told again.
        let dir = scratch("immutable");
        let path = dir.join("state.db");
        let (store, _) = RedbStore::open(&path).unwrap();
        store.save(&epoch(1)).unwrap();
        let chattr = |flag: &str| {
            std::process::Command::new("chattr")
                .arg(flag)
                .arg(&path)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        if !chattr("+i") {
            // One line, never a silent pass.
            eprintln!("skipped: chattr +i is not available here (needs root and ext4/xfs)");
            return;
        }
        let failed = store.save(&epoch(2));
        assert!(chattr("-i"));
        assert!(failed.is_err(), "an immutable file took a write");
        store.save(&epoch(3)).unwrap();
        drop(store);
        let (_, read) = RedbStore::open(&path).unwrap();
        assert_eq!(read.last_epoch, 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
