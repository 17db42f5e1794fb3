//! Records into columns: one MessagePack payload or one JSON line at a time, appended to the
//! columns of the batch being built (only the selected ones; the rest is skipped unbuilt).

use arrow_array::RecordBatch;
use jiter::{Jiter, JiterError, NumberAny, NumberInt, Peek};

use super::builder::{finish_batch, BuildResult, Column, Leaf};
use crate::codec::lines::nesting_exceeds;
use crate::codec::msgpack::{self, Cursor, Scalar, Token};
use crate::codec::MAX_JSON_DEPTH;

/// Builds the record batch of consecutive records.
pub struct RecordBuilder {
    root: Column,
    /// The top-level keys to build, in batch column order (`None`: every key, first-seen order).
    columns: Option<Vec<String>>,
    /// Memory the batch's values take, roughly (for cutting batches by size).
    bytes: usize,
}

/// What one JSON line held.
#[derive(Debug, PartialEq)]
pub enum JsonRow {
    Record,
    /// Not JSON, or not an object: the caller logs and skips it (nothing was added).
    Invalid,
    /// Nested deeper than [`MAX_JSON_DEPTH`] levels.
    TooDeep,
}

enum JsonFailure {
    Syntax,
    TooDeep,
    Build(String),
}

impl From<JiterError> for JsonFailure {
    fn from(_: JiterError) -> Self {
        JsonFailure::Syntax
    }
}

impl From<String> for JsonFailure {
    fn from(reason: String) -> Self {
        JsonFailure::Build(reason)
    }
}

impl RecordBuilder {
    pub fn new(columns: Option<Vec<String>>) -> Self {
        let mut builder = Self {
            root: Column::root(),
            columns,
            bytes: 0,
        };
        builder.select();
        builder
    }

    /// Selected columns exist from the first row on, in the order asked for (a key no record
    /// holds is a column of nulls).
    fn select(&mut self) {
        for key in self.columns.iter().flatten() {
            // The root is a map column, so this cannot fail.
            let _ = self.root.field(key);
        }
    }

    fn selected(&self, key: &str) -> bool {
        self.columns
            .as_ref()
            .is_none_or(|columns| columns.iter().any(|c| c == key))
    }

