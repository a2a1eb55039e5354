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
//!   segment lie before it (open counts them again from the records); 28
//!   bytes with a CRC, replaced by rename.
//! - `quarantine/`: copies of segments found damaged, as they were found.
//!
//! Guarantees: a record is appended whole or, after a crash, cut off as a torn
//! tail on open; nothing is dropped while the records not yet acknowledged
//! fit in `max_bytes`; when an append would exceed it, the oldest segments are
//! deleted (their unsent samples counted as dropped), never the one being
//! written, and of a segment written under a larger bound before a restart,
//! only the oldest records that exceed the bound. Records
//! are read back in append order from the acknowledged position, so a restart
//! resends at most the request that was in flight. A record whose checksum
//! fails is stepped over when its length field leads to an intact record, so
//! damage inside one record loses that record only; a damaged length loses
//! the rest of its segment, not the next segments.

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
    /// Bytes cut off the last segment's torn tail (a crash mid-append).
    pub truncated_bytes: u64,
    /// Segments with damage: a damaged magic, a record whose checksum fails,
    /// or bytes after the last intact record of a segment before the last.
    /// Each was copied to `quarantine/` first.
    pub damaged_segments: Vec<PathBuf>,
    /// Bytes of those segments that held no intact record; their samples are lost.
    pub damaged_bytes: u64,
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
    /// Bytes found damaged: what open cut or mended, and what reads met since.
    damaged_bytes: u64,
    /// Damage before this position is counted in `damaged_bytes` already.
    damage_counted_until: Position,
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.seg"))
}

