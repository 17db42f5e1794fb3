//! Arrow arrays built from records whose types are learned while reading (the schema rules of
//! README "Columnar batches"): a column starts untyped (all nulls) and takes the type of its
//! first value; ints meeting floats become float64; any other mix is an error naming the column.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Float64Array, Int64Array, ListArray, NullArray,
    RecordBatch, RecordBatchOptions, StringArray, StructArray,
};
use arrow_buffer::{BooleanBufferBuilder, Buffer, NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Fields, Schema};

use super::recycled::{int_buffer, int_vec};

/// The deepest a column may nest (a top-level column is at level 1, each list item or map
/// field one deeper): Arrow C++ (pyarrow) refuses to import a schema nested 64 levels or more.
pub const MAX_ARROW_DEPTH: usize = 63;

/// A value the builder cannot store, with the column it was meant for.
pub type BuildResult<T> = Result<T, String>;

/// A leaf value handed to a column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Leaf<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
    Bin(&'a [u8]),
}

impl Leaf<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Leaf::Null => "null",
            Leaf::Bool(_) => "bool",
            Leaf::Int(_) => "int",
            Leaf::Float(_) => "float",
            Leaf::Str(_) => "str",
            Leaf::Bin(_) => "bytes",
        }
    }
}

/// The values of a typed column (its nulls are kept apart, in `Column::nulls`); a null slot
/// holds a default value.
enum Values {
    /// No value but null seen yet.
    Untyped,
    Bool(BooleanBufferBuilder),
    Int(Vec<i64>),
    Float(Vec<f64>),
    Str(Offsets, Vec<u8>),
    Bin(Offsets, Vec<u8>),
    List(Offsets, Box<Column>),
    Struct(StructFields),
}

impl Values {
    fn kind(&self) -> &'static str {
        match self {
            Values::Untyped => "null",
            Values::Bool(_) => "bool",
            Values::Int(_) => "int",
            Values::Float(_) => "float",
            Values::Str(..) => "str",
            Values::Bin(..) => "bytes",
            Values::List(..) => "list",
            Values::Struct(_) => "map",
        }
    }
}

/// Arrow offsets (`len + 1` entries, starting at 0).
struct Offsets(Vec<i32>);

impl Offsets {
    fn with_rows(rows: usize) -> Self {
        Self(vec![0; rows + 1])
    }

    fn last(&self) -> i32 {
        self.0.last().copied().unwrap_or(0)
    }

    /// Closes a slot that ends at `end` (bytes or child items).
    fn push(&mut self, end: usize, path: &str) -> BuildResult<()> {
        let end = i32::try_from(end)
            .map_err(|_| format!("column {path:?} holds more than 2 GiB in one batch"))?;
        self.0.push(end);
        Ok(())
    }

    fn repeat_last(&mut self) {
        let last = self.last();
        self.0.push(last);
    }

    fn truncate(&mut self, rows: usize) -> usize {
        self.0.truncate(rows + 1);
        self.last() as usize
    }

    fn finish(self) -> OffsetBuffer<i32> {
        // Built only by push / repeat_last from 0, so never decreasing.
        OffsetBuffer::new(ScalarBuffer::from(self.0))
    }
}

/// The named children of a map column, in first-seen order.
#[derive(Default)]
struct StructFields {
    columns: Vec<Column>,
    index: HashMap<String, usize>,
    /// The row of the parent at which each child was first seen (earlier rows are nulls).
    first_rows: Vec<usize>,
}

/// One column of a batch: its values, which of them are null, its name and its path from the
/// record's root (for messages: "meta.tags[]").
pub struct Column {
    name: String,
    path: String,
    /// Its nesting level (the root is 0).
    depth: usize,
    len: usize,
    nulls: NullBufferBuilder,
    values: Values,
}

impl Column {
    fn new(name: String, path: String, depth: usize) -> Self {
        Self {
            name,
            path,
            depth,
            len: 0,
            nulls: NullBufferBuilder::new(0),
            values: Values::Untyped,
        }
    }

