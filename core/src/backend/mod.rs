//! For implementors of a store: the [`Backend`] trait and the helpers backends share (argument
//! checks, TTLs in milliseconds, counters, directory listings here; operation deadlines in
//! [`Deadline`]; URL parsing, credentials and redacted secrets in [`url`]; asking a server that
//! failed to connect what protocol it speaks in [`probe`]; versions built from a store-wide
//! revision, and noticing a store that went back in time, in [`RevisionWatch`]).
//! Users of headcount never need this module; they call [`Store`], which every `Backend` is.
//!
//! A backend implements [`Backend`]: the primitives of the [`Store`] contract, with the same
//! names and semantics, each called only with arguments already checked by [`check_key`],
//! [`check_value`], [`check_ttl`] and the other checks of this module. [`Store`] is implemented
//! for every `Backend` and is the only way in, so a backend cannot forget a check. The provided
//! methods are fallbacks over the four primitives (each documented on [`Store`]); a backend that
//! can do better overrides one and says so in its [`Capabilities`].
//!
//! ```
//! use std::time::Duration;
//!
//! use async_trait::async_trait;
//! use headcount_core::backend::Backend;
//! use headcount_core::{Capabilities, MemoryStore, Result, Store};
//!
//! /// A backend that forwards to another store (a real one talks to its server instead).
//! #[derive(Debug)]
//! struct Forward(MemoryStore);
//!
//! #[async_trait]
//! impl Backend for Forward {
//!     fn capabilities(&self) -> Capabilities {
//!         Capabilities::new("forward")
//!     }
//!     async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
//!         Store::incr(&self.0, key, ttl).await
//!     }
//!     async fn get(&self, key: &str) -> Result<Option<String>> {
//!         Store::get(&self.0, key).await
//!     }
//!     async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
//!         Store::expire(&self.0, key, ttl).await
//!     }
//!     async fn compare_and_set(
//!         &self,
//!         key: &str,
//!         expected: Option<&str>,
//!         new: &str,
//!         ttl: Option<Duration>,
//!     ) -> Result<bool> {
//!         Store::compare_and_set(&self.0, key, expected, new, ttl).await
//!     }
//!     async fn delete(&self, key: &str) -> Result<bool> {
//!         Store::delete(&self.0, key).await
//!     }
//!     async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
//!         Store::list(&self.0, prefix).await
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! let store: headcount_core::DynStore = std::sync::Arc::new(Forward(MemoryStore::new()));
//! // Checked before the backend sees it: an empty key is an InvalidArgument.
//! assert!(store.get("").await.is_err());
//! // A provided fallback: set_max as a get + compare_and_set loop.
//! assert!(store.set_max("hc:{g}:max", 7, None).await?);
//! # Ok(())
//! # }
//! ```

mod deadline;
pub mod probe;
mod revisions;
pub mod url;

pub use deadline::Deadline;
pub use revisions::{revision_version, RevisionWatch, Sent};

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::notify::Notifications;
use crate::op::for_each_op;
use crate::store::{
    Capabilities, Durability, RenewedListing, Store, MAX_KEY_LEN, MAX_TTL, MAX_VALUE_LEN, MIN_TTL,
};

