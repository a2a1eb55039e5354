//! The upload manifest: an append-only JSON-lines file in the data directory
//! that says which local files are safely in object storage.
//!
//! One line per event, written with one `write` and fsynced before the event is
//! acted on further: an `attempt` before a file is put (until its `put`, an
//! object of that key may be there: the answer lost, the check failed, the
//! agent stopped), a `put` once an object is confirmed (size and ETag checked),
//! a `cover` for a merged file whose every input is already remote, a `delete`
//! once a replaced object is gone. A crash can only cut the last line short; a
//! line that does not parse is ignored (and cut off before the next append), so
//! the worst a crash does is make the next run upload one file again, to the
//! same key, with the same bytes.
//!
//! Lines name their target (URL, and endpoint where one is set), so pointing
//! the agent at another bucket or service starts from nothing there instead
//! of trusting uploads made elsewhere.

// Without the "object-storage" feature only retention reads the manifest;
// what writes it serves `transfer.rs`.
#![cfg_attr(not(feature = "object-storage"), allow(dead_code))]

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The manifest's file name, under `<data_dir>/upload/`.
pub const MANIFEST_FILE: &str = "manifest.jsonl";
/// The lock one uploader per data directory holds.
const LOCK_FILE: &str = "LOCK";

/// One manifest line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Record {
    /// `file` is in object storage as `key`, confirmed; the objects in
    /// `replaces` hold rows that `file` now holds too and are to be deleted.
    Put {
        target: String,
        file: String,
        bytes: u64,
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        e_tag: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        replaces: Vec<String>,
        time_us: i64,
    },
    /// `file`, a merge of files already remote, has its rows in `keys`.
    Cover {
        target: String,
        file: String,
        bytes: u64,
        keys: Vec<String>,
        time_us: i64,
    },
    /// The replaced object `key` is deleted.
    Delete {
        target: String,
        key: String,
        time_us: i64,
    },
    /// The object `key` is still to be deleted: how a rewritten manifest keeps
    /// the deletes that `put` lines it dropped asked for.
    Replaced { target: String, key: String },
    /// A put of `file` to `key` begins. Until a `put` line confirms it the
    /// object may or may not be there; should the file be merged away
    /// first, the merged file's upload deletes `key` with the objects it
    /// replaces, or its rows would be in the bucket twice.
    Attempt {
        target: String,
        file: String,
        key: String,
    },
}

impl Record {
    /// The object keys the record names.
    fn keys(&self) -> Vec<&str> {
        match self {
            Record::Put { key, replaces, .. } => std::iter::once(key)
                .chain(replaces)
                .map(String::as_str)
                .collect(),
            Record::Cover { keys, .. } => keys.iter().map(String::as_str).collect(),
            Record::Delete { key, .. }
            | Record::Replaced { key, .. }
            | Record::Attempt { key, .. } => vec![key.as_str()],
        }
    }

    fn target(&self) -> &str {
        match self {
            Record::Put { target, .. }
            | Record::Cover { target, .. }
            | Record::Delete { target, .. }
            | Record::Replaced { target, .. }
            | Record::Attempt { target, .. } => target,
        }
    }
}

/// What the manifest says about one local file.
#[derive(Clone, Debug, PartialEq)]
pub struct Covered {
    /// Its size when uploaded or covered: a file of the same name and another
    /// size is another file.
    pub bytes: u64,
    /// The objects that hold its rows.
    pub keys: Vec<String>,
}

/// The manifest of one target, loaded, and open for appending.
pub struct Manifest {
    path: PathBuf,
    target: String,
    /// Local file id (`<table>/date=<day>/<name>`) → where its rows are.
    covered: HashMap<String, Covered>,
    /// Replaced objects not yet deleted.
    pending_deletes: BTreeSet<String>,
    /// Local file id → keys a put of it began at and no `put` line confirmed.
    attempted: HashMap<String, BTreeSet<String>>,
    /// Lines that are no record, or name a key no object can have: left out.
    lines_not_understood: usize,
    file: Option<File>,
    _lock: Option<File>,
}

