//! Projections: pure functions from events to the rows of a queryable view.
//!
//! A [`Projection`] reads the events of its source aggregate type, one at a time, with
//! their envelope ([`Event`]), and turns each into row changes of its view through
//! [`ViewChanges`]: `upsert(key, document)` or `delete(key)`. It may read the current row
//! of any key first (e.g. to change one field). It also declares the view's secondary
//! [`Index`]es: a field of the row document, its kind, and whether it is unique.
//!
//! Like aggregates, projections do no I/O and read no clock: timestamps come from the
//! event's record. The runtime (eventfold-runtime) tails the source log, applies the
//! projection and commits the rows, the index entries and the source offset in one local
//! write batch, so a view is exactly-once. [`ProjectionTest`] is the given/when/then
//! harness to test a projection without any runtime.
//!
//! **Sources.** Today a projection has one source aggregate type ([`Projection::Source`]);
//! the runtime keeps its checkpoints per source topic and partition, so more sources can be
//! added later without changing what is stored.
//!
//! **Unique indexes.** When a row's value for a unique index is already held by another
//! row, the index entry stays with the row that holds it (first writer wins): the new row
//! is stored, but is not reachable through that index for that value. The conflict is
//! reported (a warning in the log and `eventfold_view_unique_conflicts_total`). When the
//! holder changes or drops the value, the entry is removed; it is not handed over.

use crate::aggregate::Aggregate;
use crate::lookup::{LookupRows, Lookups};
use crate::time::{parse_rfc3339_ms, rfc3339_ms};
use serde_json::Value;
use std::collections::BTreeMap;

/// Longest row key accepted, in bytes.
pub const MAX_ROW_KEY_BYTES: usize = 1024;

/// One event with its envelope, as a projection sees it.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a, E> {
    /// Source aggregate type, e.g. `order`.
    pub aggregate_type: &'a str,
    /// Aggregate id.
    pub aggregate_id: &'a str,
    /// Version of the aggregate after this event (1-based).
    pub version: u64,
    /// Event type name (the `type` of the JSON document).
    pub event_type: &'a str,
    /// Record timestamp, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The decoded event.
    pub payload: &'a E,
    /// The lookup tables (see [`Event::lookup`]).
    pub lookups: &'a dyn Lookups,
}

impl<E> Event<'_, E> {
    /// Row `key` of lookup table `table` as it is when the event is applied. A rebuild
    /// applies old events against the table of its own time: to show a table's current
    /// value, declare a [`Join`] instead (read at query time, always current).
    pub fn lookup(&self, table: &str, key: &str) -> Option<Value> {
        self.lookups.get(table, key)
    }

    /// The record timestamp as RFC 3339 (UTC, milliseconds).
    pub fn timestamp(&self) -> String {
        rfc3339_ms(self.timestamp_ms)
    }
}

/// What a value of an index is: how a row's field is read and how a query value is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// A JSON string, ordered by its UTF-8 bytes. Besides equality and ranges, a string
    /// index answers prefix queries (`{name}_prefix=v`): its order-preserving encoding
    /// makes "starts with" one key range, so every string index is a prefix index at no
    /// extra cost.
    String,
    /// A JSON number (integer or float), ordered numerically.
    Number,
    /// An instant: an RFC 3339 string or a number of milliseconds since the epoch, ordered
    /// in time.
    Timestamp,
}

/// `doc.pointer(pointer)` without its allocations for the common case of object fields
/// with no escapes (`/a/b`): runs for every index of every changed row.
fn lookup<'a>(doc: &'a Value, pointer: &str) -> Option<&'a Value> {
    let Some(path) = pointer.strip_prefix('/').filter(|_| !pointer.contains('~')) else {
        return doc.pointer(pointer);
    };
    let mut at = doc;
    for token in path.split('/') {
        at = match at {
            Value::Object(fields) => fields.get(token)?,
            // Array indexes have their own parsing rules: leave them to serde_json.
            _ => return doc.pointer(pointer),
        };
    }
    Some(at)
}

/// A secondary index of a view. Every index answers equality (`{name}=v`) and range
/// (`{name}_gte`, `{name}_lt`) queries in both orders: its stored encoding preserves order.
/// String indexes also answer prefix queries (`{name}_prefix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// Query name, e.g. `customer_id`.
    pub name: &'static str,
    /// JSON pointer of the field in the row document, e.g. `/customer_id`.
    pub field: String,
    /// How values are read and compared.
    pub kind: IndexKind,
    /// At most one row per value (see the module docs for the conflict policy).
    pub unique: bool,
}

