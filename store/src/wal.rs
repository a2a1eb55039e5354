//! The write-ahead log: append-only segments of CRC-framed batches.
//!
//! A segment is `wal/<first_seq>.wal`: an 8-byte magic, then frames
//! `[payload_len: u32 LE][crc32(payload): u32 LE][payload]`. Every frame holds rows of
//! one table within one hour (the store's bucket), with a sequence number that grows
//! by one per frame across segments. Appends go to memory; [`WalWriter::sync`] writes
//! them and fsyncs (group commit). A write that fails (disk full) keeps the whole frames
//! that fit, and the part of a frame after them is cut back off the file, so a segment
//! never holds a partial frame except a torn tail after a crash, which replay cuts at
//! the last good frame. The frames that did not fit wait in memory and are written as
//! space appears, so a backlog drains by what the disk takes, not all at once.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::batch::{Batch, FieldColumn, TagColumn, Values};
use crate::error::{Error, Result};
use crate::schema::{FieldType, TableDef};
use crate::segment_log::{Format, Frame as LogFrame, ScanError};
use crate::Catalog;

/// The WAL's framing: no meta, and a frame larger than 1 GiB is corruption,
/// not data.
const FORMAT: Format = Format {
    magic: b"VTAXWAL\x01",
    extension: "wal",
    meta_bytes: 0,
    max_payload_bytes: 1 << 30,
};
const MAGIC: &[u8; 8] = FORMAT.magic;

/// Default size at which a segment is closed and a new one started.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// Default bound on rows held in memory after writes fail (disk full).
pub const DEFAULT_MAX_BACKLOG_BYTES: usize = 256 << 20;
/// Pending bytes past which frames are handed to the OS before the next fsync,
/// so a fast writer does not hold a whole sync interval of frames in memory.
const WRITE_THROUGH_BYTES: usize = 4 << 20;

/// One decoded frame.
#[derive(Debug)]
pub struct Frame {
    /// Sequence number.
    pub seq: u64,
    /// The hour bucket (hours since the epoch) all rows fall in.
    pub hour: i64,
    /// The rows.
    pub batch: Batch,
}

/// Appends frames and makes them durable.
pub struct WalWriter {
    dir: PathBuf,
    /// The open segment; `None` while one could not be made for a full disk
    /// (at the store's open, after a kill on a full disk): frames wait in
    /// `pending`, and a segment is made at the next write.
    file: Option<File>,
    /// The open segment's path, or the one the next is to have.
    path: PathBuf,
    file_len: u64,
    /// Frames appended, whole, in sequence order; the first `pending_written`
    /// bytes of them are already in the file.
    pending: Vec<u8>,
    /// Bytes at the head of `pending` written by a write that then failed:
    /// the whole frames that fitted. Dropped from `pending` lazily, so that a
    /// backlog draining a little at a time is not copied down at every write.
    pending_written: usize,
    /// Sequence number the next frame gets.
    next_seq: u64,
    /// Every frame with a smaller sequence number is on disk and fsynced.
    durable_below: u64,
    /// Every frame with a smaller sequence number is written (maybe not fsynced).
    written_below: u64,
    segment_bytes: u64,
    max_backlog_bytes: usize,
    last_write_error: Option<String>,
    fsync_failed: bool,
    /// Bytes on disk of every segment but the open one, by path: the WAL's
    /// size for `/metrics` without listing the directory every second.
    closed_segment_bytes: BTreeMap<PathBuf, u64>,
}

impl WalWriter {
    /// Starts a new segment in `dir` whose first frame will be `next_seq`. A
    /// disk too full to hold even a new segment is no failure: the writer
    /// opens without one, as after failed writes, and frames wait in memory
    /// until a write finds room (the store then runs, serves its rows and
    /// publishes what space allows, rather than refusing to open).
    pub fn create(
        dir: &Path,
        next_seq: u64,
        segment_bytes: u64,
        max_backlog_bytes: usize,
    ) -> Result<Self> {
        crate::regular_file::create_dirs(dir).map_err(Error::io("create", dir))?;
        let (file, path, last_write_error) = match new_segment(dir, next_seq) {
            Ok((file, path)) => (Some(file), path, None),
            Err(e) if e.is_disk_full() => {
                tracing::error!(error = %e, "The disk is full: the WAL has no open segment; rows wait in memory until space appears.");
                (
                    None,
                    FORMAT.segment_path(dir, next_seq),
                    Some(e.to_string()),
                )
            }
            Err(e) => return Err(e),
        };
        let file_len = if file.is_some() {
            MAGIC.len() as u64
        } else {
            0
        };
        // Segments left from before (replayed, not yet published) count until removed.
        let mut closed_segment_bytes = BTreeMap::new();
        for (_, old) in list_segments(dir)? {
            if old != path {
                let bytes = fs::metadata(&old).map_err(Error::io("stat", &old))?.len();
                closed_segment_bytes.insert(old, bytes);
            }
        }
        Ok(WalWriter {
            dir: dir.to_owned(),
            file,
            path,
            file_len,
            pending: Vec::with_capacity(1 << 20),
            pending_written: 0,
            next_seq,
            durable_below: next_seq,
            written_below: next_seq,
            segment_bytes,
            max_backlog_bytes,
            last_write_error,
            fsync_failed: false,
            closed_segment_bytes,
        })
    }