/// Whether `key` can name an object. Every key the uploader writes does; one
/// that does not (a line edited by hand) failed every upload pass at the
/// delete it asked for.
#[cfg(feature = "object-storage")]
fn is_object_key(key: &str) -> bool {
    object_store::path::Path::parse(key).is_ok()
}

#[cfg(not(feature = "object-storage"))]
fn is_object_key(key: &str) -> bool {
    !key.is_empty()
}

/// The manifest's directory.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("upload")
}

impl Manifest {
    /// Reads the manifest of `target` without taking the lock or opening it
    /// for writing (retention's view).
    pub fn read(data_dir: &Path, target: &str) -> Result<Manifest> {
        let path = dir(data_dir).join(MANIFEST_FILE);
        let text = match vtax_store::regular_file::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
        };
        let mut manifest = Manifest {
            path,
            target: target.to_string(),
            covered: HashMap::new(),
            pending_deletes: BTreeSet::new(),
            attempted: HashMap::new(),
            lines_not_understood: 0,
            file: None,
            _lock: None,
        };
        for line in text.split(|&b| b == b'\n') {
            match serde_json::from_slice::<Record>(line) {
                Ok(record) if record.keys().into_iter().all(is_object_key) => {
                    manifest.apply(&record)
                }
                _ if line.iter().all(u8::is_ascii_whitespace) => {}
                _ => manifest.lines_not_understood += 1,
            }
        }
        Ok(manifest)
    }

    /// Takes the uploader's lock, reads the manifest, cuts a torn last line off,
    /// and opens it for appending.
    pub fn open(data_dir: &Path, target: &str) -> Result<Manifest> {
        let dir = dir(data_dir);
        vtax_store::regular_file::create_dirs(&dir)
            .with_context(|| format!("create {}", dir.display()))?;
        let lock = take_lock(&dir.join(LOCK_FILE))?;
        let mut manifest = Manifest::read(data_dir, target)?;
        let mut file = vtax_store::regular_file::open_or_create(
            &manifest.path,
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true),
        )
        .with_context(|| format!("open {}", manifest.path.display()))?;
        let mut text = Vec::new();
        file.read_to_end(&mut text)
            .with_context(|| format!("read {}", manifest.path.display()))?;
        let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if whole < text.len() {
            tracing::warn!(path = %manifest.path.display(), bytes = text.len() - whole, "Cut a torn last line off the upload manifest; its file is uploaded again.");
            file.set_len(whole as u64)
                .with_context(|| format!("truncate {}", manifest.path.display()))?;
            file.sync_all()
                .with_context(|| format!("fsync {}", manifest.path.display()))?;
        }
        file.seek(SeekFrom::End(0))
            .with_context(|| format!("seek {}", manifest.path.display()))?;
        // The manifest's creation must survive a crash as its lines do.
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("fsync {}", dir.display()))?;
        if manifest.lines_not_understood > 0 {
            tracing::warn!(path = %manifest.path.display(), lines = manifest.lines_not_understood, "Upload manifest lines not understood (damaged, or edited by hand) are left out: a file one names is uploaded again, an object one names is not deleted.");
        }
        manifest.file = Some(file);
        manifest._lock = Some(lock);
        Ok(manifest)
    }

    fn apply(&mut self, record: &Record) {
        if record.target() != self.target {
            return;
        }
        match record {
            Record::Put {
                file,
                bytes,
                key,
                replaces,
                ..
            } => {
                self.covered.insert(
                    file.clone(),
                    Covered {
                        bytes: *bytes,
                        keys: vec![key.clone()],
                    },
                );
                self.attempted.remove(file);
                self.pending_deletes.remove(key);
                self.pending_deletes
                    .extend(replaces.iter().filter(|k| *k != key).cloned());
            }
            Record::Cover {
                file, bytes, keys, ..
            } => {
                self.covered.insert(
                    file.clone(),
                    Covered {
                        bytes: *bytes,
                        keys: keys.clone(),
                    },
                );
            }
            Record::Delete { key, .. } => {
                self.pending_deletes.remove(key);
            }
            Record::Replaced { key, .. } => {
                self.pending_deletes.insert(key.clone());
            }
            Record::Attempt { file, key, .. } => {
                self.attempted
                    .entry(file.clone())
                    .or_default()
                    .insert(key.clone());
            }
        }
    }

    /// Appends a record and fsyncs it, then applies it.
    pub fn append(&mut self, record: Record) -> Result<()> {
        let Some(file) = self.file.as_mut() else {
            bail!("the upload manifest was opened read-only");
        };
        let mut line = serde_json::to_vec(&record).context("encode a manifest line")?;
        line.push(b'\n');
        file.write_all(&line)
            .and_then(|()| file.sync_data())
            .with_context(|| format!("append to {}", self.path.display()))?;
        self.apply(&record);
        Ok(())
    }

    /// Bytes the manifest file holds.
    pub fn len_bytes(&self) -> u64 {
        self.file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len())
    }

    /// Rewrites the manifest with what it says about the files `keep` names
    /// and the deletes still to do, one line each, dropping the history of
    /// files long gone (and other targets' lines): a new file is written,
    /// fsynced, and renamed over the old one, so a crash leaves one or the
    /// other. Only files alive locally, or named by a live file's
    /// `vtax.compacted_from`, can be asked about again.
    pub fn rewrite(&mut self, keep: impl Fn(&str) -> bool, now_us: i64) -> Result<()> {
        let mut ids: Vec<&String> = self.covered.keys().filter(|id| keep(id)).collect();
        ids.sort();
        let mut text = Vec::new();
        for id in ids {
            let covered = &self.covered[id];
            let record = Record::Cover {
                target: self.target.clone(),
                file: id.clone(),
                bytes: covered.bytes,
                keys: covered.keys.clone(),
                time_us: now_us,
            };
            serde_json::to_writer(&mut text, &record).context("encode a manifest line")?;
            text.push(b'\n');
        }
        for key in &self.pending_deletes {
            let record = Record::Replaced {
                target: self.target.clone(),
                key: key.clone(),
            };
            serde_json::to_writer(&mut text, &record).context("encode a manifest line")?;
            text.push(b'\n');
        }
        let mut attempted: Vec<(&String, &BTreeSet<String>)> =
            self.attempted.iter().filter(|(id, _)| keep(id)).collect();
        attempted.sort();
        for (id, keys) in attempted {
            for key in keys {
                let record = Record::Attempt {
                    target: self.target.clone(),
                    file: id.clone(),
                    key: key.clone(),
                };
                serde_json::to_writer(&mut text, &record).context("encode a manifest line")?;
                text.push(b'\n');
            }
        }
        let tmp = self.path.with_extension("jsonl.tmp");
        let mut file = vtax_store::regular_file::create_fresh(&tmp)
            .with_context(|| format!("create {}", tmp.display()))?;
        file.write_all(&text)
            .and_then(|()| file.sync_all())
            .with_context(|| format!("write {}", tmp.display()))?;
        fs::rename(&tmp, &self.path)
            .with_context(|| format!("rename {} over the manifest", tmp.display()))?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("fsync {}", dir.display()))?;
        let data_dir = dir.parent().unwrap_or(dir);
        let mut reread = Manifest::read(data_dir, &self.target)?;
        reread.file = Some(
            vtax_store::regular_file::open(&self.path, OpenOptions::new().append(true))
                .with_context(|| format!("open {}", self.path.display()))?,
        );
        reread._lock = self._lock.take();
        *self = reread;
        Ok(())
    }

    /// Where the rows of local file `id` are, if remote.
    pub fn covered(&self, id: &str) -> Option<&Covered> {
        self.covered.get(id)
    }

    /// Keys a put of local file `id` began at and no `put` line confirmed.
    pub fn attempted(&self, id: &str) -> impl Iterator<Item = &String> {
        self.attempted.get(id).into_iter().flatten()
    }

    /// Replaced objects still to delete.
    pub fn pending_deletes(&self) -> Vec<String> {
        self.pending_deletes.iter().cloned().collect()
    }
}

