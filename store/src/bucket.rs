//! A bucket buffers one table's rows for one hour until they are published.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, DictionaryArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, UInt64Array,
};
use arrow_schema::Schema;

use crate::batch::{Batch, FieldColumn, Values};
use crate::schema::TableDef;

/// A tag column with a dictionary shared by every row of the bucket.
#[derive(Default)]
struct BucketTag {
    dict: Vec<Arc<str>>,
    index: HashMap<Arc<str>, u32>,
    codes: Vec<u32>,
}

pub(crate) struct Bucket {
    pub table: &'static TableDef,
    pub hour: i64,
    time_us: Vec<i64>,
    tags: Vec<BucketTag>,
    fields: Vec<FieldColumn>,
    /// Lowest and highest WAL sequence numbers absorbed.
    pub first_seq: u64,
    pub last_seq: u64,
    dict_bytes: usize,
}

impl Bucket {
    pub fn new(table: &'static TableDef, hour: i64) -> Self {
        Bucket {
            table,
            hour,
            time_us: Vec::new(),
            tags: table.tags.iter().map(|_| BucketTag::default()).collect(),
            fields: table
                .fields
                .iter()
                .map(|f| FieldColumn::new(f.ty))
                .collect(),
            first_seq: u64::MAX,
            last_seq: 0,
            dict_bytes: 0,
        }
    }

    /// The smallest time buffered.
    pub fn min_time(&self) -> Option<i64> {
        self.time_us.iter().copied().min()
    }

    pub fn rows(&self) -> usize {
        self.time_us.len()
    }

    /// Approximate heap bytes held, for the memory budget.
    pub fn bytes(&self) -> usize {
        let per_row = 8 + 4 * self.tags.len() + 9 * self.fields.len();
        self.rows() * per_row + self.dict_bytes
    }

    /// Takes every row of `batch` (all in this bucket's hour), from frame `seq`.
    pub fn absorb(&mut self, seq: u64, batch: &Batch) {
        debug_assert!(seq > self.last_seq || self.rows() == 0);
        self.first_seq = self.first_seq.min(seq);
        self.last_seq = self.last_seq.max(seq);
        self.time_us.extend_from_slice(&batch.time_us);
        for (mine, theirs) in self.tags.iter_mut().zip(&batch.tags) {
            let remap: Vec<u32> = theirs
                .dict
                .iter()
                .map(|value| {
                    if let Some(&code) = mine.index.get(value.as_str()) {
                        return code;
                    }
                    let code = mine.dict.len() as u32;
                    let value: Arc<str> = Arc::from(value.as_str());
                    self.dict_bytes += value.len() + 48;
                    mine.dict.push(value.clone());
                    mine.index.insert(value, code);
                    code
                })
                .collect();
            mine.codes
                .extend(theirs.codes.iter().map(|&c| remap[c as usize]));
        }
        for (mine, theirs) in self.fields.iter_mut().zip(&batch.fields) {
            mine.extend_from(theirs, 0..batch.len());
        }
    }

    /// The rows as one Arrow batch sorted by tags, then time.
    pub fn to_record_batch(&self, schema: &Arc<Schema>) -> RecordBatch {
        let sorted = self.sorted();
        let columns = (0..schema.fields().len())
            .map(|c| sorted.column(c, 0..self.rows()))
            .collect();
        RecordBatch::try_new(schema.clone(), columns)
            .expect("bucket columns follow the table schema")
    }

