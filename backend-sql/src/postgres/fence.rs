//! A fencing guard for a PostgreSQL sink: the check of a grant's fencing token and the write it
//! guards in one statement: [`PgFence`].

use async_trait::async_trait;
use headcount_core::fence::{Fence, FencingToken};
use headcount_core::{Error, Result};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};

use super::config::is_plain_identifier;
use super::errors::{self, BACKEND};

/// PostgreSQL truncates identifiers longer than this.
const MAX_IDENTIFIER_LEN: usize = 63;

/// A fencing guard for a PostgreSQL sink, over one table of `(resource text primary key, token
/// bigint not null)` rows: the check of a grant's fencing token and the write it guards in one
/// statement.
///
/// Every grant headcount hands out carries a [`FencingToken`] (`Grant::token`: for a key,
/// the first epoch of the member's unbroken ownership of it; for a whole share, the epoch of its
/// view). A sink that
/// accepts writes from whoever currently owns a resource keeps, per resource, the highest token it
/// has admitted, admits a write whose token is at least that (equal tokens: the same owner writes
/// again), records it, and refuses older ones. An owner that was paused past its lease and wakes
/// up with an old token is refused, however late its write arrives.
///
/// The fence row lives in the sink's own database, and [`PgFence::fenced`] puts the check in the
/// same statement as the write: the fence's `INSERT ... ON CONFLICT DO UPDATE ... WHERE` takes the
/// resource's fence row lock (also when it refuses) and keeps it until the statement's transaction
/// commits, so writers of one resource are serialised on it, and the sink's commit order follows
/// the tokens.
///
/// ```no_run
/// # async fn demo(
/// #     client: &tokio_postgres::Client,
/// #     token: headcount_core::fence::FencingToken,
/// # ) -> headcount_core::Result<()> {
/// use headcount_sql::postgres::PgFence;
///
/// let fence = PgFence::new("hc_fence")?;
/// fence.ensure_table(client).await?;
/// // $1 and $2 are the fence's (resource, token); the write's own parameters start at $3. The
/// // write reads FROM hc_fence, so it writes nothing when the fence refuses.
/// let outcome = fence
///     .execute_fenced(
///         client,
///         "INSERT INTO invoices (customer, total, token) SELECT $3, $4, token FROM hc_fence",
///         "customer:42",
///         token, // the grant's fencing token: grant.token()
///         &[&"customer:42", &1999_i64],
///     )
///     .await?;
/// if !outcome.admitted {
///     // A newer owner of customer:42 exists: stop working on it.
/// }
/// # Ok(())
/// # }
/// ```
///
/// Cheap to clone; holds no connection: every method takes the caller's client (a
/// `tokio_postgres::Client` or `Transaction`, or a pooled client dereferenced to one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgFence {
    table: String,
    quoted: String,
    fence_cte: String,
    admit: String,
}

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencedOutcome {
    /// Whether the fence admitted the token (and recorded it as the resource's highest).
    pub admitted: bool,
    /// How many rows the write wrote: 0 whenever the fence refused.
    pub rows: u64,
}

impl PgFence {
    /// A fence whose rows live in `table`, a plain SQL identifier (ASCII letters, digits and `_`,
    /// not starting with a digit, at most 63 bytes), folded to lower case as PostgreSQL folds
    /// unquoted names, then always quoted. Anything else is [`Error::InvalidArgument`]: the name
    /// is spliced into SQL text, so nothing that could carry SQL is accepted.
    pub fn new(table: &str) -> Result<Self> {
        if !is_plain_identifier(table, MAX_IDENTIFIER_LEN) {
            return Err(Error::invalid(format!(
                "invalid fence table name {table:?}: expected a plain SQL identifier (ASCII \
                 letters, digits and `_`, not starting with a digit, at most \
                 {MAX_IDENTIFIER_LEN} bytes)"
            )));
        }
        let table = table.to_ascii_lowercase();
        let quoted = format!("\"{table}\"");
        // The WHERE makes the upsert a no-op (no row returned) for an older token; the conflicting
        // row is locked either way.
        let upsert = format!(
            "INSERT INTO {quoted} (resource, token) VALUES ($1::text, $2::bigint)
             ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
             WHERE {quoted}.token <= EXCLUDED.token
             RETURNING token"
        );
        Ok(PgFence {
            fence_cte: format!("WITH hc_fence AS ({upsert})"),
            admit: upsert,
            table,
            quoted,
        })
    }

