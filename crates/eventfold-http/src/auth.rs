//! Bearer tokens with roles (DESIGN §6 "Authentication"): the token file, its reload, and
//! the per-token rate limit.
//!
//! The file holds one token a line as `<name> <role> <sha256 hex of the token>`: the
//! service never sees a token in the clear except in a request's `Authorization` header,
//! whose token it hashes and compares with every entry's digest in constant time
//! ([`subtle`]). Roles nest: `admin` ⊇ `write` ⊇ `read`. What each route needs is in
//! [`ROUTES`](crate::ROUTES); the check is `guard::guard`.

use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// A token's role. Each includes those before it: `Admin` ⊇ `Write` ⊇ `Read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Reads: aggregates' state and events, views, process managers, the API document.
    Read,
    /// Reads and commands.
    Write,
    /// Everything, operations included (`/v1/cluster`).
    Admin,
}

impl Role {
    /// The role named `s` (`read`, `write`, `admin`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }

    /// Its name in the token file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a route asks of its caller (a column of [`ROUTES`](crate::ROUTES)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token: health and readiness, which probes ask without credentials.
    Open,
    /// Open, unless the service protects its metrics (`--metrics-auth`): then `read`.
    Metrics,
    /// A token of this role or above.
    Role(Role),
}

impl Access {
    /// The role a request needs, if any, when the service has tokens.
    pub fn required(self, protect_metrics: bool) -> Option<Role> {
        match self {
            Self::Open => None,
            Self::Metrics => protect_metrics.then_some(Role::Read),
            Self::Role(r) => Some(r),
        }
    }
}

/// The SHA-256 of `token` in lower-case hex: what the token file holds for it.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The token file's line for a token: `<name> <role> <sha256 hex>`. `name` must be
/// non-empty and hold no whitespace; the token must be non-empty.
pub fn entry_line(name: &str, role: Role, token: &str) -> Result<String, Error> {
    check_name(name).map_err(|why| Error::Entry(format!("name {name:?}: {why}")))?;
    if token.is_empty() {
        return Err(Error::Entry("the token is empty".into()));
    }
    Ok(format!("{name} {role} {}", hash_token(token)))
}

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("a name is one word of printable characters");
    }
    Ok(())
}

/// Why a token file (or an entry) was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read the token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line does not parse.
    #[error("{path}:{line}: {why}")]
    Line {
        /// The file.
        path: PathBuf,
        /// Its line number (1-based).
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// An entry cannot be made.
    #[error("{0}")]
    Entry(String),
}

/// One token of the file.
#[derive(Debug)]
struct Entry {
    name: String,
    role: Role,
    digest: [u8; 32],
    /// Its rate limit's state; kept across reloads while the name and digest stay.
    bucket: Arc<Bucket>,
}

/// The tokens of one version of the file.
#[derive(Debug, Default)]
struct Tokens {
    entries: Vec<Entry>,
}

impl Tokens {
    /// Parses the file's text (`path` names it in errors); `old` hands its rate limit
    /// state on to the entries that keep their name and digest.
    fn parse(text: &str, path: &Path, old: Option<&Tokens>) -> Result<Self, Error> {
        let mut entries: Vec<Entry> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: String| Error::Line {
                path: path.to_owned(),
                line: i + 1,
                why,
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role, hex] = fields[..] else {
                return Err(bad(format!(
                    "expected `<name> <role> <sha256 hex of the token>`, got {} fields",
                    fields.len()
                )));
            };
            check_name(name).map_err(|why| bad(why.into()))?;
            let role =
                Role::parse(role).ok_or_else(|| bad(format!("unknown role `{role}`; roles: read, write, admin")))?;
            let digest = decode_digest(hex).ok_or_else(|| {
                bad("the third field must be the token's SHA-256 as 64 hex digits (`shop auth hash-token` makes a line)".into())
            })?;
            if entries.iter().any(|e| e.name == name) {
                return Err(bad(format!("the name `{name}` is given twice")));
            }
            if entries.iter().any(|e| e.digest == digest) {
                return Err(bad(format!("`{name}` has the same token as another entry")));
            }
            let bucket = old
                .and_then(|o| o.entries.iter().find(|e| e.name == name && e.digest == digest))
                .map_or_else(|| Arc::new(Bucket::default()), |e| e.bucket.clone());
            entries.push(Entry {
                name: name.to_owned(),
                role,
                digest,
                bucket,
            });
        }
        Ok(Self { entries })
    }

    /// The entry whose token is `token`. Every entry's digest is compared, each in
    /// constant time, so the time taken does not depend on which bytes match.
    fn find(&self, token: &str) -> Option<&Entry> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&digest)) {
                found = Some(e);
            }
        }
        found
    }
}