    /// The rows in file order (tags, then time), one column at a time.
    pub fn sorted(&self) -> SortedBucket<'_> {
        let ranks: Vec<(Vec<u32>, Arc<StringArray>)> = self
            .tags
            .iter()
            .map(|tag| {
                let mut order: Vec<u32> = (0..tag.dict.len() as u32).collect();
                order.sort_unstable_by(|&a, &b| tag.dict[a as usize].cmp(&tag.dict[b as usize]));
                let mut rank = vec![0u32; tag.dict.len()];
                for (r, &code) in order.iter().enumerate() {
                    rank[code as usize] = r as u32;
                }
                let sorted =
                    StringArray::from_iter_values(order.iter().map(|&c| &*tag.dict[c as usize]));
                (rank, Arc::new(sorted))
            })
            .collect();
        let ranked: Vec<Vec<u32>> = self
            .tags
            .iter()
            .zip(&ranks)
            .map(|(tag, (rank, _))| tag.codes.iter().map(|&c| rank[c as usize]).collect())
            .collect();
        let order = self.file_order(&ranked);
        SortedBucket {
            bucket: self,
            order,
            ranked,
            dictionaries: ranks.into_iter().map(|(_, d)| d).collect(),
        }
    }

    /// Row numbers in file order: by each tag's rank, then time, and in
    /// arrival order among equals.
    ///
    /// Sorting row numbers with a comparator that walks every tag column was
    /// the dearest step of a publish. Instead each row's ranks are packed into
    /// one integer beside its row number, so one unstable sort of plain
    /// integers orders rows by series and keeps arrival order within a series;
    /// only a series whose rows arrived out of time order is sorted again.
    /// `ranked` holds, per tag, each row's rank among the tag's values.
    fn file_order(&self, ranked: &[Vec<u32>]) -> Vec<u32> {
        // Bits for a rank below the number of the tag's values.
        let widths: Vec<u32> = self
            .tags
            .iter()
            .map(|tag| u32::BITS - (tag.dict.len().max(1) as u32 - 1).leading_zeros())
            .collect();
        let series_bits: u32 = widths.iter().sum();
        let series = |row: usize| {
            ranked
                .iter()
                .zip(&widths)
                .fold(0u128, |key, (column, &width)| {
                    (key << width) | column[row] as u128
                })
        };
        let rows = self.rows();
        let mut order: Vec<u32> = if series_bits <= 32 {
            let mut keys: Vec<u64> = (0..rows)
                .map(|row| ((series(row) as u64) << 32) | row as u64)
                .collect();
            keys.sort_unstable();
            keys.into_iter().map(|key| key as u32).collect()
        } else if series_bits <= 96 {
            let mut keys: Vec<u128> = (0..rows)
                .map(|row| (series(row) << 32) | row as u128)
                .collect();
            keys.sort_unstable();
            keys.into_iter().map(|key| key as u32).collect()
        } else {
            let mut order: Vec<u32> = (0..rows as u32).collect();
            order.sort_by(|&a, &b| {
                ranked
                    .iter()
                    .map(|column| column[a as usize].cmp(&column[b as usize]))
                    .find(|ord| ord.is_ne())
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            order
        };
        let time = |row: u32| self.time_us[row as usize];
        for run in order.chunk_by_mut(|&a, &b| same_series(ranked, a, b)) {
            if !run.is_sorted_by_key(|&row| time(row)) {
                // Stable: rows of one series and time keep their arrival order.
                run.sort_by_key(|&row| time(row));
            }
        }
        order
    }
}

/// Whether rows `a` and `b` are of one series: every tag of the same rank.
fn same_series(ranked: &[Vec<u32>], a: u32, b: u32) -> bool {
    ranked
        .iter()
        .all(|column| column[a as usize] == column[b as usize])
}

/// A bucket's rows in file order: a permutation, not a copy, so that a
/// publish holds one sorted column at a time beside the bucket.
pub(crate) struct SortedBucket<'a> {
    bucket: &'a Bucket,
    order: Vec<u32>,
    /// Per tag, each row's rank of its value among the tag's sorted values.
    ranked: Vec<Vec<u32>>,
    /// Per tag, its values sorted.
    dictionaries: Vec<Arc<StringArray>>,
}

