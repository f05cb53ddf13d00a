#![doc = include_str!("../README.md")]

pub use headcount_core::*;

/// Fencing guards for sinks in PostgreSQL (cargo feature `postgres`): the token check and the
/// guarded write in one statement.
#[cfg(feature = "postgres")]
pub use headcount_sql::postgres::{FencedOutcome, PgFence};

/// A fencing guard for sinks in Redis or Redis Cluster (cargo feature `redis`): a
/// set-if-greater-or-equal script that can write the guarded data in the same step.
#[cfg(feature = "redis")]
pub use headcount_redis::RedisFence;

/// The SQLite backend (cargo feature `sqlite`): `SqliteStore`, built from a URL or a
/// `SqliteConfig`.
#[cfg(feature = "sqlite")]
pub use headcount_sql::sqlite;

/// The PostgreSQL backend (cargo feature `postgres`): `PostgresStore` (with `from_pool` for a
/// pool the application already has), `PgFence`, and the `deadpool_postgres` and
/// `tokio_postgres` crates it uses.
#[cfg(feature = "postgres")]
pub use headcount_sql::postgres;

/// The Redis backend (cargo feature `redis`): `RedisStore` (with `from_client`, `from_manager`
/// and `from_cluster`), `RedisFence`, and the `redis` crate it uses.
#[cfg(feature = "redis")]
pub use headcount_redis as redis;

/// The etcd backend (cargo feature `etcd`): `EtcdStore` (with `from_client`) and the
/// `etcd_client` crate it uses.
#[cfg(feature = "etcd")]
pub use headcount_etcd as etcd;

/// Opens the store named by `url`, picking the backend by its scheme:
///
/// | scheme | backend | cargo feature |
/// |---|---|---|
/// | `sqlite://relative/path.db`, `sqlite:///absolute/path.db`, `sqlite::memory:` | embedded SQLite | `sqlite` (default) |
/// | `postgres://…`, `postgresql://…` | PostgreSQL | `postgres` |
/// | `redis://…`, `rediss://…`, `redis+cluster://…`, `rediss+cluster://…`, `redis+sentinel://…`, `rediss+sentinel://…` | Redis, Redis Cluster, Redis behind Sentinel | `redis` |
/// | `etcd://…`, `etcds://…` | etcd | `etcd` |
/// | `memory://` or `memory://NAME` | [`MemoryStore`]: this process only, for tests; one store per name | always |
///
/// A scheme whose feature is not compiled in gives [`Error::FeatureDisabled`] naming the feature;
/// an unknown scheme or a malformed URL gives [`Error::InvalidConfig`]. Error messages never
/// contain the URL's password.
///
/// The store comes [instrumented](crate::instrumented::instrument): every operation records its latency and errors
/// through the [`metrics`](mod@metrics) facade and runs in a `tracing` span (backend, operation,
/// key scope; never a value or a password). Use [`connect_plain`] for a store without them.
pub async fn connect(url: &str) -> Result<DynStore> {
    Ok(instrumented::instrument(connect_plain(url).await?))
}

/// [`connect`] without the metrics and spans: the backend's store itself.
pub async fn connect_plain(url: &str) -> Result<DynStore> {
    let scheme = scheme_of(url)?;
    match scheme.as_str() {
        "sqlite" => connect_sqlite(url).await,
        "postgres" | "postgresql" => connect_postgres(url).await,
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
        | "rediss+sentinel" => connect_redis(url, scheme).await,
        "etcd" | "etcds" => connect_etcd(url, scheme).await,
        "memory" => connect_memory(url),
        _ => Err(Error::config(format!(
            "unknown store scheme `{scheme}`: expected sqlite, postgres, postgresql, redis, rediss, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel, etcd, etcds or memory"
        ))),
    }
}

/// `url` with any password replaced by `***`, for logs, errors and output: both the
/// `user:password@` part of the authority and `password=` query parameters.
///
/// ```
/// assert_eq!(
///     headcount::redact_url("postgres://app:s3cret@db:5432/hc?sslmode=require&password=x"),
///     "postgres://app:***@db:5432/hc?sslmode=require&password=***"
/// );
/// assert_eq!(headcount::redact_url("sqlite://headcount.db"), "sqlite://headcount.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let (head, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => return redact_query(url),
    };
    // The authority ends at the first `/` or `?`, as the backends parse it; not at `#`: no
    // backend accepts a raw `#` (it would start a fragment; a password writes it `%23`), but a
    // mistyped password may hold one, and it must be hidden with it.
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (userinfo, hosts) = authority.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***{hosts}"),
                None => authority.to_owned(),
            }
        }
        None => authority.to_owned(),
    };
    format!("{head}{authority}{}", redact_query(tail))
}