    /// Whether the WAL takes more rows: not once failed writes have left
    /// `max_backlog_bytes` unwritten. Checked once for a batch, before
    /// [`Self::append`] takes its frames, so that a batch split into frames
    /// (one per hour) is taken whole or not at all.
    pub fn admit(&self) -> Result<()> {
        match &self.last_write_error {
            Some(err) if self.pending_bytes() >= self.max_backlog_bytes => Err(Error::Backlogged {
                pending_bytes: self.pending_bytes(),
                last_error: err.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Frames the batch (all rows in `hour`) and returns its sequence number. The
    /// frame is durable once [`Self::sync`] has returned `Ok` after this call.
    /// The caller asks [`Self::admit`] first.
    pub fn append(&mut self, hour: i64, batch: &Batch) -> u64 {
        let seq = self.next_seq;
        FORMAT.append_frame(&mut self.pending, |out| {
            encode_frame(out, seq, hour, batch);
        });
        self.next_seq += 1;
        if self.pending_bytes() >= WRITE_THROUGH_BYTES && self.last_write_error.is_none() {
            // A failure here is kept for `sync` to report; the frames stay pending.
            let _ = self.write_pending();
        }
        seq
    }

    /// Writes pending frames to the file without fsync. On failure the whole
    /// frames that landed stay written and the part of a frame after them is
    /// cut off, so the segment ends at a frame boundary; the other frames stay
    /// pending for a retry.
    fn write_pending(&mut self) -> Result<()> {
        if self.pending_written == self.pending.len() {
            return Ok(());
        }
        if self.file.is_none() {
            // Named after the first frame it will hold.
            match new_segment(&self.dir, self.written_below) {
                Ok((file, path)) => {
                    self.file = Some(file);
                    self.path = path;
                    self.file_len = MAGIC.len() as u64;
                }
                Err(e) => {
                    self.last_write_error = Some(e.to_string());
                    return Err(e);
                }
            }
        }
        let file = self.file.as_mut().expect("made above");
        let unwritten = &self.pending[self.pending_written..];
        // `write_all` would not say how much landed before an error.
        let mut landed = 0;
        let failed = loop {
            if landed == unwritten.len() {
                break None;
            }
            match file.write(&unwritten[landed..]) {
                Ok(0) => break Some(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                Ok(n) => landed += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
        };
        let (whole_bytes, frames) = match failed {
            None => (landed, self.next_seq - self.written_below),
            Some(_) => FORMAT.whole_frames(unwritten, landed),
        };
        if whole_bytes < landed {
            // Cut the partial frame and move the write position back with it,
            // or the retry would leave a gap of zeros before its frames.
            let end = self.file_len + whole_bytes as u64;
            let _ = file.set_len(end);
            let _ = file.seek(SeekFrom::Start(end));
        }
        self.file_len += whole_bytes as u64;
        self.written_below += frames;
        self.pending_written += whole_bytes;
        if self.pending_written == self.pending.len() {
            self.pending.clear();
            self.pending_written = 0;
        } else if self.pending_written >= self.pending.len() / 2 {
            self.pending.drain(..self.pending_written);
            self.pending_written = 0;
        }
        match failed {
            None => Ok(()),
            Some(source) => {
                self.last_write_error = Some(source.to_string());
                Err(Error::Io {
                    op: "write WAL segment",
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }

    /// Writes pending frames and fsyncs. Returns the sequence number below which
    /// every frame is durable. On a failed write the whole frames that fitted are
    /// fsynced (and [`Self::durable_below`] moves past them) before the error is
    /// returned, nothing partial stays in the file, the other frames stay
    /// pending, and a later call writes what fits of them.
    pub fn sync(&mut self) -> Result<u64> {
        if self.fsync_failed {
            return Err(Error::Io {
                op: "fsync WAL segment (failed before; waiting for the rows to be published)",
                path: self.path.clone(),
                source: std::io::Error::other(self.last_write_error.clone().unwrap_or_default()),
            });
        }
        if self.durable_below < self.next_seq {
            let written = self.write_pending();
            if self.durable_below < self.written_below {
                let file = self.file.as_ref().expect("frames were written to it");
                if let Err(source) = file.sync_data() {
                    // The kernel may have dropped the dirty pages: a later fsync of
                    // this file that succeeds would prove nothing. See
                    // `abandon_segment`.
                    self.fsync_failed = true;
                    self.last_write_error = Some(source.to_string());
                    return Err(Error::Io {
                        op: "fsync WAL segment",
                        path: self.path.clone(),
                        source,
                    });
                }
                self.durable_below = self.written_below;
            }
            written?;
            self.last_write_error = None;
        }
        if self.file_len >= self.segment_bytes {
            self.start_segment()?;
        }
        Ok(self.durable_below)
    }

    /// Closes the current segment and starts a new one (after a successful sync),
    /// so that every earlier segment can be removed once its frames are published.
    pub fn rotate(&mut self) -> Result<()> {
        self.sync()?;
        if self.file_len > MAGIC.len() as u64 {
            self.start_segment()?;
        }
        Ok(())
    }

    /// Closes the open segment and opens the next, starting at `next_seq`.
    fn start_segment(&mut self) -> Result<()> {
        let (file, path) = new_segment(&self.dir, self.next_seq)?;
        let had_segment = self.file.replace(file).is_some();
        let closed = std::mem::replace(&mut self.path, path);
        // An empty segment is replaced under its own name (see `new_segment`).
        if had_segment && closed != self.path {
            self.closed_segment_bytes.insert(closed, self.file_len);
        }
        self.file_len = MAGIC.len() as u64;
        Ok(())
    }

    /// Whether an fsync failed: frames since the last good one may be lost and
    /// this segment can no longer be trusted.
    pub fn fsync_failed(&self) -> bool {
        self.fsync_failed
    }

    /// Leaves the current segment behind after a failed fsync, once the caller has
    /// made every frame so far durable another way (published them): drops what is
    /// pending and starts a fresh segment. Everything below `next_seq` then counts
    /// as durable.
    pub fn abandon_segment(&mut self) -> Result<()> {
        self.start_segment()?;
        self.pending.clear();
        self.pending_written = 0;
        self.fsync_failed = false;
        self.last_write_error = None;
        self.written_below = self.next_seq;
        self.durable_below = self.next_seq;
        Ok(())
    }

    /// Every frame below this sequence number is durable.
    pub fn durable_below(&self) -> u64 {
        self.durable_below
    }

    /// The sequence number the next frame gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Bytes appended but not yet written: after failed writes, the backlog.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len() - self.pending_written
    }

    /// Bytes of every segment on disk, the open one included; frames still
    /// pending in memory are not on disk and not counted.
    pub fn disk_bytes(&self) -> u64 {
        self.closed_segment_bytes.values().sum::<u64>() + self.file_len
    }

    /// Deletes closed segments whose frames all have sequence numbers below `lowest_needed`.
    pub fn remove_segments_below(&mut self, lowest_needed: u64) -> Result<usize> {
        let segments = list_segments(&self.dir)?;
        let mut removed = 0;
        for pair in segments.windows(2) {
            let (_, path) = &pair[0];
            let (next_start, _) = pair[1];
            // A segment holds frames [start, next_start); the open one is always last.
            if next_start <= lowest_needed && *path != self.path {
                fs::remove_file(path).map_err(Error::io("remove WAL segment", path))?;
                self.closed_segment_bytes.remove(path);
                removed += 1;
            }
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }
}

fn new_segment(dir: &Path, first_seq: u64) -> Result<(File, PathBuf)> {
    let path = FORMAT.segment_path(dir, first_seq);
    // A segment of ours with this name can exist only if no frame was ever
    // written to it (opened, then closed cleanly): it holds nothing, so start
    // it afresh. A link, FIFO or device under the name is none of ours and
    // goes too (the link, not what it names); only a file with frames stays,
    // and is named.
    let holds_frames = fs::symlink_metadata(&path)
        .is_ok_and(|m| m.is_file() && m.len() > FORMAT.magic.len() as u64);
    let created = if holds_frames {
        Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "a segment that holds frames is in the way",
        ))
    } else {
        crate::regular_file::create_fresh(&path)
    };
    let mut file = created.map_err(Error::io("create WAL segment", &path))?;
    let started = file
        .write_all(FORMAT.magic)
        .and_then(|()| file.sync_data())
        .map_err(Error::io("write WAL segment", &path))
        .and_then(|()| sync_dir(dir));
    if let Err(e) = started {
        // A segment left behind would tell truncation that the previous one
        // ends here while that one goes on taking frames.
        let _ = fs::remove_file(&path);
        return Err(e);
    }
    Ok((file, path))
}

/// Fsyncs a directory so that creations, renames and deletions in it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io("fsync directory", dir))
}

/// Segments in `dir`, ordered by first sequence number.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    FORMAT.list_segments(dir).map_err(Error::io("list", dir))
}

/// What replay found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// Frames read intact.
    pub frames: u64,
    /// Bytes cut off torn tails (a crash mid-write).
    pub torn_bytes: u64,
    /// Segments damaged before their end: every intact frame in them was still
    /// read (replay steps over a damaged frame whose length is intact), but
    /// some bytes could not be.
    pub damaged_segments: Vec<PathBuf>,
    /// Bytes of those segments that held no intact frame.
    pub damaged_bytes: u64,
    /// Bytes checksummed searching past damage for the next intact frame.
    pub search_checksum_bytes: u64,
    /// Segments with intact frames that this build's tables cannot hold in
    /// full (a table or tag it does not declare, a field of another type:
    /// written by another vtax, as after a downgrade), each with the first
    /// reason. Such a frame is skipped; a field it does not declare is
    /// dropped from rows replayed. The caller keeps a copy.
    pub set_aside_segments: Vec<(PathBuf, String)>,
    /// Intact frames skipped for that.
    pub frames_skipped: u64,
    /// The sequence number after the last intact frame.
    pub next_seq: u64,
    /// Intact frames whose sequence number was not above the one before
    /// (a frame written twice by a disk or a tool): damage, skipped.
    pub frames_out_of_order: u64,
    /// The sequence number of the last frame handed on.
    last_seq: Option<u64>,
}

impl ReplayReport {
    /// Counts `bytes` of `path` that held no intact frame it could use.
    fn damaged(&mut self, path: &Path, bytes: u64) {
        self.damaged_bytes += bytes;
        if !self.damaged_segments.iter().any(|p| p == path) {
            self.damaged_segments.push(path.to_path_buf());
        }
    }
}

/// Reads every segment in order, calling `on_frame` for each intact frame. With
/// `repair`, a torn tail of the last segment is cut off the file and empty torn
/// segments removed; without, the files are left alone (a reader beside a live
/// writer). A damaged segment is left in place either way: its intact frames
/// are still needed until they are published, and the caller decides what to
/// keep of it ([`ReplayReport::damaged_segments`]).
pub fn replay(
    dir: &Path,
    catalog: &Catalog,
    repair: bool,
    on_frame: impl FnMut(Frame) -> Result<()>,
) -> Result<ReplayReport> {
    replay_segments(open_segments(dir)?, catalog, repair, on_frame)
}

/// The WAL's segments, listed and opened, for [`replay_open`]: a reader
/// beside the writer opens them before it lists the published files, so a
/// row no file it lists holds yet is in one of these.
pub struct OpenSegments(Vec<(u64, PathBuf, File)>);

impl OpenSegments {
    /// Segments opened.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there were none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Lists and opens the segments in `dir`. One removed between the two was
/// retired, every row of it published, and is left out.
pub fn open_segments(dir: &Path) -> Result<OpenSegments> {
    let mut open = Vec::new();
    for (first_seq, path) in list_segments(dir)? {
        match crate::regular_file::open_read(&path) {
            Ok(file) => open.push((first_seq, path, file)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("open WAL segment", &path)(e)),
        }
    }
    Ok(OpenSegments(open))
}

/// [`replay`] of segments opened earlier, reading nothing else and changing
/// nothing.
pub fn replay_open(
    segments: OpenSegments,
    catalog: &Catalog,
    on_frame: impl FnMut(Frame) -> Result<()>,
) -> Result<ReplayReport> {
    replay_segments(segments, catalog, false, on_frame)
}

/// Replays segments in order, each through the handle opened with it.
fn replay_segments(
    segments: OpenSegments,
    catalog: &Catalog,
    repair: bool,
    mut on_frame: impl FnMut(Frame) -> Result<()>,
) -> Result<ReplayReport> {
    let mut report = ReplayReport::default();
    let last_index = segments.len().saturating_sub(1);
    for (i, (first_seq, path, file)) in segments.0.into_iter().enumerate() {
        let path = &path;
        report.next_seq = report.next_seq.max(first_seq);
        let file_len = file
            .metadata()
            .map_err(Error::io("read WAL segment", path))?
            .len();
        let scan = FORMAT
            .scan_resync(file, file_len, plausible_frame_start, |frame| {
                replay_frame(frame, path, catalog, &mut report, &mut on_frame)
            })
            .map_err(|e| match e {
                ScanError::Read(source) => Error::io("read WAL segment", path)(source),
                ScanError::Stopped(e) => e,
            })?;
        if scan.torn_magic {
            // A segment torn while being created holds no frames.
            if repair {
                fs::remove_file(path).map_err(Error::io("remove torn WAL segment", path))?;
            }
            continue;
        }
        let last = i == last_index;
        if last && scan.tail_bytes() > 0 {
            // Frames after the last intact one were being written at a crash.
            report.torn_bytes += scan.tail_bytes();
            if repair {
                let file = crate::regular_file::open(path, OpenOptions::new().write(true))
                    .map_err(Error::io("open WAL segment", path))?;
                file.set_len(scan.valid_bytes)
                    .and_then(|()| file.sync_all())
                    .map_err(Error::io("cut torn WAL tail", path))?;
            }
        }
        report.search_checksum_bytes += scan.search_checksum_bytes;
        let damaged = scan.damaged_bytes(last);
        // A damaged magic counts its bytes here too.
        if damaged > 0 {
            report.damaged(path, damaged);
        }
    }
    Ok(report)
}

/// Whether a payload can begin a frame this WAL wrote: a sequence number
/// below 2^48, an hour since the epoch below 2^24 (1,900 years), then a
/// table's name (1 to 64 bytes of `a-z`, `0-9`, `_`). The bytes of rows
/// past a damage rarely pass, so the search past it checksums little.
fn plausible_frame_start(payload: &[u8]) -> bool {
    let word = |i: usize| {
        payload
            .get(i..i + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let numbers =
        matches!((word(0), word(8)), (Some(seq), Some(hour)) if seq < 1 << 48 && hour < 1 << 24);
    let name = payload
        .get(16..20)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        .filter(|len| (1..=64).contains(len))
        .and_then(|len| payload.get(20..20 + len));
    numbers
        && name.is_some_and(|name| {
            name.iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
        })
}

/// Hands one intact frame of `path` to `on_frame`, decoded; a frame whose
/// rows this build's tables cannot hold is set aside in `report` instead.
fn replay_frame(
    frame: LogFrame,
    path: &PathBuf,
    catalog: &Catalog,
    report: &mut ReplayReport,
    on_frame: &mut impl FnMut(Frame) -> Result<()>,
) -> Result<()> {
    let offset = frame.offset;
    let set_aside = |report: &mut ReplayReport, reason: String| {
        if !report.set_aside_segments.iter().any(|(p, _)| p == path) {
            let reason = format!("frame at byte {offset}: {reason}");
            report.set_aside_segments.push((path.clone(), reason));
        }
    };
    let mut dropped = Vec::new();
    match decode_frame(&frame.payload, catalog, &mut dropped) {
        Ok(decoded) => {
            // Every frame takes the next number: one at or below the last
            // is a copy (a block written twice), whose rows replayed again
            // were held twice.
            if report.last_seq.is_some_and(|last| decoded.seq <= last) {
                report.frames_out_of_order += 1;
                report.damaged(path, FORMAT.frame_bytes(frame.payload.len()));
                return Ok(());
            }
            report.last_seq = Some(decoded.seq);
            if !dropped.is_empty() {
                let reason = format!(
                    "table {} does not declare field(s) {}: dropped from the rows replayed",
                    decoded.batch.table.name,
                    dropped.join(", ")
                );
                set_aside(report, reason);
            }
            report.next_seq = report.next_seq.max(decoded.seq + 1);
            report.frames += 1;
            on_frame(decoded)
        }
        Err(reason) => {
            // Its checksum holds: not damage, but rows this build has no
            // place for. Its number still counts, so no new frame reuses it.
            let seq = frame.payload[..8.min(frame.payload.len())]
                .try_into()
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            report.next_seq = report.next_seq.max(seq + 1);
            report.frames_skipped += 1;
            set_aside(report, format!("{reason}: skipped"));
            Ok(())
        }
    }
}

// ---- frame encoding ----------------------------------------------------------------

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn encode_frame(out: &mut Vec<u8>, seq: u64, hour: i64, batch: &Batch) {
    let rows = batch.len();
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&hour.to_le_bytes());
    put_str(out, batch.table.name);
    out.extend_from_slice(&(rows as u32).to_le_bytes());
    for t in &batch.time_us {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(batch.tags.len() as u16).to_le_bytes());
    for (def, column) in batch.table.tags.iter().zip(&batch.tags) {
        put_str(out, def.name);
        out.extend_from_slice(&(column.dict.len() as u32).to_le_bytes());
        for value in &column.dict {
            put_str(out, value);
        }
        for code in &column.codes {
            out.extend_from_slice(&code.to_le_bytes());
        }
    }
    out.extend_from_slice(&(batch.fields.len() as u16).to_le_bytes());
    for (def, column) in batch.table.fields.iter().zip(&batch.fields) {
        put_str(out, def.name);
        out.push(def.ty.code());
        match &column.valid {
            None => out.push(0),
            Some(valid) => {
                out.push(1);
                out.extend(valid.iter().map(|&v| v as u8));
            }
        }
        match &column.values {
            Values::F64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
            Values::I64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Values::U64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated at byte {}", self.at))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn str(&mut self) -> Result<&'a str, String> {
        let len = self.u32()? as usize;
        std::str::from_utf8(self.take(len)?).map_err(|e| e.to_string())
    }
    fn u64s(&mut self, n: usize) -> Result<impl Iterator<Item = u64> + 'a, String> {
        let bytes = self.take(n.checked_mul(8).ok_or("row count overflow")?)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap())))
    }
}

/// Decodes a frame, mapping its columns onto the current declaration by name: a
/// field the frame lacks becomes null; a field the declaration does not have is
/// left out and named in `dropped`; a tag or table it does not have, or a field
/// of another type, is an error.
fn decode_frame(
    payload: &[u8],
    catalog: &Catalog,
    dropped: &mut Vec<String>,
) -> Result<Frame, String> {
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    let seq = r.u64()?;
    let hour = r.u64()? as i64;
    let table_name = r.str()?;
    let table: &'static TableDef = catalog
        .get(table_name)
        .ok_or_else(|| format!("unknown table {table_name:?}"))?;
    let rows = r.u32()? as usize;
    let time_us: Vec<i64> = r.u64s(rows)?.map(|x| x as i64).collect();
    let mut batch = Batch::new(table);
    batch.time_us = time_us;
    let ntags = r.u16()? as usize;
    for _ in 0..ntags {
        let name = r.str()?;
        let index = table
            .tag_index(name)
            .ok_or_else(|| format!("table {} has no tag {name:?}", table.name))?;
        let dict_len = r.u32()? as usize;
        let mut column = TagColumn {
            dict: Vec::with_capacity(dict_len.min(rows + 1)),
            codes: Vec::with_capacity(rows),
        };
        for _ in 0..dict_len {
            column.dict.push(r.str()?.to_owned());
        }
        for _ in 0..rows {
            let code = r.u32()?;
            if code as usize >= dict_len {
                return Err(format!("tag code {code} outside dictionary of {dict_len}"));
            }
            column.codes.push(code);
        }
        batch.tags[index] = column;
    }
    for column in &mut batch.tags {
        if column.codes.len() != rows {
            // A tag added since the frame was written: the empty string.
            column.dict = vec![String::new()];
            column.codes = vec![0; rows];
        }
    }
    let nfields = r.u16()? as usize;
    let mut seen = vec![false; table.fields.len()];
    for _ in 0..nfields {
        let name = r.str()?;
        let index = table.field_index(name);
        let ty = FieldType::from_code(r.u8()?).ok_or("bad field type")?;
        let Some(index) = index else {
            if r.u8()? != 0 {
                r.take(rows)?;
            }
            r.take(rows.checked_mul(8).ok_or("row count overflow")?)?;
            dropped.push(name.to_owned());
            continue;
        };
        if ty != table.fields[index].ty {
            return Err(format!(
                "field {name} was {ty:?}, is now {:?}",
                table.fields[index].ty
            ));
        }
        let valid = match r.u8()? {
            0 => None,
            _ => Some(r.take(rows)?.iter().map(|&b| b != 0).collect()),
        };
        let raw = r.u64s(rows)?;
        let values = match ty {
            FieldType::F64 => Values::F64(raw.map(f64::from_bits).collect()),
            FieldType::I64 => Values::I64(raw.map(|x| x as i64).collect()),
            FieldType::U64 => Values::U64(raw.collect()),
        };
        batch.fields[index] = FieldColumn { values, valid };
        seen[index] = true;
    }
    for (column, seen) in batch.fields.iter_mut().zip(seen) {
        if !seen {
            column.values.push_default(rows);
            column.valid = Some(vec![false; rows]);
        }
    }
    if r.at != payload.len() {
        return Err(format!("{} trailing bytes", payload.len() - r.at));
    }
    Ok(Frame { seq, hour, batch })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;
    use crate::segment_log::FRAME_HEADER_BYTES;
    use crate::tables::{ScrapedRow, SCRAPED};

    fn catalog() -> Catalog {
        Catalog::new(&[&SCRAPED]).unwrap()
    }

    fn batch(n: usize, base: i64) -> Batch {
        let mut b = BatchBuilder::new(&SCRAPED);
        for i in 0..n {
            let row = ScrapedRow {
                target: "",
                metric: "m",
                labels: &format!("i=\"{}\"", i % 3),
                value: (i % 7 != 3).then_some(i as f64 * 0.1),
            };
            b.push_row(base + i as i64, &row).unwrap();
        }
        b.finish()
    }

    fn read_all(dir: &Path, repair: bool) -> (Vec<Frame>, ReplayReport) {
        let mut frames = Vec::new();
        let report = replay(dir, &catalog(), repair, |f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
        (frames, report)
    }

    #[test]
    fn frames_round_trip_through_segments() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = WalWriter::create(dir.path(), 1, 300, 1 << 20).unwrap();
        let written: Vec<Batch> = (0..5).map(|i| batch(10, i * 100)).collect();
        for b in &written {
            wal.append(7, b);
            wal.sync().unwrap();
        }
        assert!(
            list_segments(dir.path()).unwrap().len() > 1,
            "small segments rotate"
        );
        let (frames, report) = read_all(dir.path(), false);
        assert_eq!(report.frames, 5);
        assert_eq!(report.next_seq, 6);
        for (i, (frame, b)) in frames.iter().zip(&written).enumerate() {
            assert_eq!(frame.seq, i as u64 + 1);
            assert_eq!(frame.hour, 7);
            assert_eq!(&frame.batch, b);
        }
    }

    #[test]
    fn a_torn_tail_is_cut_at_the_last_good_frame() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = WalWriter::create(dir.path(), 1, 1 << 20, 1 << 20).unwrap();
        wal.append(1, &batch(5, 0));
        wal.append(1, &batch(5, 10));
        wal.sync().unwrap();
        let path = list_segments(dir.path()).unwrap()[0].1.clone();
        let full = fs::metadata(&path).unwrap().len();
        // Chop the second frame in half, as a crash mid-write would.
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(full - 20)
            .unwrap();
        let (frames, report) = read_all(dir.path(), true);
        assert_eq!(frames.len(), 1);
        assert!(report.torn_bytes > 0);
        let (_, again) = read_all(dir.path(), true);
        assert_eq!(again.torn_bytes, 0, "the cut was made on disk");
    }

    /// Where each frame of a segment starts, and where the last one ends.
    fn frame_offsets(bytes: &[u8]) -> Vec<usize> {
        let mut offsets = vec![MAGIC.len()];
        FORMAT
            .scan(bytes, bytes.len() as u64, |frame| -> Result<(), ()> {
                offsets.push(frame.end(&FORMAT) as usize);
                Ok(())
            })
            .unwrap();
        offsets
    }

    fn one_segment_of_frames(dir: &Path, frames: i64) -> (PathBuf, Vec<u8>) {
        let mut wal = WalWriter::create(dir, 1, 1 << 20, 1 << 20).unwrap();
        for i in 0..frames {
            wal.append(1, &batch(5, i * 10));
        }
        wal.sync().unwrap();
        let path = list_segments(dir).unwrap()[0].1.clone();
        let bytes = fs::read(&path).unwrap();
        (path, bytes)
    }

    #[test]
    fn a_flipped_bit_loses_its_frame_only_and_the_segment_is_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut bytes) = one_segment_of_frames(dir.path(), 4);
        let offsets = frame_offsets(&bytes);
        assert_eq!(offsets.len(), 5);
        bytes[offsets[1] + FRAME_HEADER_BYTES + 20] ^= 0x10;
        fs::write(&path, &bytes).unwrap();
        let (frames, report) = read_all(dir.path(), true);
        let seqs: Vec<u64> = frames.iter().map(|f| f.seq).collect();
        assert_eq!(seqs, [1, 3, 4], "the frames on either side of the damage");
        assert_eq!(report.damaged_segments, std::slice::from_ref(&path));
        assert_eq!(report.damaged_bytes, (offsets[2] - offsets[1]) as u64);
        assert_eq!(report.torn_bytes, 0);
        assert_eq!(report.next_seq, 5);
        assert_eq!(fs::read(&path).unwrap(), bytes, "repair cuts no damage");
    }

    #[test]
    fn a_damaged_length_gives_up_the_rest_of_its_segment_not_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = WalWriter::create(dir.path(), 1, 400, 1 << 20).unwrap();
        for i in 0..6 {
            wal.append(1, &batch(5, i * 10));
            wal.sync().unwrap();
        }
        let segments = list_segments(dir.path()).unwrap();
        assert!(segments.len() >= 3);
        let (first_seq, path) = &segments[0];
        let mut bytes = fs::read(path).unwrap();
        let offsets = frame_offsets(&bytes);
        assert!(offsets.len() >= 3, "two frames in the first segment");
        bytes[offsets[1] + 2] ^= 0x40;
        fs::write(path, &bytes).unwrap();
        let (frames, report) = read_all(dir.path(), true);
        let lost = offsets.len() as u64 - 2;
        assert_eq!(report.frames, 6 - lost);
        assert!(frames
            .iter()
            .all(|f| f.seq == *first_seq || f.seq > first_seq + lost));
        assert_eq!(report.damaged_segments, std::slice::from_ref(path));
        assert_eq!(report.damaged_bytes, (bytes.len() - offsets[1]) as u64);
        assert_eq!(
            report.torn_bytes, 0,
            "a segment before the last is not torn"
        );
        assert_eq!(fs::read(path).unwrap(), bytes);
    }

