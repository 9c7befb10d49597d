//! The read side of a view: rows by key, index queries, and waiting until a position is
//! applied (read-your-writes); the view as a lookup table of other views' joins.

use super::service::ViewService;
use super::storage::corrupt;
use crate::error::{Error, Result};
use crate::lookup::{JoinCache, JoinError, LookupTable};
use eventfold_core::partition::partition_for;
use eventfold_core::{Index, IndexKind, IndexValue, Position, Scope};
use eventfold_store::{Scan, encode_prefix, encode_value};
use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::time::Duration;

/// A condition of a query on one index: equality, a half-open range, a string prefix
/// (string indexes only), or a prefix within a range.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Condition {
    /// Value must equal this.
    pub eq: Option<IndexValue>,
    /// Value must be at or above this.
    pub gte: Option<IndexValue>,
    /// Value must be below this.
    pub lt: Option<IndexValue>,
    /// Value must be a string starting with this (by UTF-8 bytes, case-sensitive).
    pub prefix: Option<String>,
}

/// A view query: one index drives the scan (and the order); conditions on other indexes
/// filter the rows it yields.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// The index whose order the rows come in; `None`: row key order (then `conditions`
    /// only filter).
    pub order_by: Option<String>,
    /// Conditions by index name.
    pub conditions: BTreeMap<String, Condition>,
    /// Highest values first.
    pub descending: bool,
    /// Most rows returned.
    pub limit: usize,
    /// Continue after this scan position (from [`QueryPage::next`]).
    pub after: Option<Vec<u8>>,
}

/// A condition of a query on an index other than the driving one, encoded: the index,
/// then equality, lower bound, upper bound and prefix (see [`Condition`]).
type Filter<'a> = (
    &'a Index,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
);

/// One row of a query's answer.
#[derive(Debug)]
pub struct QueryRow {
    /// Row key.
    pub key: String,
    /// The row's document.
    pub value: Box<RawValue>,
    /// Its scan position: the rows of one query sort by it (bytes, ascending or descending
    /// with the query) on every instance, so the answers of several instances merge by it
    /// and it can continue a query ([`Query::after`]).
    pub position: Vec<u8>,
}

/// One page of answers.
#[derive(Debug)]
pub struct QueryPage {
    /// The rows in order.
    pub rows: Vec<QueryRow>,
    /// Scan position to continue from; `None` on the last page.
    pub next: Option<Vec<u8>>,
}

impl LookupTable for ViewService {
    fn row(&self, key: &str) -> Result<Option<Value>> {
        Ok(match self.get(key)? {
            Some(raw) => serde_json::from_str(raw.get()).ok(),
            None => None,
        })
    }

    fn raw(&self, key: &str) -> Result<Option<Vec<u8>>> {
        if key.is_empty() || key.len() > eventfold_core::projection::MAX_ROW_KEY_BYTES {
            return Ok(None);
        }
        // A lookup table is replicated: every row is here (no ownership check). Its own
        // joins, if any, are not applied to what other views join from it.
        Ok(self.store.get_view_row(&self.storage, key)?)
    }

    fn wait<'a>(
        &'a self,
        min: &'a Position,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(self.wait_own(min, timeout))
    }
}

fn raw_json(view: &str, key: &str, json: Vec<u8>) -> Result<Box<RawValue>> {
    String::from_utf8(json)
        .ok()
        .and_then(|s| RawValue::from_string(s).ok())
        .ok_or_else(|| corrupt("view_row", format!("{view}/{key}"), "row is not JSON"))
}

impl ViewService {
    /// Waits until the view has applied every mark of `min` on its source topic (marks of
    /// other topics do not concern it), and so have the lookup tables its joins read, at
    /// most `timeout`.
    pub async fn wait_for(&self, min: &Position, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.wait_own(min, timeout).await?;
        // A row read joins the lookup tables: they must have applied the position too.
        if let Some(tables) = self.tables.get() {
            for join in &self.joins {
                if let Some(table) = tables.table(join.table) {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    table.wait(min, left).await?;
                }
            }
        }
        Ok(())
    }