fn decode_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// Per-token rate limit: `per_second` requests a second on average, bursts of up to
/// `burst` at once. `per_second` 0: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Sustained requests a second per token (0: unlimited).
    pub per_second: u32,
    /// Requests a token may send at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            per_second: 1000,
            burst: 2000,
        }
    }
}

/// The state of one token's rate limit: the generic cell rate algorithm (a token bucket
/// kept as one number, the theoretical arrival time of the next request, in nanoseconds
/// since the `Auth`'s start), updated without a lock.
#[derive(Debug, Default)]
struct Bucket {
    tat_ns: AtomicU64,
}

impl Bucket {
    /// Takes one request at `now_ns` under `limit`: `Err(wait)` when it is over the limit.
    fn take(&self, now_ns: u64, limit: RateLimit) -> Result<(), Duration> {
        if limit.per_second == 0 {
            return Ok(());
        }
        let interval = 1_000_000_000 / u64::from(limit.per_second);
        let tolerance = interval * u64::from(limit.burst.max(1) - 1);
        let mut tat = self.tat_ns.load(Ordering::Relaxed);
        loop {
            let base = tat.max(now_ns);
            if base - now_ns > tolerance {
                return Err(Duration::from_nanos(base - now_ns - tolerance));
            }
            match self
                .tat_ns
                .compare_exchange_weak(tat, base + interval, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(current) => tat = current,
            }
        }
    }
}

/// Options of [`Auth`].
#[derive(Debug, Clone, Copy, Default)]
pub struct AuthOptions {
    /// The per-token rate limit.
    pub rate: RateLimit,
    /// `/metrics` needs a `read` token too (else it is open).
    pub protect_metrics: bool,
}

/// Who a request is, once authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A known token with enough role and within its rate.
    Allowed,
    /// A known token, over its rate: retry after this long.
    Limited(Duration),
    /// A known token whose role is below `needed`.
    Forbidden { role: Role },
    /// No entry has this token.
    Unknown,
}

/// The service's tokens, loaded from a file and reloaded on demand (SIGHUP in
/// `eventfold::App`); shared by every route through [`HttpOptions`](crate::HttpOptions).
#[derive(Debug)]
pub struct Auth {
    path: PathBuf,
    tokens: RwLock<Arc<Tokens>>,
    options: AuthOptions,
    /// Origin of the rate limits' clocks.
    epoch: Instant,
}

impl Auth {
    /// Loads the token file at `path`.
    pub fn open(path: impl Into<PathBuf>, options: AuthOptions) -> Result<Self, Error> {
        let path = path.into();
        let tokens = Self::read(&path, None)?;
        if tokens.entries.is_empty() {
            tracing::warn!(file = %path.display(), "the token file has no token: every route but /healthz and /readyz answers 401");
        }
        Ok(Self {
            path,
            tokens: RwLock::new(Arc::new(tokens)),
            options,
            epoch: Instant::now(),
        })
    }

