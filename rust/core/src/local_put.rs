//! Writes of the local directory store that keep across a crash or power loss what the store
//! promises: a create-only object is either absent or whole, never empty or partial.
//!
//! Each write is staged beside its destination, flushed to disk (`fsync`), then linked into
//! place (create-only: a hard link fails when the name exists) or renamed over it (overwrite),
//! and the directory is flushed so that the new name is on disk too; directories the write
//! created are flushed into their parents the same way. The staged copy is removed in every
//! case.
//!
//! Staged copies are named `{name}#{20 digits}`: the store's listing skips a name whose suffix
//! after '#' is all digits (object_store names its own staging files so), so a copy left by a
//! killed writer never shows up as an object. Whether such a copy is abandoned is decided by its
//! age, not by a process id (another host's writer, on a shared file system or in another
//! container, has ids this host cannot check): a writer keeps its copy's modification time
//! fresh while it writes and links it within moments of its last byte, so a copy untouched for
//! [`ABANDONED_AFTER`] is removed. A directory is looked over at most once per
//! [`SWEEP_INTERVAL`] per process, not on every write.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use object_store::PutPayload;

use crate::error::{io_error, NativeError, NativeResult};
use crate::runtime::fork_guard;

/// A staged copy not modified for this long belongs to a writer that is gone.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(60 * 60);
/// How often one process looks a directory over for abandoned copies.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// What a local write copies into place.
pub enum LocalSource<'a> {
    File(&'a Path),
    Payload(&'a PutPayload),
}

/// Writes `source` to `dest` durably: AlreadyExists when `create_only` finds the name taken.
pub fn put_local(
    uri: &str,
    dest: &Path,
    source: LocalSource<'_>,
    create_only: bool,
) -> NativeResult<()> {
    let parent = dest.parent().unwrap_or_else(|| Path::new("/"));
    create_dir_durably(parent)?;
    sweep_abandoned(parent);
    let staged = Staged(staging_name(dest));
    write_synced(&staged.0, source)?;
    if create_only {
        match std::fs::hard_link(&staged.0, dest) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(NativeError::AlreadyExists {
                    uri: uri.to_string(),
                })
            }
            Err(e) => return Err(io_error("Cannot link", dest, &e)),
        }
    } else {
        std::fs::rename(&staged.0, dest).map_err(|e| io_error("Cannot rename to", dest, &e))?;
    }
    sync_dir(parent)
}

/// Creates `dir` and its missing ancestors, flushing each new name into its parent.
fn create_dir_durably(dir: &Path) -> NativeResult<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = vec![dir.to_path_buf()];
    let mut ancestor = dir.parent();
    while let Some(path) = ancestor {
        if path.is_dir() {
            break;
        }
        missing.push(path.to_path_buf());
        ancestor = path.parent();
    }
    if let Err(error) = std::fs::create_dir_all(dir) {
        // A file where a directory should be says "exists": name it as not a directory.
        let blocking = missing.iter().rev().find_map(|path| {
            let parent = path.parent()?;
            parent.exists().then_some(())?;
            (path.exists() && !path.is_dir()).then(|| path.clone())
        });
        return Err(match blocking {
            Some(path) => io_error("Cannot create", &path, &not_a_directory()),
            None => io_error("Cannot create", dir, &error),
        });
    }
    for created in missing.iter().rev() {
        if let Some(parent) = created.parent() {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

fn not_a_directory() -> std::io::Error {
    #[cfg(unix)]
    return std::io::Error::from_raw_os_error(libc::ENOTDIR);
    #[cfg(not(unix))]
    return std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory");
}

/// Writes the staged copy (create-new: never another writer's name) and flushes it to disk.
fn write_synced(staged: &Path, source: LocalSource<'_>) -> NativeResult<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(staged)
        .map_err(|e| io_error("Cannot create", staged, &e))?;
    let written = match source {
        LocalSource::File(path) => {
            let mut input = File::open(path).map_err(|e| io_error("Cannot open", path, &e))?;
            std::io::copy(&mut input, &mut file).map(|_| ())
        }
        LocalSource::Payload(payload) => payload.iter().try_for_each(|piece| file.write_all(piece)),
    };
    written.map_err(|e| io_error("Cannot write", staged, &e))?;
    file.sync_all()
        .map_err(|e| io_error("Cannot flush", staged, &e))
}

/// Flushes a directory's entries (the names linked, renamed or created in it) to disk.
fn sync_dir(dir: &Path) -> NativeResult<()> {
    #[cfg(unix)]
    {
        let handle = File::open(dir).map_err(|e| io_error("Cannot open", dir, &e))?;
        handle
            .sync_all()
            .map_err(|e| io_error("Cannot flush", dir, &e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Removes the staged copy however the write ends (after a link it is a second name).
struct Staged(PathBuf);

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn staging_name(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    let token: u64 = rand::random();
    name.push(format!("#{token:020}"));
    PathBuf::from(name)
}

/// Whether a file name is a staged copy (`{name}#` and 20 digits).
fn is_staging_name(name: &str) -> bool {
    name.rsplit_once('#').is_some_and(|(object, suffix)| {
        !object.is_empty() && suffix.len() == 20 && suffix.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Directories this process looked over, and when.
static SWEPT: Mutex<Option<HashMap<PathBuf, Instant>>> = Mutex::new(None);

/// Removes the abandoned staged copies of `dir`, at most once per SWEEP_INTERVAL.
fn sweep_abandoned(dir: &Path) {
    let now = Instant::now();
    {
        let _no_fork = fork_guard();
        let mut swept = SWEPT.lock().unwrap_or_else(|p| p.into_inner());
        let swept = swept.get_or_insert_with(HashMap::new);
        if swept
            .get(dir)
            .is_some_and(|last| now.duration_since(*last) < SWEEP_INTERVAL)
        {
            return;
        }
        swept.insert(dir.to_path_buf(), now);
    }
    remove_abandoned(dir, SystemTime::now());
}

/// Removes the staged copies of `dir` not modified for ABANDONED_AFTER before `now`.
pub fn remove_abandoned(dir: &Path, now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_staging_name) {
            continue;
        }
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        if now.duration_since(modified).unwrap_or_default() >= ABANDONED_AFTER {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_are_recognised() {
        let name = staging_name(Path::new("/d/000.bin"));
        let name = name.file_name().unwrap().to_str().unwrap();
        assert!(is_staging_name(name), "{name}");
        assert!(!is_staging_name("000.bin"));
        assert!(!is_staging_name("000.bin#123"));
        assert!(!is_staging_name("#00000000000000000000"));
        assert!(!is_staging_name("000.bin#0000000000000000000x"));
    }

    #[test]
    fn only_old_staged_copies_are_removed() {
        let dir = std::env::temp_dir().join(format!("syvain-local-put-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let staged = dir.join(format!("a.bin#{:020}", 7));
        let object = dir.join("b.bin");
        std::fs::write(&staged, b"partial").unwrap();
        std::fs::write(&object, b"whole").unwrap();
        remove_abandoned(&dir, SystemTime::now());
        assert!(staged.exists(), "a fresh copy is another writer's");
        remove_abandoned(&dir, SystemTime::now() + ABANDONED_AFTER);
        assert!(!staged.exists() && object.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
