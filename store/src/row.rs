//! Typed rows: one declaration gives a table's [`TableDef`] and a struct with
//! one Rust field per tag and per field column, so a collector fills a row by
//! name and the compiler checks every name and type.
//!
//! ```
//! use vtax_store::batch::BatchBuilder;
//! use vtax_store::schema::{FieldDef, FieldType, TagDef, Unit};
//!
//! const PORT: TagDef = TagDef { name: "port", help: "The port." };
//!
//! vtax_store::table! {
//!     /// One row per port.
//!     pub static PORTS: TableDef, pub struct PortRow {
//!         name: "ports",
//!         help: "Bytes through each port.",
//!         tags: [port = PORT],
//!         fields: [
//!             rx_bytes: Option<u64> = FieldDef::counter(FieldType::U64, Unit::Bytes, "Received."),
//!             tx_bytes: Option<u64> = FieldDef::counter(FieldType::U64, Unit::Bytes, "Sent."),
//!         ],
//!         exported: true,
//!     }
//! }
//!
//! let mut rows = BatchBuilder::new(&PORTS);
//! rows.push_row(1, &PortRow { port: "mlx5_0/1", rx_bytes: Some(10), tx_bytes: None }).unwrap();
//! let batch = rows.finish();
//! assert_eq!(PORTS.fields[0].name, "rx_bytes");
//! assert_eq!(batch.len(), 1);
//! ```
//!
//! A field whose Rust type is not its column's type does not compile:
//!
//! ```compile_fail
//! use vtax_store::schema::{FieldDef, FieldType, Unit};
//! vtax_store::table! {
//!     pub static T: TableDef, pub struct TRow {
//!         name: "t",
//!         help: "A table.",
//!         tags: [],
//!         fields: [
//!             // A U64 column filled from an f64.
//!             rx_bytes: Option<f64> = FieldDef::counter(FieldType::U64, Unit::Bytes, "Received."),
//!         ],
//!         exported: true,
//!     }
//! }
//! ```
//!
//! Nor does a row that leaves a field out, or names one the table lacks:
//!
//! ```compile_fail
//! use vtax_store::schema::{FieldDef, FieldType, Unit};
//! vtax_store::table! {
//!     pub static T: TableDef, pub struct TRow {
//!         name: "t",
//!         help: "A table.",
//!         tags: [],
//!         fields: [
//!             rx_bytes: Option<u64> = FieldDef::counter(FieldType::U64, Unit::Bytes, "Received."),
//!             tx_bytes: Option<u64> = FieldDef::counter(FieldType::U64, Unit::Bytes, "Sent."),
//!         ],
//!         exported: true,
//!     }
//! }
//! let row = TRow { rx_bytes: Some(1), tx_byte: Some(2) };
//! ```
//!
//! Nor a tag declared under another name than its [`TagDef`]'s:
//!
//! ```compile_fail
//! use vtax_store::schema::{FieldDef, FieldType, TagDef, Unit};
//! const PORT: TagDef = TagDef { name: "port", help: "The port." };
//! vtax_store::table! {
//!     pub static T: TableDef, pub struct TRow {
//!         name: "t",
//!         help: "A table.",
//!         tags: [device = PORT],
//!         fields: [
//!             rx_bytes: Option<u64> = FieldDef::counter(FieldType::U64, Unit::Bytes, "Received."),
//!         ],
//!         exported: true,
//!     }
//! }
//! ```

use crate::batch::{BatchBuilder, Value};
use crate::error::{Error, Result};
use crate::schema::{FieldType, TableDef};

/// A Rust type a field column is filled from: the column's type, or an
/// `Option` of it for a value the source may lack (null).
pub trait FieldValue {
    /// The column type this Rust type fills.
    const TYPE: FieldType;
    /// The value as the batch takes it.
    fn value(&self) -> Value;
}

macro_rules! field_value {
    ($rust:ty, $ty:ident) => {
        impl FieldValue for $rust {
            const TYPE: FieldType = FieldType::$ty;
            fn value(&self) -> Value {
                Value::$ty(*self)
            }
        }
        impl FieldValue for Option<$rust> {
            const TYPE: FieldType = FieldType::$ty;
            fn value(&self) -> Value {
                self.map_or(Value::Null, Value::$ty)
            }
        }
    };
}
field_value!(f64, F64);
field_value!(i64, I64);
field_value!(u64, U64);