    fn read(path: &Path, old: Option<&Tokens>) -> Result<Tokens, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        Tokens::parse(&text, path, old)
    }

    /// Reads the file again and, if it parses, serves its tokens from now on (returning
    /// how many); if it does not, the tokens loaded before stay and the error says why.
    /// Rate limits carry over for entries whose name and token are unchanged.
    pub fn reload(&self) -> Result<usize, Error> {
        let old = self.current();
        let new = Self::read(&self.path, Some(&old))?;
        let n = new.entries.len();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        Ok(n)
    }

    /// The token file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many tokens are loaded.
    pub fn len(&self) -> usize {
        self.current().entries.len()
    }

    /// Whether no token is loaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The options it was opened with.
    pub fn options(&self) -> AuthOptions {
        self.options
    }

    fn current(&self) -> Arc<Tokens> {
        self.tokens.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Checks `token` against `needed`, then takes one request off its rate limit. Also
    /// returns the token's name (for messages).
    pub(crate) fn check(&self, token: &str, needed: Role) -> (Verdict, Option<String>) {
        let tokens = self.tokens.read().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = tokens.find(token) else {
            return (Verdict::Unknown, None);
        };
        let name = Some(entry.name.clone());
        if entry.role < needed {
            return (Verdict::Forbidden { role: entry.role }, name);
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        match entry.bucket.take(now, self.options.rate) {
            Ok(()) => (Verdict::Allowed, name),
            Err(wait) => (Verdict::Limited(wait), name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "alice-secret";

    fn tokens(text: &str) -> Result<Tokens, Error> {
        Tokens::parse(text, Path::new("tokens"), None)
    }

    #[test]
    fn hash_token_is_sha256_hex() {
        // `printf abc | sha256sum`
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn entries_parse_and_are_found_by_their_token_only() {
        let text = format!(
            "# comment\n\n{}\nbob read {}\n",
            entry_line("alice", Role::Write, ALICE).unwrap(),
            hash_token("bob-secret").to_uppercase()
        );
        let t = tokens(&text).unwrap();
        assert_eq!(t.entries.len(), 2);
        let alice = t.find(ALICE).unwrap();
        assert_eq!((alice.name.as_str(), alice.role), ("alice", Role::Write));
        assert_eq!(t.find("bob-secret").unwrap().role, Role::Read);
        assert!(t.find("alice-secreT").is_none());
        assert!(t.find("").is_none());
        assert!(t.find(&hash_token(ALICE)).is_none(), "the hash is not the token");
    }

    #[test]
    fn bad_lines_are_refused_with_their_line_number() {
        let h = hash_token(ALICE);
        for (text, needle) in [
            ("alice write\n".to_owned(), ":1: expected"),
            (format!("\nalice owner {h}\n"), ":2: unknown role `owner`"),
            (format!("alice write {}\n", &h[..63]), "64 hex digits"),
            (format!("alice write {}g\n", &h[..63]), "64 hex digits"),
            (
                format!("alice write {h}\nalice read {}\n", hash_token("x")),
                ":2: the name `alice` is given twice",
            ),
            (format!("alice write {h}\nbob read {h}\n"), "same token"),
            (format!("alice write {h} extra\n"), "4 fields"),
        ] {
            let err = tokens(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        assert!(entry_line("two words", Role::Read, "t").is_err());
        assert!(entry_line("x", Role::Read, "").is_err());
    }

    #[test]
    fn roles_nest() {
        assert!(Role::Admin > Role::Write && Role::Write > Role::Read);
        assert_eq!(Access::Open.required(true), None);
        assert_eq!(Access::Metrics.required(false), None);
        assert_eq!(Access::Metrics.required(true), Some(Role::Read));
        assert_eq!(Access::Role(Role::Admin).required(false), Some(Role::Admin));
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let b = Bucket::default();
        let limit = RateLimit {
            per_second: 10,
            burst: 3,
        };
        let t0 = 5_000_000_000;
        for _ in 0..3 {
            assert_eq!(b.take(t0, limit), Ok(()));
        }
        let wait = b.take(t0, limit).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100), "one interval until the next");
        // 100 ms later one more request fits, and only one.
        assert_eq!(b.take(t0 + 100_000_000, limit), Ok(()));
        assert!(b.take(t0 + 100_000_000, limit).is_err());
        // After a quiet second the whole burst is back.
        let later = t0 + 2_000_000_000;
        for _ in 0..3 {
            assert_eq!(b.take(later, limit), Ok(()));
        }
        assert!(b.take(later, limit).is_err());
        // No limit.
        let off = RateLimit {
            per_second: 0,
            burst: 1,
        };
        for _ in 0..100 {
            assert_eq!(b.take(later, off), Ok(()));
        }
    }

    #[test]
    fn a_reload_keeps_the_rate_state_of_unchanged_entries_and_a_bad_file_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let alice = entry_line("alice", Role::Write, ALICE).unwrap();
        std::fs::write(&path, format!("{alice}\n")).unwrap();
        let auth = Auth::open(
            &path,
            AuthOptions {
                rate: RateLimit {
                    per_second: 1,
                    burst: 1,
                },
                protect_metrics: false,
            },
        )
        .unwrap();
        assert_eq!(auth.check(ALICE, Role::Read).0, Verdict::Allowed);
        assert!(matches!(auth.check(ALICE, Role::Read).0, Verdict::Limited(_)));
        assert_eq!(
            auth.check(ALICE, Role::Admin).0,
            Verdict::Forbidden { role: Role::Write }
        );
        let bob = entry_line("bob", Role::Admin, "bob-secret").unwrap();
        std::fs::write(&path, format!("{alice}\n{bob}\n")).unwrap();
        assert_eq!(auth.reload().unwrap(), 2);
        assert!(
            matches!(auth.check(ALICE, Role::Read).0, Verdict::Limited(_)),
            "alice's bucket carried over"
        );
        assert_eq!(auth.check("bob-secret", Role::Admin).0, Verdict::Allowed);
        std::fs::write(&path, "bob admin nothex\n").unwrap();
        let err = auth.reload().unwrap_err().to_string();
        assert!(err.contains("tokens:1:"), "{err}");
        assert_eq!(auth.len(), 2, "the old tokens stay");
        std::fs::remove_file(&path).unwrap();
        assert!(auth.reload().is_err());
        assert_eq!(auth.check("bob-secret", Role::Admin).1.as_deref(), Some("bob"));
    }
}
