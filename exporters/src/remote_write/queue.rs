//! The on-disk queue of one remote: samples wait here between the store and
//! the receiver, across receiver outages and agent restarts.
//!
//! Layout, under `<data_dir>/remote_write/<name>/`:
//! - segments `<seq>.seg` (20 decimal digits, growing by one): an 8-byte
//!   magic, then records `[len: u32][crc32: u32][samples: u32][min_time_ms: i64][payload]`
//!   (little endian; the CRC covers everything after itself). A payload is a
//!   snappy-compressed `WriteRequest` of at most one request's samples.
//! - `acked`: the position `(segment, offset)` up to which the receiver took
//!   (or permanently refused) the records, and how many samples of that
//!   segment lie before it; 28 bytes with a CRC, replaced by rename.
//!
//! Guarantees: a record is appended whole or, after a crash, cut off as a torn
//! tail on open; nothing is dropped while the segments fit in `max_bytes`;
//! when an append would exceed it, the oldest segments are deleted (their
//! unsent samples counted as dropped), never the one being written. Records
//! are read back in append order from the acknowledged position, so a restart
//! resends at most the request that was in flight.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"VTAXRWQ\x01";
const RECORD_HEADER_BYTES: usize = 20;
/// A record longer than this is corruption, not data.
const MAX_RECORD_BYTES: usize = 256 << 20;
const ACK_FILE: &str = "acked";
/// Where the request being sent ends, written before it is sent: after a
/// crash the same records go again as one request, so a receiver that took
/// them the first time sees only samples it already has.
const IN_FLIGHT_FILE: &str = "in_flight";

/// A place in the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// Segment sequence number.
    pub segment: u64,
    /// Byte offset in the segment.
    pub offset: u64,
}

#[derive(Debug)]
struct Segment {
    seq: u64,
    bytes: u64,
    samples: u64,
}

/// Records read for one request.
#[derive(Debug)]
pub struct Pending {
    /// The records' payloads, decompressed and concatenated: one `WriteRequest`.
    pub protobuf: Vec<u8>,
    /// Samples in them.
    pub samples: u64,
    /// Where the next unread record starts: acknowledge this once sent.
    pub end: Position,
    /// Samples of `end.segment` before `end`.
    end_samples_in_segment: u64,
    /// Earliest sample time among the records, ms since the epoch.
    pub min_time_ms: i64,
}

/// What opening a queue found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Segments found.
    pub segments: usize,
    /// Samples waiting to be sent.
    pub pending_samples: u64,
    /// Bytes cut off segments: torn tails, or records after a bad one.
    pub truncated_bytes: u64,
}

/// The queue: appended to by the store's thread, read by the sender.
#[derive(Debug)]
pub struct Queue {
    dir: PathBuf,
    max_bytes: u64,
    segment_bytes: u64,
    segments: VecDeque<Segment>,
    file: File,
    acked: Position,
    acked_samples_in_segment: u64,
    /// The end of a request sent but not acknowledged before a restart.
    in_flight: Option<Position>,
    /// Whether `in_flight` was restored at open: its request may have arrived.
    resending: bool,
    total_bytes: u64,
    unsynced: bool,
    new_segment_unsynced: bool,
    dropped_samples: u64,
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.seg"))
}

