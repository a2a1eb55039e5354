//! The queue's segment files: their records, a scan that steps over a torn
//! or damaged one, verification, quarantine, and the acknowledged position.

use super::*;

pub(super) fn create_segment(dir: &Path, seq: u64) -> io::Result<File> {
    let path = segment_path(dir, seq);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    file.write_all(MAGIC)?;
    Ok(file)
}

pub(super) enum Record {
    Intact(IntactRecord),
    /// A whole record whose checksum fails; `bytes` long if its length field
    /// is right, which only an intact record after it confirms.
    Damaged {
        bytes: u64,
    },
    /// The end, a torn record, or a length that cannot be a record's.
    End,
}

pub(super) fn read_record(reader: &mut impl Read) -> io::Result<Record> {
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
pub(super) struct SegmentScan {
    /// Where the last intact record ends.
    pub(super) valid_bytes: u64,
    /// Where each intact record ends, and its samples.
    pub(super) record_ends: Vec<(u64, u32)>,
    /// Bytes of damaged records stepped over (not the tail after the last
    /// intact record).
    pub(super) stepped_over_bytes: u64,
    /// Where the last record stepped over ends (0 if none).
    pub(super) stepped_over_end: u64,
    pub(super) bad_magic: bool,
    /// Shorter than the magic: torn while being created.
    pub(super) torn_magic: bool,
    pub(super) file_len: u64,
}

impl SegmentScan {
    /// Bytes after the last intact record.
    pub(super) fn tail_bytes(&self) -> u64 {
        self.file_len - self.valid_bytes
    }

    /// Damaged bytes that no read will step over: a damaged magic, and the
    /// tail of a segment before the last (a complete segment has none; the
    /// last one's is taken for a torn append).
    pub(super) fn cut_damage_bytes(&self, last: bool) -> u64 {
        self.bad_magic_bytes() + if last { 0 } else { self.tail_bytes() }
    }

    /// The magic's bytes when it is damaged (they end where they count).
    pub(super) fn bad_magic_bytes(&self) -> u64 {
        if self.bad_magic {
            MAGIC.len() as u64
        } else {
            0
        }
    }

    /// Every byte of the segment that held no intact record, but a torn tail.
    pub(super) fn damaged_bytes(&self, last: bool) -> u64 {
        self.cut_damage_bytes(last) + self.stepped_over_bytes
    }

    /// Where the last damaged byte ends: a copy at least this long holds
    /// the damage as found (segments are only appended to after it).
    pub(super) fn damage_end(&self, last: bool) -> u64 {
        let cut_end = if last { 0 } else { self.file_len };
        cut_end
            .max(self.stepped_over_end)
            .max(self.bad_magic_bytes())
    }
}

/// The sequence numbers of the segments in `dir`, in order.
pub(super) fn segment_seqs(dir: &Path) -> io::Result<Vec<u64>> {
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
pub(super) fn next_intact_record(
    reader: &mut impl Read,
) -> io::Result<Option<(u64, IntactRecord)>> {
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
pub(super) fn scan_segment(path: &Path) -> io::Result<SegmentScan> {
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
pub(super) fn copy_to_quarantine(dir: &Path, path: &Path) -> io::Result<()> {
    let target = quarantine_path(dir, path);
    fs::create_dir_all(target.parent().expect("in quarantine/"))?;
    let len = fs::metadata(path)?.len();
    if fs::metadata(&target).is_ok_and(|m| m.len() == len) {
        return Ok(());
    }
    fs::copy(path, &target)?;
    File::open(&target)?.sync_all()
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
