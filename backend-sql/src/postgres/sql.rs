//! The SQL of every primitive, with the table name filled in: one statement each, with expiry
//! judged by the server's `now()`, and the types of its parameters.

use std::borrow::Cow;

use tokio_postgres::types::Type;

const TEXT: Type = Type::TEXT;
const INT8: Type = Type::INT8;
const BYTEA: Type = Type::BYTEA;

/// How many leading characters of a key the prefix index holds. 512 characters are at most 2 KiB
/// of UTF-8, safely under the ~2.7 KB limit of a btree entry, while keys may be 4 KiB.
pub(crate) const KEY_HEAD_CHARS: usize = 512;

/// The most rows one garbage collection examines (a slice of the primary key after a cursor), and
/// so also the most it deletes: its work and its locks stay bounded however large the table is
/// (which may hold other deployments' rows).
pub(crate) const GC_BATCH: u32 = 1000;

/// For how many directories [`Statements::new`] builds `renew_and_versions`' statement ahead (a
/// group member asks for two); [`Statements::renew_versions`] builds it for more on each call.
const RENEW_VERSIONS_BUILT: usize = 4;

/// One statement: its SQL and the types of its parameters (`$1`, `$2`, ...), which go to the
/// server with every execution (see `connection::run`), so that it needs no named prepared
/// statement.
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    pub(crate) sql: String,
    pub(crate) types: Vec<Type>,
}

/// `sql.typed(&[TEXT, INT8])`: the [`Statement`] of `sql` with the parameter types given.
trait Typed {
    fn typed(self, types: &[Type]) -> Statement;
}

impl Typed for String {
    fn typed(self, types: &[Type]) -> Statement {
        Statement {
            sql: self,
            types: types.to_vec(),
        }
    }
}

/// The SQL of every statement, with the table name filled in.
#[derive(Debug)]
pub(crate) struct Statements {
    /// The quoted table name, for `to_regclass`.
    pub(crate) quoted_table: String,
    pub(crate) exists: Statement,
    /// A batch for the simple-query protocol (no parameters), run in a transaction.
    pub(crate) create: String,
    /// The channel the change triggers notify (see `notify_schema`): `<table>_changed`.
    pub(crate) channel: String,
    /// Whether the change triggers are installed: `$1` the quoted table, `$2` the name of the
    /// last trigger `notify_schema` creates.
    pub(crate) notify_installed: Statement,
    /// The name of the last trigger `notify_schema` creates.
    pub(crate) notify_trigger: String,
    /// A batch for the simple-query protocol, run in a transaction: (re)creates the triggers
    /// that `pg_notify` a key's directory (its text up to its last `:`) on the channel when a
    /// write creates, deletes or changes the value of a live key (an `UPDATE` that keeps the
    /// value of a live row, a renewal, runs no trigger function: the `WHEN` clause says no; a
    /// garbage collection's `DELETE` of an expired row neither).
    pub(crate) notify_schema: String,
    pub(crate) incr: Statement,
    pub(crate) incr_and_get: Statement,
    pub(crate) get: Statement,
    pub(crate) expire: Statement,
    pub(crate) cas_update: Statement,
    pub(crate) cas_insert: Statement,
    pub(crate) delete: Statement,
    pub(crate) compare_and_delete: Statement,
    pub(crate) list: Statement,
    /// The listing with each key's milliseconds left on the server's clock (NULL for none).
    pub(crate) list_with_ttl: Statement,
    pub(crate) renew_and_list: Statement,
    pub(crate) renew_if_changed: Statement,
    /// `renew_and_versions` over 1, 2, ... [`RENEW_VERSIONS_BUILT`] directories, by the count
    /// less one (see [`Statements::renew_versions`]).
    renew_versions: Vec<Statement>,
    pub(crate) set_max: Statement,
    pub(crate) raw_value: Statement,
    pub(crate) gc: Statement,
    /// The settings `durability()` judges.
    pub(crate) durability: Statement,
    /// The running server, as `durability()` names it: its start time and port.
    pub(crate) server: Statement,
}

