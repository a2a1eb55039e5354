//! Segment logs: the on-disk framing that the WAL and remote write's queue
//! share, with what reading it back after a crash or damage needs.
//!
//! A log is a directory of segments `<seq>.<extension>` (20 decimal digits).
//! A segment is an 8-byte magic, then frames
//! `[payload_len: u32 LE][crc32: u32 LE][meta][payload]`, where `meta` is a
//! fixed number of bytes each log chooses (none for the WAL; the samples and
//! oldest time of a request for the queue) and the CRC covers `meta` and
//! `payload`. A frame with a zero length or one above the log's bound is not a
//! frame: a file extended before its data landed ends in zeros.
//!
//! Reading a segment ([`Format::scan`]) keeps every intact frame:
//! - a **torn tail** (a crash mid-append) is what follows the last intact
//!   frame; the writer of the last segment cuts it off;
//! - a frame whose checksum fails is **stepped over** when its length field
//!   leads to an intact frame: the damage lay in that one frame. A length that
//!   leads elsewhere cannot be told from garbage: [`Format::scan`] gives up
//!   the rest of the segment (not the next segments), and
//!   [`Format::scan_resync`], which the WAL and the queue read with,
//!   searches the bytes after it for the next intact frame and reads on from
//!   there ([`Format::search_intact`] for a reader that meets it later);
//! - a **damaged magic** alone would hide every frame behind it: the frames
//!   are read on;
//! - a segment shorter than the magic and a prefix of it was **torn while
//!   being created**, and holds nothing.
//!
//! Damaged segments are copied to quarantine ([`copy_to_quarantine`]) for
//! whoever looks into them, while the log goes on reading their intact frames.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Bytes of a frame's length and checksum.
pub const FRAME_HEADER_BYTES: usize = 8;

/// What one log's segments look like.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    /// The first 8 bytes of every segment.
    pub magic: &'static [u8; 8],
    /// The segment files' extension, without the dot.
    pub extension: &'static str,
    /// Bytes of each frame's meta, between its header and its payload.
    pub meta_bytes: usize,
    /// A longer payload is damage, not data.
    pub max_payload_bytes: usize,
}

/// One intact frame, as read back.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    /// Where the frame starts in its segment.
    pub offset: u64,
    /// Its [`Format::meta_bytes`] of meta.
    pub meta: Vec<u8>,
    /// Its payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// Where the frame ends in its segment.
    pub fn end(&self, format: &Format) -> u64 {
        self.offset + format.frame_bytes(self.payload.len())
    }
}

/// What [`Format::read_frame`] found at the reader's position.
enum Read1 {
    Intact {
        meta: Vec<u8>,
        payload: Vec<u8>,
    },
    /// A whole frame whose checksum fails; `bytes` long if its length field
    /// is right, which only an intact frame after it confirms.
    Damaged {
        bytes: u64,
    },
    /// The end, a torn frame, or a length that cannot be a frame's.
    End,
}

/// What [`Format::scan`] found in a segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentScan {
    /// Intact frames read.
    pub frames: u64,
    /// Where the last intact frame ends (the magic's end when none is).
    pub valid_bytes: u64,
    /// Bytes of damaged frames stepped over (not the tail after the last
    /// intact frame).
    pub stepped_over_bytes: u64,
    /// Where the last frame stepped over ends (0 if none).
    pub stepped_over_end: u64,
    /// The magic is not the log's.
    pub bad_magic: bool,
    /// Shorter than the magic and a prefix of it: torn while being created.
    pub torn_magic: bool,
    /// The segment's length as read.
    pub file_len: u64,
    /// The log's magic's length, so that the damage it counts needs no
    /// [`Format`] beside it.
    pub magic_bytes: u64,
    /// Bytes checksummed searching past damage ([`Format::scan_resync`]).
    pub search_checksum_bytes: u64,
}

