//! The Arrow types whose values are built here; any other is left to pyarrow.

use arrow_schema::{DataType, Field};

/// Whether every value of `field`, at every depth, is built here: int, float (float16 aside),
/// bool, str, bytes, lists, structs without repeated names and maps. Extension types are left
/// to pyarrow, whose `to_pylist` values may differ from their storage type's (`uuid.UUID` for
/// arrow.uuid, bool for arrow.bool8, ...), as are dictionaries, temporal, decimal, view and
/// union types.
pub fn is_native(field: &Field) -> bool {
    if field.metadata().contains_key("ARROW:extension:name") {
        return false;
    }
    match field.data_type() {
        DataType::Null
        | DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::FixedSizeBinary(_) => true,
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            is_native(item)
        }
        // to_pylist refuses repeated field names; pyarrow raises its own error.
        DataType::Struct(fields) => {
            fields
                .iter()
                .enumerate()
                .all(|(i, field)| fields[..i].iter().all(|f| f.name() != field.name()))
                && fields.iter().all(|field| is_native(field))
        }
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(pair) if pair.len() == 2 => is_native(entries),
            _ => false,
        },
        _ => false,
    }
}
