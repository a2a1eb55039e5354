//! Reading a file written under an older schema into the current one: a
//! column added since reads as null (a tag as empty), and a column whose
//! type widened is cast. The scan and the merge both read files this way.

use std::sync::Arc;

use arrow_array::{new_null_array, Array, RecordBatch};
use arrow_schema::Schema;

use crate::error::Result;
use crate::schema::tag_type;

/// Which of a target schema's columns a file has: a field added after the file
/// was written is missing from it and reads as null.
pub(crate) struct Projection {
    /// Per target column, its root index in the file, if the file has it.
    pub wanted: Vec<Option<usize>>,
    /// The file's root columns to read, ascending.
    pub roots: Vec<usize>,
}

impl Projection {
    pub fn of(target: &Schema, file_schema: &Schema) -> Self {
        let wanted: Vec<Option<usize>> = target
            .fields()
            .iter()
            .map(|f| file_schema.index_of(f.name()).ok())
            .collect();
        let mut roots: Vec<usize> = wanted.iter().flatten().copied().collect();
        roots.sort_unstable();
        Projection { wanted, roots }
    }
}

/// Puts a file's batch into `target`: columns in order, missing ones null.
pub(crate) fn conform(
    target: &Arc<Schema>,
    batch: &RecordBatch,
    wanted: &[Option<usize>],
    roots: &[usize],
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let columns = target
        .fields()
        .iter()
        .zip(wanted)
        .map(|(field, index)| match index {
            Some(root) => {
                let position = roots.binary_search(root).expect("projected");
                let column = batch.column(position).clone();
                if column.data_type() == field.data_type() {
                    Ok(column)
                } else {
                    Ok(arrow_cast::cast(&column, field.data_type())?)
                }
            }
            None if field.data_type() == &tag_type() => {
                let empty = arrow_array::StringArray::from(vec![""; n]);
                Ok(arrow_cast::cast(&empty, &tag_type())?)
            }
            None => Ok(new_null_array(field.data_type(), n)),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(target.clone(), columns)?)
}