/// A row of one table, declared with [`table!`](crate::table).
pub trait Row {
    /// The table the row belongs to.
    fn table() -> &'static TableDef;
    /// Appends the row to `rows`, a builder for [`Row::table`].
    fn push_into(&self, time_us: i64, rows: &mut BatchBuilder) -> Result<()>;
}

impl BatchBuilder {
    /// Appends a typed row; an error if the builder is for another table.
    pub fn push_row<R: Row>(&mut self, time_us: i64, row: &R) -> Result<()> {
        let (mine, its) = (self.table().name, R::table().name);
        if mine != its {
            return Err(Error::Schema(format!(
                "a row of table {its} pushed into table {mine}"
            )));
        }
        row.push_into(time_us, self)
    }
}

/// Whether two strings are equal, at compile time.
#[doc(hidden)]
pub const fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether a Rust type fills a column of type `column`, at compile time.
#[doc(hidden)]
pub const fn same_type(rust: FieldType, column: FieldType) -> bool {
    rust as u8 == column as u8
}

/// Declares a table: a `static` [`TableDef`] and a row struct with one
/// `&str` per tag and one typed field per field column, in declaration
/// order. Each field's definition is a `FieldDef` constructor call without
/// the name, which is the Rust field's; each tag names a `TagDef` whose name
/// must be the Rust field's. See the [module](crate::row) for an example.
///
/// The row struct derives `Default` (empty tags, zeros, nulls) for a source
/// read key by key (a `/proc` file's lines), whose row starts empty and takes
/// each field as its key turns up; a row built in one literal names every
/// field, so the compiler checks that none is left out.
#[macro_export]
macro_rules! table {
    (
        $(#[$meta:meta])*
        $vis:vis static $table:ident : TableDef, $rvis:vis struct $row:ident {
            name: $name:expr,
            help: $help:expr,
            tags: [],
            fields: [$($field:ident : $fty:ty = $($ctor:ident)::+ ( $($arg:expr),* $(,)? )),* $(,)?],
            exported: $exported:expr $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis static $table: $crate::schema::TableDef = $crate::schema::TableDef {
            name: $name,
            help: $help,
            tags: &[],
            fields: &[$($($ctor)::+(stringify!($field), $($arg),*)),*],
            exported: $exported,
        };
        #[doc = concat!("A row of the `", stringify!($table), "` table.")]
        #[derive(Clone, Debug, Default, PartialEq)]
        $rvis struct $row {
            $(#[allow(missing_docs)] pub $field: $fty,)*
        }
        $crate::table!(@checks $($field : $fty = $($ctor)::+ ($($arg),*)),*);
        impl $crate::row::Row for $row {
            fn table() -> &'static $crate::schema::TableDef {
                &$table
            }
            fn push_into(&self, time_us: i64, rows: &mut $crate::batch::BatchBuilder) -> $crate::error::Result<()> {
                rows.push(time_us, &[], &[$($crate::row::FieldValue::value(&self.$field)),*])
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis static $table:ident : TableDef, $rvis:vis struct $row:ident {
            name: $name:expr,
            help: $help:expr,
            tags: [$($tag:ident = $tagdef:expr),+ $(,)?],
            fields: [$($field:ident : $fty:ty = $($ctor:ident)::+ ( $($arg:expr),* $(,)? )),* $(,)?],
            exported: $exported:expr $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis static $table: $crate::schema::TableDef = $crate::schema::TableDef {
            name: $name,
            help: $help,
            tags: &[$($tagdef),+],
            fields: &[$($($ctor)::+(stringify!($field), $($arg),*)),*],
            exported: $exported,
        };
        #[doc = concat!("A row of the `", stringify!($table), "` table.")]
        #[derive(Clone, Debug, Default, PartialEq)]
        $rvis struct $row<'a> {
            $(#[allow(missing_docs)] pub $tag: &'a str,)+
            $(#[allow(missing_docs)] pub $field: $fty,)*
        }
        $(
            const _: () = assert!(
                $crate::row::same_name($tagdef.name, stringify!($tag)),
                concat!("tag ", stringify!($tag), " is declared with another name")
            );
        )+
        $crate::table!(@checks $($field : $fty = $($ctor)::+ ($($arg),*)),*);
        impl $crate::row::Row for $row<'_> {
            fn table() -> &'static $crate::schema::TableDef {
                &$table
            }
            fn push_into(&self, time_us: i64, rows: &mut $crate::batch::BatchBuilder) -> $crate::error::Result<()> {
                rows.push(
                    time_us,
                    &[$(self.$tag),+],
                    &[$($crate::row::FieldValue::value(&self.$field)),*],
                )
            }
        }
    };
    (@checks $($field:ident : $fty:ty = $($ctor:ident)::+ ($($arg:expr),*)),*) => {
        $(
            const _: () = assert!(
                $crate::row::same_type(
                    <$fty as $crate::row::FieldValue>::TYPE,
                    $($ctor)::+(stringify!($field), $($arg),*).ty,
                ),
                concat!("field ", stringify!($field), "'s Rust type is not its column's type")
            );
        )*
    };
}

#[cfg(test)]
mod tests {
    use crate::batch::{BatchBuilder, Values};
    use crate::schema::{FieldDef, FieldType, TagDef, Unit};

    const GPU: TagDef = TagDef {
        name: "gpu",
        help: "GPU index.",
    };

    crate::table! {
        static LINKS: TableDef, struct LinkRow {
            name: "links",
            help: "A test table.",
            tags: [gpu = GPU],
            fields: [
                rx_bytes: Option<u64> = FieldDef::counter(FieldType::U64, Unit::Bytes, "Received."),
                tx_bytes: u64 = FieldDef::counter(FieldType::U64, Unit::Bytes, "Sent."),
                ratio: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Ratio, "A ratio."),
            ],
            exported: true,
        }
    }

    crate::table! {
        static PLAIN: TableDef, struct PlainRow {
            name: "plain",
            help: "A test table without tags.",
            tags: [],
            fields: [level: i64 = FieldDef::gauge(FieldType::I64, Unit::None, "A level.")],
            exported: false,
        }
    }

    #[test]
    fn a_row_lands_in_the_columns_its_names_say() {
        assert_eq!(
            LINKS.fields.iter().map(|f| f.name).collect::<Vec<_>>(),
            ["rx_bytes", "tx_bytes", "ratio"]
        );
        let mut rows = BatchBuilder::new(&LINKS);
        let row = LinkRow {
            gpu: "3",
            tx_bytes: 7,
            rx_bytes: None,
            ratio: Some(0.5),
        };
        rows.push_row(10, &row).unwrap();
        let batch = rows.finish();
        assert_eq!(batch.len(), 1);
        let rx = &batch.fields[LINKS.field_index("rx_bytes").unwrap()];
        assert!(!rx.is_valid(0));
        let tx = &batch.fields[LINKS.field_index("tx_bytes").unwrap()];
        assert_eq!(tx.values, Values::U64(vec![7]));
        let ratio = &batch.fields[LINKS.field_index("ratio").unwrap()];
        assert_eq!(ratio.values, Values::F64(vec![0.5]));
    }

    #[test]
    fn a_default_row_is_null_where_the_column_may_be() {
        let mut rows = BatchBuilder::new(&LINKS);
        let mut row = LinkRow::default();
        assert_eq!((row.gpu, row.rx_bytes, row.tx_bytes), ("", None, 0));
        row.gpu = "1";
        row.ratio = Some(0.25);
        rows.push_row(10, &row).unwrap();
        let batch = rows.finish();
        assert_eq!(batch.tags[0].dict, ["1"]);
        assert!(!batch.fields[0].is_valid(0));
        assert_eq!(batch.fields[1].values, Values::U64(vec![0]));
        assert_eq!(batch.fields[2].values, Values::F64(vec![0.25]));
    }

    #[test]
    fn a_row_of_another_table_is_refused() {
        let mut rows = BatchBuilder::new(&LINKS);
        let err = rows.push_row(1, &PlainRow { level: -1 }).unwrap_err();
        assert!(err
            .to_string()
            .contains("a row of table plain pushed into table links"));
        let mut rows = BatchBuilder::new(&PLAIN);
        rows.push_row(1, &PlainRow { level: -1 }).unwrap();
        assert_eq!(rows.finish().fields[0].values, Values::I64(vec![-1]));
    }
}
