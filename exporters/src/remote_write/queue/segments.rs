//! The queue's segment files: its records in `vtax_store::segment_log`'s
//! framing (which steps over a torn or damaged one), verification,
//! quarantine, and the acknowledged position.

use super::*;

pub(super) fn create_segment(dir: &Path, seq: u64) -> io::Result<File> {
    let path = FORMAT.segment_path(dir, seq);
    let mut file = vtax_store::regular_file::open_or_create(
        &path,
        OpenOptions::new().create(true).truncate(true).write(true),
    )?;
    file.write_all(MAGIC)?;
    Ok(file)
}

/// Reads a segment's records from an offset on, as open found them: past
/// damage that no length field steps over, it searches for the next intact
/// record ([`Format::search_intact`]), as open's scan did.
pub(super) struct RecordReader {
    file: File,
    reader: io::BufReader<io::Take<File>>,
    offset: u64,
    end: u64,
}

impl RecordReader {
    /// Reads the segment `seq` of `dir` from `offset` to `end`.
    pub(super) fn open(dir: &Path, seq: u64, offset: u64, end: u64) -> io::Result<RecordReader> {
        let file = vtax_store::regular_file::open_read(&segment_path(dir, seq))?;
        let reader = Self::reader_at(&file, offset, end)?;
        Ok(RecordReader {
            file,
            reader,
            offset,
            end,
        })
    }

    fn reader_at(file: &File, offset: u64, end: u64) -> io::Result<io::BufReader<io::Take<File>>> {
        let mut file = file.try_clone()?;
        file.seek(SeekFrom::Start(offset))?;
        Ok(io::BufReader::new(file.take(end.saturating_sub(offset))))
    }

    /// The next intact record, and the bytes of damage stepped over to
    /// reach it. `None` at the end, or where no intact record follows.
    pub(super) fn next(&mut self) -> io::Result<Option<(u64, IntactRecord)>> {
        if self.offset >= self.end {
            return Ok(None);
        }
        let (stepped_over, frame) = match FORMAT.next_intact(&mut self.reader, self.offset)? {
            Some(found) => found,
            None => {
                let Some(frame) = FORMAT.search_intact(
                    &mut self.file,
                    self.offset,
                    self.end,
                    plausible_record,
                )?
                else {
                    self.offset = self.end;
                    return Ok(None);
                };
                let stepped_over = frame.offset - self.offset;
                self.reader = Self::reader_at(&self.file, frame.end(&FORMAT), self.end)?;
                (stepped_over, frame)
            }
        };
        self.offset += stepped_over + FORMAT.frame_bytes(frame.payload.len());
        Ok(Some((stepped_over, IntactRecord::from_frame(frame))))
    }
}

impl IntactRecord {
    fn from_frame(frame: segment_log::Frame) -> IntactRecord {
        let meta = &frame.meta;
        IntactRecord {
            samples: u32::from_le_bytes(meta[0..4].try_into().expect("4 bytes")),
            min_time_ms: i64::from_le_bytes(meta[4..12].try_into().expect("8 bytes")),
            payload: frame.payload,
        }
    }

    /// Bytes of the record on disk.
    pub(super) fn bytes(&self) -> u64 {
        FORMAT.frame_bytes(self.payload.len())
    }
}

/// What a segment holds, as [`Queue::open`] found it.
pub(super) struct SegmentScan {
    /// What the shared framing found.
    pub(super) log: segment_log::SegmentScan,
    /// Where each intact record ends, and its samples.
    pub(super) record_ends: Vec<(u64, u32)>,
}

/// The sequence numbers of the segments in `dir`, in order.
pub(super) fn segment_seqs(dir: &Path) -> io::Result<Vec<u64>> {
    Ok(FORMAT
        .list_segments(dir)?
        .into_iter()
        .map(|(seq, _)| seq)
        .collect())
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
        if scan.log.torn_magic {
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
        let bytes = scan.log.damaged_bytes(last);
        if bytes > 0 {
            let copy = quarantine_path(dir, &path);
            let kept_in_quarantine =
                fs::metadata(copy).is_ok_and(|m| m.len() >= scan.log.damage_end(last));
            verified.damaged.push(DamagedSegment {
                path,
                bytes,
                kept_in_quarantine,
            });
        }
        if last {
            verified.tail_bytes = scan.log.tail_bytes();
        }
    }
    Ok(verified)
}

/// Whether a frame's body can be a record this queue wrote: at least one
/// sample, and an oldest time (milliseconds) from 1970 to about 2248. The
/// bytes past a damage rarely pass, so the search past it checksums little.
pub(super) fn plausible_record(body: &[u8]) -> bool {
    let (Some(samples), Some(min_time_ms)) = (body.get(0..4), body.get(4..12)) else {
        return false;
    };
    let samples = u32::from_le_bytes(samples.try_into().expect("4 bytes"));
    let min_time_ms = i64::from_le_bytes(min_time_ms.try_into().expect("8 bytes"));
    samples > 0 && (0..1 << 43).contains(&min_time_ms)
}

/// Reads a segment's records, searching past damage for the next intact
/// one: a zeroed block in the middle of a segment loses only the records it
/// held. The segment's intact part ends at its last intact record.
pub(super) fn scan_segment(path: &Path) -> io::Result<SegmentScan> {
    let file = vtax_store::regular_file::open_read(path)?;
    let file_len = file.metadata()?.len();
    let mut record_ends = Vec::new();
    let log = FORMAT
        .scan_resync(
            file,
            file_len,
            plausible_record,
            |frame| -> Result<(), io::Error> {
                let end = frame.end(&FORMAT);
                record_ends.push((end, IntactRecord::from_frame(frame).samples));
                Ok(())
            },
        )
        .map_err(|e| match e {
            segment_log::ScanError::Read(e) | segment_log::ScanError::Stopped(e) => e,
        })?;
    Ok(SegmentScan { log, record_ends })
}

/// Copies a segment to `<dir>/quarantine/`, unless a copy of the same length
/// is there already.
pub(super) fn copy_to_quarantine(dir: &Path, path: &Path) -> io::Result<()> {
    segment_log::copy_to_quarantine(path, dir, &quarantine_path(dir, path)).map(|_| ())
}

pub(super) fn read_ack(dir: &Path) -> Option<Position> {
    let found = read_position(dir, ACK_FILE);
    if found.is_none() && dir.join(ACK_FILE).exists() {
        tracing::warn!(dir = %dir.display(), "Remote write queue: acknowledged position unreadable; resending from the oldest segment.");
    }
    found
}

/// The position in a position file; the samples count written after it is
/// not read back (open counts the samples from the records).
pub(super) fn read_position(dir: &Path, name: &str) -> Option<Position> {
    let bytes = vtax_store::regular_file::read(&dir.join(name)).ok()?;
    if bytes.len() != 28 || crc32fast::hash(&bytes[..24]).to_le_bytes() != bytes[24..28] {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    Some(Position {
        segment: word(0),
        offset: word(8),
    })
}

pub(super) fn write_position(
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
    let mut file = vtax_store::regular_file::create_fresh(&tmp)?;
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