fn redact_query(s: &str) -> String {
    let Some((path, query)) = s.split_once('?') else {
        return s.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.to_ascii_lowercase().contains("pass") => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{path}?{}", params.join("&"))
}

/// The scheme of a store URL, lower-cased, without touching (or echoing) the rest.
fn scheme_of(url: &str) -> Result<String> {
    let Some((scheme, _)) = url.split_once(':') else {
        return Err(Error::config(
            "store URL has no scheme: expected something like sqlite://headcount.db or postgres://user@host/db",
        ));
    };
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(Error::config(
            "store URL has a malformed scheme: expected something like sqlite://headcount.db",
        ));
    }
    Ok(scheme.to_ascii_lowercase())
}

/// `memory://NAME`: the process-wide in-memory store called NAME (empty name allowed).
fn connect_memory(url: &str) -> Result<DynStore> {
    let name = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .ok_or_else(|| Error::config("a memory store URL is `memory://` or `memory://NAME`"))?;
    if name.contains(['/', '?', '#', '@']) {
        return Err(Error::config(
            "a memory store URL is `memory://` or `memory://NAME`, with no path, query or user",
        ));
    }
    Ok(std::sync::Arc::new(MemoryStore::named(name)))
}

#[cfg(feature = "sqlite")]
async fn connect_sqlite(url: &str) -> Result<DynStore> {
    Ok(std::sync::Arc::new(
        headcount_sql::sqlite::SqliteStore::connect(url).await?,
    ))
}

#[cfg(not(feature = "sqlite"))]
async fn connect_sqlite(_url: &str) -> Result<DynStore> {
    Err(Error::FeatureDisabled {
        scheme: "sqlite".into(),
        feature: "sqlite",
    })
}

