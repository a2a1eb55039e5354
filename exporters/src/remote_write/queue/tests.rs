//! Tests of the module.

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

/// A queue in `dir` of four records of 10 samples, one segment, with a bit
/// of the second record's payload flipped: the segment, its bytes, and its
/// records' offsets.
fn four_records_the_second_damaged(dir: &Path) -> (PathBuf, Vec<u8>, Vec<usize>) {
    let (mut q, _) = Queue::open(dir, 1 << 30).unwrap();
    for n in 0..4u8 {
        q.append(&payload(n, 3), 10, i64::from(n)).unwrap();
    }
    drop(q);
    let seg = segment_path(dir, 0);
    let mut bytes = fs::read(&seg).unwrap();
    let offsets = record_offsets(&bytes);
    bytes[offsets[1] + RECORD_HEADER_BYTES] ^= 4;
    fs::write(&seg, &bytes).unwrap();
    (seg, bytes, offsets)
}

/// A damaged segment whose copy cannot be made (a file where `quarantine/`
/// goes, a link there) costs the copy: the queue opens and sends every
/// intact record. It stopped the agent's start.
#[test]
fn a_damaged_segment_that_cannot_be_copied_does_not_stop_the_queue() {
    for in_the_way in ["file", "link"] {
        let dir = tempfile::tempdir().unwrap();
        let (seg, _, _) = four_records_the_second_damaged(dir.path());
        let elsewhere = tempfile::tempdir().unwrap();
        match in_the_way {
            "file" => fs::write(dir.path().join("quarantine"), "in the way").unwrap(),
            _ => {
                std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("quarantine")).unwrap()
            }
        }
        let (_q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
        assert_eq!(report.pending_samples, 30, "{in_the_way}");
        assert_eq!(report.damaged_segments, std::slice::from_ref(&seg));
        assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}

#[test]
fn a_flipped_bit_loses_its_record_only_and_the_segment_is_kept_in_quarantine() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, bytes, offsets) = four_records_the_second_damaged(dir.path());

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

/// Damage the reader meets while the agent runs, in a length field that
/// leads nowhere, costs the record it hit: the reader searches past it for
/// the next intact record, as open's scan does, rather than give up the rest
/// of the segment.
#[test]
fn damage_after_open_costs_only_the_record_it_hit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut q, _) = Queue::open(dir.path(), 1 << 20).unwrap();
    let records: Vec<Vec<u8>> = (0..12).map(|i| noise(20_000, 2 * i + 1)).collect();
    for r in &records {
        q.append(r, 1, 0).unwrap();
    }
    assert!(q.segments.len() >= 3);
    // The length of the first segment's second record is hit while the agent runs.
    let seg = segment_path(dir.path(), 0);
    let mut bytes = fs::read(&seg).unwrap();
    let offsets = record_offsets(&bytes);
    bytes[offsets[1] + 3] ^= 0x80;
    fs::write(&seg, &bytes).unwrap();
    let got = drain_records(&mut q);
    assert_eq!(q.damaged_bytes(), (offsets[2] - offsets[1]) as u64);
    let expected: Vec<Vec<u8>> = (0..12u64)
        .filter(|&i| i != 1)
        .map(|i| raw(2 * i + 1, 20_000))
        .collect();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "every record but the one hit, in order");
    assert_eq!(q.pending_samples(), 0);
}

/// A block zeroed in the middle of the segment being written loses the
/// records it held, not those after it: neither the reader nor the next
/// open cuts them as a torn tail, and records appended since survive a
/// restart.
#[test]
fn records_after_a_zeroed_block_of_the_open_segment_are_sent() {
    const TIME_MS: i64 = 1_763_683_200_000;
    let dir = tempfile::tempdir().unwrap();
    let (mut q, _) = Queue::open(dir.path(), 1 << 30).unwrap();
    for i in 0..6u64 {
        q.append(&noise(4_000, 2 * i + 1), 1, TIME_MS).unwrap();
    }
    let seg = segment_path(dir.path(), 0);
    let mut bytes = fs::read(&seg).unwrap();
    let offsets = record_offsets(&bytes);
    // From inside the second record's payload to inside the third's.
    bytes[offsets[1] + 100..offsets[2] + 2_000].fill(0);
    fs::write(&seg, &bytes).unwrap();
    let survivors: Vec<Vec<u8>> = [0u64, 3, 4, 5]
        .iter()
        .map(|i| raw(2 * i + 1, 4_000))
        .collect();
    assert_eq!(drain_records(&mut q), survivors);
    assert_eq!(q.damaged_bytes(), (offsets[3] - offsets[1]) as u64);
    q.append(&noise(4_000, 99), 1, TIME_MS).unwrap();
    q.sync().unwrap();
    drop(q);
    let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
    assert_eq!(report.truncated_bytes, 0, "nothing cut as a tail");
    assert_eq!(report.pending_samples, 1);
    assert_eq!(drain_records(&mut q), [raw(99, 4_000)]);
    drop(q);

    // Met first by an open: the same records go.
    let dir = tempfile::tempdir().unwrap();
    fs::write(segment_path(dir.path(), 0), &bytes).unwrap();
    let (mut q, report) = Queue::open(dir.path(), 1 << 30).unwrap();
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(report.damaged_bytes, (offsets[3] - offsets[1]) as u64);
    assert_eq!(drain_records(&mut q), survivors);
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
                let in_target =
                    (first_record[target]..first_record[target] + offsets.len() - 1).contains(&r);
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

/// The request the sender holds (read and marked in flight, retried while
/// the receiver is down) is sent from memory once the receiver is back:
/// when the bound drops its records meanwhile, its samples are counted
/// sent by the sender, not dropped here too. Every sample is counted once.
#[test]
fn a_held_request_dropped_from_the_queue_is_not_counted_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let max = 1 << 20; // segments of 64 KiB
    let (mut q, _) = Queue::open(dir.path(), max).unwrap();
    fill(&mut q, 20);
    let held = q.read(500).unwrap().unwrap();
    assert_eq!(held.samples, 500);
    q.mark_in_flight(&held).unwrap();
    // The receiver stays down; the bound drops the oldest segments, the
    // held request's among them.
    fill(&mut q, 200);
    let dropped = q.dropped_samples();
    assert!(dropped > 0, "the bound was hit");
    // The receiver comes back: the held request goes, then the rest.
    let mut sent = held.samples;
    q.ack(&held).unwrap();
    while let Some(p) = q.read(1000).unwrap() {
        sent += p.samples;
        q.ack(&p).unwrap();
    }
    assert_eq!(
        sent + dropped,
        220 * 100,
        "each sample sent or dropped, once"
    );
}