    /// [`Self::wait_for`] of this view's own partitions.
    async fn wait_own(&self, min: &Position, timeout: Duration) -> Result<()> {
        let mut waits = Vec::new();
        for (topic, p, offset) in min.marks() {
            if topic != &*self.source.events {
                continue;
            }
            let part = self.partitions.get(p as usize).ok_or_else(|| {
                Error::BadRequest(format!(
                    "min_position names partition {p} of `{topic}`, which has {} partitions",
                    self.partitions.len()
                ))
            })?;
            // A partition served elsewhere is waited for where it is served.
            if self.is_local(p) {
                if *part.applied.borrow() < offset {
                    part.hurry.notify_one();
                }
                waits.push((part.applied.subscribe(), offset));
            }
        }
        let all = async {
            for (mut rx, offset) in waits {
                // The sender lives as long as the service; an error cannot happen here.
                let _ = rx.wait_for(|applied| *applied >= offset).await;
            }
        };
        if tokio::time::timeout(timeout, all).await.is_ok() {
            return Ok(());
        }
        let failures: Vec<String> = self
            .partitions
            .iter()
            .enumerate()
            .filter_map(|(p, part)| {
                part.failure
                    .lock()
                    .expect("not poisoned")
                    .as_ref()
                    .map(|f| format!("partition {p}: {f}"))
            })
            .collect();
        Err(Error::ViewBehind {
            view: self.name.to_owned(),
            waited: timeout,
            position: self.position().encode(),
            failures,
        })
    }

    /// Row `key`, if present. A partitioned view answers only for the partitions it
    /// serves ([`Error::NotOwner`] otherwise: ask the owner).
    pub fn get(&self, key: &str) -> Result<Option<Box<RawValue>>> {
        if key.is_empty() || key.len() > eventfold_core::projection::MAX_ROW_KEY_BYTES {
            return Ok(None);
        }
        let p = self.partition_of(key);
        if !self.is_local(p) {
            return Err(self.not_owner(p));
        }
        match self.store.get_view_row(&self.storage, key)? {
            Some(json) => self.read_row(key, json, &mut JoinCache::default()).map(Some),
            None => Ok(None),
        }
    }

    /// A stored row as served: with its joins filled from the lookup tables.
    fn read_row(&self, key: &str, json: Vec<u8>, cache: &mut JoinCache) -> Result<Box<RawValue>> {
        if self.joins.is_empty() {
            return raw_json(self.name, key, json);
        }
        match crate::lookup::fill(&json, &self.joins, self.tables.get(), cache) {
            Ok(joined) => raw_json(self.name, key, joined),
            Err(JoinError::Row(reason)) => Err(corrupt("view_row", format!("{}/{key}", self.name), reason)),
            Err(JoinError::Table(e)) => Err(e),
        }
    }

    fn not_owner(&self, p: u32) -> Error {
        Error::NotOwner {
            aggregate: self.source_type.to_owned(),
            partition: p,
        }
    }

    /// Runs `query`: scans the driving index, filters by the other conditions. A
    /// partitioned view answers for the partitions it serves (see [`Self::query_partitions`]).
    pub fn query(&self, query: &Query) -> Result<QueryPage> {
        self.query_partitions(query, None)
    }