    /// The column of whole records: a map column whose children become the batch's columns.
    pub fn root() -> Self {
        let mut root = Self::new(String::new(), String::new(), 0);
        root.values = Values::Struct(StructFields::default());
        root
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Where the column sits in a record ("meta.tags[]"), for messages.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The level of a new child column, or the error when it would nest too deep.
    fn child_depth(&self) -> BuildResult<usize> {
        if self.depth >= MAX_ARROW_DEPTH {
            return Err(too_deep(&format!("{}[]", self.path)));
        }
        Ok(self.depth + 1)
    }

    fn conflict(&self, found: &str) -> String {
        format!(
            "column {:?} mixes {} and {} values",
            self.path,
            self.values.kind(),
            found
        )
    }

    /// Appends a leaf. `bytes` counts the memory it takes (for batch sizing).
    pub fn push_leaf(&mut self, leaf: Leaf<'_>, bytes: &mut usize) -> BuildResult<()> {
        if let Leaf::Null = leaf {
            self.push_null();
            return Ok(());
        }
        if let Values::Untyped = self.values {
            self.values = typed_like(&leaf, self.len);
        }
        // An int meeting a float column, or a float meeting an int column: float64.
        if let (Values::Int(ints), Leaf::Float(_)) = (&self.values, &leaf) {
            self.values = Values::Float(ints.iter().map(|&i| i as f64).collect());
        }
        match (&mut self.values, leaf) {
            (Values::Bool(values), Leaf::Bool(b)) => values.append(b),
            (Values::Int(values), Leaf::Int(i)) => values.push(i),
            (Values::Float(values), Leaf::Float(f)) => values.push(f),
            (Values::Float(values), Leaf::Int(i)) => values.push(i as f64),
            (Values::Str(offsets, data), Leaf::Str(s)) => {
                data.extend_from_slice(s.as_bytes());
                offsets.push(data.len(), &self.path)?;
                *bytes += s.len();
            }
            (Values::Bin(offsets, data), Leaf::Bin(b)) => {
                data.extend_from_slice(b);
                offsets.push(data.len(), &self.path)?;
                *bytes += b.len();
            }
            (_, leaf) => return Err(self.conflict(leaf.kind())),
        }
        *bytes += 8;
        self.nulls.append_non_null();
        self.len += 1;
        Ok(())
    }

    /// The int values of an int column, for appending a run of non-null ints in one go
    /// (then [`Column::appended_ints`]); `None` for a column of another type.
    pub fn int_values(&mut self) -> Option<&mut Vec<i64>> {
        match &mut self.values {
            Values::Int(values) => Some(values),
            _ => None,
        }
    }

    /// Counts `count` ints appended through [`Column::int_values`].
    pub fn appended_ints(&mut self, count: usize, bytes: &mut usize) {
        self.nulls.append_n_non_nulls(count);
        self.len += count;
        *bytes += 8 * count;
    }

    pub fn push_null(&mut self) {
        match &mut self.values {
            Values::Untyped => {}
            Values::Bool(values) => values.append(false),
            Values::Int(values) => values.push(0),
            Values::Float(values) => values.push(0.0),
            Values::Str(offsets, _) | Values::Bin(offsets, _) | Values::List(offsets, _) => {
                offsets.repeat_last()
            }
            Values::Struct(fields) => {
                for column in &mut fields.columns {
                    column.push_null();
                }
            }
        }
        self.nulls.append_null();
        self.len += 1;
    }

    /// Opens a list slot: its items are then pushed to [`Column::list_items`] and the slot
    /// closed by [`Column::end_list`].
    pub fn begin_list(&mut self) -> BuildResult<()> {
        if let Values::Untyped = self.values {
            let path = format!("{}[]", self.path);
            let child = Column::new("item".to_owned(), path, self.child_depth()?);
            self.values = Values::List(Offsets::with_rows(self.len), Box::new(child));
        }
        match self.values {
            Values::List(..) => Ok(()),
            _ => Err(self.conflict("list")),
        }
    }

    /// The child column of a list column (after `begin_list`).
    pub fn list_items(&mut self) -> BuildResult<&mut Column> {
        if !matches!(self.values, Values::List(..)) {
            return Err(self.conflict("list"));
        }
        match &mut self.values {
            Values::List(_, child) => Ok(child),
            _ => Err(String::new()),
        }
    }

    pub fn end_list(&mut self, bytes: &mut usize) -> BuildResult<()> {
        let Values::List(offsets, child) = &mut self.values else {
            return Err(self.conflict("list"));
        };
        offsets.push(child.len, &self.path)?;
        *bytes += 4;
        self.nulls.append_non_null();
        self.len += 1;
        Ok(())
    }

    /// Opens a map slot: its entries go to [`Column::field`], and [`Column::end_struct`]
    /// closes it (keys it did not hold become nulls).
    pub fn begin_struct(&mut self) -> BuildResult<()> {
        if let Values::Untyped = self.values {
            self.values = Values::Struct(StructFields::default());
        }
        match self.values {
            Values::Struct(_) => Ok(()),
            _ => Err(self.conflict("map")),
        }
    }

    /// The child column for `key` in the open map slot: created on first sight (with nulls
    /// for the rows before), emptied of this row's earlier value when a key repeats (the last
    /// value wins, as in a dict).
    pub fn field(&mut self, key: &str) -> BuildResult<&mut Column> {
        let row = self.len;
        let prefix = struct_prefix(&self.path);
        if !matches!(self.values, Values::Struct(_)) {
            return Err(self.conflict("map"));
        }
        let Values::Struct(fields) = &mut self.values else {
            return Err(String::new());
        };
        let at = match fields.index.get(key) {
            Some(&at) => {
                if fields.columns[at].len > row {
                    fields.columns[at].truncate(row);
                }
                at
            }
            None => {
                let depth = self.depth + 1;
                if depth > MAX_ARROW_DEPTH {
                    return Err(too_deep(&format!("{prefix}{key}")));
                }
                let mut column = Column::new(key.to_owned(), format!("{prefix}{key}"), depth);
                for _ in 0..row {
                    column.push_null();
                }
                fields.index.insert(key.to_owned(), fields.columns.len());
                fields.columns.push(column);
                fields.first_rows.push(row);
                fields.columns.len() - 1
            }
        };
        Ok(&mut fields.columns[at])
    }

    pub fn end_struct(&mut self) {
        let row = self.len;
        if let Values::Struct(fields) = &mut self.values {
            for column in &mut fields.columns {
                if column.len == row {
                    column.push_null();
                }
            }
        }
        self.nulls.append_non_null();
        self.len += 1;
    }

    /// Drops the slots from `rows` on (a record that turned out invalid); children first seen
    /// in a dropped row are dropped too, so the schema is as if the record never came.
    pub fn truncate(&mut self, rows: usize) {
        // At `rows == len` a slot may still be open (a map or list begun, not ended): its
        // children hold values of it that must go too.
        if rows > self.len {
            return;
        }
        match &mut self.values {
            Values::Untyped => {}
            Values::Bool(values) => values.truncate(rows),
            Values::Int(values) => values.truncate(rows),
            Values::Float(values) => values.truncate(rows),
            Values::Str(offsets, data) | Values::Bin(offsets, data) => {
                let end = offsets.truncate(rows);
                data.truncate(end);
            }
            Values::List(offsets, child) => {
                let end = offsets.truncate(rows);
                child.truncate(end);
            }
            Values::Struct(fields) => {
                let keep = fields.first_rows.iter().take_while(|&&r| r < rows).count();
                // Children are added in row order, so the dropped ones are the last ones.
                fields.columns.truncate(keep);
                fields.first_rows.truncate(keep);
                fields.index.retain(|_, at| *at < keep);
                for column in &mut fields.columns {
                    column.truncate(rows);
                }
            }
        }
        self.nulls.truncate(rows);
        self.len = rows;
    }

    /// The Arrow array of this column, leaving it empty.
    pub fn finish(&mut self) -> (DataType, ArrayRef) {
        let len = std::mem::take(&mut self.len);
        let nulls = std::mem::replace(&mut self.nulls, NullBufferBuilder::new(0)).finish();
        let values = std::mem::replace(&mut self.values, Values::Untyped);
        let array: ArrayRef = match values {
            Values::Untyped => Arc::new(NullArray::new(len)),
            Values::Bool(mut values) => Arc::new(BooleanArray::new(values.finish(), nulls)),
            Values::Int(values) => Arc::new(Int64Array::new(int_buffer(values), nulls)),
            Values::Float(values) => Arc::new(Float64Array::new(values.into(), nulls)),
            Values::Str(offsets, data) => {
                // SAFETY: `data` is the concatenation of `&str` values (valid UTF-8) and every
                // offset ends one of them, so each slice is valid UTF-8 and in bounds.
                Arc::new(unsafe {
                    StringArray::new_unchecked(offsets.finish(), Buffer::from_vec(data), nulls)
                })
            }
            Values::Bin(offsets, data) => Arc::new(BinaryArray::new(
                offsets.finish(),
                Buffer::from_vec(data),
                nulls,
            )),
            Values::List(offsets, mut child) => {
                let (item_type, items) = child.finish();
                let item = Arc::new(Field::new("item", item_type, true));
                Arc::new(ListArray::new(item, offsets.finish(), items, nulls))
            }
            Values::Struct(fields) => {
                let (fields, arrays) = finish_fields(fields.columns);
                if fields.is_empty() {
                    Arc::new(StructArray::new_empty_fields(len, nulls))
                } else {
                    Arc::new(StructArray::new(fields, arrays, nulls))
                }
            }
        };
        (array.data_type().clone(), array)
    }
}

/// The record batch of a root map column, leaving it empty.
pub fn finish_batch(root: &mut Column) -> BuildResult<RecordBatch> {
    let rows = root.len;
    let columns = match std::mem::replace(&mut root.values, Values::Untyped) {
        Values::Struct(fields) => fields.columns,
        _ => Vec::new(),
    };
    root.len = 0;
    root.nulls = NullBufferBuilder::new(0);
    root.values = Values::Struct(StructFields::default());
    let (fields, arrays) = finish_fields(columns);
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), arrays, &options)
        .map_err(|e| format!("cannot assemble a record batch: {e}"))
}