impl SortedBucket<'_> {
    /// Leaves out each row whose series and time equal the row's before it.
    /// File order keeps arrival order among rows of one series and time, so
    /// the first to arrive stays.
    pub fn keep_first_per_instant(&mut self) {
        let (ranked, time_us) = (&self.ranked, &self.bucket.time_us);
        let same_instant = |a: u32, b: u32| {
            time_us[a as usize] == time_us[b as usize] && same_series(ranked, a, b)
        };
        let mut previous: Option<u32> = None;
        self.order.retain(|&row| {
            let repeat = previous.is_some_and(|p| same_instant(p, row));
            previous = Some(row);
            !repeat
        });
    }

    /// Column `column` of the table's Arrow schema for sorted rows `rows`.
    pub fn column(&self, column: usize, rows: std::ops::Range<usize>) -> ArrayRef {
        let order = &self.order[rows];
        let tags = self.ranked.len();
        if column == 0 {
            let time: TimestampMicrosecondArray = order
                .iter()
                .map(|&i| self.bucket.time_us[i as usize])
                .collect::<Vec<_>>()
                .into();
            return Arc::new(time.with_timezone(crate::schema::UTC));
        }
        if column <= tags {
            let ranked = &self.ranked[column - 1];
            let keys =
                Int32Array::from_iter_values(order.iter().map(|&i| ranked[i as usize] as i32));
            let dict =
                DictionaryArray::<Int32Type>::try_new(keys, self.dictionaries[column - 1].clone())
                    .expect("keys index the dictionary they were ranked from");
            return Arc::new(dict);
        }
        permuted(&self.bucket.fields[column - 1 - tags], order)
    }
}

/// Rows per chunk a [`BucketColumns`] hands out.
const CHUNK_ROWS: usize = 16 * 1024;

/// A bucket as a [`crate::files::ColumnSource`] for publishing.
pub(crate) struct BucketColumns<'a> {
    sorted: SortedBucket<'a>,
    start: usize,
    len: usize,
}

impl<'a> BucketColumns<'a> {
    /// The bucket's rows in file order; with `one_row_per_instant`, only the
    /// first to arrive of the rows of one series and time.
    pub fn new(bucket: &'a Bucket, one_row_per_instant: bool) -> Self {
        let mut sorted = bucket.sorted();
        if one_row_per_instant {
            sorted.keep_first_per_instant();
        }
        BucketColumns {
            sorted,
            start: 0,
            len: 0,
        }
    }
}

impl BucketColumns<'_> {
    /// The rows it hands out.
    pub fn rows(&self) -> usize {
        self.sorted.order.len()
    }
}

impl crate::files::ColumnSource for BucketColumns<'_> {
    fn next_row_group(&mut self, max_rows: usize) -> crate::error::Result<usize> {
        self.start += self.len;
        self.len = max_rows.min(self.sorted.order.len() - self.start);
        Ok(self.len)
    }

    fn column(
        &mut self,
        column: usize,
        sink: &mut dyn FnMut(ArrayRef) -> crate::error::Result<()>,
    ) -> crate::error::Result<()> {
        let end = self.start + self.len;
        for chunk_start in (self.start..end).step_by(CHUNK_ROWS) {
            sink(
                self.sorted
                    .column(column, chunk_start..end.min(chunk_start + CHUNK_ROWS)),
            )?;
        }
        Ok(())
    }
}

