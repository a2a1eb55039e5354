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

use vtax_store::segment_log::{self, Format};

mod segments;

pub use segments::*;

#[cfg(test)]
mod tests;

/// The queue's framing: each record's meta is its samples (u32) and its
/// oldest sample's time (i64, ms); a payload longer than 256 MiB is
/// corruption, not data.
const FORMAT: Format = Format {
    magic: b"VTAXRWQ\x01",
    extension: "seg",
    meta_bytes: 12,
    max_payload_bytes: 256 << 20,
};
const MAGIC: &[u8; 8] = FORMAT.magic;
/// A record's bytes before its payload: the frame header and the meta.
#[cfg(test)]
const RECORD_HEADER_BYTES: usize = segment_log::FRAME_HEADER_BYTES + 12;
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
    /// The end of the request the sender holds (read, marked in flight, not
    /// yet acknowledged) and the samples of its segment before that end.
    /// It starts at `acked`. The sender sends it from memory and counts it
    /// sent or refused; a drop of its records while it is held does not
    /// count them again.
    held: Option<(Position, u64)>,
    total_bytes: u64,
    unsynced: bool,
    new_segment_unsynced: bool,
    dropped_samples: u64,
    /// Bytes found damaged: what open cut or mended, and what reads met since.
    damaged_bytes: u64,
    /// Damage before this position is counted in `damaged_bytes` already.
    damage_counted_until: Position,
    /// The drops of a full queue, logged at most once a minute: a small
    /// queue behind a receiver that is down drops a segment every few
    /// seconds (`samples_dropped_queue_full` counts every one).
    drop_log: vtax_store::log_limit::Repeats,
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    FORMAT.segment_path(dir, seq)
}

impl Queue {
    /// Opens (or creates) the queue in `dir`, cutting torn tails, resuming
    /// from the persisted acknowledged position.
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<(Queue, OpenReport)> {
        vtax_store::regular_file::create_dirs(dir)?;
        let seqs = segment_seqs(dir)?;
        let mut report = OpenReport::default();
        let mut segments = VecDeque::new();
        let mut record_ends = Vec::new();
        let mut cut_damage = 0;
        let last_seq = seqs.last().copied();
        for seq in seqs {
            let path = segment_path(dir, seq);
            let mut scan = scan_segment(&path)?;
            if scan.log.torn_magic {
                // Torn while being created: start it over.
                let mut file =
                    vtax_store::regular_file::open(&path, OpenOptions::new().write(true))?;
                file.set_len(0)?;
                file.write_all(MAGIC)?;
                scan.log.file_len = MAGIC.len() as u64;
                scan.log.valid_bytes = MAGIC.len() as u64;
            }
            let tail = scan.log.tail_bytes();
            let torn = Some(seq) == last_seq;
            let cut_bytes = scan.log.cut_damage_bytes(torn);
            // Records stepped over stay in the segment and count when read.
            cut_damage += cut_bytes;
            let damaged_bytes = scan.log.damaged_bytes(torn);
            if damaged_bytes > 0 {
                // Kept as found before anything is cut or mended. A copy that
                // cannot be made (something in the way under quarantine/, a
                // full disk) costs the copy, not the queue: failing here
                // stopped the agent's start, as the store's WAL does not.
                match copy_to_quarantine(dir, &path) {
                    Ok(()) => {
                        tracing::error!(path = %path.display(), damaged_bytes, "Remote write queue: a segment is damaged; every intact record is still sent, the damaged ones are lost. Copied it to quarantine.")
                    }
                    Err(e) => {
                        tracing::error!(path = %path.display(), damaged_bytes, error = %e, "Remote write queue: a segment is damaged; every intact record is still sent, the damaged ones are lost. It could not be copied to quarantine.")
                    }
                }
                report.damaged_bytes += damaged_bytes;
                report.damaged_segments.push(path.clone());
            }
            if scan.log.bad_magic {
                let mut file =
                    vtax_store::regular_file::open(&path, OpenOptions::new().write(true))?;
                file.write_all(MAGIC)?;
                // Shorter than the magic, it holds the magic alone now.
                scan.log.valid_bytes = scan.log.valid_bytes.max(MAGIC.len() as u64);
                scan.log.file_len = scan.log.file_len.max(MAGIC.len() as u64);
            }
            if tail > 0 {
                if torn {
                    tracing::warn!(path = %path.display(), valid_bytes = scan.log.valid_bytes, cut_bytes = tail, "Remote write queue: cut a torn tail.");
                    report.truncated_bytes += tail;
                }
                vtax_store::regular_file::open(&path, OpenOptions::new().write(true))?
                    .set_len(scan.log.valid_bytes)?;
            }
            segments.push_back(Segment {
                seq,
                bytes: scan.log.valid_bytes,
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
                let file = vtax_store::regular_file::open(
                    &segment_path(dir, last.seq),
                    OpenOptions::new().append(true),
                )?;
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
                held: None,
                acked,
                acked_samples_in_segment: acked_samples,
                total_bytes,
                unsynced: false,
                new_segment_unsynced: false,
                dropped_samples: 0,
                damaged_bytes: cut_damage,
                damage_counted_until: acked,
                drop_log: vtax_store::log_limit::Repeats::default(),
            },
            report,
        ))
    }