impl Queue {
    /// Opens (or creates) the queue in `dir`, cutting torn tails, resuming
    /// from the persisted acknowledged position.
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<(Queue, OpenReport)> {
        fs::create_dir_all(dir)?;
        let seqs = segment_seqs(dir)?;
        let mut report = OpenReport::default();
        let mut segments = VecDeque::new();
        let mut record_ends = Vec::new();
        let mut cut_damage = 0;
        let last_seq = seqs.last().copied();
        for seq in seqs {
            let path = segment_path(dir, seq);
            let mut scan = scan_segment(&path)?;
            if scan.torn_magic {
                // Torn while being created: start it over.
                let mut file = OpenOptions::new().write(true).open(&path)?;
                file.set_len(0)?;
                file.write_all(MAGIC)?;
                scan.file_len = MAGIC.len() as u64;
            }
            let tail = scan.tail_bytes();
            let torn = Some(seq) == last_seq;
            let cut_bytes = scan.cut_damage_bytes(torn);
            // Records stepped over stay in the segment and count when read.
            cut_damage += cut_bytes;
            let damaged_bytes = scan.damaged_bytes(torn);
            if damaged_bytes > 0 {
                // Kept as found before anything is cut or mended.
                copy_to_quarantine(dir, &path)?;
                tracing::error!(path = %path.display(), damaged_bytes, "Remote write queue: a segment is damaged; every intact record is still sent, the damaged ones are lost. Copied it to quarantine.");
                report.damaged_bytes += damaged_bytes;
                report.damaged_segments.push(path.clone());
            }
            if scan.bad_magic {
                let mut file = OpenOptions::new().write(true).open(&path)?;
                file.write_all(MAGIC)?;
            }
            if tail > 0 {
                if torn {
                    tracing::warn!(path = %path.display(), valid_bytes = scan.valid_bytes, cut_bytes = tail, "Remote write queue: cut a torn tail.");
                    report.truncated_bytes += tail;
                }
                OpenOptions::new()
                    .write(true)
                    .open(&path)?
                    .set_len(scan.valid_bytes)?;
            }
            segments.push_back(Segment {
                seq,
                bytes: scan.valid_bytes,
                samples: scan.record_ends.iter().map(|&(_, n)| u64::from(n)).sum(),
            });
            record_ends.push(scan.record_ends);
        }
        // Resume after the last acknowledged record, if its segment is still
        // here. The samples before it are counted again from the records (the
        // file's count would include a record since found damaged).
        let mut acked = read_ack(dir).unwrap_or(Position {
            segment: 0,
            offset: MAGIC.len() as u64,
        });
        let acked_samples;
        match segments.iter().position(|s| s.seq == acked.segment) {
            Some(i) if acked.offset <= segments[i].bytes => {
                acked_samples = record_ends[i]
                    .iter()
                    .take_while(|(end, _)| *end <= acked.offset)
                    .map(|&(_, samples)| u64::from(samples))
                    .sum();
            }
            Some(i) => {
                // The acknowledged tail was cut: nothing of it is pending.
                acked.offset = segments[i].bytes;
                acked_samples = segments[i].samples;
            }
            None => {
                acked = Position {
                    segment: segments.front().map_or(acked.segment, |s| s.seq),
                    offset: MAGIC.len() as u64,
                };
                acked_samples = 0;
            }
        }
        // The request in flight ended at a record's end. Where damage or a
        // torn tail cut the queue below it, it ends at the last record left
        // before that: a resend is never larger than the request was (new
        // records appended past the cut would otherwise join it, unbounded).
        let in_flight = read_position(dir, IN_FLIGHT_FILE)
            .and_then(|mark| {
                let i = segments.iter().position(|s| s.seq == mark.segment)?;
                let end = record_ends[i]
                    .iter()
                    .map(|&(end, _)| end)
                    .take_while(|&end| end <= mark.offset)
                    .last()?;
                Some(Position {
                    segment: mark.segment,
                    offset: end,
                })
            })
            .filter(|position| *position > acked);
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
                damaged_bytes: cut_damage,
                damage_counted_until: acked,
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
            || self.held_bytes() + record_bytes > self.max_bytes && self.segments.len() == 1
        {
            self.rotate()?;
        }
        self.make_room(record_bytes)?;
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

    /// Bytes the queue holds against its bound: its segments less the
    /// acknowledged records at the head of the first. Those stay on disk until
    /// the sender leaves their segment; counting them would make a restart
    /// with a smaller bound drop records that were never over it.
    fn held_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.segments.front().map(|s| s.seq),
            Some(self.acked.segment)
        );
        self.total_bytes - (self.acked.offset - MAGIC.len() as u64)
    }

    /// Drops the oldest records until `record_bytes` more fit in the bound:
    /// whole segments (a sixteenth of the bound each), but from a segment
    /// written under a larger bound only the records that exceed this one,
    /// so that a smaller bound at restart does not drop what fits under it.
    fn make_room(&mut self, record_bytes: u64) -> io::Result<()> {
        while self.held_bytes() + record_bytes > self.max_bytes && self.segments.len() > 1 {
            let excess = self.held_bytes() + record_bytes - self.max_bytes;
            let front = &self.segments[0];
            if front.bytes - self.acked.offset <= excess || front.bytes <= self.segment_bytes {
                self.drop_oldest();
                continue;
            }
            self.drop_head_records(excess)?;
        }
        Ok(())
    }

    /// Drops records from the acknowledged position of the first segment
    /// until at least `bytes` are dropped, by moving that position on; the
    /// whole segment goes if damage leaves no next record to step to.
    fn drop_head_records(&mut self, bytes: u64) -> io::Result<()> {
        let front = &self.segments[0];
        let (seq, end) = (front.seq, front.bytes);
        let start = self.acked.offset;
        let mut file = File::open(segment_path(&self.dir, seq))?;
        file.seek(SeekFrom::Start(start))?;
        let mut reader = io::BufReader::new(file.take(end - start));
        let (mut offset, mut lost) = (start, 0u64);
        while offset - start < bytes && offset < end {
            let Some((stepped_over, record)) = next_intact_record(&mut reader)? else {
                self.drop_oldest();
                return Ok(());
            };
            offset += stepped_over + (RECORD_HEADER_BYTES + record.payload.len()) as u64;
            lost += u64::from(record.samples);
        }
        self.acked.offset = offset;
        self.acked_samples_in_segment += lost;
        self.dropped_samples += lost;
        if self.in_flight.is_some_and(|end| end <= self.acked) {
            self.in_flight = None;
            self.resending = false;
        }
        write_ack(&self.dir, self.acked, self.acked_samples_in_segment)?;
        tracing::warn!(
            dir = %self.dir.display(),
            dropped_samples = lost,
            "Remote write queue full: dropped its oldest records."
        );
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
    pub fn read(&mut self, max_samples: u64) -> io::Result<Option<Pending>> {
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
        // Damage met on the way: where, how many bytes, what.
        let mut met: Vec<(Position, u64, &'static str)> = Vec::new();
        let mut gave_up_on_last = false;
        let last = self
            .segments
            .back()
            .expect("one segment is always open")
            .seq;
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
                let Some((stepped_over, record)) = next_intact_record(&mut reader)? else {
                    // Damaged since open, past finding the next record: the
                    // reader moves on to the next segment rather than stop.
                    met.push((
                        position,
                        segment.bytes - position.offset,
                        "the rest of a segment damaged since the queue was opened",
                    ));
                    gave_up_on_last |= segment.seq == last;
                    position.offset = segment.bytes;
                    pending.end = position;
                    pending.end_samples_in_segment = segment.samples;
                    continue;
                };
                if stepped_over > 0 {
                    // Open steps over such a record too; it is counted when met.
                    met.push((
                        position,
                        stepped_over,
                        "a record whose checksum fails; stepped over",
                    ));
                    position.offset += stepped_over;
                }
                let record_bytes = (RECORD_HEADER_BYTES + record.payload.len()) as u64;
                let at = position;
                position.offset += record_bytes;
                in_segment += u64::from(record.samples);
                pending.end = position;
                pending.end_samples_in_segment = in_segment;
                match decoder.decompress_vec(&record.payload) {
                    Ok(protobuf) => {
                        pending.protobuf.extend_from_slice(&protobuf);
                        pending.samples += u64::from(record.samples);
                        pending.min_time_ms = pending.min_time_ms.min(record.min_time_ms);
                    }
                    // Its checksum held, so it was written so: sending the
                    // rest matters more than this record.
                    Err(_) => met.push((
                        at,
                        record_bytes,
                        "a record that does not decompress; skipped",
                    )),
                }
                match self.in_flight {
                    // Resend exactly the request that was in flight.
                    Some(end) if position >= end => break 'segments,
                    Some(_) => {}
                    None if pending.samples >= max_samples => break 'segments,
                    None => {}
                }
            }
        }
        // Records appended after damage in the segment being written would be
        // cut with it, as a torn tail, at the next open: append to a new one.
        if gave_up_on_last {
            self.rotate()?;
        }
        // A short request is read again until it is due: count and tell each
        // damage once.
        for (at, bytes, what) in met {
            if at >= self.damage_counted_until {
                self.damaged_bytes += bytes;
                self.damage_counted_until = Position {
                    segment: at.segment,
                    offset: at.offset + 1,
                };
                tracing::error!(path = %segment_path(&self.dir, at.segment).display(), offset = at.offset, lost_bytes = bytes, "Remote write queue: {what}; its samples are lost.");
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

    /// Bytes found damaged since it was opened, at open included.
    pub fn damaged_bytes(&self) -> u64 {
        self.damaged_bytes
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

struct IntactRecord {
    samples: u32,
    min_time_ms: i64,
    payload: Vec<u8>,
}

enum Record {
    Intact(IntactRecord),
    /// A whole record whose checksum fails; `bytes` long if its length field
    /// is right, which only an intact record after it confirms.
    Damaged {
        bytes: u64,
    },
    /// The end, a torn record, or a length that cannot be a record's.
    End,
}

fn read_record(reader: &mut impl Read) -> io::Result<Record> {
    let mut header = [0u8; RECORD_HEADER_BYTES];
    if let Err(e) = reader.read_exact(&mut header) {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof => Ok(Record::End),
            _ => Err(e),
        };
    }
    let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    if len > MAX_RECORD_BYTES {
        return Ok(Record::End);
    }
    let mut payload = vec![0; len];
    if let Err(e) = reader.read_exact(&mut payload) {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof => Ok(Record::End),
            _ => Err(e),
        };
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[8..]);
    hasher.update(&payload);
    if hasher.finalize() != crc {
        return Ok(Record::Damaged {
            bytes: (RECORD_HEADER_BYTES + len) as u64,
        });
    }
    Ok(Record::Intact(IntactRecord {
        samples: u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")),
        min_time_ms: i64::from_le_bytes(header[12..20].try_into().expect("8 bytes")),
        payload,
    }))
}

/// What a segment holds, as [`Queue::open`] found it.
struct SegmentScan {
    /// Where the last intact record ends.
    valid_bytes: u64,
    /// Where each intact record ends, and its samples.
    record_ends: Vec<(u64, u32)>,
    /// Bytes of damaged records stepped over (not the tail after the last
    /// intact record).
    stepped_over_bytes: u64,
    /// Where the last record stepped over ends (0 if none).
    stepped_over_end: u64,
    bad_magic: bool,
    /// Shorter than the magic: torn while being created.
    torn_magic: bool,
    file_len: u64,
}

impl SegmentScan {
    /// Bytes after the last intact record.
    fn tail_bytes(&self) -> u64 {
        self.file_len - self.valid_bytes
    }

    /// Damaged bytes that no read will step over: a damaged magic, and the
    /// tail of a segment before the last (a complete segment has none; the
    /// last one's is taken for a torn append).
    fn cut_damage_bytes(&self, last: bool) -> u64 {
        self.bad_magic_bytes() + if last { 0 } else { self.tail_bytes() }
    }

    /// The magic's bytes when it is damaged (they end where they count).
    fn bad_magic_bytes(&self) -> u64 {
        if self.bad_magic {
            MAGIC.len() as u64
        } else {
            0
        }
    }

    /// Every byte of the segment that held no intact record, but a torn tail.
    fn damaged_bytes(&self, last: bool) -> u64 {
        self.cut_damage_bytes(last) + self.stepped_over_bytes
    }

    /// Where the last damaged byte ends: a copy at least this long holds
    /// the damage as found (segments are only appended to after it).
    fn damage_end(&self, last: bool) -> u64 {
        let cut_end = if last { 0 } else { self.file_len };
        cut_end
            .max(self.stepped_over_end)
            .max(self.bad_magic_bytes())
    }
}

/// The sequence numbers of the segments in `dir`, in order.
fn segment_seqs(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs: Vec<u64> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".seg")?.parse().ok()
        })
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