fn take_lock(path: &Path) -> Result<File> {
    let mut file = vtax_store::regular_file::open_or_create(
        path,
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true),
    )
    .with_context(|| format!("open {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; no memory is touched.
    let rc = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    if rc != 0 {
        let holder = vtax_store::regular_file::read_to_string(path).unwrap_or_default();
        bail!(
            "another uploader (pid {}) holds {}",
            holder.trim(),
            path.display()
        );
    }
    file.set_len(0)
        .and_then(|()| write!(file, "{}", std::process::id()))
        .with_context(|| format!("write {}", path.display()))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_cut_and_the_rest_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let put = |file: &str, key: &str, replaces: Vec<String>| Record::Put {
            target: "file:///x".into(),
            file: file.into(),
            bytes: 10,
            key: key.into(),
            e_tag: None,
            replaces,
            time_us: 1,
        };
        {
            let mut m = Manifest::open(dir.path(), "file:///x").unwrap();
            m.append(put("a", "k/a", vec![])).unwrap();
            m.append(put("b", "k/b", vec!["k/a".into()])).unwrap();
            assert!(
                Manifest::open(dir.path(), "file:///x").is_err(),
                "one uploader per data directory"
            );
        }
        let path = dir.path().join("upload").join(MANIFEST_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"op":"put","target":"file:///x","fi"#)
            .unwrap();
        drop(f);
        let mut m = Manifest::open(dir.path(), "file:///x").unwrap();
        assert_eq!(m.covered("b").unwrap().keys, ["k/b"]);
        assert_eq!(m.pending_deletes(), ["k/a"]);
        m.append(Record::Delete {
            target: "file:///x".into(),
            key: "k/a".into(),
            time_us: 2,
        })
        .unwrap();
        drop(m);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text
            .lines()
            .all(|l| serde_json::from_str::<Record>(l).is_ok()));
        let m = Manifest::read(dir.path(), "file:///x").unwrap();
        assert!(m.pending_deletes().is_empty());
        let other = Manifest::read(dir.path(), "s3://elsewhere").unwrap();
        assert!(other.covered("b").is_none(), "records are per target");
    }

    /// A line that is no record, or names a key no object can have (`a//b`,
    /// `../x`), is left out and counted; the lines around it still count.
    #[cfg(feature = "object-storage")]
    #[test]
    fn a_line_naming_no_possible_object_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let upload = dir.path().join("upload");
        fs::create_dir(&upload).unwrap();
        let lines = [
            r#"{"op":"put","target":"t","file":"a","bytes":1,"key":"k/a","replaces":["k/old"],"time_us":1}"#,
            r#"{"op":"replaced","target":"t","key":"k//twice"}"#,
            r#"{"op":"put","target":"t","file":"b","bytes":1,"key":"../b","time_us":1}"#,
            r#"not json"#,
            "",
            r#"{"op":"replaced","target":"t","key":"k/gone"}"#,
        ];
        fs::write(upload.join(MANIFEST_FILE), lines.join("\n") + "\n").unwrap();
        let m = Manifest::open(dir.path(), "t").unwrap();
        assert_eq!(m.lines_not_understood, 3);
        assert_eq!(m.pending_deletes(), ["k/gone", "k/old"]);
        assert_eq!(m.covered("a").unwrap().keys, ["k/a"]);
        assert!(m.covered("b").is_none());
    }

    #[test]
    fn a_rewrite_keeps_the_deletes_still_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Manifest::open(dir.path(), "t").unwrap();
        m.append(Record::Put {
            target: "t".into(),
            file: "a".into(),
            bytes: 1,
            key: "k/a".into(),
            e_tag: None,
            replaces: vec!["k/old".into()],
            time_us: 1,
        })
        .unwrap();
        m.rewrite(|_| false, 2).unwrap();
        assert!(m.covered("a").is_none());
        assert_eq!(m.pending_deletes(), ["k/old"]);
        drop(m);
        let m = Manifest::open(dir.path(), "t").unwrap();
        assert_eq!(m.pending_deletes(), ["k/old"], "and after a restart");
    }
}
