//! Rows for one table, held column by column: the unit that collectors and
//! importers hand to the store, that the WAL frames, and that buckets absorb.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::schema::{FieldType, TableDef};

/// One field value, as a collector produces it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// A double.
    F64(f64),
    /// A signed integer.
    I64(i64),
    /// An unsigned integer.
    U64(u64),
    /// No value this row (source lacks it, or read failed).
    Null,
}

/// Values of one field column. Null slots hold a zero and are marked in `valid`.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Doubles.
    F64(Vec<f64>),
    /// Signed integers.
    I64(Vec<i64>),
    /// Unsigned integers.
    U64(Vec<u64>),
}

impl Values {
    pub(crate) fn new(ty: FieldType) -> Self {
        match ty {
            FieldType::F64 => Values::F64(Vec::new()),
            FieldType::I64 => Values::I64(Vec::new()),
            FieldType::U64 => Values::U64(Vec::new()),
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::F64(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::U64(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn field_type(&self) -> FieldType {
        match self {
            Values::F64(_) => FieldType::F64,
            Values::I64(_) => FieldType::I64,
            Values::U64(_) => FieldType::U64,
        }
    }

    /// Appends `other[range]`; both must have the same type.
    pub(crate) fn extend_from(&mut self, other: &Values, range: std::ops::Range<usize>) {
        match (self, other) {
            (Values::F64(a), Values::F64(b)) => a.extend_from_slice(&b[range]),
            (Values::I64(a), Values::I64(b)) => a.extend_from_slice(&b[range]),
            (Values::U64(a), Values::U64(b)) => a.extend_from_slice(&b[range]),
            _ => unreachable!("column types are checked when a batch is built or decoded"),
        }
    }

    pub(crate) fn push_default(&mut self, n: usize) {
        match self {
            Values::F64(v) => v.resize(v.len() + n, 0.0),
            Values::I64(v) => v.resize(v.len() + n, 0),
            Values::U64(v) => v.resize(v.len() + n, 0),
        }
    }
}

/// A field column: values plus, when any is null, a validity vector.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldColumn {
    /// Values; nulls hold zero.
    pub values: Values,
    /// `Some` once any row is null: `valid[i]` says whether row `i` has a value.
    pub valid: Option<Vec<bool>>,
}

impl FieldColumn {
    pub(crate) fn new(ty: FieldType) -> Self {
        FieldColumn {
            values: Values::new(ty),
            valid: None,
        }
    }

    /// Whether row `i` holds a value.
    pub fn is_valid(&self, i: usize) -> bool {
        self.valid.as_ref().is_none_or(|v| v[i])
    }

    fn push(&mut self, value: Value) -> std::result::Result<(), FieldType> {
        let row = self.values.len();
        let is_null = matches!(value, Value::Null);
        match (&mut self.values, value) {
            (Values::F64(v), Value::F64(x)) => v.push(x),
            (Values::I64(v), Value::I64(x)) => v.push(x),
            (Values::U64(v), Value::U64(x)) => v.push(x),
            (values, Value::Null) => values.push_default(1),
            (values, _) => return Err(values.field_type()),
        }
        if is_null {
            self.valid
                .get_or_insert_with(|| vec![true; row])
                .push(false);
        } else if let Some(valid) = &mut self.valid {
            valid.push(true);
        }
        Ok(())
    }

    /// Appends rows `range` of `other` (same type).
    pub(crate) fn extend_from(&mut self, other: &FieldColumn, range: std::ops::Range<usize>) {
        let before = self.values.len();
        self.values.extend_from(&other.values, range.clone());
        match (&mut self.valid, &other.valid) {
            (None, None) => {}
            (Some(mine), None) => mine.resize(mine.len() + range.len(), true),
            (mine, Some(theirs)) => {
                let mine = mine.get_or_insert_with(|| vec![true; before]);
                mine.extend_from_slice(&theirs[range]);
            }
        }
    }
}

/// A dictionary-encoded tag column: distinct strings once, a code per row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TagColumn {
    /// Distinct values in first-seen order.
    pub dict: Vec<String>,
    /// Per row: index into `dict`.
    pub codes: Vec<u32>,
}

/// Interns tag values while a batch is built.
#[derive(Default)]
struct Interner {
    index: HashMap<String, u32>,
}

impl Interner {
    fn code(&mut self, column: &mut TagColumn, value: &str) -> u32 {
        if let Some(&code) = self.index.get(value) {
            return code;
        }
        let code = column.dict.len() as u32;
        column.dict.push(value.to_owned());
        self.index.insert(value.to_owned(), code);
        code
    }
}

/// Rows for one table: a time per row, tag columns and field columns.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The table's declaration.
    pub table: &'static TableDef,
    /// Per row: microseconds since the epoch, UTC.
    pub time_us: Vec<i64>,
    /// One per declared tag, in declaration order.
    pub tags: Vec<TagColumn>,
    /// One per declared field, in declaration order.
    pub fields: Vec<FieldColumn>,
}

impl PartialEq for Batch {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.table, other.table)
            && self.time_us == other.time_us
            && self.tags == other.tags
            && self.fields == other.fields
    }
}