impl Statements {
    /// `renew_and_versions` over `dirs` directories: built ahead for up to
    /// [`RENEW_VERSIONS_BUILT`], else now.
    pub(crate) fn renew_versions(&self, dirs: usize) -> Cow<'_, Statement> {
        match self.renew_versions.get(dirs.wrapping_sub(1)) {
            Some(statement) => Cow::Borrowed(statement),
            None => Cow::Owned(renew_versions(&self.quoted_table, dirs)),
        }
    }

    pub(crate) fn new(table: &str) -> Self {
        // `table` is a validated identifier ([a-z0-9_]); quoting it lets reserved words through.
        let t = format!("\"{table}\"");
        let live = LIVE;
        let expired = "(cur.expires_at IS NOT NULL AND cur.expires_at <= now())";
        // `::bigint` alone would accept " 7", "+7" or "007" where core's parse_counter (and
        // Redis's INCR) refuse them; anything but canonical decimal is cast from 'x' instead,
        // which raises 22P02 and so reports the same ForeignValue as every other backend.
        let stored_int =
            "(CASE WHEN cur.value ~ '^(0|-?[1-9][0-9]*)$' THEN cur.value ELSE 'x' END)::bigint";
        let hash = key_hash_of;
        let by_key = by_key(1);
        let key_hash = hash("key");
        let new_expiry = NEW_EXPIRY;
        let listing = |head: &str, whole: &str| listing(&t, head, whole);
        let channel = format!("{table}_changed");
        Statements {
            channel: channel.clone(),
            notify_installed: String::from(
                "SELECT EXISTS (SELECT 1 FROM pg_trigger
                                WHERE tgrelid = to_regclass($1::text) AND tgname = $2::text)",
            )
            .typed(&[TEXT, TEXT]),
            notify_trigger: format!("{table}_changed_del"),
            notify_schema: format!(
                r#"SELECT pg_advisory_xact_lock(hashtext('headcount schema {table}'));
CREATE OR REPLACE FUNCTION "{channel}"() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE dir text;
BEGIN
  IF TG_OP = 'DELETE' THEN dir := OLD.key; ELSE dir := NEW.key; END IF;
  dir := substring(dir from '^(.*:)');
  IF dir IS NOT NULL THEN
    PERFORM pg_notify('{channel}', dir);
  END IF;
  RETURN NULL;
END
$fn$;
DROP TRIGGER IF EXISTS "{table}_changed_ins" ON {t};
DROP TRIGGER IF EXISTS "{table}_changed_upd" ON {t};
DROP TRIGGER IF EXISTS "{table}_changed_del" ON {t};
CREATE TRIGGER "{table}_changed_ins" AFTER INSERT ON {t}
  FOR EACH ROW EXECUTE FUNCTION "{channel}"();
CREATE TRIGGER "{table}_changed_upd" AFTER UPDATE ON {t}
  FOR EACH ROW WHEN (OLD.value IS DISTINCT FROM NEW.value
                     OR (OLD.expires_at IS NOT NULL AND OLD.expires_at <= now()))
  EXECUTE FUNCTION "{channel}"();
CREATE TRIGGER "{table}_changed_del" AFTER DELETE ON {t}
  FOR EACH ROW WHEN (OLD.expires_at IS NULL OR OLD.expires_at > now())
  EXECUTE FUNCTION "{channel}"();"#
            ),
            quoted_table: t.clone(),
            exists: String::from("SELECT to_regclass($1::text) IS NOT NULL").typed(&[TEXT]),
            create: format!(
                r#"SELECT pg_advisory_xact_lock(hashtext('headcount schema {table}'));
CREATE TABLE IF NOT EXISTS {t} (
    key text COLLATE "C" NOT NULL,
    key_hash bytea GENERATED ALWAYS AS ({key_hash}) STORED,
    value text NOT NULL,
    expires_at timestamptz,
    CONSTRAINT "{table}_pkey" PRIMARY KEY (key_hash)
);
CREATE INDEX IF NOT EXISTS "{table}_key_head" ON {t} (left(key, {KEY_HEAD_CHARS}));
COMMENT ON TABLE {t} IS 'headcount coordination keys: value is text (counters in decimal), expires_at NULL means never; a row whose expires_at has passed is absent.';"#
            ),
            incr: format!(
                "INSERT INTO {t} AS cur (key, value, expires_at) VALUES ($1, '1', {new_expiry})
                 ON CONFLICT (key_hash) DO UPDATE SET
                   value = CASE WHEN {live} THEN ({stored_int} + 1)::text ELSE '1' END,
                   expires_at = CASE WHEN {live} THEN cur.expires_at ELSE EXCLUDED.expires_at END
                 RETURNING cur.value::bigint"
            )
            .typed(&[TEXT, INT8]),
            // One statement: the CTE increments, the outer query reads the other key. The read
            // sees the snapshot the statement started with (READ COMMITTED), which is a point
            // between sending the request and its reply.
            incr_and_get: format!(
                "WITH i AS (
                   INSERT INTO {t} AS cur (key, value, expires_at) VALUES ($1, $3::bigint::text, {new_expiry})
                   ON CONFLICT (key_hash) DO UPDATE SET
                     value = CASE WHEN {live} THEN ({stored_int} + $3::bigint)::text ELSE EXCLUDED.value END,
                     expires_at = CASE WHEN {live} THEN cur.expires_at ELSE EXCLUDED.expires_at END
                   RETURNING cur.value::bigint AS v
                 )
                 SELECT i.v, (SELECT g.value FROM {t} AS g
                              WHERE g.key_hash = {get_hash}
                                AND (g.expires_at IS NULL OR g.expires_at > now()))
                 FROM i",
                get_hash = hash("$4::text"),
            )
            .typed(&[TEXT, INT8, INT8, TEXT]),
            get: format!("SELECT cur.value FROM {t} AS cur WHERE {by_key} AND {live}")
            .typed(&[TEXT]),
            expire: format!(
                "UPDATE {t} AS cur SET expires_at = {new_expiry} WHERE {by_key} AND {live} RETURNING 1"
            )
            .typed(&[TEXT, INT8]),
            cas_update: format!(
                "UPDATE {t} AS cur SET value = $3, expires_at = {new_expiry}
                 WHERE {by_key} AND cur.value = $4 AND {live} RETURNING 1"
            )
            .typed(&[TEXT, INT8, TEXT, TEXT]),
            cas_insert: format!(
                "INSERT INTO {t} AS cur (key, value, expires_at) VALUES ($1, $3, {new_expiry})
                 ON CONFLICT (key_hash) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                 WHERE {expired} RETURNING 1"
            )
            .typed(&[TEXT, INT8, TEXT]),
            delete: format!(
                "DELETE FROM {t} AS cur WHERE {by_key} RETURNING {live}"
            )
            .typed(&[TEXT]),
            compare_and_delete: format!(
                "DELETE FROM {t} AS cur WHERE {by_key} AND cur.value = $2 AND {live} RETURNING 1"
            )
            .typed(&[TEXT, TEXT]),
            list: format!("{} ORDER BY cur.key", listing("$1", "$2"))
            .typed(&[TEXT, TEXT]),
            // Rounded up: a live key has more than 0 ms left.
            list_with_ttl: format!(
                "SELECT q.key, q.value, ceil(extract(epoch FROM (q.expires_at - now())) * 1000)::bigint
                 FROM ({}) AS q ORDER BY q.key",
                listing("$1", "$2").replacen("SELECT cur.key, cur.value", "SELECT cur.key, cur.value, cur.expires_at", 1)
            )
            .typed(&[TEXT, TEXT]),
            // One statement: the CTE renews, the outer query lists. The listing reads the
            // snapshot the statement started with, so it does not see the new expiry, but the
            // renewal never changes a value, and `now()` is the same instant for both parts: a
            // key the CTE found live (and renewed) is live in the listing too. The LEFT JOIN
            // gives one row (with NULL key) when nothing is listed, so the flag always comes
            // back; the CTE runs to completion whether or not anything reads it.
            renew_and_list: format!(
                "WITH r AS ({renewal})
                 SELECT EXISTS (SELECT 1 FROM r), l.key, l.value
                 FROM (VALUES (1)) AS one (x)
                 LEFT JOIN ({listing}) AS l ON true
                 ORDER BY l.key",
                listing = listing("$4", "$5"),
                renewal = renewal(&t),
            )
            .typed(&[TEXT, INT8, TEXT, TEXT, TEXT]),
            // The renewal, then the keys directly under the directory ($4 to $6, see
            // `direct_entries`) and their digest (`DIGEST`): the rows come back only when that
            // digest differs from $7 (the caller's version), else one row with the digest and no
            // key. Like `renew_and_list`, the listing reads the statement's snapshot, which the
            // renewal (a TTL of a live row) does not change.
            renew_if_changed: format!(
                "WITH r AS ({renewal}),
                 l AS ({entries}),
                 v AS (SELECT {version} AS version FROM l)
                 SELECT EXISTS (SELECT 1 FROM r), v.version, l.key, l.value
                 FROM v LEFT JOIN l ON v.version IS DISTINCT FROM $7::text
                 ORDER BY l.key",
                renewal = renewal(&t),
                entries = direct_entries(&t, 4),
                version = DIGEST,
            )
            .typed(&[TEXT, INT8, TEXT, TEXT, TEXT, TEXT, TEXT]),
            renew_versions: (1..=RENEW_VERSIONS_BUILT)
                .map(|dirs| renew_versions(&t, dirs))
                .collect(),
            // CASE, not OR: PostgreSQL does not promise to evaluate OR left to right, and the cast
            // must never run on an expired row (it may hold anything).
            set_max: format!(
                "INSERT INTO {t} AS cur (key, value, expires_at) VALUES ($1, $3::bigint::text, {new_expiry})
                 ON CONFLICT (key_hash) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                 WHERE CASE WHEN {expired} THEN true ELSE {stored_int} < $3::bigint END
                 RETURNING 1"
            )
            .typed(&[TEXT, INT8, INT8]),
            raw_value: format!("SELECT cur.value FROM {t} AS cur WHERE {by_key}")
            .typed(&[TEXT]),
            // Garbage collection over the slice of at most GC_BATCH rows after the cursor $1 in
            // primary key order: an index range scan, never a scan of the whole table (there is
            // no index on `expires_at`). Of those, the rows expired in the statement's snapshot
            // are locked, skipping any a caller holds (a collection never waits), and deleted if
            // still expired: DELETE re-checks its predicate on the latest row version under READ
            // COMMITTED, so a row renewed after the slice saw it expired is left alone. Returns
            // the slice's last key (bytea has no max()), its size and the rows deleted.
            gc: format!(
                "WITH slice AS (
                   SELECT key_hash, expires_at FROM {t} WHERE key_hash > $1::bytea
                   ORDER BY key_hash LIMIT {GC_BATCH}
                 ),
                 due AS (
                   SELECT key_hash FROM {t} WHERE key_hash IN (
                     SELECT key_hash FROM slice WHERE expires_at <= now())
                   FOR UPDATE SKIP LOCKED
                 ),
                 gone AS (
                   DELETE FROM {t} AS cur WHERE cur.key_hash IN (SELECT key_hash FROM due)
                   AND {expired} RETURNING 1
                 )
                 SELECT (SELECT key_hash FROM slice ORDER BY key_hash DESC LIMIT 1),
                        (SELECT count(*) FROM slice), (SELECT count(*) FROM gone)"
            )
            .typed(&[BYTEA]),
            durability: String::from(
                "SELECT current_setting('fsync'), current_setting('synchronous_commit'),
                        (SELECT count(*) FROM pg_stat_replication),
                        current_setting('synchronous_standby_names')",
            )
            .typed(&[]),
            // As seconds since 1970, so no session time zone changes it.
            server: String::from(
                "SELECT extract(epoch FROM pg_postmaster_start_time())::text || ' on port ' \
                 || current_setting('port')",
            )
            .typed(&[]),
        }
    }
}