impl SegmentScan {
    /// Bytes after the last intact frame: a torn tail in the last segment,
    /// damage in any other (a segment was complete when the next began).
    pub fn tail_bytes(&self) -> u64 {
        self.file_len.saturating_sub(self.valid_bytes)
    }

    /// The magic's bytes when it is damaged.
    pub fn bad_magic_bytes(&self) -> u64 {
        if self.bad_magic {
            self.magic_bytes.min(self.file_len)
        } else {
            0
        }
    }

    /// Damaged bytes that no read steps over: a damaged magic, and the tail
    /// of a segment before the last.
    pub fn cut_damage_bytes(&self, last: bool) -> u64 {
        self.bad_magic_bytes() + if last { 0 } else { self.tail_bytes() }
    }

    /// Every byte of the segment that held no intact frame, but a torn tail
    /// of the last segment.
    pub fn damaged_bytes(&self, last: bool) -> u64 {
        self.cut_damage_bytes(last) + self.stepped_over_bytes
    }

    /// Where the last damaged byte ends: a copy at least this long holds the
    /// damage as found (segments are only appended to after it).
    pub fn damage_end(&self, last: bool) -> u64 {
        let cut_end = if last { 0 } else { self.file_len };
        cut_end
            .max(self.stepped_over_end)
            .max(self.bad_magic_bytes())
    }
}

impl Format {
    /// The path of segment `seq` in `dir`.
    pub fn segment_path(&self, dir: &Path, seq: u64) -> PathBuf {
        dir.join(format!("{seq:020}.{}", self.extension))
    }