impl Index {
    fn new(name: &'static str, kind: IndexKind) -> Self {
        Self {
            name,
            field: format!("/{name}"),
            kind,
            unique: false,
        }
    }

    /// A string index on the top-level field `name`.
    pub fn string(name: &'static str) -> Self {
        Self::new(name, IndexKind::String)
    }

    /// A number index on the top-level field `name`.
    pub fn number(name: &'static str) -> Self {
        Self::new(name, IndexKind::Number)
    }

    /// A timestamp index on the top-level field `name`.
    pub fn timestamp(name: &'static str) -> Self {
        Self::new(name, IndexKind::Timestamp)
    }

    /// Reads the value from another field (a JSON pointer such as `/address/city`).
    pub fn at(mut self, pointer: &str) -> Self {
        self.field = pointer.to_owned();
        self
    }

    /// Makes the index unique.
    pub fn unique(mut self) -> Self {
        self.unique = true;
        self
    }

    /// The value of this index in `doc`: `Ok(None)` when the field is absent or null (the
    /// row is then not in the index), an error when it has the wrong type.
    pub fn extract(&self, doc: &Value) -> Result<Option<IndexValue>, String> {
        match lookup(doc, &self.field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => self.value_of(v).map(Some),
        }
    }

    fn value_of(&self, v: &Value) -> Result<IndexValue, String> {
        let wrong = || {
            format!(
                "index `{}` expects a {:?} at {}, found {v}",
                self.name, self.kind, self.field
            )
        };
        match (self.kind, v) {
            (IndexKind::String, Value::String(s)) => Ok(IndexValue::String(s.clone())),
            (IndexKind::Number | IndexKind::Timestamp, Value::Number(n)) => number(n).ok_or_else(wrong),
            (IndexKind::Timestamp, Value::String(s)) => parse_rfc3339_ms(s).map(IndexValue::ms).ok_or_else(wrong),
            _ => Err(wrong()),
        }
    }

    /// Parses a query parameter value for this index.
    pub fn parse(&self, text: &str) -> Result<IndexValue, String> {
        let err = |what: &str| format!("index `{}` expects {what}, got {text:?}", self.name);
        match self.kind {
            IndexKind::String => Ok(IndexValue::String(text.to_owned())),
            IndexKind::Number => parse_number(text).ok_or_else(|| err("a number")),
            IndexKind::Timestamp => parse_rfc3339_ms(text)
                .map(IndexValue::ms)
                .or_else(|| text.parse::<i64>().ok().map(IndexValue::ms))
                .ok_or_else(|| {
                    err("an RFC 3339 timestamp (e.g. 2024-05-01T00:00:00Z) or milliseconds since the epoch")
                }),
        }
    }
}

fn number(n: &serde_json::Number) -> Option<IndexValue> {
    if let Some(i) = n.as_i64() {
        Some(IndexValue::Int(i128::from(i)))
    } else if let Some(u) = n.as_u64() {
        Some(IndexValue::Int(i128::from(u)))
    } else {
        n.as_f64().filter(|f| f.is_finite()).map(IndexValue::float)
    }
}

fn parse_number(text: &str) -> Option<IndexValue> {
    if let Ok(i) = text.parse::<i128>() {
        return (i64::MIN as i128..=u64::MAX as i128)
            .contains(&i)
            .then_some(IndexValue::Int(i));
    }
    text.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(IndexValue::float)
}

/// A value of an index, as compared: integers exactly, floats as IEEE doubles, strings by
/// their UTF-8 bytes. Timestamps are integers (milliseconds).
#[derive(Debug, Clone, PartialEq)]
pub enum IndexValue {
    /// An integer (any `i64` or `u64`).
    Int(i128),
    /// A finite float that is not an integer (integral floats become [`IndexValue::Int`]).
    Float(f64),
    /// A string.
    String(String),
}

impl IndexValue {
    /// A timestamp in milliseconds since the epoch.
    pub fn ms(ms: i64) -> Self {
        Self::Int(i128::from(ms))
    }

    /// A float, normalised so that integral values compare equal to the same integer.
    pub fn float(f: f64) -> Self {
        if f.fract() == 0.0 && f.abs() < 1.7e38 {
            Self::Int(f as i128)
        } else {
            Self::Float(f)
        }
    }
}

/// Reads the current rows of a view (the stored ones, with the changes not yet committed).
pub trait RowReader {
    /// The current document of `key`, if any.
    fn row(&self, key: &str) -> Option<Value>;

    /// The current document of `key`, for a caller that writes its new version at once
    /// ([`ViewChanges::update`]): a reader may hand over its own copy instead of cloning
    /// it. The default is [`RowReader::row`].
    fn row_to_change(&self, key: &str) -> Option<Value> {
        self.row(key)
    }
}