    /// Runs `query` over the rows of `partitions` (`None`: every partition served here).
    /// A partitioned view refuses partitions it does not serve ([`Error::NotOwner`]); its
    /// store may still hold rows of partitions it served before, which are left out. A
    /// replicated view holds every row and ignores `partitions`.
    pub fn query_partitions(&self, query: &Query, partitions: Option<&[u32]>) -> Result<QueryPage> {
        let wanted = self.wanted(partitions)?;
        let (scan, filters) = self.plan(query)?;
        let count = self.partitions.len() as u32;
        let mut filter = |key: &str, json: &[u8]| -> bool {
            if let Some(wanted) = &wanted
                && !wanted[partition_for(key.as_bytes(), count) as usize]
            {
                return false;
            }
            if filters.is_empty() {
                return true;
            }
            let Ok(doc) = serde_json::from_slice::<Value>(json) else {
                return false;
            };
            filters.iter().all(|(idx, eq, gte, lt, prefix)| {
                let Ok(Some(v)) = idx.extract(&doc) else {
                    return false;
                };
                let v = encode_value(&v);
                eq.as_ref().is_none_or(|e| v == *e)
                    && gte.as_ref().is_none_or(|g| v >= *g)
                    && lt.as_ref().is_none_or(|l| v < *l)
                    && prefix.as_ref().is_none_or(|p| v.starts_with(p))
            })
        };
        let page = self
            .store
            .scan_view(&self.storage, query.order_by.as_deref(), &scan, &mut filter)?;
        let mut cache = JoinCache::default();
        let rows = page
            .rows
            .into_iter()
            .map(|h| {
                Ok(QueryRow {
                    value: self.read_row(&h.key, h.json, &mut cache)?,
                    key: h.key,
                    position: h.position,
                })
            })
            .collect::<Result<_>>()?;
        Ok(QueryPage { rows, next: page.next })
    }

    /// The partitions whose rows a query over `partitions` keeps, by partition (`None`:
    /// every row, in a replicated view); refuses partitions this instance does not serve.
    fn wanted(&self, partitions: Option<&[u32]>) -> Result<Option<Vec<bool>>> {
        Ok(match self.scope {
            Scope::Replicated => None,
            Scope::Partitioned => {
                let mut wanted = vec![false; self.partitions.len()];
                let list = partitions.map_or_else(|| self.local_partitions(), <[u32]>::to_vec);
                for p in list {
                    if p as usize >= wanted.len() {
                        return Err(Error::BadRequest(format!(
                            "view `{}` has {} partitions, not {p}",
                            self.name,
                            wanted.len()
                        )));
                    }
                    if !self.is_local(p) {
                        return Err(self.not_owner(p));
                    }
                    wanted[p as usize] = true;
                }
                Some(wanted)
            }
        })
    }

    /// The scan of `query`'s driving index, and the conditions on other indexes that
    /// filter the rows it yields; refuses unknown indexes and misplaced prefixes.
    fn plan(&self, query: &Query) -> Result<(Scan, Vec<Filter<'_>>)> {
        let unknown = |name: &str| Error::BadRequest(format!("view `{}` has no index `{name}`", self.name));
        let enc = |v: &Option<IndexValue>| v.as_ref().map(encode_value);
        for (name, c) in &query.conditions {
            let idx = self.index(name).ok_or_else(|| unknown(name))?;
            if c.prefix.is_some() && idx.kind != IndexKind::String {
                return Err(Error::BadRequest(format!(
                    "index `{name}` of view `{}` holds {:?} values; a prefix applies to string indexes",
                    self.name, idx.kind
                )));
            }
        }
        let enc_prefix = |c: &Condition| c.prefix.as_deref().map(encode_prefix);
        let mut scan = Scan {
            descending: query.descending,
            limit: query.limit,
            max_scanned: self.options.max_scanned,
            after: query.after.clone(),
            ..Default::default()
        };
        if let Some(name) = &query.order_by {
            self.index(name).ok_or_else(|| unknown(name))?;
            if let Some(c) = query.conditions.get(name) {
                scan.eq = enc(&c.eq);
                scan.gte = enc(&c.gte);
                scan.lt = enc(&c.lt);
                scan.prefix = enc_prefix(c);
            }
        }
        let mut filters = Vec::new();
        for (name, c) in &query.conditions {
            if Some(name) == query.order_by.as_ref() {
                continue;
            }
            let idx = self.index(name).ok_or_else(|| unknown(name))?;
            filters.push((idx, enc(&c.eq), enc(&c.gte), enc(&c.lt), enc_prefix(c)));
        }
        Ok((scan, filters))
    }
}