    /// The table name, lower-cased and unquoted.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the fence table when missing (`CREATE TABLE IF NOT EXISTS`), serialised with an
    /// advisory lock so processes starting together do not trip over each other.
    pub async fn ensure_table<C: GenericClient + Sync>(&self, client: &C) -> Result<()> {
        // The simple-query protocol runs the batch as one implicit transaction, which the
        // transaction-scoped advisory lock needs.
        let sql = format!(
            "SELECT pg_advisory_xact_lock(hashtext('headcount fence {table}'));
             CREATE TABLE IF NOT EXISTS {quoted} (resource text PRIMARY KEY, token bigint NOT NULL);
             COMMENT ON TABLE {quoted} IS 'headcount fence: the highest fencing token admitted per resource';",
            table = self.table,
            quoted = self.quoted,
        );
        client.batch_execute(&sql).await.map_err(classify)
    }

    /// Admits `token` for `resource` when it is at least the highest token admitted so far (and
    /// records it), in one statement; returns whether it did. A check on its own: to guard a
    /// write, put both in one statement with [`PgFence::fenced`], or call this inside the
    /// transaction that writes (the fence row stays locked until it ends).
    pub async fn admit<C: GenericClient + Sync>(
        &self,
        client: &C,
        resource: &str,
        token: FencingToken,
    ) -> Result<bool> {
        let token = check(resource, token)?;
        let rows = client
            .query_typed(
                &self.admit,
                &[(&resource, Type::TEXT), (&token, Type::INT8)],
            )
            .await
            .map_err(classify)?;
        if rows.is_empty() {
            headcount_core::metrics::record_fence_rejection("postgres");
        }
        Ok(!rows.is_empty())
    }

    /// The highest token admitted for `resource`, or `None` when none was.
    pub async fn current<C: GenericClient + Sync>(
        &self,
        client: &C,
        resource: &str,
    ) -> Result<Option<FencingToken>> {
        check(resource, FencingToken::default())?;
        let sql = format!("SELECT token FROM {} WHERE resource = $1", self.quoted);
        let row = client
            .query_typed_opt(&sql, &[(&resource, Type::TEXT)])
            .await
            .map_err(classify)?;
        row.map(|r| {
            r.try_get::<_, i64>(0).map_err(classify).and_then(|t| {
                u64::try_from(t).map(FencingToken::new).map_err(|_| {
                    Error::foreign(resource, "a non-negative fencing token", &t.to_string())
                })
            })
        })
        .transpose()
    }

    /// `write_sql` behind the fence, as one statement:
    ///
    /// ```text
    /// WITH hc_fence AS (INSERT INTO <table> (resource, token) VALUES ($1, $2)
    ///                   ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
    ///                   WHERE <table>.token <= EXCLUDED.token RETURNING token)
    /// <write_sql>
    /// ```
    ///
    /// `$1` (the resource, text) and `$2` (the token, bigint) are the fence's; the write numbers
    /// its own parameters from `$3`. The write must read `FROM hc_fence` (for example
    /// `INSERT INTO t (a) SELECT $3 FROM hc_fence`, or `UPDATE t SET a = $3 FROM hc_fence WHERE
    /// t.id = $4`), so it writes nothing when the fence refuses: `hc_fence` then has no row.
    pub fn fenced(&self, write_sql: &str) -> String {
        format!("{} {write_sql}", self.fence_cte)
    }

    /// Runs `write_sql` behind the fence in one statement (see [`PgFence::fenced`]; `params` are
    /// `$3`, `$4`, ...) and says whether the fence admitted `token` and how many rows the write
    /// wrote. `write_sql` must be an `INSERT`, `UPDATE` or `DELETE` without a `RETURNING` clause
    /// of its own: it runs as a second data-modifying CTE, `RETURNING 1` appended, so both
    /// answers come back in one statement.
    ///
    /// tokio-postgres prepares the statement first, as a named prepared statement, which a
    /// pooler in transaction mode (PgBouncer) cannot keep for the execution that follows: through
    /// one, use [`execute_fenced_typed`](Self::execute_fenced_typed).
    pub async fn execute_fenced<C: GenericClient + Sync>(
        &self,
        client: &C,
        write_sql: &str,
        resource: &str,
        token: FencingToken,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<FencedOutcome> {
        let token = check(resource, token)?;
        let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 2);
        all.push(&resource);
        all.push(&token);
        all.extend_from_slice(params);
        let row = client
            .query_one(&self.fenced_write(write_sql), &all)
            .await
            .map_err(classify)?;
        outcome(&row)
    }