fn permuted(field: &FieldColumn, order: &[u32]) -> ArrayRef {
    let valid = |i: u32| field.is_valid(i as usize);
    match &field.values {
        Values::F64(v) => Arc::new(
            order
                .iter()
                .map(|&i| valid(i).then(|| v[i as usize]))
                .collect::<Float64Array>(),
        ),
        Values::I64(v) => Arc::new(
            order
                .iter()
                .map(|&i| valid(i).then(|| v[i as usize]))
                .collect::<Int64Array>(),
        ),
        Values::U64(v) => Arc::new(
            order
                .iter()
                .map(|&i| valid(i).then(|| v[i as usize]))
                .collect::<UInt64Array>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchBuilder, Value};
    use crate::schema::{FieldDef, FieldType, TagDef, Unit};

    const fn tag(name: &'static str) -> TagDef {
        TagDef { name, help: "h" }
    }

    static EIGHT_TAGS: TableDef = TableDef {
        name: "eight",
        help: "h",
        tags: &[
            tag("a"),
            tag("b"),
            tag("c"),
            tag("d"),
            tag("e"),
            tag("f"),
            tag("g"),
            tag("h"),
        ],
        fields: &[FieldDef::gauge("v", FieldType::F64, Unit::None, "h")],
        exported: false,
    };

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Rows with `distinct` values per tag, times drawn from a few seconds so
    /// that series arrive out of time order and repeat times, in batches.
    fn bucket(distinct: u64, rows: usize, seed: u64) -> Bucket {
        let mut rng = Rng(seed);
        let mut bucket = Bucket::new(&EIGHT_TAGS, 0);
        let mut seq = 1;
        let mut builder = BatchBuilder::new(&EIGHT_TAGS);
        for row in 0..rows {
            let tags: Vec<String> = (0..8)
                .map(|_| format!("v{}", rng.below(distinct)))
                .collect();
            let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
            let time = rng.below(20) as i64;
            builder
                .push(time, &tags, &[Value::F64(row as f64)])
                .unwrap();
            if row % 97 == 96 {
                bucket.absorb(seq, &builder.finish());
                seq += 1;
            }
        }
        bucket.absorb(seq, &builder.finish());
        bucket
    }

    /// The order by a comparator over each row's tag strings, then time;
    /// stable, so equal rows stay in arrival order (the value column counts
    /// arrivals).
    fn reference_order(bucket: &Bucket) -> Vec<u32> {
        let tag_value =
            |t: usize, row: u32| &*bucket.tags[t].dict[bucket.tags[t].codes[row as usize] as usize];
        let mut order: Vec<u32> = (0..bucket.rows() as u32).collect();
        order.sort_by(|&a, &b| {
            (0..bucket.tags.len())
                .map(|t| tag_value(t, a).cmp(tag_value(t, b)))
                .find(|ord| ord.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(bucket.time_us[a as usize].cmp(&bucket.time_us[b as usize]))
        });
        order
    }

    #[test]
    fn file_order_is_tags_then_time_then_arrival_whatever_the_key_width() {
        // 8 tags of 2 values pack into 8 bits, of 30 values into 40, and of
        // 20 000 values (15 bits each) into 120: the three ways of sorting.
        for (distinct, rows) in [(2, 5_000), (30, 5_000), (20_000, 20_000)] {
            for seed in [1, 0x9e37_79b9_7f4a_7c15] {
                let bucket = bucket(distinct, rows, seed);
                let sorted = bucket.sorted();
                assert_eq!(
                    sorted.order,
                    reference_order(&bucket),
                    "{distinct} values per tag, seed {seed}"
                );
            }
        }
    }

    #[test]
    fn one_row_per_instant_keeps_the_first_to_arrive() {
        // Of 256 series (8 tags of 2 values) at 20 times, 5 000 rows leave
        // about a third repeating an instant; of 1 series, all but 20.
        for (distinct, rows, most_kept) in [(2, 5_000, 3_500), (1, 500, 20)] {
            let bucket = bucket(distinct, rows, 7);
            let order = reference_order(&bucket);
            let key = |row: u32| {
                let tags: Vec<u32> = bucket.tags.iter().map(|t| t.codes[row as usize]).collect();
                (tags, bucket.time_us[row as usize])
            };
            // The reference: of each run of equal keys in file order, the first
            // (the earliest to arrive, as the stable sort keeps them).
            let mut expected: Vec<u32> = Vec::new();
            for &row in &order {
                if expected.last().is_none_or(|&last| key(last) != key(row)) {
                    expected.push(row);
                }
            }
            assert!(
                expected.len() <= most_kept,
                "{} of {}",
                expected.len(),
                order.len()
            );
            let kept = BucketColumns::new(&bucket, true);
            assert_eq!(kept.rows(), expected.len());
            assert_eq!(kept.sorted.order, expected);
            let every = BucketColumns::new(&bucket, false);
            assert_eq!(every.rows(), bucket.rows());
        }
    }
}