    /// Appends one record. When the queue would outgrow its bound, the oldest
    /// segments go first (counted in [`Queue::dropped_samples`]).
    pub fn append(&mut self, payload: &[u8], samples: u32, min_time_ms: i64) -> io::Result<()> {
        let record_bytes = FORMAT.frame_bytes(payload.len());
        let current = self.segments.back().expect("one segment is always open");
        if current.bytes + record_bytes > self.segment_bytes && current.bytes > MAGIC.len() as u64
            || self.held_bytes() + record_bytes > self.max_bytes && self.segments.len() == 1
        {
            self.rotate()?;
        }
        self.make_room(record_bytes)?;
        let mut record = Vec::with_capacity(record_bytes as usize);
        FORMAT.append_frame(&mut record, |out| {
            out.extend_from_slice(&samples.to_le_bytes());
            out.extend_from_slice(&min_time_ms.to_le_bytes());
            out.extend_from_slice(payload);
        });
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
        let mut reader = RecordReader::open(&self.dir, seq, start, end)?;
        let (mut offset, mut stepped, mut lost) = (start, 0u64, 0u64);
        while offset - start < bytes && offset < end {
            let Some((stepped_over, record)) = reader.next()? else {
                self.drop_oldest();
                return Ok(());
            };
            offset += stepped_over + record.bytes();
            stepped += u64::from(record.samples);
            let record_end = Position {
                segment: seq,
                offset,
            };
            if self.held.is_none_or(|(held_end, _)| record_end > held_end) {
                lost += u64::from(record.samples);
            }
        }
        self.acked.offset = offset;
        self.acked_samples_in_segment += stepped;
        self.dropped_samples += lost;
        if self.in_flight.is_some_and(|end| end <= self.acked) {
            self.in_flight = None;
            self.resending = false;
        }
        write_ack(&self.dir, self.acked, self.acked_samples_in_segment)?;
        if let Some(not_logged) = self.drop_log.occurred("full") {
            tracing::warn!(
                dir = %self.dir.display(),
                dropped_samples = lost,
                drops_not_logged = not_logged,
                "Remote write queue full: dropped its oldest records."
            );
        }
        Ok(())
    }

    fn drop_oldest(&mut self) {
        let oldest = self.segments.pop_front().expect("more than one segment");
        let mut lost = if oldest.seq == self.acked.segment {
            oldest.samples - self.acked_samples_in_segment
        } else {
            oldest.samples
        };
        // The held request starts at `acked`: what of it lies in this
        // segment goes from the sender's memory, not from here.
        if let Some((held_end, held_end_samples)) = self.held {
            if oldest.seq == self.acked.segment {
                let held_here = match held_end.segment.cmp(&oldest.seq) {
                    std::cmp::Ordering::Greater => oldest.samples,
                    std::cmp::Ordering::Equal => held_end_samples,
                    std::cmp::Ordering::Less => self.acked_samples_in_segment,
                } - self.acked_samples_in_segment;
                lost -= held_here.min(lost);
            }
        }
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
        if let Some(not_logged) = self.drop_log.occurred("full") {
            tracing::warn!(
                dir = %self.dir.display(),
                dropped_samples = lost,
                drops_not_logged = not_logged,
                "Remote write queue full: dropped its oldest segment."
            );
        }
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
            let mut reader =
                RecordReader::open(&self.dir, segment.seq, position.offset, segment.bytes)?;
            while position.offset < segment.bytes {
                let Some((stepped_over, record)) = reader.next()? else {
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
                let record_bytes = record.bytes();
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
        self.held = None;
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
        self.held = Some((pending.end, pending.end_samples_in_segment));
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

struct IntactRecord {
    samples: u32,
    min_time_ms: i64,
    payload: Vec<u8>,
}

fn quarantine_path(dir: &Path, segment: &Path) -> PathBuf {
    dir.join("quarantine")
        .join(segment.file_name().expect("a segment has a name"))
}

fn write_ack(dir: &Path, position: Position, samples: u64) -> io::Result<()> {
    // A rename without fsync: after a power cut the previous position comes
    // back with the in-flight mark of the request after it, and that request
    // is sent again whole.
    write_position(dir, ACK_FILE, position, samples, false)
}