impl Queue {
    /// Opens (or creates) the queue in `dir`, cutting torn tails, resuming
    /// from the persisted acknowledged position.
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<(Queue, OpenReport)> {
        fs::create_dir_all(dir)?;
        let mut seqs: Vec<u64> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".seg")?.parse().ok()
            })
            .collect();
        seqs.sort_unstable();
        let mut report = OpenReport::default();
        let mut segments = VecDeque::new();
        for seq in seqs {
            let path = segment_path(dir, seq);
            let (valid, samples, file_len) = scan_segment(&path)?;
            if valid < file_len {
                tracing::warn!(path = %path.display(), valid_bytes = valid, cut_bytes = file_len - valid, "Remote write queue: cut a torn or corrupt tail.");
                report.truncated_bytes += file_len - valid;
                OpenOptions::new().write(true).open(&path)?.set_len(valid)?;
            }
            segments.push_back(Segment {
                seq,
                bytes: valid,
                samples: samples.iter().map(|&n| u64::from(n)).sum(),
            });
        }
        // Resume after the last acknowledged record, if its segment is still here.
        let (mut acked, mut acked_samples) = read_ack(dir).unwrap_or((
            Position {
                segment: 0,
                offset: MAGIC.len() as u64,
            },
            0,
        ));
        match segments.iter().find(|s| s.seq == acked.segment) {
            Some(s) if acked.offset <= s.bytes => {}
            Some(s) => {
                // The acknowledged tail was cut: nothing of it is pending.
                acked.offset = s.bytes;
                acked_samples = s.samples;
            }
            None => {
                acked = Position {
                    segment: segments.front().map_or(acked.segment, |s| s.seq),
                    offset: MAGIC.len() as u64,
                };
                acked_samples = 0;
            }
        }
        // Fully acknowledged segments before the position are of no more use.
        while segments.front().is_some_and(|s| s.seq < acked.segment) {
            let s = segments.pop_front().expect("checked");
            let _ = fs::remove_file(segment_path(dir, s.seq));
        }
        let file = match segments.back() {
            Some(last) => {
                let file = OpenOptions::new()
                    .append(true)
                    .open(segment_path(dir, last.seq))?;
                file
            }
            None => {
                let seq = acked.segment;
                let file = create_segment(dir, seq)?;
                segments.push_back(Segment {
                    seq,
                    bytes: MAGIC.len() as u64,
                    samples: 0,
                });
                file
            }
        };
        report.segments = segments.len();
        report.pending_samples = segments.iter().map(|s| s.samples).sum::<u64>() - acked_samples;
        let total_bytes = segments.iter().map(|s| s.bytes).sum();
        let in_flight = read_position(dir, IN_FLIGHT_FILE)
            .map(|(position, _)| position)
            .filter(|position| *position > acked);
        Ok((
            Queue {
                dir: dir.to_owned(),
                max_bytes,
                segment_bytes: segment_bytes_for(max_bytes),
                segments,
                file,
                in_flight,
                resending: in_flight.is_some(),
                acked,
                acked_samples_in_segment: acked_samples,
                total_bytes,
                unsynced: false,
                new_segment_unsynced: false,
                dropped_samples: 0,
            },
            report,
        ))
    }

    /// Appends one record. When the queue would outgrow its bound, the oldest
    /// segments go first (counted in [`Queue::dropped_samples`]).
    pub fn append(&mut self, payload: &[u8], samples: u32, min_time_ms: i64) -> io::Result<()> {
        let record_bytes = (RECORD_HEADER_BYTES + payload.len()) as u64;
        let current = self.segments.back().expect("one segment is always open");
        if current.bytes + record_bytes > self.segment_bytes && current.bytes > MAGIC.len() as u64
            || self.total_bytes + record_bytes > self.max_bytes && self.segments.len() == 1
        {
            self.rotate()?;
        }
        while self.total_bytes + record_bytes > self.max_bytes && self.segments.len() > 1 {
            self.drop_oldest();
        }
        let mut record = Vec::with_capacity(record_bytes as usize);
        record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        record.extend_from_slice(&[0; 4]);
        record.extend_from_slice(&samples.to_le_bytes());
        record.extend_from_slice(&min_time_ms.to_le_bytes());
        record.extend_from_slice(payload);
        let crc = crc32fast::hash(&record[8..]);
        record[4..8].copy_from_slice(&crc.to_le_bytes());
        let current = self
            .segments
            .back_mut()
            .expect("one segment is always open");
        if let Err(e) = self.file.write_all(&record) {
            // Cut a partial record back off, so the segment stays readable.
            let _ = self.file.set_len(current.bytes);
            return Err(e);
        }
        current.bytes += record_bytes;
        current.samples += u64::from(samples);
        self.total_bytes += record_bytes;
        self.unsynced = true;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.sync_data()?;
        let seq = self
            .segments
            .back()
            .expect("one segment is always open")
            .seq
            + 1;
        self.file = create_segment(&self.dir, seq)?;
        self.segments.push_back(Segment {
            seq,
            bytes: MAGIC.len() as u64,
            samples: 0,
        });
        self.total_bytes += MAGIC.len() as u64;
        self.new_segment_unsynced = true;
        Ok(())
    }

    fn drop_oldest(&mut self) {
        let oldest = self.segments.pop_front().expect("more than one segment");
        let lost = if oldest.seq == self.acked.segment {
            oldest.samples - self.acked_samples_in_segment
        } else {
            oldest.samples
        };
        self.dropped_samples += lost;
        self.total_bytes -= oldest.bytes;
        let _ = fs::remove_file(segment_path(&self.dir, oldest.seq));
        if self.acked.segment <= oldest.seq {
            let next = self.segments.front().expect("one segment is left").seq;
            self.acked = Position {
                segment: next,
                offset: MAGIC.len() as u64,
            };
            self.acked_samples_in_segment = 0;
        }
        tracing::warn!(
            dir = %self.dir.display(),
            dropped_samples = lost,
            "Remote write queue full: dropped its oldest segment."
        );
    }

    /// Makes appended records durable (called on the store's fsync cadence).
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            self.file.sync_data()?;
            self.unsynced = false;
        }
        if self.new_segment_unsynced {
            File::open(&self.dir)?.sync_all()?;
            self.new_segment_unsynced = false;
        }
        Ok(())
    }

    /// Reads records from the acknowledged position until they hold at least
    /// `max_samples` samples (a record is never split) or none are left.
    pub fn read(&self, max_samples: u64) -> io::Result<Option<Pending>> {
        let mut position = self.acked;
        let mut in_segment = self.acked_samples_in_segment;
        let mut pending = Pending {
            protobuf: Vec::new(),
            samples: 0,
            end: position,
            end_samples_in_segment: in_segment,
            min_time_ms: i64::MAX,
        };
        let mut decoder = snap::raw::Decoder::new();
        let first = position.segment;
        'segments: for segment in self.segments.iter().filter(|s| s.seq >= first) {
            if segment.seq > position.segment {
                position = Position {
                    segment: segment.seq,
                    offset: MAGIC.len() as u64,
                };
                in_segment = 0;
            }
            if position.offset >= segment.bytes {
                continue;
            }
            let mut file = File::open(segment_path(&self.dir, segment.seq))?;
            file.seek(SeekFrom::Start(position.offset))?;
            let mut reader = io::BufReader::new(file.take(segment.bytes - position.offset));
            while position.offset < segment.bytes {
                let Some((samples, min_time_ms, payload)) = read_record(&mut reader)? else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: bad record at offset {}",
                            segment_path(&self.dir, segment.seq).display(),
                            position.offset
                        ),
                    ));
                };
                let protobuf = decoder
                    .decompress_vec(&payload)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                pending.protobuf.extend_from_slice(&protobuf);
                pending.samples += u64::from(samples);
                pending.min_time_ms = pending.min_time_ms.min(min_time_ms);
                position.offset += (RECORD_HEADER_BYTES + payload.len()) as u64;
                in_segment += u64::from(samples);
                pending.end = position;
                pending.end_samples_in_segment = in_segment;
                match self.in_flight {
                    // Resend exactly the request that was in flight.
                    Some(end) if position >= end => break 'segments,
                    Some(_) => {}
                    None if pending.samples >= max_samples => break 'segments,
                    None => {}
                }
            }
        }
        Ok((pending.samples > 0 || pending.end != self.acked).then_some(pending))
    }

    /// Records everything before `pending.end` as done, and deletes segments
    /// the sender has left behind. A position whose segment was dropped
    /// meanwhile changes nothing.
    pub fn ack(&mut self, pending: &Pending) -> io::Result<()> {
        if pending.end < self.acked {
            return Ok(());
        }
        self.in_flight = None;
        self.resending = false;
        self.acked = pending.end;
        self.acked_samples_in_segment = pending.end_samples_in_segment;
        while self.segments.len() > 1 && self.segments[0].seq < self.acked.segment {
            let done = self.segments.pop_front().expect("checked");
            self.total_bytes -= done.bytes;
            fs::remove_file(segment_path(&self.dir, done.seq))?;
        }
        write_ack(&self.dir, self.acked, self.acked_samples_in_segment)
    }

    /// Records, durably, that the request reading up to `pending.end` is
    /// about to be sent; until it is acknowledged, [`Queue::read`] returns
    /// exactly those records, across restarts.
    pub fn mark_in_flight(&mut self, pending: &Pending) -> io::Result<()> {
        if self.in_flight == Some(pending.end) {
            return Ok(());
        }
        write_position(
            &self.dir,
            IN_FLIGHT_FILE,
            pending.end,
            pending.end_samples_in_segment,
            true,
        )?;
        self.in_flight = Some(pending.end);
        Ok(())
    }

    /// Whether a request was in flight when the queue was opened and has not
    /// been acknowledged since: the receiver may already hold its samples.
    pub fn resending(&self) -> bool {
        self.resending
    }

    /// Bytes of records not yet acknowledged.
    pub fn pending_bytes(&self) -> u64 {
        self.total_bytes
            - (self.acked.offset - MAGIC.len() as u64)
            - MAGIC.len() as u64 * self.segments.len() as u64
    }

    /// Samples not yet acknowledged.
    pub fn pending_samples(&self) -> u64 {
        self.segments.iter().map(|s| s.samples).sum::<u64>() - self.acked_samples_in_segment
    }

    /// Samples dropped because the queue was full, since it was opened.
    pub fn dropped_samples(&self) -> u64 {
        self.dropped_samples
    }
}