    pub fn rows(&self) -> usize {
        self.root.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The batch of the records appended since the last call.
    pub fn finish(&mut self) -> BuildResult<RecordBatch> {
        self.bytes = 0;
        let batch = finish_batch(&mut self.root);
        self.select();
        batch
    }

    /// Appends one validated MessagePack record (a map with string keys).
    pub fn push_msgpack(&mut self, payload: &[u8]) -> BuildResult<()> {
        let row = self.root.len();
        let result = self.push_msgpack_record(payload);
        if result.is_err() {
            self.root.truncate(row);
        }
        result
    }

    fn push_msgpack_record(&mut self, payload: &[u8]) -> BuildResult<()> {
        let mut cursor = Cursor::new(payload);
        let Token::Map(entries) = cursor.token()? else {
            return Err(msgpack::NOT_A_MAP.to_owned());
        };
        self.root.begin_struct()?;
        for _ in 0..entries {
            let Token::Scalar(Scalar::Str(key)) = cursor.token()? else {
                return Err(msgpack::NON_STRING_KEY.to_owned());
            };
            let token = cursor.token()?;
            if self.selected(key) {
                push_msgpack_value(self.root.field(key)?, &mut cursor, token, &mut self.bytes)?;
            } else {
                skip_msgpack_value(&mut cursor, token)?;
            }
        }
        if cursor.remaining() != 0 {
            return Err(msgpack::INVALID_PAYLOAD.to_owned());
        }
        self.root.end_struct();
        Ok(())
    }

    /// Appends one JSON line (as `json.loads` reads it: NaN and Infinity are floats, a repeated
    /// key keeps its last value). An invalid line adds nothing; a value the columns cannot hold
    /// is an error.
    pub fn push_json(&mut self, line: &[u8]) -> BuildResult<JsonRow> {
        let row = self.root.len();
        let result = self.push_json_record(line);
        if result.is_ok() {
            return Ok(JsonRow::Record);
        }
        self.root.truncate(row);
        match result {
            Ok(()) | Err(JsonFailure::Syntax) => Ok(JsonRow::Invalid),
            Err(JsonFailure::TooDeep) => Ok(JsonRow::TooDeep),
            // Too deep for a column, and for the record path too.
            Err(JsonFailure::Build(_)) if nesting_exceeds(line, MAX_JSON_DEPTH) => {
                Ok(JsonRow::TooDeep)
            }
            // A line that is not JSON at all is skipped even if a value came first that the
            // columns could not hold, as the record path skips it.
            Err(JsonFailure::Build(_)) if !is_json(line) => Ok(JsonRow::Invalid),
            Err(JsonFailure::Build(reason)) => Err(reason),
        }
    }

    fn push_json_record(&mut self, line: &[u8]) -> Result<(), JsonFailure> {
        let mut jiter = Jiter::new(line).with_allow_inf_nan();
        if jiter.peek()? != Peek::Object {
            return Err(JsonFailure::Syntax);
        }
        self.root.begin_struct()?;
        let mut key = jiter.known_object()?.map(str::to_owned);
        while let Some(name) = key {
            let peek = jiter.peek()?;
            if self.selected(&name) {
                let column = self.root.field(&name)?;
                push_json_value(column, &mut jiter, peek, 2, &mut self.bytes)?;
            } else {
                jiter.known_skip(peek)?;
            }
            key = jiter.next_key()?.map(str::to_owned);
        }
        jiter.finish()?;
        self.root.end_struct();
        Ok(())
    }
}

/// Whether `line` is one JSON value, at any depth (jiter's own skip stops at 200 levels, and
/// the record path reads deeper lines): a walk with a stack of open containers.
fn is_json(line: &[u8]) -> bool {
    let mut jiter = Jiter::new(line).with_allow_inf_nan();
    json_walk(&mut jiter).is_ok()
}

fn json_walk(jiter: &mut Jiter<'_>) -> Result<(), JiterError> {
    // Per open container: whether it is an object.
    let mut open: Vec<bool> = Vec::new();
    let mut peek = jiter.peek()?;
    loop {
        let entered = match peek {
            Peek::Array => jiter.known_array()?.map(|first| (false, first)),
            Peek::Object => match jiter.known_object()? {
                Some(_) => Some((true, jiter.peek()?)),
                None => None,
            },
            _ => {
                jiter.known_skip(peek)?;
                None
            }
        };
        if let Some((is_object, first)) = entered {
            open.push(is_object);
            peek = first;
            continue;
        }
        // A value ended: step to the next one of the innermost open container.
        loop {
            let next = match open.last() {
                None => return jiter.finish(),
                Some(false) => jiter.array_step()?,
                Some(true) => match jiter.next_key()? {
                    Some(_) => Some(jiter.peek()?),
                    None => None,
                },
            };
            match next {
                Some(next) => {
                    peek = next;
                    break;
                }
                None => {
                    open.pop();
                }
            }
        }
    }
}

/// Whether a jsonl line is a record (a JSON object) rather than one to skip, without building it.
pub fn is_json_record(line: &[u8]) -> bool {
    let mut jiter = Jiter::new(line).with_allow_inf_nan();
    jiter.peek().is_ok_and(|peek| peek == Peek::Object) && is_json(line)
}

fn leaf<'a>(column: &Column, scalar: Scalar<'a>) -> BuildResult<Leaf<'a>> {
    Ok(match scalar {
        Scalar::Nil => Leaf::Null,
        Scalar::Bool(b) => Leaf::Bool(b),
        Scalar::Int(i) => Leaf::Int(i),
        Scalar::UInt(u) => Leaf::Int(i64::try_from(u).map_err(|_| out_of_range(column, u))?),
        Scalar::Float(f) => Leaf::Float(f),
        Scalar::Str(s) => Leaf::Str(s),
        Scalar::Bin(b) => Leaf::Bin(b),
    })
}

fn out_of_range(column: &Column, value: impl std::fmt::Display) -> String {
    format!(
        "column {:?} holds the integer {value}, outside the int64 range",
        column.path()
    )
}