    /// [`execute_fenced`](Self::execute_fenced) with the type of each of `params` given
    /// (`(&value, Type::TEXT)`, as tokio-postgres's `query_typed` takes them): one round trip,
    /// with the unnamed statement, so it works through a pooler in transaction mode (PgBouncer)
    /// too.
    pub async fn execute_fenced_typed<C: GenericClient + Sync>(
        &self,
        client: &C,
        write_sql: &str,
        resource: &str,
        token: FencingToken,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<FencedOutcome> {
        let token = check(resource, token)?;
        let mut all: Vec<(&(dyn ToSql + Sync), Type)> = Vec::with_capacity(params.len() + 2);
        all.push((&resource, Type::TEXT));
        all.push((&token, Type::INT8));
        all.extend(params.iter().cloned());
        let rows = client
            .query_typed(&self.fenced_write(write_sql), &all)
            .await
            .map_err(classify)?;
        match rows.first() {
            Some(row) => outcome(row),
            None => Err(Error::rejected(
                BACKEND,
                "a fenced write returned no row",
                "the statement always returns one",
            )),
        }
    }

    /// The statement of [`execute_fenced`](Self::execute_fenced): the fence, `write_sql`, and
    /// a count of each.
    fn fenced_write(&self, write_sql: &str) -> String {
        format!(
            "{}, hc_write AS ({write_sql} RETURNING 1)
             SELECT (SELECT count(*) FROM hc_fence), (SELECT count(*) FROM hc_write)",
            self.fence_cte
        )
    }
}

/// [`PgFence::admit`] and [`PgFence::current`] through the caller's client.
#[async_trait]
impl<C: GenericClient + Send + Sync> Fence<C> for PgFence {
    async fn admit(&self, client: &mut C, resource: &str, token: FencingToken) -> Result<bool> {
        PgFence::admit(self, client, resource, token).await
    }

    async fn current(&self, client: &mut C, resource: &str) -> Result<Option<FencingToken>> {
        PgFence::current(self, client, resource).await
    }
}

/// What the row of a fenced write says.
fn outcome(row: &Row) -> Result<FencedOutcome> {
    let admitted: i64 = row.try_get(0).map_err(classify)?;
    let rows: i64 = row.try_get(1).map_err(classify)?;
    if admitted == 0 {
        headcount_core::metrics::record_fence_rejection("postgres");
    }
    Ok(FencedOutcome {
        admitted: admitted > 0,
        rows: u64::try_from(rows).unwrap_or(0),
    })
}

/// Checks a resource name and a token, returning the token as PostgreSQL's `bigint`.
fn check(resource: &str, token: FencingToken) -> Result<i64> {
    if resource.is_empty() || resource.contains('\0') {
        return Err(Error::invalid(
            "fence resource must be non-empty text without NUL characters",
        ));
    }
    i64::try_from(token.get()).map_err(|_| {
        Error::invalid(format!(
            "fencing token {token} does not fit PostgreSQL's bigint (at most {})",
            i64::MAX
        ))
    })
}

fn classify(e: tokio_postgres::Error) -> Error {
    // The client is the caller's: we never saw its password, so there is nothing to scrub.
    errors::classify(e, None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use headcount_core::ErrorKind;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert_eq!(PgFence::new("Hc_Fence").unwrap().table(), "hc_fence");
        assert!(PgFence::new("user").is_ok());
        for bad in [
            "",
            "1fence",
            "fence; DROP TABLE x",
            "a.b",
            "\"q\"",
            "f-e",
            &"f".repeat(64),
        ] {
            let e = PgFence::new(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}: {e}");
        }
    }

    #[test]
    fn fenced_sql_reads_from_the_fence() {
        let f = PgFence::new("fence").unwrap();
        let sql = f.fenced("INSERT INTO sink (v) SELECT $3 FROM hc_fence");
        assert!(sql.starts_with("WITH hc_fence AS (INSERT INTO \"fence\""));
        assert!(sql.ends_with("INSERT INTO sink (v) SELECT $3 FROM hc_fence"));
        assert!(sql.contains("WHERE \"fence\".token <= EXCLUDED.token"));
    }

    #[test]
    fn tokens_must_fit_a_bigint() {
        assert_eq!(
            check("r", FencingToken::new(i64::MAX as u64)).unwrap(),
            i64::MAX
        );
        let e = check("r", FencingToken::new(i64::MAX as u64 + 1)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(check("", FencingToken::new(1)).is_err());
        assert!(check("a\0b", FencingToken::new(1)).is_err());
    }
}
