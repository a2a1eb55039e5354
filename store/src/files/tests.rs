//! Tests of the module.

use super::*;

/// A disk that fails a read mid-file: the file's footer was read, then
/// its pages cannot be (a directory's descriptor stands in: every read of
/// it fails with EISDIR). That is an OS error, not a damaged file.
#[test]
fn a_failed_read_of_pages_is_an_io_error_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.parquet");
    let values = arrow_array::Int64Array::from_iter_values(0..10_000);
    let batch = RecordBatch::try_from_iter([("v", Arc::new(values) as ArrayRef)]).unwrap();
    let mut writer =
        ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let (file, metadata) = open_for_reading(&path).unwrap();

    let mut whole =
        FileBatches::new(file, &path, metadata.clone(), |b| b.with_batch_size(10_000)).unwrap();
    assert_eq!(whole.next(&path).unwrap().unwrap().num_rows(), 10_000);

    let failing = File::open(dir.path()).unwrap();
    let mut reader = FileBatches::new(failing, &path, metadata, |b| b).unwrap();
    let error = reader.next(&path).unwrap().unwrap_err();
    assert!(
        matches!(&error, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EISDIR)),
        "{error:?}"
    );
    assert!(error.damaged_file().is_none(), "{error}");
}

#[test]
fn strings_that_are_all_empty_get_bytes_in_allocated_memory_and_keep_their_values() {
    let empty = StringArray::from_iter_values(["", "", ""]);
    assert!(empty.values().is_empty());
    let keys = arrow_array::Int32Array::from(vec![0, 0, 0, 0]);
    let dictionary = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(empty.clone())).unwrap();

    let strings = with_readable_string_bytes(Arc::new(empty.clone()));
    let strings = strings.as_any().downcast_ref::<StringArray>().unwrap();
    assert!(!strings.values().is_empty());
    assert_eq!(strings, &empty);

    let fixed = with_readable_string_bytes(Arc::new(dictionary.clone()));
    let fixed = fixed
        .as_any()
        .downcast_ref::<DictionaryArray<Int32Type>>()
        .unwrap();
    let values = fixed
        .values()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert!(!values.values().is_empty());
    assert_eq!(fixed, &dictionary);

    // Strings with bytes are passed through as they are.
    let labels: ArrayRef = Arc::new(StringArray::from_iter_values(["", "gpu=\"0\""]));
    assert!(Arc::ptr_eq(
        &with_readable_string_bytes(labels.clone()),
        &labels
    ));
}