/// Segments a sixteenth of the bound, so dropping one frees little more than
/// needed, within sizes that keep file counts and rewrites reasonable.
fn segment_bytes_for(max_bytes: u64) -> u64 {
    (max_bytes / 16).clamp(64 << 10, 16 << 20)
}

fn create_segment(dir: &Path, seq: u64) -> io::Result<File> {
    let path = segment_path(dir, seq);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    file.write_all(MAGIC)?;
    Ok(file)
}

/// Reads one record; `None` for a torn or corrupt one (or the end).
fn read_record(reader: &mut impl Read) -> io::Result<Option<(u32, i64, Vec<u8>)>> {
    let mut header = [0u8; RECORD_HEADER_BYTES];
    if let Err(e) = reader.read_exact(&mut header) {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof => Ok(None),
            _ => Err(e),
        };
    }
    let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    if len > MAX_RECORD_BYTES {
        return Ok(None);
    }
    let mut payload = vec![0; len];
    if let Err(e) = reader.read_exact(&mut payload) {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof => Ok(None),
            _ => Err(e),
        };
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[8..]);
    hasher.update(&payload);
    if hasher.finalize() != crc {
        return Ok(None);
    }
    let samples = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    let min_time_ms = i64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    Ok(Some((samples, min_time_ms, payload)))
}