/// A live row of the table aliased `cur`, at the statement's `now()`.
const LIVE: &str = "(cur.expires_at IS NULL OR cur.expires_at > now())";

/// The expiry of a write whose TTL in milliseconds is `$2`.
const NEW_EXPIRY: &str = "now() + $2::bigint * interval '1 millisecond'";

/// sha256 of the key's bytes. `convert_to` would say it more plainly but is only STABLE, which a
/// generated column refuses; doubling backslashes makes the IMMUTABLE text->bytea cast take every
/// byte literally (its escape syntax is just `\\` and `\ooo`, and `\x` only counts at the very
/// start).
fn key_hash_of(key: &str) -> String {
    format!(r"sha256(replace({key}, E'\\', E'\\\\')::bytea)")
}

/// The row of the table aliased `cur` whose key is the parameter `$n`, found by its primary key.
fn by_key(n: usize) -> String {
    format!("cur.key_hash = {}", key_hash_of(&format!("${n}::text")))
}

/// The live keys under a prefix and their values, the prefix given as the two LIKE patterns of
/// [`prefix_patterns`]: a range of the index on the key's head.
fn listing(t: &str, head: &str, whole: &str) -> String {
    format!(
        "SELECT cur.key, cur.value FROM {t} AS cur
                 WHERE left(cur.key, {KEY_HEAD_CHARS}) LIKE {head} AND cur.key LIKE {whole}
                   AND {LIVE}"
    )
}

