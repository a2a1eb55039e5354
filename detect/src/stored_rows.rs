//! Stored rows of one table as plain columns (times, tags as strings,
//! fields as f64), for the readers that look at a few columns of a scan:
//! the report, and the detector reading back its own events and baselines.

use std::collections::{BTreeMap, HashMap};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;

/// Rows of one table as plain columns: times, tags as strings, fields as f64.
#[derive(Debug, Default)]
pub struct Rows {
    /// Microseconds since the epoch, one per row.
    pub time_us: Vec<i64>,
    tags: HashMap<String, Vec<String>>,
    fields: HashMap<String, Vec<Option<f64>>>,
}

impl Rows {
    /// Flattens batches of a scan (time column first, then tags and fields).
    /// Dictionary and string columns become tags; numbers become f64 fields.
    pub fn from_batches(batches: &[RecordBatch]) -> Rows {
        let mut rows = Rows::default();
        for batch in batches {
            for (i, field) in batch.schema().fields().iter().enumerate() {
                let column = batch.column(i);
                let name = field.name().clone();
                match column.data_type() {
                    DataType::Timestamp(..) => rows.time_us.extend(
                        column
                            .as_primitive::<TimestampMicrosecondType>()
                            .values()
                            .iter(),
                    ),
                    DataType::Dictionary(..) | DataType::Utf8 => {
                        let strings = arrow_cast::cast(column, &DataType::Utf8)
                            .expect("a dictionary of strings casts to strings");
                        let strings = strings.as_string::<i32>();
                        rows.tags
                            .entry(name)
                            .or_default()
                            .extend(strings.iter().map(|s| s.unwrap_or("").to_owned()));
                    }
                    _ => {
                        let values: Vec<Option<f64>> =
                            match arrow_cast::cast(column, &DataType::Float64) {
                                Ok(cast) => cast.as_primitive::<Float64Type>().iter().collect(),
                                Err(_) => vec![None; column.len()],
                            };
                        rows.fields.entry(name).or_default().extend(values);
                    }
                }
            }
        }
        rows
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.time_us.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.time_us.is_empty()
    }

    /// A tag column; empty strings when the table has no such tag.
    pub fn tag(&self, name: &str) -> Vec<&str> {
        match self.tags.get(name) {
            Some(v) => v.iter().map(String::as_str).collect(),
            None => vec![""; self.len()],
        }
    }

    /// A field column; nulls when the table (or this file) has no such field.
    pub fn field(&self, name: &str) -> Vec<Option<f64>> {
        self.fields
            .get(name)
            .cloned()
            .unwrap_or_else(|| vec![None; self.len()])
    }

    /// `(time, value)` points of a field per value of a tag (nulls skipped),
    /// each series in time order.
    pub fn series_by(&self, tag: &str, field: &str) -> BTreeMap<String, Vec<(i64, f64)>> {
        let mut out: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
        for ((&t, key), value) in self
            .time_us
            .iter()
            .zip(self.tag(tag))
            .zip(self.field(field))
        {
            if let Some(v) = value.filter(|v| v.is_finite()) {
                out.entry(key.to_owned()).or_default().push((t, v));
            }
        }
        for points in out.values_mut() {
            points.sort_by_key(|p| p.0);
        }
        out
    }

    /// The tags of the latest row, by name.
    pub fn latest_tags(&self) -> Option<BTreeMap<String, String>> {
        let (last, _) = self.time_us.iter().enumerate().max_by_key(|(_, t)| **t)?;
        Some(
            self.tags
                .iter()
                .map(|(k, v)| (k.clone(), v[last].clone()))
                .collect(),
        )
    }

    /// The latest row of each key, by row index: rows come in file order,
    /// which is by tags, not time. A row whose key is `None` is passed over.
    pub fn latest_by<K: Ord>(&self, mut key: impl FnMut(usize) -> Option<K>) -> BTreeMap<K, usize> {
        let mut latest: BTreeMap<K, usize> = BTreeMap::new();
        for i in 0..self.len() {
            let Some(k) = key(i) else {
                continue;
            };
            let at = latest.entry(k).or_insert(i);
            if self.time_us[i] >= self.time_us[*at] {
                *at = i;
            }
        }
        latest
    }
}