impl RowReader for BTreeMap<String, Value> {
    fn row(&self, key: &str) -> Option<Value> {
        self.get(key).cloned()
    }
}

/// The row changes one event produces, in order; reads see earlier changes of the same
/// event.
pub struct ViewChanges<'a> {
    rows: &'a dyn RowReader,
    changes: Vec<(String, Option<Value>)>,
    errors: Vec<String>,
}

impl std::fmt::Debug for ViewChanges<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewChanges")
            .field("changes", &self.changes)
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
}

impl<'a> ViewChanges<'a> {
    /// Changes over the rows `rows` can read.
    pub fn new(rows: &'a dyn RowReader) -> Self {
        Self {
            rows,
            changes: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// The current document of `key`.
    pub fn get(&self, key: &str) -> Option<Value> {
        match self.changed(key) {
            Some(v) => v.clone(),
            None => self.rows.row(key),
        }
    }

    /// The last change of `key` by this event, if any.
    fn changed(&self, key: &str) -> Option<&Option<Value>> {
        self.changes.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Inserts or replaces the row `key`. A key must be 1 to [`MAX_ROW_KEY_BYTES`] bytes;
    /// an invalid key is recorded as an error (the runtime stops the view: skipping would
    /// lose the row silently).
    pub fn upsert(&mut self, key: impl Into<String>, document: Value) {
        let key = key.into();
        if self.check(&key) {
            self.changes.push((key, Some(document)));
        }
    }

    /// Deletes the row `key` (nothing happens when it does not exist).
    pub fn delete(&mut self, key: impl Into<String>) {
        let key = key.into();
        if self.check(&key) {
            self.changes.push((key, None));
        }
    }

    /// Changes the row `key` in place, if it exists; `f` gets the document to edit.
    pub fn update(&mut self, key: &str, f: impl FnOnce(&mut Value)) {
        let doc = match self.changed(key) {
            Some(v) => v.clone(),
            None => self.rows.row_to_change(key),
        };
        if let Some(mut doc) = doc {
            f(&mut doc);
            self.upsert(key, doc);
        }
    }

    fn check(&mut self, key: &str) -> bool {
        let ok = !key.is_empty() && key.len() <= MAX_ROW_KEY_BYTES;
        if !ok {
            self.errors
                .push(format!("row key {key:?} must be 1 to {MAX_ROW_KEY_BYTES} bytes"));
        }
        ok
    }

    /// The changes in order and the errors, consuming the set.
    pub fn into_parts(self) -> (Vec<(String, Option<Value>)>, Vec<String>) {
        (self.changes, self.errors)
    }
}

/// Where a view's rows live when several instances share the work (Kafka mode). With one
/// instance (the embedded log, or a single Kafka instance) both scopes hold every row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every instance reads every partition of the source and holds every row: any
    /// instance answers any query from its own store. Needed for unique indexes (a value
    /// must be unique across all rows) and for rows keyed by something other than the
    /// source aggregate (e.g. a row per customer built from order events).
    Replicated,
    /// Co-partitioned with the source: the instance owning a source partition (its
    /// consumer group member) applies that partition's events and holds its rows. A key
    /// lookup goes to the owner of the key's partition; an index query is sent to every
    /// owner and the answers are merged in index order. Each instance stores and applies
    /// only its share. A row key must fall in the partition of the event that writes it
    /// (key rows by the aggregate id), and unique indexes are not available.
    Partitioned,
}

/// A field a view's rows carry when they are read, taken from a **lookup table**: the row
/// of view `table` (a [`Scope::Replicated`] view, which every instance holds whole) whose
/// key is the value of the row's `key_field`; its `column`, or `null` when the table has
/// no such row. Evaluated at read time, so a change in the table shows on every joined row
/// at once (an email change is one write, not one per order) and a rebuilt view joins the
/// same way as the live one. A query's `min_position` waits for the table too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Join {
    /// The field the joined value is written to (replacing one of that name).
    pub field: &'static str,
    /// The row's field holding the table's key (a string).
    pub key_field: &'static str,
    /// The lookup table: a replicated view's name.
    pub table: &'static str,
    /// The field of the table's row to take.
    pub column: &'static str,
}

impl Join {
    /// `field` = `table[row[key_field]][column]`, or `null` (see [`Join`]).
    pub fn lookup(field: &'static str, key_field: &'static str, table: &'static str, column: &'static str) -> Self {
        Self {
            field,
            key_field,
            table,
            column,
        }
    }