    /// A zeroed block in the middle of the last segment: a length field
    /// reads 0, which no frame has, and the scan stops there. Read as a torn
    /// tail, every intact frame after it was cut off at open; it is damage,
    /// stepped over, and the segment stays whole.
    #[test]
    fn a_zeroed_block_in_the_last_segment_costs_only_its_frames() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut bytes) = one_segment_of_frames(dir.path(), 8);
        let offsets = frame_offsets(&bytes);
        assert_eq!(offsets.len(), 9);
        // From inside frame 3 (the fourth) to inside frame 5.
        let (from, to) = (offsets[3] + 5, offsets[5] + 5);
        bytes[from..to].fill(0);
        fs::write(&path, &bytes).unwrap();
        let (frames, report) = read_all(dir.path(), true);
        let seqs: Vec<u64> = frames.iter().map(|f| f.seq).collect();
        assert_eq!(
            seqs,
            [1, 2, 3, 7, 8],
            "the frames on either side of the damage"
        );
        assert_eq!(report.damaged_segments, std::slice::from_ref(&path));
        assert_eq!(report.damaged_bytes, (offsets[6] - offsets[3]) as u64);
        assert_eq!(report.torn_bytes, 0);
        assert_eq!(fs::read(&path).unwrap(), bytes, "nothing is cut");
        // A torn tail after the last intact frame is still cut.
        let torn = [&bytes[..], &bytes[offsets[1]..offsets[1] + 30]].concat();
        fs::write(&path, &torn).unwrap();
        let (frames, report) = read_all(dir.path(), true);
        assert_eq!(frames.len(), 5);
        assert_eq!(report.torn_bytes, 30);
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }

    /// A frame written twice in a row (a disk or a tool repeating a block):
    /// both copies are intact, and the second was replayed too, its rows held
    /// twice (a debug build stopped on an assertion). A frame whose number
    /// is not above the one before is damage, skipped and reported.
    #[test]
    fn a_frame_written_twice_is_replayed_once_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes) = one_segment_of_frames(dir.path(), 4);
        let offsets = frame_offsets(&bytes);
        let copy = &bytes[offsets[1]..offsets[2]];
        let doubled = [&bytes[..offsets[2]], copy, &bytes[offsets[2]..]].concat();
        fs::write(&path, &doubled).unwrap();
        let (frames, report) = read_all(dir.path(), true);
        let seqs: Vec<u64> = frames.iter().map(|f| f.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
        assert_eq!(report.frames_out_of_order, 1);
        assert_eq!(report.damaged_segments, std::slice::from_ref(&path));
        assert_eq!(report.damaged_bytes, copy.len() as u64);
        assert_eq!(report.torn_bytes, 0);
    }

    /// Past a damage, the search computes a checksum only where a frame
    /// could begin. In rows stamped as the agent stamps them (µs since the
    /// epoch) each timestamp's upper half reads as a length of about 418 KB
    /// that fits, and a checksum at each made a damaged 50,000-row frame
    /// (a scrape at the default sample limit) take 17 s to read past.
    #[test]
    fn the_search_past_a_damage_keeps_to_plausible_frame_starts() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = WalWriter::create(dir.path(), 1, 64 << 20, 64 << 20).unwrap();
        let t0 = 1_796_640_000_000_000;
        wal.append(1, &batch(20, t0));
        wal.append(1, &batch(50_000, t0 + 1_000_000));
        // Enough after it for those lengths to fit.
        for i in 2..8 {
            wal.append(1, &batch(10_000, t0 + i * 1_000_000));
        }
        wal.sync().unwrap();
        let path = list_segments(dir.path()).unwrap()[0].1.clone();
        let mut bytes = fs::read(&path).unwrap();
        let offsets = frame_offsets(&bytes);
        bytes[offsets[1]..offsets[1] + 4096].fill(0);
        fs::write(&path, &bytes).unwrap();
        let (frames, report) = read_all(dir.path(), false);
        // The frames after it are about 1.2 MB in all.
        let searched = report.search_checksum_bytes;
        assert!(searched < 4 << 20, "{searched} bytes checksummed");
        let seqs: Vec<u64> = frames.iter().map(|f| f.seq).collect();
        assert_eq!(
            seqs,
            [1, 3, 4, 5, 6, 7, 8],
            "the damaged frame only is lost"
        );
        assert_eq!(report.damaged_segments, [path]);
    }

    #[test]
    fn a_damaged_magic_hides_no_frames() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut bytes) = one_segment_of_frames(dir.path(), 3);
        bytes[0] = b'X';
        fs::write(&path, &bytes).unwrap();
        let (frames, report) = read_all(dir.path(), true);
        assert_eq!(frames.len(), 3);
        assert_eq!(report.damaged_segments, [path]);
        assert_eq!(report.damaged_bytes, MAGIC.len() as u64);
    }

    #[test]
    fn fully_published_segments_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = WalWriter::create(dir.path(), 1, 100, 1 << 20).unwrap();
        for i in 0..4 {
            wal.append(1, &batch(5, i));
            wal.sync().unwrap();
        }
        let before = list_segments(dir.path()).unwrap().len();
        wal.remove_segments_below(3).unwrap();
        let after = list_segments(dir.path()).unwrap();
        assert!(after.len() < before);
        let (frames, _) = read_all(dir.path(), false);
        assert!(frames.iter().all(|f| f.seq >= 3) && frames.iter().any(|f| f.seq == 3));
    }

    fn bytes_on_disk(dir: &Path) -> u64 {
        list_segments(dir)
            .unwrap()
            .iter()
            .map(|(_, path)| fs::metadata(path).unwrap().len())
            .sum()
    }

    #[test]
    fn disk_bytes_follow_the_segments_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = WalWriter::create(dir.path(), 1, 400, 1 << 20).unwrap();
        assert_eq!(wal.disk_bytes(), MAGIC.len() as u64);
        for i in 0..6 {
            wal.append(1, &batch(5, i));
            assert!(wal.pending_bytes() > 0);
            assert_eq!(
                wal.disk_bytes(),
                bytes_on_disk(dir.path()),
                "frames pending in memory are not counted"
            );
            wal.sync().unwrap();
            assert_eq!(
                wal.disk_bytes(),
                bytes_on_disk(dir.path()),
                "after sync {i}"
            );
        }
        assert!(
            list_segments(dir.path()).unwrap().len() > 2,
            "segments rotated"
        );
        wal.rotate().unwrap();
        assert_eq!(wal.disk_bytes(), bytes_on_disk(dir.path()), "after rotate");
        assert!(wal.remove_segments_below(4).unwrap() > 0);
        assert_eq!(wal.disk_bytes(), bytes_on_disk(dir.path()), "after removal");
        let next = wal.next_seq();
        drop(wal);

        // Reopened beside the segments a crash left: they count until removed.
        let mut wal = WalWriter::create(dir.path(), next, 400, 1 << 20).unwrap();
        assert_eq!(
            wal.disk_bytes(),
            bytes_on_disk(dir.path()),
            "after reopening"
        );
        wal.remove_segments_below(next).unwrap();
        assert_eq!(
            wal.disk_bytes(),
            MAGIC.len() as u64,
            "only the new segment is left"
        );
        assert_eq!(wal.disk_bytes(), bytes_on_disk(dir.path()));
    }
}