impl Batch {
    /// An empty batch for `table`.
    pub fn new(table: &'static TableDef) -> Self {
        Batch {
            table,
            time_us: Vec::new(),
            tags: vec![TagColumn::default(); table.tags.len()],
            fields: table
                .fields
                .iter()
                .map(|f| FieldColumn::new(f.ty))
                .collect(),
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.time_us.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.time_us.is_empty()
    }

    /// Number of field values (non-null), the unit that "samples" counts.
    pub fn sample_count(&self) -> usize {
        self.fields
            .iter()
            .map(|f| match &f.valid {
                None => f.values.len(),
                Some(v) => v.iter().filter(|&&x| x).count(),
            })
            .sum()
    }
}

/// Builds a [`Batch`] row by row, interning tag values.
pub struct BatchBuilder {
    batch: Batch,
    interners: Vec<Interner>,
}

impl BatchBuilder {
    /// A builder for `table`.
    pub fn new(table: &'static TableDef) -> Self {
        BatchBuilder {
            batch: Batch::new(table),
            interners: table.tags.iter().map(|_| Interner::default()).collect(),
        }
    }

    /// The table the rows are for.
    pub fn table(&self) -> &'static TableDef {
        self.batch.table
    }

    /// Rows so far.
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    /// Whether no row was added yet.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Adds one row. `tags` and `fields` follow the table's declaration order.
    pub fn push(&mut self, time_us: i64, tags: &[&str], fields: &[Value]) -> Result<()> {
        let table = self.batch.table;
        if tags.len() != table.tags.len() || fields.len() != table.fields.len() {
            return Err(Error::Schema(format!(
                "table {} takes {} tags and {} fields, got {} and {}",
                table.name,
                table.tags.len(),
                table.fields.len(),
                tags.len(),
                fields.len()
            )));
        }
        // Check every field before touching any column so a bad row leaves no trace.
        for (def, value) in table.fields.iter().zip(fields) {
            let ok = matches!(
                (def.ty, value),
                (_, Value::Null)
                    | (FieldType::F64, Value::F64(_))
                    | (FieldType::I64, Value::I64(_))
                    | (FieldType::U64, Value::U64(_))
            );
            if !ok {
                return Err(Error::Schema(format!(
                    "table {} field {} is {:?}, got {value:?}",
                    table.name, def.name, def.ty
                )));
            }
        }
        self.batch.time_us.push(time_us);
        for ((column, interner), value) in self
            .batch
            .tags
            .iter_mut()
            .zip(&mut self.interners)
            .zip(tags)
        {
            let code = interner.code(column, value);
            column.codes.push(code);
        }
        for (column, value) in self.batch.fields.iter_mut().zip(fields) {
            column.push(*value).expect("field types were checked above");
        }
        Ok(())
    }

    /// The batch built so far; the builder starts empty again.
    pub fn finish(&mut self) -> Batch {
        for interner in &mut self.interners {
            interner.index.clear();
        }
        let table = self.batch.table;
        std::mem::replace(&mut self.batch, Batch::new(table))
    }
}