    /// Writes the joined value into `row`, reading the table through `get` (key -> row).
    pub fn fill(&self, row: &mut Value, get: impl FnOnce(&str) -> Option<Value>) {
        let joined = row
            .get(self.key_field)
            .and_then(Value::as_str)
            .and_then(get)
            .and_then(|mut r| r.get_mut(self.column).map(Value::take))
            .unwrap_or(Value::Null);
        if let Some(obj) = row.as_object_mut() {
            obj.insert(self.field.to_owned(), joined);
        }
    }
}

/// A projection: events of [`Projection::Source`] to rows of the view [`Projection::VIEW`].
/// Pure and deterministic: replaying the same events must build the same rows.
pub trait Projection: Default + Send + Sync + 'static {
    /// The view name used in URLs and storage, e.g. `orders`. Stable: renaming it starts
    /// an empty view.
    const VIEW: &'static str;
    /// The version of what the projection stores: bump it when `apply` or `indexes`
    /// change. A new version is built **side by side** from the start of the log while
    /// the previous one, if its projection is still registered, keeps serving; queries
    /// switch once the new one has caught up, and the old data is removed.
    const VERSION: u32 = 1;
    /// Where the view's rows live when several instances run in Kafka mode (see
    /// [`Scope`]); [`Scope::Replicated`] unless the projection says otherwise.
    const SCOPE: Scope = Scope::Replicated;
    /// The aggregate type whose events this projection reads.
    type Source: Aggregate;
    /// The secondary indexes of the view.
    fn indexes(&self) -> Vec<Index>;
    /// Turns one event into row changes.
    fn apply(&self, event: &Event<'_, <Self::Source as Aggregate>::Event>, view: &mut ViewChanges<'_>);
    /// Fields filled from lookup tables when rows are read (see [`Join`]); none by default.
    fn joins(&self) -> Vec<Join> {
        Vec::new()
    }
}

/// A given/when/then harness for projections:
///
/// ```
/// use eventfold_core::projection::{Event, Index, Projection, ProjectionTest, ViewChanges};
/// use eventfold_core::testing::{Counter, CounterEvent};
/// use serde_json::json;
///
/// /// `counters`: one row per counter, `{"total"}`, indexed by total.
/// #[derive(Default)]
/// struct Counters;
///
/// impl Projection for Counters {
///     const VIEW: &'static str = "counters";
///     type Source = Counter;
///     fn indexes(&self) -> Vec<Index> {
///         vec![Index::number("total")]
///     }
///     fn apply(&self, event: &Event<'_, CounterEvent>, view: &mut ViewChanges<'_>) {
///         let CounterEvent::Added { n } = event.payload;
///         let total = view.get(event.aggregate_id).map_or(0, |row| row["total"].as_u64().unwrap_or(0));
///         view.upsert(event.aggregate_id, json!({ "total": total + n }));
///     }
/// }
///
/// ProjectionTest::<Counters>::new()
///     .given("c-1", [CounterEvent::Added { n: 2 }])
///     .given("c-2", [CounterEvent::Added { n: 5 }])
///     .when("c-1", CounterEvent::Added { n: 3 })
///     .then_row("c-1", json!({ "total": 5 }))
///     .then_index("total", "5", &["c-1", "c-2"])
///     .then_no_errors();
/// ```
///
/// Events of each aggregate id get versions 1, 2, ...; timestamps start at
/// [`ProjectionTest::at`] (default 0) and advance by one second per event.
pub struct ProjectionTest<P: Projection> {
    projection: P,
    rows: BTreeMap<String, Value>,
    versions: BTreeMap<String, u64>,
    timestamp_ms: i64,
    errors: Vec<String>,
    /// Lookup tables the joins and `Event::lookup` read.
    tables: LookupRows,
}

impl<P: Projection> Default for ProjectionTest<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Projection> ProjectionTest<P> {
    /// An empty view.
    pub fn new() -> Self {
        Self {
            projection: P::default(),
            rows: BTreeMap::new(),
            versions: BTreeMap::new(),
            timestamp_ms: 0,
            errors: Vec::new(),
            tables: LookupRows::default(),
        }
    }

    /// Puts row `key` (`None`: removes it) in lookup table `table`, which the view's joins
    /// read when its rows are read ([`ProjectionTest::then_read`]) and `apply` through
    /// [`Event::lookup`].
    pub fn with_table_row(mut self, table: &str, key: &str, row: Option<Value>) -> Self {
        self.tables.put(table, key, row);
        self
    }