/// The renewal the heartbeat statements start with: `$1` the key, `$2` the TTL in
/// milliseconds, `$3` the holder; a row when it renewed.
fn renewal(t: &str) -> String {
    format!(
        "UPDATE {t} AS cur SET expires_at = {NEW_EXPIRY}
                   WHERE {by_key} AND cur.value = $3 AND {LIVE} RETURNING 1",
        by_key = by_key(1)
    )
}

/// The live keys directly under a directory and their values: `$n` and `$n+1` its LIKE
/// patterns, `$n+2` the directory, measured by the server in its own encoding's characters, as
/// `substr` counts them.
fn direct_entries(t: &str, n: usize) -> String {
    format!(
        "SELECT d.key, d.value FROM ({listing}) AS d
                   WHERE strpos(substr(d.key, length(${dir}::text) + 1), ':') = 0",
        listing = listing(t, &format!("${n}"), &format!("${}", n + 1)),
        dir = n + 2,
    )
}

/// A directory's version: over its entries `l` (key, value), a SHA-256 computed by the server
/// (not md5, which FIPS-mode servers refuse) of every entry, length-prefixed so that the
/// encoding is unambiguous, in key order. One aggregate: over no entries, the digest of "".
const DIGEST: &str = "'p' || encode(sha256(convert_to(coalesce(string_agg(
                     length(l.key)::text || ':' || l.key || length(l.value)::text || ':' || l.value,
                     '' ORDER BY l.key), ''), 'UTF8')), 'hex')";

