//! Reading another collector's batch by column name. The detector reads a
//! few columns of many tables; looking each up by name keeps it from
//! breaking silently when a table gains a field.

use vtax_store::batch::Values;
use vtax_store::Batch;

/// A batch with lookups by column name.
pub struct View<'a> {
    batch: &'a Batch,
}

impl<'a> View<'a> {
    pub fn new(batch: &'a Batch) -> Self {
        View { batch }
    }

    pub fn table_name(&self) -> &'static str {
        self.batch.table.name
    }

    pub fn rows(&self) -> usize {
        self.batch.len()
    }

    pub fn time_us(&self, row: usize) -> i64 {
        self.batch.time_us[row]
    }

    /// The column of tag `name`, to read many rows with [`View::tag_at`].
    pub fn tag_column(&self, name: &str) -> Option<usize> {
        self.batch.table.tags.iter().position(|t| t.name == name)
    }

    pub fn tag_at(&self, column: usize, row: usize) -> &'a str {
        let tags = &self.batch.tags[column];
        &tags.dict[tags.codes[row] as usize]
    }

    /// Tag `name` of `row`; empty when the table has no such tag.
    pub fn tag(&self, row: usize, name: &str) -> &'a str {
        self.tag_column(name)
            .map(|c| self.tag_at(c, row))
            .unwrap_or("")
    }

    pub fn field_column(&self, name: &str) -> Option<usize> {
        self.batch.table.fields.iter().position(|f| f.name == name)
    }

    /// A field's value as f64; None when null or absent.
    pub fn value_at(&self, column: usize, row: usize) -> Option<f64> {
        let field = &self.batch.fields[column];
        if !field.is_valid(row) {
            return None;
        }
        let v = match &field.values {
            Values::F64(v) => v[row],
            Values::I64(v) => v[row] as f64,
            Values::U64(v) => v[row] as f64,
        };
        v.is_finite().then_some(v)
    }

    /// Field `name` of `row`.
    pub fn value(&self, row: usize, name: &str) -> Option<f64> {
        self.field_column(name).and_then(|c| self.value_at(c, row))
    }
}