    /// The segments in `dir` with their sequence numbers, in order; none
    /// when `dir` does not exist.
    pub fn list_segments(&self, dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut segments = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(stem) = name
                .to_str()
                .and_then(|n| n.strip_suffix(self.extension)?.strip_suffix('.'))
            else {
                continue;
            };
            let Ok(seq) = stem.parse::<u64>() else {
                continue;
            };
            // A directory or a FIFO under a segment's name holds no frames,
            // and its open would fail or wait: no segment, and no reason for
            // the whole log to refuse to open. A symbolic link is not
            // followed either: cutting a torn tail or writing the magic
            // through it truncated whatever file it named, as root.
            if !fs::symlink_metadata(entry.path()).is_ok_and(|m| m.is_file()) {
                // The log is listed at every open, replay and truncation: one
                // line a minute for each such entry, not one a listing.
                static NOT_REGULAR: std::sync::Mutex<Option<crate::log_limit::Repeats>> =
                    std::sync::Mutex::new(None);
                let path = entry.path();
                let mut repeats = NOT_REGULAR.lock().unwrap_or_else(|e| e.into_inner());
                let repeats = repeats.get_or_insert_with(Default::default);
                if let Some(not_logged) = repeats.occurred(&path.to_string_lossy()) {
                    tracing::warn!(path = %path.display(), not_logged, "Not a regular file under a log segment's name: left where it is and out of the log.");
                }
                continue;
            }
            segments.push((seq, entry.path()));
        }
        segments.sort();
        Ok(segments)
    }

    /// Bytes of a frame whose payload is `payload_len` long.
    pub fn frame_bytes(&self, payload_len: usize) -> u64 {
        (FRAME_HEADER_BYTES + self.meta_bytes + payload_len) as u64
    }

    /// Appends a frame to `out`: `write` appends its meta (exactly
    /// [`Self::meta_bytes`]) and then its payload; the header is filled in
    /// after, so the payload is encoded in place, not copied.
    pub fn append_frame(&self, out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
        write(out);
        let body = &out[start + FRAME_HEADER_BYTES..];
        let payload_len = body
            .len()
            .checked_sub(self.meta_bytes)
            .expect("a frame holds its meta");
        assert!(
            payload_len > 0 && payload_len <= self.max_payload_bytes,
            "a payload of {payload_len} bytes is outside what the log reads back"
        );
        let crc = crc32fast::hash(body);
        out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Of `frames` (whole frames of this format, back to back), the bytes and
    /// the count of those lying whole within their first `landed` bytes: what
    /// a write that stopped partway left intact.
    pub fn whole_frames(&self, frames: &[u8], landed: usize) -> (usize, u64) {
        let (mut end, mut count) = (0, 0);
        while let Some(header) = frames.get(end..end + FRAME_HEADER_BYTES) {
            let payload_len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
            let next = end + self.frame_bytes(payload_len) as usize;
            if next > landed {
                break;
            }
            (end, count) = (next, count + 1);
        }
        (end, count)
    }

    /// Reads the frame at the reader's position.
    fn read_frame(&self, reader: &mut impl Read) -> io::Result<Read1> {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        if !read_whole(reader, &mut header)? {
            return Ok(Read1::End);
        }
        let payload_len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        if payload_len == 0 || payload_len > self.max_payload_bytes {
            return Ok(Read1::End);
        }
        let mut meta = vec![0; self.meta_bytes];
        let mut payload = vec![0; payload_len];
        if !read_whole(reader, &mut meta)? || !read_whole(reader, &mut payload)? {
            return Ok(Read1::End);
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&meta);
        hasher.update(&payload);
        if hasher.finalize() != crc {
            return Ok(Read1::Damaged {
                bytes: self.frame_bytes(payload_len),
            });
        }
        Ok(Read1::Intact { meta, payload })
    }

    /// The next intact frame from the reader's position, which is `offset`
    /// in its segment, and the bytes of a damaged frame stepped over to reach
    /// it. `None` at the end, or where damage leaves no next frame to find.
    pub fn next_intact(
        &self,
        reader: &mut impl Read,
        offset: u64,
    ) -> io::Result<Option<(u64, Frame)>> {
        let (stepped_over, read) = match self.read_frame(reader)? {
            Read1::Damaged { bytes } => (bytes, self.read_frame(reader)?),
            read => (0, read),
        };
        Ok(match read {
            Read1::Intact { meta, payload } => Some((
                stepped_over,
                Frame {
                    offset: offset + stepped_over,
                    meta,
                    payload,
                },
            )),
            _ => None,
        })
    }

    /// Reads a segment from its start, calling `on_frame` for each intact
    /// frame in order; `file_len` is the segment's length. An error of
    /// `on_frame` stops the scan.
    pub fn scan<E>(
        &self,
        reader: impl Read,
        file_len: u64,
        mut on_frame: impl FnMut(Frame) -> Result<(), E>,
    ) -> Result<SegmentScan, ScanError<E>> {
        let mut reader = io::BufReader::new(reader);
        let magic_len = self.magic.len();
        let mut scan = SegmentScan {
            valid_bytes: magic_len as u64,
            file_len,
            magic_bytes: magic_len as u64,
            ..SegmentScan::default()
        };
        let mut magic = [0u8; 8];
        let got = read_up_to(&mut reader, &mut magic).map_err(ScanError::Read)?;
        if got < magic_len && self.magic.starts_with(&magic[..got]) {
            scan.torn_magic = true;
            scan.valid_bytes = got as u64;
            return Ok(scan);
        }
        if magic != *self.magic {
            scan.bad_magic = true;
        }
        if got < magic_len {
            scan.valid_bytes = got as u64;
            return Ok(scan);
        }
        while let Some((stepped_over, frame)) = self
            .next_intact(&mut reader, scan.valid_bytes)
            .map_err(ScanError::Read)?
        {
            if stepped_over > 0 {
                scan.stepped_over_bytes += stepped_over;
                scan.stepped_over_end = frame.offset;
            }
            scan.valid_bytes = frame.end(self);
            scan.frames += 1;
            on_frame(frame).map_err(ScanError::Stopped)?;
        }
        Ok(scan)
    }

    /// [`Self::scan`], and past the first damage that gives no next frame
    /// (a zeroed block, a length field hit), the rest of the segment is read
    /// once (at most [`MAX_RESYNC_BYTES`]) and searched for the next intact
    /// frame, read on from there: the damage is stepped over. Only what no
    /// intact frame follows is left as the tail. Without the search, a
    /// damaged block in the middle of the last segment read as a torn tail,
    /// and the writer cut off every intact frame after it.
    ///
    /// A candidate's checksum is computed only where `plausible` holds for
    /// its body, meta then payload (the WAL's sequence number and hour, the
    /// queue's samples and oldest time): inside
    /// real rows a timestamp's upper half reads as a length that fits, and
    /// a checksum over it at every such byte made a damaged segment take
    /// tens of seconds to open.
    pub fn scan_resync<R: Read + Seek, E>(
        &self,
        mut reader: R,
        file_len: u64,
        plausible: impl Fn(&[u8]) -> bool,
        mut on_frame: impl FnMut(Frame) -> Result<(), E>,
    ) -> Result<SegmentScan, ScanError<E>> {
        let mut scan = self.scan(&mut reader, file_len, &mut on_frame)?;
        if scan.torn_magic || scan.tail_bytes() == 0 {
            return Ok(scan);
        }
        let from = scan.valid_bytes;
        let len = (file_len - from).min(MAX_RESYNC_BYTES);
        reader
            .seek(SeekFrom::Start(from))
            .map_err(ScanError::Read)?;
        let mut rest = Vec::with_capacity(len as usize);
        (&mut reader)
            .take(len)
            .read_to_end(&mut rest)
            .map_err(ScanError::Read)?;
        // Where the bytes read so far end, relative to `from`.
        let mut at = 0;
        loop {
            let checksums = std::cell::Cell::new(0);
            let counted = |body: &[u8]| {
                let yes = plausible(body);
                if yes {
                    checksums.set(checksums.get() + body.len() as u64);
                }
                yes
            };
            let next = self.find_intact(&rest, at, &counted);
            scan.search_checksum_bytes += checksums.get();
            let Some((start, end)) = next else {
                break;
            };
            if start > at {
                scan.stepped_over_bytes += (start - at) as u64;
                scan.stepped_over_end = from + start as u64;
            }
            let meta_end = start + FRAME_HEADER_BYTES + self.meta_bytes;
            let frame = Frame {
                offset: from + start as u64,
                meta: rest[start + FRAME_HEADER_BYTES..meta_end].to_vec(),
                payload: rest[meta_end..end].to_vec(),
            };
            scan.valid_bytes = from + end as u64;
            scan.frames += 1;
            on_frame(frame).map_err(ScanError::Stopped)?;
            at = end;
        }
        Ok(scan)
    }

    /// Where the first intact frame at or after `at` of `bytes` starts and
    /// ends: the frame at `at` whatever it holds, past it only one whose
    /// body is `plausible`.
    fn find_intact(
        &self,
        bytes: &[u8],
        at: usize,
        plausible: &dyn Fn(&[u8]) -> bool,
    ) -> Option<(usize, usize)> {
        match self.intact_frame_at(bytes, at, &|_| true) {
            Some((end, _)) => Some((at, end)),
            None => (at + 1..bytes.len()).find_map(|candidate| {
                self.intact_frame_at(bytes, candidate, plausible)
                    .map(|(end, _)| (candidate, end))
            }),
        }
    }

    /// The first intact frame from `from` of a segment on, before `end`,
    /// searched for past damage as [`Self::scan_resync`] does (at most
    /// [`MAX_RESYNC_BYTES`] read): for a reader that met damage it cannot
    /// step over ([`Self::next_intact`] gave none before `end`) where the
    /// scan at open found intact frames beyond. Leaves `reader` anywhere.
    pub fn search_intact<R: Read + Seek>(
        &self,
        reader: &mut R,
        from: u64,
        end: u64,
        plausible: impl Fn(&[u8]) -> bool,
    ) -> io::Result<Option<Frame>> {
        reader.seek(SeekFrom::Start(from))?;
        let mut rest = Vec::new();
        reader
            .take(end.saturating_sub(from).min(MAX_RESYNC_BYTES))
            .read_to_end(&mut rest)?;
        Ok(self.find_intact(&rest, 0, &plausible).map(|(start, stop)| {
            let meta_end = start + FRAME_HEADER_BYTES + self.meta_bytes;
            Frame {
                offset: from + start as u64,
                meta: rest[start + FRAME_HEADER_BYTES..meta_end].to_vec(),
                payload: rest[meta_end..stop].to_vec(),
            }
        }))
    }

    /// The intact frame starting at `at` of `bytes`, if one lies whole
    /// there and its body (meta, then payload) is `plausible`: where it
    /// ends, and its payload. The checksum, the costly part, comes last.
    fn intact_frame_at<'a>(
        &self,
        bytes: &'a [u8],
        at: usize,
        plausible: &dyn Fn(&[u8]) -> bool,
    ) -> Option<(usize, &'a [u8])> {
        let header = bytes.get(at..at + FRAME_HEADER_BYTES)?;
        let payload_len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        if payload_len == 0 || payload_len > self.max_payload_bytes {
            return None;
        }
        let body_start = at + FRAME_HEADER_BYTES;
        let end = body_start + self.meta_bytes + payload_len;
        let body = bytes.get(body_start..end)?;
        let payload = &body[self.meta_bytes..];
        if !plausible(body) {
            return None;
        }
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        (crc32fast::hash(body) == crc).then_some((end, payload))
    }
}

