//! `durability`: the probe the majority-IDs recipe relies on to refuse stores that forget.

use crate::{ensure, ensure_eq, CaseResult, Ctx, ResultExt};

/// The durability probe answers without error, the same twice, with a detail naming the settings
/// it read, and its verdict agrees with those settings.
pub async fn durability_probe(ctx: &Ctx) -> CaseResult {
    let first = ctx.store.durability().await.during("durability()")?;
    let again = ctx.store.durability().await.during("durability() again")?;
    ensure_eq!(again, first, "a second durability() call");
    let detail = first.detail.as_str();
    ensure!(!detail.is_empty(), "durability() gave an empty detail");
    let backend = ctx.caps().backend;
    // The settings as read, without the hint that may follow in parentheses.
    let read = detail.split(" (").next().unwrap_or(detail);
    // What the detail must mention, and the verdict those settings call for.
    let (names, durable): (&[&str], bool) = match backend {
        "redis" => (
            &["appendonly", "appendfsync"],
            read == "appendonly yes, appendfsync always",
        ),
        "postgres" => (
            &["fsync", "synchronous_commit"],
            read.starts_with("fsync on,") && !read.ends_with("synchronous_commit off"),
        ),
        "sqlite" => (
            &["synchronous", "journal_mode"],
            (read.starts_with("synchronous FULL") || read.starts_with("synchronous EXTRA"))
                && ["wal", "delete", "truncate", "persist"]
                    .iter()
                    .any(|j| read.ends_with(&format!("journal_mode {j}"))),
        ),
        "etcd" => (&["WAL"], true),
        // Another backend: only the call itself is checked.
        _ => (&[], first.durable),
    };
    if backend == "sqlite" && !ctx.caps().shared {
        ensure!(
            !first.durable,
            "an in-memory SQLite database reported itself durable: {detail}"
        );
        return Ok(());
    }
    // This workspace's backends name the server behind a shared store (majority IDs refuse
    // two stores that share one); another backend may leave it empty ("cannot tell").
    if ctx.caps().shared && ["redis", "postgres", "sqlite", "etcd"].contains(&backend) {
        ensure!(
            !first.servers.is_empty() && first.servers.iter().all(|s| !s.is_empty()),
            "the {backend} durability answer names no server: {first:?}"
        );
    }
    for name in names {
        ensure!(
            detail.contains(name),
            "the {backend} durability detail does not mention {name}: {detail:?}"
        );
    }
    ensure_eq!(
        first.durable,
        durable,
        "the durability verdict for {detail:?}"
    );
    Ok(())
}