/// A store's primitives as a backend implements them: [`Store`]'s methods, with the same
/// semantics (see each one's documentation there), called only with checked arguments.
/// Implement this, never [`Store`]: `Store` is implemented for every `Backend`, checking the
/// arguments first (see the [module documentation](self)).
#[async_trait]
pub trait Backend: Send + Sync + Debug + 'static {
    /// See [`Store::capabilities`].
    fn capabilities(&self) -> Capabilities;

    /// See [`Store::incr`].
    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64>;

    /// See [`Store::get`].
    async fn get(&self, key: &str) -> Result<Option<String>>;

    /// See [`Store::expire`].
    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool>;

    /// See [`Store::compare_and_set`].
    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool>;

    /// See [`Store::delete`].
    async fn delete(&self, key: &str) -> Result<bool>;

    /// See [`Store::list`].
    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>>;

    /// See [`Store::set_max`]. Provided: a `get` + `compare_and_set` loop.
    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        let new = value.to_string();
        // Every failed CAS means another writer changed the key, so the loop only spins while
        // others make progress; the bound turns pathological contention into an error.
        for _ in 0..SET_MAX_ATTEMPTS {
            let current = Backend::get(self, key).await?;
            match current {
                None => {
                    if Backend::compare_and_set(self, key, None, &new, ttl).await? {
                        return Ok(true);
                    }
                }
                Some(text) => {
                    if parse_counter(key, &text)? >= value {
                        return Ok(false);
                    }
                    if Backend::compare_and_set(self, key, Some(&text), &new, ttl).await? {
                        return Ok(true);
                    }
                }
            }
        }
        Err(Error::contended(
            key,
            format!("set_max lost {SET_MAX_ATTEMPTS} compare-and-set races in a row"),
        ))
    }

    /// See [`Store::incr_and_get`]. Provided: `incr` (or, for `by > 1`, a `get` +
    /// `compare_and_set` loop), then `get`.
    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        let value = if by == 1 {
            Backend::incr(self, incr_key, ttl).await?
        } else {
            incr_by_cas(self, incr_key, by, ttl).await?
        };
        let read = Backend::get(self, get_key).await?;
        Ok((value, read))
    }

    /// See [`Store::renew_and_list`]. Provided: `compare_and_set` with the same value, then
    /// `list`.
    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        let renewed = Backend::compare_and_set(self, key, Some(holder), holder, Some(ttl)).await?;
        let listed = Backend::list(self, prefix).await?;
        Ok((renewed, listed))
    }

    /// See [`Store::renew_and_list_if_changed`]. Provided: `renew_and_list` and a digest of the
    /// directory's entries ([`listing_digest`]).
    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> Result<RenewedListing> {
        let (renewed, listed) = Backend::renew_and_list(self, key, holder, ttl, dir).await?;
        let entries = direct_entries(dir, listed);
        let version = listing_digest(&entries);
        let listing = (since != Some(version.as_str())).then_some(entries);
        Ok(RenewedListing::new(renewed, version, listing))
    }

    /// See [`Store::renew_and_versions`]. Provided: [`versions_one_by_one`].
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        versions_one_by_one(self, key, holder, ttl, dirs).await
    }

    /// See [`Store::compare_and_delete`]. Provided: `compare_and_set` keeping the value with the
    /// backend's shortest TTL.
    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let shortest = Backend::capabilities(self).min_ttl.max(MIN_TTL);
        Backend::compare_and_set(self, key, Some(expected), expected, Some(shortest)).await
    }

    /// See [`Store::list_with_ttl`]. Provided: [`Error::Unsupported`], since no other primitive
    /// reads a TTL.
    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        let _ = prefix;
        Err(Error::Unsupported {
            backend: Backend::capabilities(self).backend,
            what: "reading a key's remaining time to live (list_with_ttl)".to_owned(),
        })
    }

    /// See [`Store::durability`]. Provided: "not known to be durable".
    async fn durability(&self) -> Result<Durability> {
        Ok(Durability::not_durable(format!(
            "the {} backend cannot tell whether its writes survive a crash",
            Backend::capabilities(self).backend
        )))
    }

    /// See [`Store::subscribe`]. Provided: [`Notifications::never`].
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        Ok(Notifications::never(dir))
    }
}

/// The checked entry point: every [`Backend`] is a [`Store`] whose methods check their arguments
/// and then call the backend's. The only implementation of [`Store`] there is; its methods are
/// expanded from the one list of operations ([`for_each_op`]).
macro_rules! checked_store {
    ([$({ $name:ident, $op:ident, ($($arg:ident: $ty:ty),*) -> $answer:ty,
          scope: $scope:expr, check: { $($check:tt)* } },)*]) => {
        #[async_trait]
        impl<B: Backend> Store for B {
            fn capabilities(&self) -> Capabilities {
                Backend::capabilities(self)
            }

            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$answer> {
                    $($check)*
                    Backend::$name(self, $($arg),*).await
                }
            )*

            async fn subscribe(&self, dir: &str) -> Result<Notifications> {
                check_dir(dir)?;
                Backend::subscribe(self, dir).await
            }
        }
    };
}

for_each_op!(checked_store);

impl<B: Backend> crate::store::sealed::Sealed for B {}

/// Of a listing of `dir`, the entries directly under it (no `:` after `dir`).
pub fn direct_entries(dir: &str, listed: Vec<(String, String)>) -> Vec<(String, String)> {
    listed
        .into_iter()
        .filter(|(k, _)| k.strip_prefix(dir).is_some_and(|rest| !rest.contains(':')))
        .collect()
}

/// The version of a directory as the provided [`Store::renew_and_list_if_changed`] computes it:
/// a digest of its entries, so equal versions mean equal contents (up to a 64-bit collision).
pub fn listing_digest(entries: &[(String, String)]) -> String {
    let mut bytes = Vec::new();
    for (k, v) in entries {
        bytes.extend_from_slice(&(k.len() as u64).to_le_bytes());
        bytes.extend_from_slice(k.as_bytes());
        bytes.extend_from_slice(&(v.len() as u64).to_le_bytes());
        bytes.extend_from_slice(v.as_bytes());
    }
    format!("d{:016x}", crate::assign::hash_bytes(&bytes))
}

