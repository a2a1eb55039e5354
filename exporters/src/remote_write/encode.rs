//! Prometheus remote write 1.0 on the wire: a `prometheus.WriteRequest`
//! protobuf, snappy-compressed in the block format. The messages are declared
//! by hand (the fields remote write 1.0 uses, with their proto tag numbers), so
//! the build needs no protoc.
//!
//! A batch becomes one series per sample, named as `/metrics` names them:
//! `vtax_<table>_<field>` (`_total` on counters), the table's tags as labels;
//! a histogram field gives `_bucket` (with `le`) per row and `_count` and
//! `_sum` on its `+Inf` row. Labels are sorted by name, `__name__` among them,
//! as receivers require; a tag with an empty value is left out, as Prometheus
//! treats an empty label as an absent one.

use vtax_store::batch::Values;
use vtax_store::schema::{MetricKind, TableDef, BUCKET_TAG};
use vtax_store::Batch;

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    /// Series with their samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    /// Labels, sorted by name.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Samples, in time order.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, prost::Message)]
pub struct Label {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// The series of a batch, one sample each, with the `external` labels (sorted)
/// where no tag has their name; empty for a table that is not exported (it
/// holds other systems' samples).
pub fn batch_series(batch: &Batch, external: &[Label]) -> Vec<TimeSeries> {
    let table = batch.table;
    let mut out = Vec::new();
    if !table.exported || batch.is_empty() {
        return out;
    }
    let le = table.tag_index(BUCKET_TAG);
    for row in 0..batch.len() {
        let timestamp = batch.time_us[row].div_euclid(1000);
        // The row's tags as labels, sorted once; each field adds `__name__`.
        let mut tags: Vec<Label> = table
            .tags
            .iter()
            .zip(&batch.tags)
            .map(|(def, column)| Label {
                name: def.name.to_string(),
                value: column.dict[column.codes[row] as usize].clone(),
            })
            .filter(|l| !l.value.is_empty())
            .collect();
        for label in external {
            if table.tag_index(&label.name).is_none() {
                tags.push(label.clone());
            }
        }
        tags.sort();
        let without_le: Vec<Label> = tags
            .iter()
            .filter(|l| l.name != BUCKET_TAG)
            .cloned()
            .collect();
        let is_inf = le.is_some_and(|t| {
            let column = &batch.tags[t];
            column.dict[column.codes[row] as usize] == "+Inf"
        });
        for (f, field) in table.fields.iter().enumerate() {
            let column = &batch.fields[f];
            if !column.is_valid(row) || !table.exports(field) {
                continue;
            }
            let value = value_at(&column.values, row);
            let name = table.metric_name(field);
            let mut push = |name: String, labels: &[Label]| {
                out.push(series(name, labels, value, timestamp));
            };
            match field.kind {
                MetricKind::Gauge | MetricKind::Counter => push(name, &tags),
                MetricKind::Histogram => {
                    push(format!("{name}_bucket"), &tags);
                    if is_inf {
                        push(format!("{name}_count"), &without_le);
                    }
                }
                // The sum is named after its histogram, like the field itself
                // (`<histogram>_sum`), and only the `+Inf` row carries it.
                MetricKind::HistogramSum => {
                    if is_inf {
                        push(name, &without_le);
                    }
                }
                MetricKind::StoredOnly => {}
            }
        }
    }
    out
}

fn value_at(values: &Values, row: usize) -> f64 {
    match values {
        Values::F64(v) => v[row],
        Values::I64(v) => v[row] as f64,
        Values::U64(v) => v[row] as f64,
    }
}

fn series(name: String, sorted: &[Label], value: f64, timestamp: i64) -> TimeSeries {
    let mut labels = Vec::with_capacity(sorted.len() + 1);
    let name_label = Label {
        name: "__name__".into(),
        value: name,
    };
    // `__name__` sorts before every tag name, which are lower-case snake case.
    let at = sorted.partition_point(|l| l.name.as_str() < "__name__");
    labels.extend_from_slice(&sorted[..at]);
    labels.push(name_label);
    labels.extend_from_slice(&sorted[at..]);
    TimeSeries {
        labels,
        samples: vec![Sample { value, timestamp }],
    }
}

/// Number of samples in a set of series.
pub fn sample_count(series: &[TimeSeries]) -> usize {
    series.iter().map(|s| s.samples.len()).sum()
}

/// Whether a table is sent at all.
pub fn is_sent(table: &TableDef) -> bool {
    table.exported
}

/// Compresses an encoded write request for the wire (snappy block format).
pub fn compress(protobuf: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new()
        .compress_vec(protobuf)
        .expect("snappy compresses any input below 4 GiB")
}

/// Undoes [`compress`].
pub fn decompress(body: &[u8]) -> Result<Vec<u8>, snap::Error> {
    snap::raw::Decoder::new().decompress_vec(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tables::{WakeupHistogramRow, WAKEUP_HISTOGRAM};
    use prost::Message;
    use vtax_store::schema::{FieldDef, FieldType, TagDef, Unit};
    use vtax_store::BatchBuilder;

    vtax_store::table! {
        static GPU: TableDef, struct GpuRow {
            name: "gpu",
            help: "test",
            tags: [
                uuid = TagDef { name: "uuid", help: "id" },
                gpu = TagDef { name: "gpu", help: "index" },
            ],
            fields: [
                energy_joules: Option<f64> = FieldDef::counter(FieldType::F64, Unit::Joules, "Energy."),
                memory_used_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Used."),
            ],
            exported: true,
        }
    }

    vtax_store::table! {
        static SCRAPED: TableDef, struct ScrapedRow {
            name: "scraped",
            help: "test",
            tags: [],
            fields: [value: f64 = FieldDef::gauge(FieldType::F64, Unit::None, "x")],
            exported: false,
        }
    }

    fn labels(s: &TimeSeries) -> Vec<(&str, &str)> {
        s.labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect()
    }

    #[test]
    fn plain_fields_become_sorted_series_and_survive_the_wire() {
        let mut b = BatchBuilder::new(&GPU);
        let row = GpuRow {
            uuid: "GPU-a",
            gpu: "0",
            energy_joules: Some(1.5),
            memory_used_bytes: Some(7),
        };
        b.push_row(1_700_000_000_123_456, &row).unwrap();
        let row = GpuRow {
            uuid: "",
            gpu: "1",
            energy_joules: None,
            memory_used_bytes: Some(9),
        };
        b.push_row(1_700_000_000_123_999, &row).unwrap();
        let series = batch_series(&b.finish(), &[]);
        assert_eq!(series.len(), 3, "a null is no sample");
        assert_eq!(
            labels(&series[0]),
            [
                ("__name__", "vtax_gpu_energy_joules_total"),
                ("gpu", "0"),
                ("uuid", "GPU-a")
            ]
        );
        assert_eq!(
            labels(&series[2]),
            [("__name__", "vtax_gpu_memory_used_bytes"), ("gpu", "1")],
            "an empty tag is no label"
        );
        let mut b = BatchBuilder::new(&GPU);
        let row = GpuRow {
            uuid: "u",
            gpu: "0",
            energy_joules: None,
            memory_used_bytes: Some(1),
        };
        b.push_row(1, &row).unwrap();
        let external = [
            Label {
                name: "gpu".into(),
                value: "ignored: the tag wins".into(),
            },
            Label {
                name: "instance".into(),
                value: "n1".into(),
            },
            Label {
                name: "job".into(),
                value: "vtax".into(),
            },
        ];
        assert_eq!(
            labels(&batch_series(&b.finish(), &external)[0]),
            [
                ("__name__", "vtax_gpu_memory_used_bytes"),
                ("gpu", "0"),
                ("instance", "n1"),
                ("job", "vtax"),
                ("uuid", "u")
            ]
        );
        assert_eq!(
            series[1].samples,
            [Sample {
                value: 7.0,
                timestamp: 1_700_000_000_123
            }]
        );

        let request = WriteRequest { timeseries: series };
        let wire = compress(&request.encode_to_vec());
        let back = WriteRequest::decode(&decompress(&wire).unwrap()[..]).unwrap();
        assert_eq!(back, request);
    }

    #[test]
    fn histograms_give_buckets_count_and_sum() {
        let mut b = BatchBuilder::new(&WAKEUP_HISTOGRAM);
        for (le, count, sum) in [("0.001", 4, None), ("+Inf", 5, Some(0.25))] {
            let row = WakeupHistogramRow {
                cpu: "3",
                le,
                latency_seconds: count,
                latency_seconds_sum: sum,
            };
            b.push_row(2_000, &row).unwrap();
        }
        let series = batch_series(&b.finish(), &[]);
        let names: Vec<_> = series.iter().map(|s| labels(s)).collect();
        assert_eq!(
            names,
            [
                vec![
                    ("__name__", "vtax_jitter_wakeup_latency_seconds_bucket"),
                    ("cpu", "3"),
                    ("le", "0.001")
                ],
                vec![
                    ("__name__", "vtax_jitter_wakeup_latency_seconds_bucket"),
                    ("cpu", "3"),
                    ("le", "+Inf")
                ],
                vec![
                    ("__name__", "vtax_jitter_wakeup_latency_seconds_count"),
                    ("cpu", "3")
                ],
                vec![
                    ("__name__", "vtax_jitter_wakeup_latency_seconds_sum"),
                    ("cpu", "3")
                ],
            ]
        );
        assert_eq!(series[3].samples[0].value, 0.25);
        assert_eq!(series[2].samples[0].value, 5.0);
    }

    #[test]
    fn stored_only_tables_are_not_sent() {
        let mut b = BatchBuilder::new(&SCRAPED);
        b.push_row(1, &ScrapedRow { value: 1.0 }).unwrap();
        assert!(batch_series(&b.finish(), &[]).is_empty());
        assert!(!is_sent(&SCRAPED));
    }

    /// Concatenated write requests are one request holding all their series:
    /// the queue relies on it to batch records without re-encoding them.
    #[test]
    fn concatenated_requests_merge() {
        let one = |v: f64| WriteRequest {
            timeseries: vec![series("a".into(), &[], v, 1)],
        };
        let mut bytes = one(1.0).encode_to_vec();
        bytes.extend(one(2.0).encode_to_vec());
        let merged = WriteRequest::decode(&bytes[..]).unwrap();
        assert_eq!(merged.timeseries.len(), 2);
        assert_eq!(merged.timeseries[1].samples[0].value, 2.0);
    }
}