/// What [`verify`] found in a queue.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Segments read.
    pub segments: usize,
    /// Intact records.
    pub records: u64,
    /// Samples in them that the receiver has not acknowledged.
    pub pending_samples: u64,
    /// Damaged segments (their damaged records' samples are lost; open
    /// copies the segment to `quarantine/` and sends every intact record).
    pub damaged: Vec<DamagedSegment>,
    /// Bytes after the last intact record of the newest segment: a record
    /// being appended, or one torn by a crash (the next open cuts it).
    pub tail_bytes: u64,
}

/// A segment [`verify`] found damaged.
#[derive(Debug, PartialEq, Eq)]
pub struct DamagedSegment {
    /// The segment.
    pub path: PathBuf,
    /// Its bytes that held no intact record.
    pub bytes: u64,
    /// Whether a copy that holds the damage lies in `quarantine/` (open made it).
    pub kept_in_quarantine: bool,
}

/// Reads every record of the queue in `dir` and checks it, changing nothing:
/// it runs beside an agent that appends and sends. A segment removed
/// meanwhile (acknowledged whole, or dropped for room) is passed over.
pub fn verify(dir: &Path) -> io::Result<Verified> {
    let seqs = segment_seqs(dir)?;
    let acked = read_position(dir, ACK_FILE);
    let mut verified = Verified::default();
    let last_seq = seqs.last().copied();
    for seq in seqs {
        let path = segment_path(dir, seq);
        let scan = match scan_segment(&path) {
            Ok(scan) => scan,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let last = Some(seq) == last_seq;
        verified.segments += 1;
        if scan.torn_magic {
            // Torn while being created: nothing in it yet (open starts it over).
            continue;
        }
        verified.records += scan.record_ends.len() as u64;
        verified.pending_samples += scan
            .record_ends
            .iter()
            .filter(|&&(end, _)| {
                acked.is_none_or(|a| {
                    Position {
                        segment: seq,
                        offset: end,
                    } > a
                })
            })
            .map(|&(_, samples)| u64::from(samples))
            .sum::<u64>();
        let bytes = scan.damaged_bytes(last);
        if bytes > 0 {
            let copy = quarantine_path(dir, &path);
            let kept_in_quarantine =
                fs::metadata(copy).is_ok_and(|m| m.len() >= scan.damage_end(last));
            verified.damaged.push(DamagedSegment {
                path,
                bytes,
                kept_in_quarantine,
            });
        }
        if last {
            verified.tail_bytes = scan.tail_bytes();
        }
    }
    Ok(verified)
}

/// The next intact record and the bytes of a damaged one stepped over to
/// reach it: a record whose checksum fails is stepped over when the record
/// its length field points to is intact (the damage lay in that one record).
/// `None` at the end, or where damage leaves no next record to find.
fn next_intact_record(reader: &mut impl Read) -> io::Result<Option<(u64, IntactRecord)>> {
    Ok(match read_record(reader)? {
        Record::Intact(record) => Some((0, record)),
        Record::Damaged { bytes } => match read_record(reader)? {
            Record::Intact(record) => Some((bytes, record)),
            _ => None,
        },
        Record::End => None,
    })
}

/// Reads a segment's records ([`next_intact_record`]); the segment's intact
/// part ends where no next record can be found.
fn scan_segment(path: &Path) -> io::Result<SegmentScan> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut reader = io::BufReader::new(file);
    let mut magic = [0u8; 8];
    let read_magic = reader.read_exact(&mut magic);
    let mut scan = SegmentScan {
        valid_bytes: MAGIC.len() as u64,
        record_ends: Vec::new(),
        stepped_over_bytes: 0,
        stepped_over_end: 0,
        bad_magic: false,
        torn_magic: false,
        file_len,
    };
    if read_magic.is_err() {
        // Torn while being created: it holds nothing.
        scan.torn_magic = true;
        return Ok(scan);
    }
    if &magic != MAGIC {
        // A damaged magic alone would hide every record behind it: read on.
        scan.bad_magic = true;
    }
    while let Some((stepped_over, record)) = next_intact_record(&mut reader)? {
        scan.stepped_over_bytes += stepped_over;
        if stepped_over > 0 {
            scan.stepped_over_end = scan.valid_bytes + stepped_over;
        }
        scan.valid_bytes += stepped_over + (RECORD_HEADER_BYTES + record.payload.len()) as u64;
        scan.record_ends.push((scan.valid_bytes, record.samples));
    }
    Ok(scan)
}