/// Valid length, samples per record, and file length of a segment.
fn scan_segment(path: &Path) -> io::Result<(u64, Vec<u32>, u64)> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut reader = io::BufReader::new(file);
    let mut magic = [0u8; 8];
    if reader.read_exact(&mut magic).is_err() || &magic != MAGIC {
        // Not even a header: start the segment over.
        let mut file = OpenOptions::new().write(true).open(path)?;
        file.set_len(0)?;
        file.write_all(MAGIC)?;
        return Ok((MAGIC.len() as u64, Vec::new(), MAGIC.len() as u64));
    }
    let mut valid = MAGIC.len() as u64;
    let mut samples = Vec::new();
    while let Some((n, _, payload)) = read_record(&mut reader)? {
        valid += (RECORD_HEADER_BYTES + payload.len()) as u64;
        samples.push(n);
    }
    Ok((valid, samples, file_len))
}

fn read_ack(dir: &Path) -> Option<(Position, u64)> {
    let found = read_position(dir, ACK_FILE);
    if found.is_none() && dir.join(ACK_FILE).exists() {
        tracing::warn!(dir = %dir.display(), "Remote write queue: acknowledged position unreadable; resending from the oldest segment.");
    }
    found
}

fn read_position(dir: &Path, name: &str) -> Option<(Position, u64)> {
    let bytes = fs::read(dir.join(name)).ok()?;
    if bytes.len() != 28 || crc32fast::hash(&bytes[..24]).to_le_bytes() != bytes[24..28] {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    Some((
        Position {
            segment: word(0),
            offset: word(8),
        },
        word(16),
    ))
}

fn write_ack(dir: &Path, position: Position, samples: u64) -> io::Result<()> {
    // A rename without fsync: after a power cut the previous position comes
    // back with the in-flight mark of the request after it, and that request
    // is sent again whole.
    write_position(dir, ACK_FILE, position, samples, false)
}

fn write_position(
    dir: &Path,
    name: &str,
    position: Position,
    samples: u64,
    durable: bool,
) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(28);
    bytes.extend_from_slice(&position.segment.to_le_bytes());
    bytes.extend_from_slice(&position.offset.to_le_bytes());
    bytes.extend_from_slice(&samples.to_le_bytes());
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = File::create(&tmp)?;
    file.write_all(&bytes)?;
    if durable {
        file.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(n: u8, len: usize) -> Vec<u8> {
        snap::raw::Encoder::new()
            .compress_vec(&vec![n; len])
            .unwrap()
    }

    /// A snappy payload of `len` bytes that do not compress.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let raw: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        snap::raw::Encoder::new().compress_vec(&raw).unwrap()
    }

    fn drain(queue: &mut Queue, max: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(p) = queue.read(max).unwrap() {
            if p.samples == 0 {
                queue.ack(&p).unwrap();
                continue;
            }
            out.extend(p.protobuf.iter().copied());
            queue.ack(&p).unwrap();
        }
        out
    }

    #[test]
    fn records_come_back_in_order_across_reopen_from_the_acked_position() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 0);
        for n in 0..5u8 {
            q.append(&payload(n, 3), 10, i64::from(n)).unwrap();
        }
        let first = q.read(15).unwrap().unwrap();
        assert_eq!(
            (first.samples, first.min_time_ms),
            (20, 0),
            "two whole records"
        );
        assert_eq!(first.protobuf, [0, 0, 0, 1, 1, 1]);
        q.ack(&first).unwrap();
        q.sync().unwrap();
        drop(q);

        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 30);
        assert_eq!(q.pending_samples(), 30);
        assert_eq!(drain(&mut q, 1000), [2, 2, 2, 3, 3, 3, 4, 4, 4]);
        assert_eq!(q.pending_bytes(), 0);
        q.append(&payload(9, 1), 1, 9).unwrap();
        assert_eq!(drain(&mut q, 1000), [9]);
    }

    #[test]
    fn the_request_in_flight_at_a_crash_is_read_again_whole_and_no_larger() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        for n in 0..2u8 {
            q.append(&payload(n, 2), 10, i64::from(n)).unwrap();
        }
        let sent = q.read(1000).unwrap().unwrap();
        q.mark_in_flight(&sent).unwrap();
        assert!(!q.resending(), "a request of this run is no resend");
        // More arrives while the request is out; then the agent dies unacknowledged.
        for n in 2..4u8 {
            q.append(&payload(n, 2), 10, i64::from(n)).unwrap();
        }
        q.sync().unwrap();
        drop(q);

        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 40);
        assert!(q.resending());
        let again = q.read(1000).unwrap().unwrap();
        assert_eq!(
            again.protobuf, sent.protobuf,
            "the same records, none added"
        );
        assert_eq!((again.samples, again.end), (sent.samples, sent.end));
        q.mark_in_flight(&again).unwrap();
        q.ack(&again).unwrap();
        assert!(!q.resending());
        assert_eq!(drain(&mut q, 1000), [2, 2, 3, 3]);
        drop(q);
        // An acknowledged mark left on disk is not a resend at the next start.
        let (q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert!(!q.resending());
    }

    #[test]
    fn a_torn_tail_is_cut_and_the_records_before_it_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        q.append(&payload(1, 4), 2, 1).unwrap();
        q.append(&payload(2, 4), 3, 2).unwrap();
        drop(q);
        let seg = segment_path(dir.path(), 0);
        let len = fs::metadata(&seg).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(len - 3)
            .unwrap();

        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 2);
        assert!(report.truncated_bytes > 0);
        q.append(&payload(3, 4), 4, 3).unwrap();
        assert_eq!(drain(&mut q, 1000), [1, 1, 1, 1, 3, 3, 3, 3]);

        // A flipped bit is as good as a tear: the record and what follows go.
        let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        q.append(&payload(4, 4), 1, 4).unwrap();
        drop(q);
        let mut bytes = fs::read(&seg).unwrap();
        let at = bytes.len() - 2;
        bytes[at] ^= 1;
        fs::write(&seg, bytes).unwrap();
        let (q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 0);
        assert!(q.read(1000).unwrap().is_none());
    }

    #[test]
    fn the_bound_drops_the_oldest_segments_only_when_hit_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let max = 1 << 20; // segments of 64 KiB
        let (mut q, _) = Queue::open(dir.path(), max).unwrap();
        let record = noise(10_000, 7);
        let per_record = (RECORD_HEADER_BYTES + record.len()) as u64;
        let fit = (max - 16 * 8) / per_record; // records that fit in the bound
        for i in 0..fit - 8 {
            q.append(&record, 100, i as i64).unwrap();
        }
        assert_eq!(
            q.dropped_samples(),
            0,
            "nothing dropped while there is room"
        );
        assert!(q.total_bytes <= max);
        for i in 0..40 {
            q.append(&record, 100, i).unwrap();
            assert!(q.total_bytes <= max, "{} > {max}", q.total_bytes);
        }
        let dropped = q.dropped_samples();
        assert!(dropped > 0 && dropped % 100 == 0, "{dropped}");
        let appended = (fit - 8 + 40) * 100;
        assert_eq!(q.pending_samples(), appended - dropped);
        let mut read = 0;
        while let Some(p) = q.read(1000).unwrap() {
            read += p.samples;
            q.ack(&p).unwrap();
        }
        assert_eq!(read, appended - dropped, "what was not dropped arrives");
        let segments = fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "seg")
            })
            .count();
        assert_eq!(segments, 1, "sent segments are deleted");
    }

    #[test]
    fn dropping_the_segment_being_read_moves_the_reader_on() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 1 << 20).unwrap();
        let record = noise(30_000, 3);
        q.append(&record, 5, 0).unwrap();
        let first = q.read(1).unwrap().unwrap();
        q.ack(&first).unwrap();
        for _ in 0..200 {
            q.append(&record, 5, 1).unwrap();
        }
        let stale = first; // acknowledged before: an old position changes nothing
        q.ack(&stale).unwrap();
        assert_eq!(q.pending_samples() + q.dropped_samples(), 200 * 5);
        let (q2, report) = {
            drop(q);
            Queue::open(dir.path(), 1 << 20).unwrap()
        };
        assert_eq!(report.pending_samples, q2.pending_samples());
    }
}
