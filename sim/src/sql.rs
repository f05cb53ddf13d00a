//! [`SqlModel`]: the in-memory store answering as the SQL backends do.
//!
//! A SQL backend's directory version is a digest of the directory's entries, computed with the
//! listing it stands for: SQLite's is the provided `renew_and_list_if_changed` (one transaction
//! that renews and lists, then [`listing_digest`](headcount_core::backend::listing_digest)), PostgreSQL's
//! a SHA-256 the server computes in the statement that renews and lists. Like the in-memory
//! store's, such a version has no counter, index or clock of its own, so nothing but the data
//! can make it miss a change, and a rollback of the data (which the simulation does to every
//! model) is all there is to it. Both answer several directories' versions in one call, as the
//! in-memory store does ([`renew_and_versions`](headcount_core::Store::renew_and_versions): one
//! transaction, or one statement, that renews and digests each directory as
//! `renew_and_list_if_changed` would). What the model keeps of the SQL backends is their
//! capabilities (no version kept per directory: `renew_and_list_if_changed` digests the listing
//! it reads), so the group takes the path it takes on them.
//!
//! Change notifications: PostgreSQL's row triggers `pg_notify` a directory whenever a write
//! changes a row under it (not on a renewal that changes nothing), and one `LISTEN` connection
//! per handle hands them to every process; SQLite's wake the handles on the same file. The
//! model's writes go through the in-memory store's methods, which notify every write that
//! changes a key to the subscribers of its directory, in every process of the simulation (they
//! share the store), and a rollback as [`Notice::MayHaveMissed`](headcount_core::notify::Notice) (the
//! listener reconnecting to the restored server).

use std::time::Duration;

use async_trait::async_trait;

use headcount_core::backend::Backend;
use headcount_core::error::Result;
use headcount_core::memory::MemoryStore;
use headcount_core::notify::Notifications;
use headcount_core::store::{Capabilities, Durability};

const BACKEND: &str = "sql-model";

/// A [`MemoryStore`] whose capabilities are the SQL backends': versions digested from the
/// listings. Clones share the data, which the simulation rolls back through the memory store.
#[derive(Debug, Clone)]
pub struct SqlModel {
    data: MemoryStore,
}

impl SqlModel {
    /// A model over `data`.
    pub fn new(data: MemoryStore) -> Self {
        SqlModel { data }
    }
}

#[async_trait]
impl Backend for SqlModel {
    /// SQLite's and PostgreSQL's, with the in-memory store's TTLs.
    fn capabilities(&self) -> Capabilities {
        let mut caps = Backend::capabilities(&self.data);
        caps.backend = BACKEND;
        caps.native_renew_and_versions = true;
        caps.native_change_version = false;
        caps.native_notifications = true;
        caps
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        Backend::incr(&self.data, key, ttl).await
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        Backend::get(&self.data, key).await
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        Backend::expire(&self.data, key, ttl).await
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        Backend::compare_and_set(&self.data, key, expected, new, ttl).await
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        Backend::delete(&self.data, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        Backend::list(&self.data, prefix).await
    }

    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        Backend::list_with_ttl(&self.data, prefix).await
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        Backend::set_max(&self.data, key, value, ttl).await
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        Backend::incr_and_get(&self.data, incr_key, by, ttl, get_key).await
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        Backend::renew_and_list(&self.data, key, holder, ttl, prefix).await
    }

    /// The in-memory store's: the renewal and each directory's digest under one lock, as both
    /// SQL backends answer it in one transaction.
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        Backend::renew_and_versions(&self.data, key, holder, ttl, dirs).await
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        Backend::compare_and_delete(&self.data, key, expected).await
    }

    /// The in-memory store's: every write that changes a key under `dir`, as PostgreSQL's
    /// triggers notify it (see the module docs).
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        Backend::subscribe(&self.data, dir).await
    }

    async fn durability(&self) -> Result<Durability> {
        Ok(Durability::not_durable(
            "the SQL model keeps its data in this process only",
        ))
    }
}