fn finish_fields(columns: Vec<Column>) -> (Fields, Vec<ArrayRef>) {
    let mut fields = Vec::with_capacity(columns.len());
    let mut arrays = Vec::with_capacity(columns.len());
    for mut column in columns {
        let (data_type, array) = column.finish();
        fields.push(Field::new(
            std::mem::take(&mut column.name),
            data_type,
            true,
        ));
        arrays.push(array);
    }
    (fields.into(), arrays)
}

fn too_deep(path: &str) -> String {
    format!(
        "column {path:?} nests deeper than {MAX_ARROW_DEPTH} levels, more than Arrow readers \
         import (iter_shard reads such records)"
    )
}

fn struct_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}.")
    }
}

fn typed_like(leaf: &Leaf<'_>, rows: usize) -> Values {
    match leaf {
        Leaf::Null => Values::Untyped,
        Leaf::Bool(_) => {
            let mut values = BooleanBufferBuilder::new(rows);
            values.append_n(rows, false);
            Values::Bool(values)
        }
        Leaf::Int(_) => Values::Int(int_vec(rows)),
        Leaf::Float(_) => Values::Float(vec![0.0; rows]),
        Leaf::Str(_) => Values::Str(Offsets::with_rows(rows), Vec::new()),
        Leaf::Bin(_) => Values::Bin(Offsets::with_rows(rows), Vec::new()),
    }
}
