#![doc = include_str!("../README.md")]

pub use headcount_core::*;

/// Opens the store named by `url`, picking the backend by its scheme:
///
/// | scheme | backend | cargo feature |
/// |---|---|---|
/// | `sqlite://relative/path.db`, `sqlite:///absolute/path.db`, `sqlite::memory:` | embedded SQLite | `sqlite` (default) |
/// | `postgres://…`, `postgresql://…` | PostgreSQL | `postgres` |
///
/// A scheme whose feature is not compiled in gives [`Error::FeatureDisabled`] naming the feature;
/// an unknown scheme or a malformed URL gives [`Error::InvalidConfig`]. Error messages never
/// contain the URL's password.
pub async fn connect(url: &str) -> Result<DynStore> {
    let scheme = scheme_of(url)?;
    match scheme.as_str() {
        "sqlite" => connect_sqlite(url).await,
        "postgres" | "postgresql" => connect_postgres(url).await,
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => Err(Error::FeatureDisabled {
            scheme,
            feature: "redis",
        }),
        "etcd" | "etcds" => Err(Error::FeatureDisabled {
            scheme,
            feature: "etcd",
        }),
        _ => Err(Error::config(format!(
            "unknown store scheme `{scheme}`: expected sqlite, postgres or postgresql"
        ))),
    }
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
    async fn disabled_backends_name_their_feature() {
        for (url, feature) in [
            ("redis://127.0.0.1:6379", "redis"),
            ("redis+cluster://a:1,b:2", "redis"),
            ("etcd://127.0.0.1:2379", "etcd"),
        ] {
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