/// Most bytes after a damage searched for the next intact frame: a WAL
/// segment's size. A search holds them in memory, once, when a log is read
/// at open and found damaged.
pub const MAX_RESYNC_BYTES: u64 = 64 << 20;

/// Why [`Format::scan`] ended before the segment did.
#[derive(Debug)]
pub enum ScanError<E> {
    /// Reading the segment failed.
    Read(io::Error),
    /// `on_frame` returned this.
    Stopped(E),
}

/// Fills `buf`; false if the reader ended first.
fn read_whole(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    match reader.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads into `buf` until it is full or the reader ends; the bytes read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Copies a damaged segment to `target` (below `base`, the store's or the
/// queue's directory, through no link: `regular_file::create_dirs_below`),
/// unless a copy as long as the segment is there already (its damage was
/// kept at an earlier start); whether it copied. The copy is written beside `target` and renamed into
/// place, then its directory fsynced, so a crash leaves either no copy or a
/// whole one.
pub fn copy_to_quarantine(segment: &Path, base: &Path, target: &Path) -> io::Result<bool> {
    use crate::regular_file::{
        c_name, create_new_at, open_dirs_below, remove_at, rename_at, stat_at,
    };
    let len = fs::metadata(segment)?.len();
    let parent = target.parent().expect("a quarantine path has a parent");
    let name = target.file_name().expect("a quarantine path has a name");
    // Made and written through one descriptor of the quarantine directory,
    // opened from `base` without following a link.
    let dir = open_dirs_below(base, parent, true)?;
    let target_name = c_name(name)?;
    let is_whole_copy = |stat: libc::stat| {
        stat.st_mode & libc::S_IFMT == libc::S_IFREG && stat.st_size as u64 == len
    };
    if stat_at(&dir, &target_name).is_ok_and(is_whole_copy) {
        return Ok(false);
    }
    let partial = c_name(Path::new(name).with_extension("copying").as_os_str())?;
    // Whatever an interrupted copy, or anyone, left under the partial name
    // goes first: a FIFO there made the copy's open wait for a reader, and
    // the agent's start with it.
    match remove_at(&dir, &partial) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut from = crate::regular_file::open_read(segment)?;
    let mut to = create_new_at(&dir, &partial)?;
    io::copy(&mut from, &mut to)?;
    to.sync_all()?;
    rename_at(&dir, &partial, &dir, &target_name)?;
    dir.sync_all()?;
    Ok(true)
}

#[cfg(test)]
mod tests;