/// `renew_and_versions` over `dirs` directories in one statement: the renewal (`$1` to `$3`, as
/// in [`renewal`]), then for the `i`-th directory (from 0) the version `renew_if_changed`
/// answers for it, its LIKE patterns and itself at `$(4 + 3i)` to `$(6 + 3i)`. One row: whether
/// it renewed, then one version per directory. Each version is a scalar subquery over the same
/// index range as the listings, reading the statement's snapshot as `renew_if_changed` does (the
/// renewal changes a live row's TTL, never its value, and `now()` is one instant for the whole
/// statement).
fn renew_versions(t: &str, dirs: usize) -> Statement {
    let versions: Vec<String> = (0..dirs)
        .map(|i| {
            format!(
                "(SELECT {DIGEST} FROM ({entries}) AS l)",
                entries = direct_entries(t, 4 + 3 * i)
            )
        })
        .collect();
    let mut types = vec![TEXT, INT8, TEXT];
    for _ in 0..dirs {
        types.extend([TEXT, TEXT, TEXT]);
    }
    format!(
        "WITH r AS ({renewal})
                 SELECT EXISTS (SELECT 1 FROM r), {versions}",
        renewal = renewal(t),
        versions = versions.join(",\n                        "),
    )
    .typed(&types)
}

/// Escapes `%`, `_` and `\` for a LIKE pattern (backslash is the default escape character).
fn like_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 1);
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The two LIKE patterns of `list`: one for the indexed head of the key, one for the whole key.
pub(crate) fn prefix_patterns(prefix: &str) -> (String, String) {
    let head: String = prefix.chars().take(KEY_HEAD_CHARS).collect();
    (
        format!("{}%", like_escape(&head)),
        format!("{}%", like_escape(prefix)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns_escape_wildcards() {
        assert_eq!(like_escape(r"a%b_c\d"), r"a\%b\_c\\d");
        let (head, whole) = prefix_patterns("hc:{g}:");
        assert_eq!(head, "hc:{g}:%");
        assert_eq!(whole, "hc:{g}:%");
        let long = "é".repeat(600);
        let (head, whole) = prefix_patterns(&long);
        assert_eq!(head.chars().count(), KEY_HEAD_CHARS + 1);
        assert_eq!(whole.chars().count(), 601);
    }

    #[test]
    fn statements_quote_the_table() {
        let sql = Statements::new("user");
        assert!(sql.create.contains("CREATE TABLE IF NOT EXISTS \"user\""));
        assert!(sql.incr.sql.contains("INSERT INTO \"user\" AS cur"));
        assert_eq!(sql.quoted_table, "\"user\"");
    }

    /// The highest `$n` in `sql`.
    fn highest_parameter(sql: &str) -> usize {
        let mut highest = 0;
        let mut rest = sql;
        while let Some(at) = rest.find('$') {
            rest = &rest[at + 1..];
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            highest = highest.max(rest[..digits].parse().unwrap_or(0));
        }
        highest
    }

    #[test]
    fn every_parameter_has_a_type() {
        let sql = Statements::new("kv");
        let all = [
            ("exists", &sql.exists),
            ("incr", &sql.incr),
            ("incr_and_get", &sql.incr_and_get),
            ("get", &sql.get),
            ("expire", &sql.expire),
            ("cas_update", &sql.cas_update),
            ("cas_insert", &sql.cas_insert),
            ("delete", &sql.delete),
            ("compare_and_delete", &sql.compare_and_delete),
            ("list", &sql.list),
            ("renew_and_list", &sql.renew_and_list),
            ("renew_if_changed", &sql.renew_if_changed),
            ("set_max", &sql.set_max),
            ("raw_value", &sql.raw_value),
            ("gc", &sql.gc),
            ("durability", &sql.durability),
            ("server", &sql.server),
        ];
        for (name, statement) in all {
            assert_eq!(
                highest_parameter(&statement.sql),
                statement.types.len(),
                "{name}"
            );
        }
        for dirs in 1..=RENEW_VERSIONS_BUILT + 2 {
            let statement = sql.renew_versions(dirs);
            assert_eq!(
                highest_parameter(&statement.sql),
                statement.types.len(),
                "renew_versions over {dirs}"
            );
            assert_eq!(statement.types.len(), 3 + 3 * dirs);
        }
        assert_eq!(highest_parameter("a $1, $12 and $3"), 12);
    }

    /// The version `renew_versions` answers for a directory is the one `renew_if_changed`
    /// answers: the same entries and the same digest of them, in the same words.
    #[test]
    fn both_heartbeats_digest_a_directory_alike() {
        let sql = Statements::new("kv");
        let entries = direct_entries("\"kv\"", 4);
        assert!(sql.renew_if_changed.sql.contains(&entries));
        assert!(sql.renew_if_changed.sql.contains(DIGEST));
        let two = sql.renew_versions(2);
        assert!(two.sql.contains(&entries));
        assert!(two.sql.contains(&direct_entries("\"kv\"", 7)));
        assert_eq!(two.sql.matches(DIGEST).count(), 2);
        // Built now for more directories than built ahead: the same statement.
        let many = RENEW_VERSIONS_BUILT + 1;
        assert_eq!(
            sql.renew_versions(many).sql,
            renew_versions("\"kv\"", many).sql
        );
    }
}