#[cfg(feature = "postgres")]
async fn connect_postgres(url: &str) -> Result<DynStore> {
    Ok(std::sync::Arc::new(
        headcount_sql::postgres::PostgresStore::connect(url).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn connect_postgres(url: &str) -> Result<DynStore> {
    Err(Error::FeatureDisabled {
        scheme: scheme_of(url)?,
        feature: "postgres",
    })
}

#[cfg(feature = "redis")]
async fn connect_redis(url: &str, _scheme: String) -> Result<DynStore> {
    Ok(std::sync::Arc::new(
        headcount_redis::RedisStore::connect(url).await?,
    ))
}

#[cfg(not(feature = "redis"))]
async fn connect_redis(_url: &str, scheme: String) -> Result<DynStore> {
    Err(Error::FeatureDisabled {
        scheme,
        feature: "redis",
    })
}

#[cfg(feature = "etcd")]
async fn connect_etcd(url: &str, _scheme: String) -> Result<DynStore> {
    Ok(std::sync::Arc::new(
        headcount_etcd::EtcdStore::connect(url).await?,
    ))
}

#[cfg(not(feature = "etcd"))]
async fn connect_etcd(_url: &str, scheme: String) -> Result<DynStore> {
    Err(Error::FeatureDisabled {
        scheme,
        feature: "etcd",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_and_malformed_schemes_are_config_errors() {
        for url in [
            "mysql://u:secret@h/db",
            "no-scheme-here",
            "://x",
            "1x://y",
            "",
        ] {
            let err = connect(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
    }

    #[tokio::test]
    async fn memory_urls_share_one_store_per_name() {
        let a = connect("memory://urls-test").await.expect("memory store");
        let b = connect("memory://urls-test").await.expect("memory store");
        assert_eq!(a.capabilities().backend, "memory");
        assert_eq!(a.incr("hc:{t}:n", None).await.ok(), Some(1));
        assert_eq!(b.incr("hc:{t}:n", None).await.ok(), Some(2));
        for bad in ["memory:x", "memory://a/b", "memory://a?x=1"] {
            let err = connect(bad).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad}: {err}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_urls_dispatch_to_sqlite() {
        let store = connect("sqlite::memory:").await.expect("in-memory sqlite");
        assert_eq!(store.capabilities().backend, "sqlite");
        assert_eq!(store.incr("hc:{t}:n", None).await.ok(), Some(1));
        let err = connect("sqlite://").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn bad_postgres_urls_are_config_errors_without_the_password() {
        for url in [
            "postgres://u:hunter2@localhost:notaport/db",
            "postgresql://u:hunter2@/db",
            "postgres://u:hunter2@h/db?timeout=abc",
            "postgres://u:hunter2@h/db?timeout=0s",
            "postgres://u:hunter2@h/db?nonsense=1",
        ] {
            let err = connect(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
            assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
        }
    }

    #[test]
    fn redaction_hides_every_password_form() {
        for (url, want) in [
            ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
            (
                "redis+cluster://u:pw@a:1,b:2",
                "redis+cluster://u:***@a:1,b:2",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u:ab#cd@h/db", "postgres://u:***@h/db"),
            ("redis://:a#b@h:6379", "redis://:***@h:6379"),
            (
                "postgresql:///db?user=u&password=pw",
                "postgresql:///db?user=u&password=***",
            ),
            ("sqlite::memory:", "sqlite::memory:"),
        ] {
            assert_eq!(redact_url(url), want);
        }
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn bad_redis_urls_are_config_errors_without_the_password() {
        for url in [
            "redis://:hunter2@localhost:notaport",
            "redis://u:hunter2@h/x",
            "rediss+cluster://u:hunter2@a:1/3",
            "redis://u:hunter2@h?timeout=0s",
        ] {
            let err = connect(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
            assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
        }
        // Nothing listens on port 1: retryable, and still no password.
        let err = connect("redis://:hunter2@127.0.0.1:1?timeout=1s")
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }

    #[cfg(feature = "etcd")]
    #[tokio::test]
    async fn bad_etcd_urls_are_config_errors_without_the_password() {
        for url in [
            "etcd://u:hunter2@localhost:notaport",
            "etcd://u:hunter2@h/path",
            "etcd://u:hunter2@h?cacert=/x.pem",
            "etcds://u:hunter2@h?bogus=1",
        ] {
            let err = connect(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
            assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
        }
    }

    /// One `#` rule for every scheme: a raw `#` starts a fragment, which is refused (a password
    /// writes it `%23`), and the error does not show the password.
    #[tokio::test]
    async fn a_raw_hash_is_refused_by_every_scheme_without_the_password() {
        #[allow(unused_mut)]
        let mut urls: Vec<&str> = Vec::new();
        #[cfg(feature = "sqlite")]
        urls.push("sqlite://hunter#2.db");
        #[cfg(feature = "postgres")]
        urls.push("postgres://u:hunter#2@h/db");
        #[cfg(feature = "redis")]
        urls.extend(["redis://:hunter#2@h", "redis+cluster://u:hunter#2@a:1,b:2"]);
        #[cfg(feature = "etcd")]
        urls.push("etcd://u:hunter#2@h");
        for url in urls {
            let err = connect(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
            assert!(err.to_string().contains("%23"), "{url}: {err}");
            assert!(
                !format!("{err} {err:?}").contains("hunter"),
                "{url}: {err:?}"
            );
        }
    }

    #[tokio::test]
    async fn disabled_backends_name_their_feature() {
        #[allow(unused_mut)]
        let mut disabled: Vec<(&str, &str)> = Vec::new();
        #[cfg(not(feature = "redis"))]
        disabled.extend([
            ("redis://127.0.0.1:6379", "redis"),
            ("redis+cluster://a:1,b:2", "redis"),
        ]);
        #[cfg(not(feature = "etcd"))]
        disabled.push(("etcd://127.0.0.1:2379", "etcd"));
        for (url, feature) in disabled {
            match connect(url).await {
                Err(Error::FeatureDisabled { feature: f, .. }) => assert_eq!(f, feature),
                other => panic!("{url}: {other:?}"),
            }
        }
        #[cfg(not(feature = "postgres"))]
        match connect("postgres://u:secret@localhost/db").await {
            Err(e @ Error::FeatureDisabled { .. }) => {
                assert!(e.to_string().contains("`postgres` cargo feature"), "{e}");
                assert!(!e.to_string().contains("secret"));
            }
            other => panic!("{other:?}"),
        }
    }
}
