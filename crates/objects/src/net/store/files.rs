//! Content files: on disk, an object of [`FILE_MIN_BYTES`](super::FILE_MIN_BYTES) or more keeps
//! its content in a file of its own, in a directory beside the redb file, named by a 64-bit id in
//! hex. The redb header refers to the file, and the `files` table lists every file a committed
//! header refers to, so the files on disk that it does not list are garbage.
//!
//! A write creates its file and flushes it before it joins a commit; the commit flushes the
//! directory (once for all its new files) before redb commits, so a committed header never refers
//! to a file a crash could lose. After the commit, the files of the objects it replaced, and
//! those of writes that lost, are removed. A crash between a file's creation and its commit, or
//! between a commit and a removal, leaves a file no header refers to; opening the store removes
//! it.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::StoreError;

/// The directory of content files and the next file id.
#[derive(Debug)]
pub(super) struct Files {
    dir: PathBuf,
    next: AtomicU64,
    /// Content of at least this many bytes goes to a file.
    pub(super) min_bytes: usize,
}

impl Files {
    /// Opens (creating it if needed) the directory `dir` and removes every content file for
    /// which `live` says no header refers to it. Names that are not content files are left
    /// alone, with a warning. New ids start above every id in the directory and above `last`,
    /// the highest id the `files` table lists.
    pub(super) fn open(
        dir: PathBuf,
        min_bytes: usize,
        last: Option<u64>,
        mut live: impl FnMut(u64) -> Result<bool, StoreError>,
    ) -> Result<Self, StoreError> {
        let io = |source| StoreError::File {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let mut highest = last;
        let mut removed = 0u64;
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(parse_name) else {
                tracing::warn!(path = %entry.path().display(), "not a content file; leaving it alone");
                continue;
            };
            highest = highest.max(Some(id));
            if !live(id)? {
                remove(&entry.path());
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(
                files = removed,
                "removed content files no committed object refers to (a crash cut their write or removal short)"
            );
        }
        Ok(Self {
            next: AtomicU64::new(highest.map_or(0, |id| id.saturating_add(1))),
            dir,
            min_bytes,
        })
    }

    pub(super) fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:016x}"))
    }

    /// Writes `content` to a new file and flushes it; returns its id. The file's directory entry
    /// is flushed by [`Files::sync_dir`] before the commit that refers to it.
    pub(super) fn create(&self, content: &[u8]) -> Result<u64, StoreError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.path(id);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut file| {
                file.write_all(content)?;
                file.sync_data()
            });
        if let Err(source) = written {
            remove(&path);
            return Err(StoreError::File { path, source });
        }
        Ok(id)
    }

    /// Creates a new, empty file to write content into; returns its id, path and the file open
    /// for writing. Its directory entry is flushed by [`Files::sync_dir`] before the commit that
    /// refers to it.
    pub(super) fn create_empty(&self) -> Result<(u64, PathBuf, File), StoreError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.path(id);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => Ok((id, path, file)),
            Err(source) => Err(StoreError::File { path, source }),
        }
    }

    /// Flushes the directory, so the entries of the files created before survive a crash. Only on
    /// Unix: elsewhere the standard library cannot open a directory to flush it, and the store
    /// relies on the file system to keep new entries.
    pub(super) fn sync_dir(&self) -> Result<(), StoreError> {
        if cfg!(not(unix)) {
            return Ok(());
        }
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|source| StoreError::File {
                path: self.dir.clone(),
                source,
            })
    }

    /// File `id` opened for reading; `Ok(None)` if there is no such file (a commit replaced the
    /// object and removed its file since its header was read). The open file stays readable when
    /// a later commit removes it.
    pub(super) fn open_file(&self, id: u64) -> Result<Option<File>, StoreError> {
        let path = self.path(id);
        match File::open(&path) {
            Ok(file) => Ok(Some(file)),
            Err(source) if source.kind() == ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::File { path, source }),
        }
    }

    /// Removes file `id` (a failure is logged: the next open removes the file).
    pub(super) fn remove(&self, id: u64) {
        remove(&self.path(id));
    }
}

pub(super) fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == ErrorKind::NotFound => {}
        Err(error) => tracing::warn!(
            path = %path.display(),
            %error,
            "cannot remove a content file no object refers to; the next start removes it"
        ),
    }
}

/// The id a content file's name holds: exactly 16 lowercase hex digits.
fn parse_name(name: &str) -> Option<u64> {
    let hex = name.len() == 16
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then(|| u64::from_str_radix(name, 16).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_content_file_names_parse() {
        assert_eq!(parse_name("00000000000000ff"), Some(255));
        for name in [
            "ff",
            "00000000000000FF",
            "00000000000000ff.tmp",
            "+000000000000001",
        ] {
            assert_eq!(parse_name(name), None, "{name}");
        }
    }
}