/// Appends one MessagePack value (its first token already read) to `column`. Recursive: the
/// frames' validation has already bounded nesting to [`msgpack::MAX_DEPTH`] levels.
fn push_msgpack_value(
    column: &mut Column,
    cursor: &mut Cursor<'_>,
    token: Token<'_>,
    bytes: &mut usize,
) -> BuildResult<()> {
    match token {
        Token::Scalar(scalar) => {
            let value = leaf(column, scalar)?;
            column.push_leaf(value, bytes)
        }
        Token::Array(items) => {
            column.begin_list()?;
            let child = column.list_items()?;
            let mut left = items;
            while left > 0 {
                left -= push_msgpack_ints(child, cursor, left, bytes);
                if left > 0 {
                    let token = cursor.token()?;
                    push_msgpack_value(child, cursor, token, bytes)?;
                    left -= 1;
                }
            }
            column.end_list(bytes)
        }
        Token::Map(entries) => {
            column.begin_struct()?;
            for _ in 0..entries {
                let Token::Scalar(Scalar::Str(key)) = cursor.token()? else {
                    return Err(msgpack::NON_STRING_KEY.to_owned());
                };
                let token = cursor.token()?;
                push_msgpack_value(column.field(key)?, cursor, token, bytes)?;
            }
            column.end_struct();
            Ok(())
        }
    }
}

/// Appends the run of (at most `most`) integers at the cursor to an int column in one tight
/// loop: token id lists are most of what LLM datasets hold. Returns how many it took (0 for
/// a column of another type, or when the next value is not an int that fits an i64).
fn push_msgpack_ints(
    column: &mut Column,
    cursor: &mut Cursor<'_>,
    most: usize,
    bytes: &mut usize,
) -> usize {
    let Some(ints) = column.int_values() else {
        return 0;
    };
    // At least one byte per value: the payload bounds the reservation.
    ints.reserve(most.min(cursor.remaining()));
    let taken = cursor.ints(most, ints);
    column.appended_ints(taken, bytes);
    taken
}

/// Passes over a value of an unselected column without building it.
fn skip_msgpack_value(cursor: &mut Cursor<'_>, token: Token<'_>) -> BuildResult<()> {
    // Values still to pass: a map's entries count twice (key and value).
    let mut pending = match token {
        Token::Scalar(_) => return Ok(()),
        Token::Array(items) => items,
        Token::Map(entries) => entries * 2,
    };
    while pending > 0 {
        pending -= 1;
        match cursor.token()? {
            Token::Scalar(_) => {}
            Token::Array(items) => pending += items,
            Token::Map(entries) => pending += entries * 2,
        }
    }
    Ok(())
}