/// The argument checks of [`Store::renew_and_list_if_changed`]: those of
/// [`Store::renew_and_list`], and a directory that ends with `:`.
pub fn check_renew_and_list_if_changed(
    key: &str,
    holder: &str,
    ttl: Duration,
    dir: &str,
) -> Result<()> {
    check_renew_and_list(key, holder, ttl, dir)?;
    check_dir(dir)
}

/// Checks a directory (of [`Store::subscribe`] and [`Store::renew_and_list_if_changed`]): a
/// valid prefix ([`check_prefix`]) that ends with `:`.
pub fn check_dir(dir: &str) -> Result<()> {
    check_prefix(dir)?;
    if !dir.ends_with(':') {
        return Err(Error::invalid(format!(
            "directory `{dir}` does not end with `:`"
        )));
    }
    Ok(())
}

/// The provided [`Store::renew_and_versions`]: one [`Store::renew_and_list_if_changed`] per
/// directory, renewed only if every call renewed. For a backend that overrides the method but
/// cannot answer some directories in one call.
pub async fn versions_one_by_one<S: Backend + ?Sized>(
    store: &S,
    key: &str,
    holder: &str,
    ttl: Duration,
    dirs: &[(&str, Option<&str>)],
) -> Result<(bool, Vec<String>)> {
    let mut renewed = true;
    let mut versions = Vec::with_capacity(dirs.len());
    for (dir, since) in dirs {
        let answer =
            Backend::renew_and_list_if_changed(store, key, holder, ttl, dir, *since).await?;
        renewed &= answer.renewed;
        versions.push(answer.version);
    }
    Ok((renewed, versions))
}

/// The argument checks of [`Store::renew_and_versions`]: those of
/// [`Store::renew_and_list_if_changed`] for each directory, and at least one directory.
pub fn check_renew_and_versions(
    key: &str,
    holder: &str,
    ttl: Duration,
    dirs: &[(&str, Option<&str>)],
) -> Result<()> {
    if dirs.is_empty() {
        return Err(Error::invalid(
            "renew_and_versions needs at least one directory",
        ));
    }
    for (dir, _) in dirs {
        check_renew_and_list_if_changed(key, holder, ttl, dir)?;
    }
    Ok(())
}

/// The argument checks of [`Store::renew_and_list`]: the key, the holder value, the TTL and the
/// prefix.
pub fn check_renew_and_list(key: &str, holder: &str, ttl: Duration, prefix: &str) -> Result<()> {
    check_key(key)?;
    check_value(holder)?;
    check_ttl(ttl)?;
    check_prefix(prefix)
}

/// The increment-by-`by` of the provided [`Store::incr_and_get`]: a `get` + `compare_and_set`
/// loop, bounded like [`Store::set_max`]'s.
async fn incr_by_cas<S: Backend + ?Sized>(
    store: &S,
    key: &str,
    by: i64,
    ttl: Option<Duration>,
) -> Result<i64> {
    for _ in 0..SET_MAX_ATTEMPTS {
        let current = Backend::get(store, key).await?;
        let (expected, next) = match &current {
            None => (None, by),
            Some(text) => {
                let now = parse_counter(key, text)?;
                let next = now.checked_add(by).ok_or_else(|| {
                    Error::foreign(key, "a decimal integer that stays within an i64", text)
                })?;
                (Some(text.as_str()), next)
            }
        };
        if Backend::compare_and_set(store, key, expected, &next.to_string(), ttl).await? {
            return Ok(next);
        }
    }
    Err(Error::contended(
        key,
        format!("incr_and_get lost {SET_MAX_ATTEMPTS} compare-and-set races in a row"),
    ))
}

/// The argument checks of [`Store::incr_and_get`]: both keys, `by >= 1`, the TTL, and two
/// different keys.
pub fn check_incr_and_get(
    incr_key: &str,
    by: i64,
    ttl: Option<Duration>,
    get_key: &str,
) -> Result<()> {
    check_key(incr_key)?;
    check_key(get_key)?;
    check_opt_ttl(ttl)?;
    if by < 1 {
        return Err(Error::invalid(format!(
            "incr_and_get adds {by}; it must add at least 1"
        )));
    }
    if incr_key == get_key {
        return Err(Error::invalid(
            "incr_and_get needs two different keys (use incr to read back the new value)",
        ));
    }
    Ok(())
}

const SET_MAX_ATTEMPTS: usize = 1000;

/// Checks a key: non-empty, at most [`MAX_KEY_LEN`] bytes, no control characters (NUL cannot be
/// stored by PostgreSQL, and the others are almost certainly a bug). `:`, `{`, `}` and any
/// printable Unicode are fine.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(format!(
            "key is {} bytes long, more than the limit of {MAX_KEY_LEN}",
            key.len()
        )));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(format!(
            "key contains the control character {c:?}"
        )));
    }
    Ok(())
}

