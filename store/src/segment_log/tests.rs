//! The damage a segment can take, tried once here for every log that uses
//! this framing: the WAL's and the queue's own tests check what each does
//! with what a scan reports.

use super::*;

const FORMAT: Format = Format {
    magic: b"TESTLOG\x01",
    extension: "log",
    meta_bytes: 4,
    max_payload_bytes: 1 << 20,
};

/// A segment of `n` frames, frame i with meta `i` and a payload of `10 + i`
/// bytes of `i`; and where each frame starts.
fn segment(n: u32) -> (Vec<u8>, Vec<usize>) {
    let mut bytes = FORMAT.magic.to_vec();
    let mut starts = Vec::new();
    for i in 0..n {
        starts.push(bytes.len());
        FORMAT.append_frame(&mut bytes, |out| {
            out.extend_from_slice(&i.to_le_bytes());
            out.extend(std::iter::repeat_n(i as u8, 10 + i as usize));
        });
    }
    (bytes, starts)
}

/// The metas of the frames a scan of `bytes` reads, and the scan.
fn scan(bytes: &[u8]) -> (Vec<u32>, SegmentScan) {
    let mut metas = Vec::new();
    let report = FORMAT
        .scan(
            bytes,
            bytes.len() as u64,
            |frame: Frame| -> Result<(), ()> {
                let meta = u32::from_le_bytes(frame.meta[..].try_into().unwrap());
                assert_eq!(frame.payload, vec![meta as u8; 10 + meta as usize]);
                metas.push(meta);
                Ok(())
            },
        )
        .unwrap();
    (metas, report)
}