/// Appends one JSON value (`peek` is its first byte) at nesting level `depth` to `column`.
fn push_json_value(
    column: &mut Column,
    jiter: &mut Jiter<'_>,
    peek: Peek,
    depth: usize,
    bytes: &mut usize,
) -> Result<(), JsonFailure> {
    match peek {
        Peek::Null => {
            jiter.known_null()?;
            column.push_null();
        }
        Peek::True | Peek::False => {
            let value = jiter.known_bool(peek)?;
            column.push_leaf(Leaf::Bool(value), bytes)?;
        }
        Peek::String => {
            let value = jiter.known_str()?;
            column.push_leaf(Leaf::Str(value), bytes)?;
        }
        Peek::Array => {
            if depth > MAX_JSON_DEPTH {
                return Err(JsonFailure::TooDeep);
            }
            column.begin_list()?;
            let child = column.list_items()?;
            let mut item = jiter.known_array()?;
            while let Some(peek) = item {
                push_json_value(child, jiter, peek, depth + 1, bytes)?;
                item = jiter.array_step()?;
            }
            column.end_list(bytes)?;
        }
        Peek::Object => {
            if depth > MAX_JSON_DEPTH {
                return Err(JsonFailure::TooDeep);
            }
            column.begin_struct()?;
            let mut key = jiter.known_object()?.map(str::to_owned);
            while let Some(name) = key {
                let peek = jiter.peek()?;
                push_json_value(column.field(&name)?, jiter, peek, depth + 1, bytes)?;
                key = jiter.next_key()?.map(str::to_owned);
            }
            column.end_struct();
        }
        _ => {
            let value = match jiter.known_number(peek)? {
                NumberAny::Int(NumberInt::Int(i)) => Leaf::Int(i),
                // jiter gives -2**63 as a big integer.
                NumberAny::Int(NumberInt::BigInt(big)) => match i64::try_from(&big) {
                    Ok(i) => Leaf::Int(i),
                    Err(_) => return Err(JsonFailure::Build(out_of_range(column, big))),
                },
                NumberAny::Float(f) => Leaf::Float(f),
            };
            column.push_leaf(value, bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type};
    use arrow_array::Array;
    use arrow_schema::DataType;

    use super::*;

    #[test]
    fn is_json_takes_any_depth_and_refuses_broken_lines() {
        let deep = |depth: usize| format!("{{\"v\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        assert!(is_json(deep(500).as_bytes()));
        assert!(is_json(
            br#"{"a": [1, {"b": [], "c": {}}, "x"], "d": null}"#
        ));
        assert!(is_json(b"[]") && is_json(b"3") && is_json(b"{}"));
        for broken in [
            &b"{"[..],
            b"[1,]",
            b"{\"a\" 1}",
            b"[1] 2",
            b"",
            b"{\"a\":[1}",
        ] {
            assert!(!is_json(broken), "{:?}", String::from_utf8_lossy(broken));
        }
        let mut truncated = deep(500);
        truncated.pop();
        assert!(!is_json(truncated.as_bytes()));
    }

    #[test]
    fn a_line_nested_too_deep_for_arrow_is_an_error_and_past_1000_too_deep() {
        let mut builder = RecordBuilder::new(None);
        let line = |depth: usize| format!("{{\"v\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        let error = builder.push_json(line(70).as_bytes()).unwrap_err();
        assert!(error.contains("nests deeper than 63 levels"), "{error}");
        assert_eq!(
            builder.push_json(line(1000).as_bytes()),
            Ok(JsonRow::TooDeep)
        );
        assert_eq!(
            builder.push_json(b"{\"v\": [[[1]]] junk"),
            Ok(JsonRow::Invalid)
        );
        assert_eq!(builder.rows(), 0);
    }

    fn json_batch(lines: &[&str], columns: Option<&[&str]>) -> BuildResult<RecordBatch> {
        let columns = columns.map(|c| c.iter().map(|s| s.to_string()).collect());
        let mut builder = RecordBuilder::new(columns);
        for line in lines {
            builder.push_json(line.as_bytes())?;
        }
        builder.finish()
    }

    #[test]
    fn ints_meeting_floats_become_float64() {
        let batch = json_batch(&[r#"{"x": 1}"#, r#"{"x": 2.5}"#, r#"{"x": 3}"#], None).unwrap();
        let x = batch.column(0).as_primitive::<Float64Type>();
        assert_eq!(x.values().to_vec(), vec![1.0, 2.5, 3.0]);
    }

    #[test]
    fn missing_keys_and_nulls_are_nulls() {
        let batch = json_batch(&[r#"{"a": 1}"#, r#"{"b": "x"}"#, r#"{"a": null}"#], None).unwrap();
        assert_eq!(batch.schema().field(0).name(), "a");
        assert_eq!(batch.schema().field(1).name(), "b");
        let a = batch.column(0).as_primitive::<Int64Type>();
        assert!(a.is_valid(0) && a.is_null(1) && a.is_null(2));
        let b = batch.column(1).as_string::<i32>();
        assert!(b.is_null(0) && b.value(1) == "x" && b.is_null(2));
    }

    #[test]
    fn an_all_null_column_is_null_typed_and_lists_nest() {
        let batch = json_batch(
            &[r#"{"n": null, "t": [[1, 2], []], "m": {"k": true}}"#],
            None,
        )
        .unwrap();
        assert_eq!(batch.column(0).data_type(), &DataType::Null);
        let DataType::List(item) = batch.column(1).data_type() else {
            panic!("not a list");
        };
        assert!(
            matches!(item.data_type(), DataType::List(inner) if inner.data_type() == &DataType::Int64)
        );
        assert!(matches!(batch.column(2).data_type(), DataType::Struct(f) if f.len() == 1));
    }

    #[test]
    fn mixed_types_name_the_column() {
        let err =
            json_batch(&[r#"{"m": {"k": [1]}}"#, r#"{"m": {"k": ["x"]}}"#], None).unwrap_err();
        assert_eq!(err, r#"column "m.k[]" mixes int and str values"#);
        let err = json_batch(&[r#"{"a": 1}"#, r#"{"a": {"b": 1}}"#], None).unwrap_err();
        assert_eq!(err, r#"column "a" mixes int and map values"#);
        let err = json_batch(&[r#"{"a": 99999999999999999999}"#], None).unwrap_err();
        assert!(err.contains("outside the int64 range"), "{err}");
    }

    #[test]
    fn an_invalid_line_adds_nothing() {
        let mut builder = RecordBuilder::new(None);
        assert_eq!(builder.push_json(br#"{"a": 1}"#), Ok(JsonRow::Record));
        assert_eq!(
            builder.push_json(br#"{"a": 2, "new": {"x": 1}, "#),
            Ok(JsonRow::Invalid)
        );
        assert_eq!(builder.push_json(b"[1, 2]"), Ok(JsonRow::Invalid));
        // Not JSON at all, though its first value would not fit the column: skipped.
        assert_eq!(
            builder.push_json(br#"{"a": "s", oops}"#),
            Ok(JsonRow::Invalid)
        );
        let batch = builder.finish().unwrap();
        assert_eq!(batch.num_rows(), 1);
        assert_eq!(batch.num_columns(), 1);
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value() {
        let batch = json_batch(&[r#"{"a": [1, 2], "a": [3]}"#], None).unwrap();
        let a = batch.column(0).as_list::<i32>();
        assert_eq!(
            a.value(0).as_primitive::<Int64Type>().values().to_vec(),
            vec![3]
        );
    }

    #[test]
    fn selected_columns_come_in_order_and_the_rest_is_skipped() {
        let lines = [r#"{"a": 1, "b": {"deep": [1, "mixed"]}, "c": "x"}"#];
        let batch = json_batch(&lines, Some(&["c", "missing", "a"])).unwrap();
        let names: Vec<_> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["c", "missing", "a"]);
        assert_eq!(batch.column(1).data_type(), &DataType::Null);
    }

    #[test]
    fn too_deep_json_is_reported() {
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(1000), "]".repeat(1000));
        let mut builder = RecordBuilder::new(None);
        assert_eq!(builder.push_json(deep.as_bytes()), Ok(JsonRow::TooDeep));
        // Within the record path's limit, beyond what Arrow readers import: an error.
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(999), "]".repeat(999));
        let error = builder.push_json(deep.as_bytes()).unwrap_err();
        assert!(error.contains("nests deeper than 63 levels"), "{error}");
        let ok = format!("{{\"a\": {}{}}}", "[".repeat(62), "]".repeat(62));
        assert_eq!(builder.push_json(ok.as_bytes()), Ok(JsonRow::Record));
        assert_eq!(builder.finish().unwrap().num_rows(), 1);
    }

    #[test]
    fn msgpack_records_build_the_same_columns() {
        let mut payload = Vec::new();
        msgpack::write_map_header(&mut payload, 3).unwrap();
        msgpack::write_str(&mut payload, "tokens").unwrap();
        msgpack::write_array_header(&mut payload, 2).unwrap();
        msgpack::write_uint(&mut payload, 7);
        msgpack::write_int(&mut payload, -3);
        msgpack::write_str(&mut payload, "bin").unwrap();
        msgpack::write_bin_header(&mut payload, 2).unwrap();
        payload.extend_from_slice(b"\x00\xff");
        msgpack::write_str(&mut payload, "big").unwrap();
        msgpack::write_uint(&mut payload, u64::MAX);
        let mut builder = RecordBuilder::new(Some(vec!["tokens".into(), "bin".into()]));
        builder.push_msgpack(&payload).unwrap();
        let batch = builder.finish().unwrap();
        let tokens = batch.column(0).as_list::<i32>().value(0);
        assert_eq!(
            tokens.as_primitive::<Int64Type>().values().to_vec(),
            vec![7, -3]
        );
        assert_eq!(batch.column(1).as_binary::<i32>().value(0), b"\x00\xff");
        // The unselected out-of-range int is skipped, not built; selected, it is an error.
        let mut builder = RecordBuilder::new(None);
        let err = builder.push_msgpack(&payload).unwrap_err();
        assert!(err.contains("\"big\""), "{err}");
        assert_eq!(builder.rows(), 0);
    }
}