/// Checks a listing prefix: the same rules as [`check_key`] (so it cannot be empty).
pub fn check_prefix(prefix: &str) -> Result<()> {
    check_key(prefix).map_err(|e| match e {
        Error::InvalidArgument { message } => Error::invalid(message.replacen("key", "prefix", 1)),
        other => other,
    })
}

/// Checks a value: at most [`MAX_VALUE_LEN`] bytes and no NUL (PostgreSQL text cannot hold it).
pub fn check_value(value: &str) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid(format!(
            "value is {} bytes long, more than the limit of {MAX_VALUE_LEN}",
            value.len()
        )));
    }
    if value.contains('\0') {
        return Err(Error::invalid("value contains a NUL character"));
    }
    Ok(())
}

/// The argument checks of [`Store::compare_and_set`]: the key, both values and the TTL.
pub fn check_cas(
    key: &str,
    expected: Option<&str>,
    new: &str,
    ttl: Option<Duration>,
) -> Result<()> {
    check_key(key)?;
    if let Some(expected) = expected {
        check_value(expected)?;
    }
    check_value(new)?;
    check_opt_ttl(ttl)
}

/// Checks a TTL: at least [`MIN_TTL`] (zero is an error) and at most [`MAX_TTL`].
pub fn check_ttl(ttl: Duration) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid(
            "TTL is zero; use None for a key that never expires",
        ));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(format!(
            "TTL of {ttl:?} is longer than the limit of {MAX_TTL:?}; use None for a key that never expires"
        )));
    }
    Ok(())
}

/// [`check_ttl`] for an optional TTL; `None` (never expires) is always fine.
pub fn check_opt_ttl(ttl: Option<Duration>) -> Result<()> {
    ttl.map_or(Ok(()), check_ttl)
}

/// A TTL in whole milliseconds, rounded up (so 1 µs becomes 1 ms, never 0). Call after
/// [`check_ttl`].
pub fn ttl_millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

/// Parses a stored counter: the canonical decimal text of an `i64`, which is `0` or an optional
/// `-` and a digit 1-9 followed by digits (no `+`, no leading zeros, no `-0`, no spaces, no
/// fraction). That is exactly what Redis's `INCR` accepts and what `i64::to_string` writes, so
/// every backend agrees on what is a counter. Anything else is [`Error::ForeignValue`] naming `key`.
pub fn parse_counter(key: &str, text: &str) -> Result<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = text == "0"
        || (digits.starts_with(|c: char| ('1'..='9').contains(&c))
            && digits.bytes().all(|b| b.is_ascii_digit()));
    canonical
        .then(|| text.parse::<i64>().ok())
        .flatten()
        .ok_or_else(|| Error::foreign(key, "a decimal integer", text))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{
        check_key, check_opt_ttl, check_prefix, check_ttl, check_value, parse_counter, ttl_millis,
    };
    use crate::error::Error;
    use crate::store::{MAX_KEY_LEN, MAX_TTL, MAX_VALUE_LEN};

    #[test]
    fn keys_are_checked() {
        assert!(check_key("hc:{g}:slot:1").is_ok());
        assert!(check_key("ключ:{群}").is_ok());
        assert!(check_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(matches!(check_key(""), Err(Error::InvalidArgument { .. })));
        assert!(check_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
        assert!(check_key("a\nb").is_err());
        assert!(check_key("a\0b").is_err());
        let e = check_prefix("").unwrap_err().to_string();
        assert!(e.contains("prefix is empty"), "{e}");
    }

    #[test]
    fn ttls_are_checked_and_rounded_up() {
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(MAX_TTL + Duration::from_secs(1)).is_err());
        assert!(check_ttl(Duration::from_nanos(1)).is_ok());
        assert!(check_opt_ttl(None).is_ok());
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
        assert_eq!(ttl_millis(Duration::from_millis(1500)), 1500);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 2);
    }

    #[test]
    fn counters_parse_strictly() {
        assert_eq!(parse_counter("k", "42").ok(), Some(42));
        assert_eq!(parse_counter("k", "-7").ok(), Some(-7));
        assert_eq!(parse_counter("k", "0").ok(), Some(0));
        assert_eq!(
            parse_counter("k", "-9223372036854775808").ok(),
            Some(i64::MIN)
        );
        for bad in [
            "abc",
            "",
            " 1",
            "1.5",
            "99999999999999999999",
            "+5",
            "007",
            "-0",
            "-",
            "00",
        ] {
            assert!(
                matches!(parse_counter("k", bad), Err(Error::ForeignValue { .. })),
                "{bad:?}"
            );
        }
        assert!(check_value("a\0").is_err());
        assert!(check_value(&"v".repeat(MAX_VALUE_LEN + 1)).is_err());
    }
}