    /// Asserts row `key` as a reader sees it: the stored row with its joins filled from
    /// the tables given with [`ProjectionTest::with_table_row`].
    #[track_caller]
    pub fn then_read(self, key: &str, expected: Value) -> Self {
        let mut row = self
            .rows
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("view `{}` has no row `{key}`", P::VIEW));
        for join in self.projection.joins() {
            join.fill(&mut row, |fk| self.tables.get(join.table, fk));
        }
        crate::harness::assert_json_eq(
            &row,
            &expected,
            format_args!("row `{key}` of view `{}` as read differs", P::VIEW),
        );
        self
    }

    /// The timestamp of the next event (milliseconds since the epoch).
    pub fn at(mut self, timestamp_ms: i64) -> Self {
        self.timestamp_ms = timestamp_ms;
        self
    }

    /// Applies past events of aggregate `id`.
    pub fn given(mut self, id: &str, events: impl IntoIterator<Item = <P::Source as Aggregate>::Event>) -> Self {
        for e in events {
            self.apply(id, &e);
        }
        self
    }

    /// Applies the event under test (the same as `given`, reads better in tests).
    pub fn when(self, id: &str, event: <P::Source as Aggregate>::Event) -> Self {
        self.given(id, [event])
    }

    fn apply(&mut self, id: &str, payload: &<P::Source as Aggregate>::Event) {
        let version = self.versions.entry(id.to_owned()).or_insert(0);
        *version += 1;
        let json = serde_json::to_value(payload).expect("events serialize");
        let event_type = json.get("type").and_then(Value::as_str).unwrap_or("unknown").to_owned();
        let event = Event {
            aggregate_type: <P::Source as Aggregate>::TYPE,
            aggregate_id: id,
            version: *version,
            event_type: &event_type,
            timestamp_ms: self.timestamp_ms,
            payload,
            lookups: &self.tables,
        };
        let mut changes = ViewChanges::new(&self.rows);
        self.projection.apply(&event, &mut changes);
        let (changes, errors) = changes.into_parts();
        self.errors.extend(errors);
        for (k, v) in changes {
            match v {
                Some(v) => self.rows.insert(k, v),
                None => self.rows.remove(&k),
            };
        }
        self.timestamp_ms += 1000;
    }

    /// Asserts row `key` is exactly `expected`.
    #[track_caller]
    pub fn then_row(self, key: &str, expected: Value) -> Self {
        crate::harness::assert_json_eq(
            &self.rows.get(key),
            &Some(&expected),
            format_args!("row `{key}` of view `{}` differs", P::VIEW),
        );
        self
    }

    /// Asserts row `key` does not exist.
    #[track_caller]
    pub fn then_no_row(self, key: &str) -> Self {
        assert!(
            !self.rows.contains_key(key),
            "row `{key}` of view `{}` exists: {}",
            P::VIEW,
            crate::harness::json_text(&self.rows.get(key))
        );
        self
    }

    /// Asserts the keys of the rows whose index `index` equals `value` (a query string
    /// value), in key order. Checks the index declaration as well as the rows.
    #[track_caller]
    pub fn then_index(self, index: &str, value: &str, expected_keys: &[&str]) -> Self {
        let idx = self
            .projection
            .indexes()
            .into_iter()
            .find(|i| i.name == index)
            .unwrap_or_else(|| panic!("view `{}` declares no index `{index}`", P::VIEW));
        let wanted = idx.parse(value).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<&str> = self
            .rows
            .iter()
            .filter(|(_, doc)| idx.extract(doc).unwrap_or_else(|e| panic!("{e}")).as_ref() == Some(&wanted))
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(got, expected_keys, "rows with {index}={value}");
        self
    }

    /// Asserts no projection error happened (invalid keys, ...).
    #[track_caller]
    pub fn then_no_errors(self) -> Self {
        assert!(self.errors.is_empty(), "projection errors: {:?}", self.errors);
        self
    }

    /// All rows, for custom assertions.
    pub fn rows(&self) -> &BTreeMap<String, Value> {
        &self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::lookup;
    use serde_json::json;

    #[test]
    fn lookup_answers_like_a_json_pointer() {
        let doc = json!({"a": {"b": 1, "": 2, "c/d": 3, "e~f": 4, "l": [5, {"x": 6}]}, "n": null});
        for p in [
            "", "/", "/a", "/a/b", "/a/", "/a/c~1d", "/a/e~0f", "/a/l/0", "/a/l/1/x", "/a/l/01", "/a/l/9", "/n",
            "/n/x", "/zz", "a", "/a/b/c",
        ] {
            assert_eq!(lookup(&doc, p), doc.pointer(p), "{p:?}");
        }
    }
}