#[test]
fn frames_come_back_whole_with_their_meta_and_offsets() {
    let (bytes, starts) = segment(3);
    let mut offsets = Vec::new();
    let report = FORMAT
        .scan(
            &bytes[..],
            bytes.len() as u64,
            |f: Frame| -> Result<(), ()> {
                offsets.push(f.offset as usize);
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(offsets, starts);
    assert_eq!(report.frames, 3);
    assert_eq!(report.valid_bytes, bytes.len() as u64);
    assert_eq!(report.tail_bytes(), 0);
    assert_eq!(report.damaged_bytes(false), 0);
}

#[test]
fn a_torn_tail_ends_the_frames_and_is_damage_only_before_the_last_segment() {
    let (bytes, starts) = segment(3);
    let cut = starts[2] + 5;
    let (metas, report) = scan(&bytes[..cut]);
    assert_eq!(metas, [0, 1]);
    assert_eq!(report.valid_bytes, starts[2] as u64);
    assert_eq!(report.tail_bytes(), 5);
    assert_eq!(
        report.damaged_bytes(true),
        0,
        "the last segment's tail is torn"
    );
    assert_eq!(
        report.damaged_bytes(false),
        5,
        "an earlier one was complete"
    );
}

#[test]
fn a_flipped_bit_in_a_payload_or_its_meta_loses_that_frame_only() {
    for in_meta in [false, true] {
        let (mut bytes, starts) = segment(4);
        let at = starts[1] + FRAME_HEADER_BYTES + if in_meta { 1 } else { FORMAT.meta_bytes + 3 };
        bytes[at] ^= 0x10;
        let (metas, report) = scan(&bytes);
        assert_eq!(metas, [0, 2, 3], "bit in meta: {in_meta}");
        let frame_1 = (starts[2] - starts[1]) as u64;
        assert_eq!(report.stepped_over_bytes, frame_1);
        assert_eq!(report.stepped_over_end, starts[2] as u64);
        assert_eq!(report.damaged_bytes(true), frame_1);
        assert_eq!(report.damage_end(true), starts[2] as u64);
        assert_eq!(report.valid_bytes, bytes.len() as u64);
    }
}

#[test]
fn a_damaged_length_gives_up_the_rest_of_its_segment() {
    let (mut bytes, starts) = segment(4);
    bytes[starts[1]] ^= 0x01;
    let (metas, report) = scan(&bytes);
    assert_eq!(metas, [0]);
    let rest = (bytes.len() - starts[1]) as u64;
    assert_eq!(report.tail_bytes(), rest);
    assert_eq!(report.damaged_bytes(false), rest);
    assert_eq!(report.damage_end(false), bytes.len() as u64);
    // A length past the bound is no frame either.
    let (mut bytes, starts) = segment(2);
    bytes[starts[1]..starts[1] + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(scan(&bytes).0, [0]);
}

#[test]
fn a_damaged_magic_hides_no_frames() {
    let (mut bytes, _) = segment(3);
    bytes[2] = b'X';
    let (metas, report) = scan(&bytes);
    assert_eq!(metas, [0, 1, 2]);
    assert!(report.bad_magic);
    assert_eq!(report.damaged_bytes(true), 8);
    assert_eq!(report.damage_end(true), 8);
}

#[test]
fn a_segment_torn_while_being_created_holds_nothing_and_a_short_stranger_is_damage() {
    let (_, report) = scan(&FORMAT.magic[..3]);
    assert!(report.torn_magic && !report.bad_magic);
    assert_eq!(report.damaged_bytes(false), 0);
    let (_, report) = scan(&[]);
    assert!(report.torn_magic);
    let (metas, report) = scan(b"ABC");
    assert!(metas.is_empty() && report.bad_magic && !report.torn_magic);
    assert_eq!(report.damaged_bytes(true), 3);
}

#[test]
fn zeros_after_the_frames_are_a_tail_not_frames() {
    let (mut bytes, _) = segment(2);
    let frames_end = bytes.len() as u64;
    bytes.extend_from_slice(&[0; 4096]);
    let (metas, report) = scan(&bytes);
    assert_eq!(metas, [0, 1]);
    assert_eq!(report.valid_bytes, frames_end);
    assert_eq!(report.tail_bytes(), 4096);
}

#[test]
fn a_write_that_stopped_partway_keeps_the_frames_that_landed_whole() {
    let (bytes, starts) = segment(3);
    let frames = &bytes[8..];
    let second_end = starts[2] - 8;
    assert_eq!(FORMAT.whole_frames(frames, second_end + 3), (second_end, 2));
    assert_eq!(FORMAT.whole_frames(frames, frames.len()), (frames.len(), 3));
    assert_eq!(FORMAT.whole_frames(frames, 0), (0, 0));
}

#[test]
fn segments_are_listed_in_order_and_nothing_else_is() {
    let dir = tempfile::tempdir().unwrap();
    for seq in [12, 3, 7] {
        fs::write(FORMAT.segment_path(dir.path(), seq), b"").unwrap();
    }
    for other in [
        "00000000000000000001.wal",
        "x.log",
        "00000000000000000002.log.tmp",
    ] {
        fs::write(dir.path().join(other), b"").unwrap();
    }
    let seqs: Vec<u64> = FORMAT
        .list_segments(dir.path())
        .unwrap()
        .into_iter()
        .map(|(seq, _)| seq)
        .collect();
    assert_eq!(seqs, [3, 7, 12]);
    assert!(FORMAT
        .list_segments(&dir.path().join("none"))
        .unwrap()
        .is_empty());
}

#[test]
fn a_segment_is_copied_to_quarantine_once_per_length() {
    let dir = tempfile::tempdir().unwrap();
    let segment_path = FORMAT.segment_path(dir.path(), 1);
    let target = dir
        .path()
        .join("quarantine")
        .join("00000000000000000001.log");
    fs::write(&segment_path, segment(2).0).unwrap();
    assert!(copy_to_quarantine(&segment_path, dir.path(), &target).unwrap());
    assert!(!copy_to_quarantine(&segment_path, dir.path(), &target).unwrap());
    assert_eq!(fs::read(&target).unwrap(), fs::read(&segment_path).unwrap());
    // Grown since (appended to after the damage): the copy follows.
    fs::write(&segment_path, segment(3).0).unwrap();
    assert!(copy_to_quarantine(&segment_path, dir.path(), &target).unwrap());
    assert_eq!(fs::read(&target).unwrap(), segment(3).0);
    assert!(!target.with_extension("copying").exists());
}