/// Copies a segment to `<dir>/quarantine/`, unless a copy of the same length
/// is there already.
fn copy_to_quarantine(dir: &Path, path: &Path) -> io::Result<()> {
    let target = quarantine_path(dir, path);
    fs::create_dir_all(target.parent().expect("in quarantine/"))?;
    let len = fs::metadata(path)?.len();
    if fs::metadata(&target).is_ok_and(|m| m.len() == len) {
        return Ok(());
    }
    fs::copy(path, &target)?;
    File::open(&target)?.sync_all()
}

fn quarantine_path(dir: &Path, segment: &Path) -> PathBuf {
    dir.join("quarantine")
        .join(segment.file_name().expect("a segment has a name"))
}

fn read_ack(dir: &Path) -> Option<Position> {
    let found = read_position(dir, ACK_FILE);
    if found.is_none() && dir.join(ACK_FILE).exists() {
        tracing::warn!(dir = %dir.display(), "Remote write queue: acknowledged position unreadable; resending from the oldest segment.");
    }
    found
}

/// The position in a position file; the samples count written after it is
/// not read back (open counts the samples from the records).
fn read_position(dir: &Path, name: &str) -> Option<Position> {
    let bytes = fs::read(dir.join(name)).ok()?;
    if bytes.len() != 28 || crc32fast::hash(&bytes[..24]).to_le_bytes() != bytes[24..28] {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    Some(Position {
        segment: word(0),
        offset: word(8),
    })
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

    /// A snappy payload of `len` bytes that do not compress; seeds that
    /// differ only in their lowest bit give the same bytes.
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

    /// Cuts the file at `path` to `len` bytes, as a crash or a bad copy would.
    fn cut(path: &Path, len: u64) {
        OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    #[test]
    fn a_resend_after_its_records_were_cut_is_no_larger_than_the_request_was() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        for i in 0..4 {
            q.append(&noise(2_000, 2 * i + 1), 10, 0).unwrap();
        }
        let sent = q.read(20).unwrap().unwrap();
        assert_eq!(sent.samples, 20, "two records");
        q.mark_in_flight(&sent).unwrap();
        q.sync().unwrap();
        drop(q);
        // The segment loses its end from inside the second record on.
        let seg = segment_path(dir.path(), 0);
        let offsets = record_offsets(&fs::read(&seg).unwrap());
        cut(&seg, offsets[2] as u64 - 3);
        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 10);
        // Small records arrive where the lost ones lay.
        for n in 0..40u8 {
            q.append(&payload(n, 1), 10, 0).unwrap();
        }
        assert!(q.resending());
        let again = q.read(20).unwrap().unwrap();
        assert_eq!(again.samples, 10, "the record left of the request only");
        assert!(
            again.protobuf == raw(1, 2_000),
            "the first record's samples"
        );
        q.ack(&again).unwrap();
        assert!(!q.resending());
        assert_eq!(
            q.read(20).unwrap().unwrap().samples,
            20,
            "back to the bound"
        );
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
        cut(&seg, len - 3);

        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 2);
        assert!(report.truncated_bytes > 0);
        q.append(&payload(3, 4), 4, 3).unwrap();
        assert_eq!(drain(&mut q, 1000), [1, 1, 1, 1, 3, 3, 3, 3]);

        // A flipped bit in the last record cannot be told from a tear: it goes.
        let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        q.append(&payload(4, 4), 1, 4).unwrap();
        drop(q);
        let mut bytes = fs::read(&seg).unwrap();
        let at = bytes.len() - 2;
        bytes[at] ^= 1;
        fs::write(&seg, bytes).unwrap();
        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
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

    /// Appends `records` records of 100 samples each, about 10 KB apiece.
    fn fill(q: &mut Queue, records: u64) {
        let record = noise(10_000, 11);
        for i in 0..records {
            q.append(&record, 100, i as i64).unwrap();
        }
    }

    /// A restart with a smaller bound, while the queue holds less than it,
    /// drops nothing: the acknowledged records still in the segment that was
    /// written under the larger bound do not count against it.
    #[test]
    fn a_smaller_bound_at_restart_keeps_what_fits_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 256 << 20).unwrap();
        fill(&mut q, 500); // 5 MB in one 16 MiB segment
        while q.pending_samples() > 300 {
            let p = q.read(100).unwrap().unwrap();
            q.ack(&p).unwrap();
        }
        q.sync().unwrap();
        assert_eq!(q.pending_samples(), 300);
        drop(q);
        let (mut q, report) = Queue::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(report.pending_samples, 300);
        fill(&mut q, 1);
        assert_eq!(q.dropped_samples(), 0, "30 KB pending is under 1 MiB");
        assert_eq!(q.pending_samples(), 400);
        let mut read = 0;
        while let Some(p) = q.read(1000).unwrap() {
            read += p.samples;
            q.ack(&p).unwrap();
        }
        assert_eq!(read, 400);
    }

    /// A restart with a bound smaller than what is pending drops the oldest
    /// records down to the bound, counted, and keeps the newest.
    #[test]
    fn a_smaller_bound_at_restart_drops_only_what_exceeds_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 256 << 20).unwrap();
        fill(&mut q, 300); // 3 MB pending in one segment
        q.sync().unwrap();
        drop(q);
        let max = 1 << 20;
        let (mut q, _) = Queue::open(dir.path(), max).unwrap();
        fill(&mut q, 1);
        let dropped = q.dropped_samples();
        let kept = q.pending_samples();
        assert_eq!(dropped + kept, 301 * 100, "every sample kept or counted");
        assert!(q.held_bytes() <= max, "{}", q.held_bytes());
        let record_bytes = (RECORD_HEADER_BYTES + noise(10_000, 11).len()) as u64;
        assert!(
            q.pending_bytes() + record_bytes > max - 16,
            "no more dropped than exceeds the bound: {} pending",
            q.pending_bytes()
        );
        let mut read = 0;
        while let Some(p) = q.read(1000).unwrap() {
            read += p.samples;
            q.ack(&p).unwrap();
        }
        assert_eq!(read, kept, "what was not dropped arrives");
        drop(q);
        let (q, report) = Queue::open(dir.path(), max).unwrap();
        assert_eq!((report.pending_samples, q.pending_samples()), (0, 0));
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

    fn raw(seed: u64, len: usize) -> Vec<u8> {
        snap::raw::Decoder::new()
            .decompress_vec(&noise(len, seed))
            .unwrap()
    }

    /// Each record alone: `read(1)` never splits one and stops after it.
    fn drain_records(queue: &mut Queue) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(p) = queue.read(1).unwrap() {
            if p.samples > 0 {
                out.push(p.protobuf.clone());
            }
            queue.ack(&p).unwrap();
        }
        out
    }

    fn quarantined(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir.join("quarantine"))
            .into_iter()
            .flatten()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// Record boundaries of a pristine segment, from its documented layout.
    fn record_offsets(bytes: &[u8]) -> Vec<usize> {
        let mut offsets = vec![MAGIC.len()];
        let mut at = MAGIC.len();
        while at < bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            at += RECORD_HEADER_BYTES + len;
            offsets.push(at);
        }
        offsets
    }

    #[test]
    fn a_flipped_bit_loses_its_record_only_and_the_segment_is_kept_in_quarantine() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        for n in 0..4u8 {
            q.append(&payload(n, 3), 10, i64::from(n)).unwrap();
        }
        drop(q);
        let seg = segment_path(dir.path(), 0);
        let pristine = fs::read(&seg).unwrap();
        let offsets = record_offsets(&pristine);
        let mut bytes = pristine.clone();
        bytes[offsets[1] + RECORD_HEADER_BYTES] ^= 4;
        fs::write(&seg, &bytes).unwrap();

        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 30);
        assert_eq!(report.damaged_segments, std::slice::from_ref(&seg));
        assert_eq!(report.damaged_bytes, (offsets[2] - offsets[1]) as u64);
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(quarantined(dir.path()), ["00000000000000000000.seg"]);
        assert_eq!(
            fs::read(
                dir.path()
                    .join("quarantine")
                    .join("00000000000000000000.seg")
            )
            .unwrap(),
            bytes
        );
        assert_eq!(q.damaged_bytes(), 0, "counted when the reader meets it");
        q.append(&payload(9, 1), 1, 9).unwrap();
        // Beside the running queue, `vtax verify` still sees the damage, and
        // its copy, though the segment has grown since.
        let verified = verify(dir.path()).unwrap();
        assert_eq!(
            verified.damaged,
            [DamagedSegment {
                path: seg.clone(),
                bytes: (offsets[2] - offsets[1]) as u64,
                kept_in_quarantine: true
            }]
        );
        assert_eq!((verified.records, verified.pending_samples), (4, 31));
        // A short request is read again and again until it is due.
        for _ in 0..3 {
            q.read(1000).unwrap().unwrap();
        }
        let record_bytes = (offsets[2] - offsets[1]) as u64;
        assert_eq!(q.damaged_bytes(), record_bytes, "counted once");
        assert_eq!(
            drain_records(&mut q),
            [vec![0; 3], vec![2; 3], vec![3; 3], vec![9]],
            "the records on either side of the damage, then a new one"
        );
        assert_eq!(q.damaged_bytes(), record_bytes);
    }

    #[test]
    fn a_damaged_magic_hides_no_records_and_is_mended() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        for n in 0..3u8 {
            q.append(&payload(n, 2), 1, 0).unwrap();
        }
        drop(q);
        let seg = segment_path(dir.path(), 0);
        let mut bytes = fs::read(&seg).unwrap();
        bytes[3] = b'?';
        fs::write(&seg, &bytes).unwrap();
        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.damaged_bytes, MAGIC.len() as u64);
        assert_eq!(quarantined(dir.path()).len(), 1);
        assert_eq!(&fs::read(&seg).unwrap()[..8], MAGIC);
        assert_eq!(drain_records(&mut q), [vec![0; 2], vec![1; 2], vec![2; 2]]);
        assert_eq!(q.damaged_bytes(), MAGIC.len() as u64);
        drop(q);
        let (_, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert!(report.damaged_segments.is_empty(), "mended");
    }

    #[test]
    fn damage_after_open_moves_the_reader_to_the_next_segment() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 1 << 20).unwrap();
        let records: Vec<Vec<u8>> = (0..12).map(|i| noise(20_000, 2 * i + 1)).collect();
        for r in &records {
            q.append(r, 1, 0).unwrap();
        }
        assert!(q.segments.len() >= 3);
        let first_segment_records =
            record_offsets(&fs::read(segment_path(dir.path(), 0)).unwrap()).len() - 1;
        // The length of the first segment's second record is hit while the agent runs.
        let seg = segment_path(dir.path(), 0);
        let mut bytes = fs::read(&seg).unwrap();
        let second = record_offsets(&bytes)[1];
        bytes[second + 3] ^= 0x80;
        fs::write(&seg, &bytes).unwrap();
        let got = drain_records(&mut q);
        assert_eq!(q.damaged_bytes(), (bytes.len() - second) as u64);
        let expected: Vec<Vec<u8>> = std::iter::once(0)
            .chain(first_segment_records..12)
            .map(|i| raw(2 * i as u64 + 1, 20_000))
            .collect();
        assert_eq!(got.len(), expected.len());
        assert!(
            got == expected,
            "the first record, then the next segments' records"
        );
        assert_eq!(q.pending_samples(), 0);
    }

    #[test]
    fn records_appended_after_damage_to_the_open_segment_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
        for n in 0..3u8 {
            q.append(&payload(n, 4), 1, 0).unwrap();
        }
        let seg = segment_path(dir.path(), 0);
        let mut bytes = fs::read(&seg).unwrap();
        let second = record_offsets(&bytes)[1];
        bytes[second + 3] ^= 0x80;
        fs::write(&seg, &bytes).unwrap();
        assert_eq!(drain_records(&mut q), [vec![0; 4]]);
        q.append(&payload(7, 4), 1, 0).unwrap();
        q.sync().unwrap();
        drop(q);
        let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 1);
        assert_eq!(drain_records(&mut q), [vec![7; 4]]);
    }

    /// Damages one segment of a queue at random (flipped bytes, a run of
    /// zeros, a cut), 300 times: opening never fails or panics, every record
    /// read is one appended, in order, once; every record before the damage
    /// and in the other segments is read; a record hit alone in its payload
    /// costs only itself.
    #[test]
    fn damaged_segments_lose_only_their_damaged_records() {
        const RECORDS: u64 = 40;
        let pristine = tempfile::tempdir().unwrap();
        let (mut q, _) = Queue::open(pristine.path(), 1 << 20).unwrap();
        for i in 0..RECORDS {
            q.append(&noise(5_000, 2 * i + 1), 1, i as i64).unwrap();
        }
        // Part of the first segment is sent already.
        let sent = q.read(3).unwrap().unwrap();
        q.ack(&sent).unwrap();
        drop(q);
        let acked_records = 3;
        let mut segments: Vec<(u64, Vec<u8>)> = Vec::new();
        for seq in 0.. {
            match fs::read(segment_path(pristine.path(), seq)) {
                Ok(bytes) => segments.push((seq, bytes)),
                Err(_) => break,
            }
        }
        assert!(segments.len() >= 3, "{} segments", segments.len());
        let acked = fs::read(pristine.path().join(ACK_FILE)).unwrap();
        let raws: Vec<Vec<u8>> = (0..RECORDS).map(|i| raw(2 * i + 1, 5_000)).collect();
        let mut first_record = Vec::new();
        let mut n = 0;
        for (_, bytes) in &segments {
            first_record.push(n);
            n += record_offsets(bytes).len() - 1;
        }
        assert_eq!(n as u64, RECORDS);

        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = |below: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % below as u64) as usize
        };
        let mut lost = 0;
        for round in 0..300 {
            let dir = tempfile::tempdir().unwrap();
            for (seq, bytes) in &segments {
                fs::write(segment_path(dir.path(), *seq), bytes).unwrap();
            }
            fs::write(dir.path().join(ACK_FILE), &acked).unwrap();
            let target = random(segments.len());
            let (seq, pristine_bytes) = &segments[target];
            let mut bytes = pristine_bytes.clone();
            let len = bytes.len();
            let mut touched = Vec::new();
            match random(4) {
                0 | 1 => {
                    for _ in 0..1 + random(3) {
                        let at = random(len);
                        bytes[at] ^= 1 << random(8);
                        touched.push(at);
                    }
                }
                2 => {
                    let at = random(len);
                    let end = (at + 1 + random(200)).min(len);
                    bytes[at..end].fill(0);
                    touched.extend(at..end);
                }
                _ => {
                    let at = random(len);
                    bytes.truncate(at);
                    touched.extend(at..len);
                }
            }
            fs::write(segment_path(dir.path(), *seq), &bytes).unwrap();

            let offsets = record_offsets(pristine_bytes);
            let hit: Vec<usize> = (0..offsets.len() - 1)
                .filter(|&r| {
                    touched
                        .iter()
                        .any(|&at| (offsets[r]..offsets[r + 1]).contains(&at))
                })
                .collect();
            let first_hit = hit
                .first()
                .map_or(usize::MAX, |&r| first_record[target] + r);
            let only_payload_hit =
                hit.len() == 1 && touched.iter().all(|&at| at >= offsets[hit[0]] + 4);
            let must_have: Vec<usize> = (acked_records..RECORDS as usize)
                .filter(|&r| {
                    let in_target = (first_record[target]
                        ..first_record[target] + offsets.len() - 1)
                        .contains(&r);
                    !in_target || r < first_hit || (only_payload_hit && r != first_hit)
                })
                .collect();

            // `vtax verify` reads what open will find, and changes nothing.
            let verified =
                verify(dir.path()).unwrap_or_else(|e| panic!("round {round}: verify failed: {e}"));
            assert_eq!(
                fs::read(segment_path(dir.path(), *seq)).unwrap(),
                bytes,
                "round {round}: verify wrote"
            );
            let (mut q, report) = std::panic::catch_unwind(|| Queue::open(dir.path(), 1 << 20))
                .unwrap_or_else(|_| panic!("round {round}: open panicked"))
                .unwrap_or_else(|e| panic!("round {round}: open failed: {e}"));
            let pending = report.pending_samples;
            let verified_damage: Vec<&PathBuf> = verified.damaged.iter().map(|d| &d.path).collect();
            assert!(verified.damaged.iter().all(|d| !d.kept_in_quarantine));
            assert_eq!(
                (
                    verified_damage,
                    verified.damaged.iter().map(|d| d.bytes).sum::<u64>(),
                    verified.pending_samples,
                    verified.tail_bytes
                ),
                (
                    report.damaged_segments.iter().collect(),
                    report.damaged_bytes,
                    pending,
                    report.truncated_bytes
                ),
                "round {round}: verify and open disagree"
            );
            let got: Vec<usize> = drain_records(&mut q)
                .iter()
                .map(|r| {
                    raws.iter()
                        .position(|x| x == r)
                        .unwrap_or_else(|| panic!("round {round}: a record never appended"))
                })
                .collect();
            assert!(
                got.windows(2).all(|w| w[0] < w[1]),
                "round {round}: in order, once: {got:?}"
            );
            assert!(
                got.iter().all(|&r| r >= acked_records),
                "round {round}: nothing acknowledged again"
            );
            for r in &must_have {
                assert!(
                    got.contains(r),
                    "round {round}: record {r} lost; segment {target} hit in {hit:?}"
                );
            }
            assert_eq!(
                pending,
                got.len() as u64,
                "round {round}: pending samples as read"
            );
            let lost_here = RECORDS as usize - acked_records - got.len();
            if lost_here > 0 && target + 1 < segments.len() {
                // A cut in the last segment cannot be told from a crash's tail.
                assert!(q.damaged_bytes() > 0, "round {round}: a loss is counted");
            }
            lost += lost_here;
            drop(q);
            let (_, again) = Queue::open(dir.path(), 1 << 20).unwrap();
            assert_eq!(again.pending_samples, 0, "round {round}: all sent");
            let after = verify(dir.path()).unwrap();
            assert!(
                after.damaged.iter().all(|d| d.kept_in_quarantine),
                "round {round}: damage left after open is in quarantine: {after:?}"
            );
        }
        eprintln!(
            "300 damaged queues: {lost} of {} records lost",
            300 * (RECORDS - 3)
        );
    }
}
