//! The SQL of every primitive, with the table name filled in: one statement each, with expiry
//! judged by the server's `now()`, and the types of its parameters.

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

/// One statement: its SQL and the types of its parameters (`$1`, `$2`, ...), which go to the
/// server with every execution (see `connection::run`), so that it needs no named prepared
/// statement.
#[derive(Debug)]
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
    pub(crate) set_max: Statement,
    pub(crate) raw_value: Statement,
    pub(crate) gc: Statement,
    /// The settings `durability()` judges.
    pub(crate) durability: Statement,
    /// The running server, as `durability()` names it: its start time and port.
    pub(crate) server: Statement,
}

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        // `table` is a validated identifier ([a-z0-9_]); quoting it lets reserved words through.
        let t = format!("\"{table}\"");
        let live = "(cur.expires_at IS NULL OR cur.expires_at > now())";
        let expired = "(cur.expires_at IS NOT NULL AND cur.expires_at <= now())";
        // `::bigint` alone would accept " 7", "+7" or "007" where core's parse_counter (and
        // Redis's INCR) refuse them; anything but canonical decimal is cast from 'x' instead,
        // which raises 22P02 and so reports the same ForeignValue as every other backend.
        let stored_int =
            "(CASE WHEN cur.value ~ '^(0|-?[1-9][0-9]*)$' THEN cur.value ELSE 'x' END)::bigint";
        // sha256 of the key's bytes. `convert_to` would say it more plainly but is only STABLE,
        // which a generated column refuses; doubling backslashes makes the IMMUTABLE text->bytea
        // cast take every byte literally (its escape syntax is just `\\` and `\ooo`, and `\x`
        // only counts at the very start).
        let hash = |k: &str| format!(r"sha256(replace({k}, E'\\', E'\\\\')::bytea)");
        let by_key = format!("cur.key_hash = {}", hash("$1::text"));
        let key_hash = hash("key");
        let new_expiry = "now() + $2::bigint * interval '1 millisecond'";
        // The live keys under a prefix, given as the two LIKE patterns of `prefix_patterns`.
        let listing = |head: &str, whole: &str| {
            format!(
                "SELECT cur.key, cur.value FROM {t} AS cur
                 WHERE left(cur.key, {KEY_HEAD_CHARS}) LIKE {head} AND cur.key LIKE {whole}
                   AND {live}"
            )
        };
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
                "WITH r AS (
                   UPDATE {t} AS cur SET expires_at = {new_expiry}
                   WHERE {by_key} AND cur.value = $3 AND {live} RETURNING 1
                 )
                 SELECT EXISTS (SELECT 1 FROM r), l.key, l.value
                 FROM (VALUES (1)) AS one (x)
                 LEFT JOIN ({listing}) AS l ON true
                 ORDER BY l.key",
                listing = listing("$4", "$5"),
            )
            .typed(&[TEXT, INT8, TEXT, TEXT, TEXT]),
            // The renewal, then the keys directly under the directory ($4, $5: its LIKE patterns;
            // $6: the directory, measured by the server in its own encoding's characters, as
            // `substr` counts them) and a SHA-256 of them computed by the server (not md5, which
            // FIPS-mode servers refuse): the rows
            // come back only when that digest differs from $7 (the caller's version), else one
            // row with the digest and no key. Like `renew_and_list`, the listing reads the
            // statement's snapshot, which the renewal (a TTL of a live row) does not change.
            // Each entry is length-prefixed, so the digest is of an unambiguous encoding.
            renew_if_changed: format!(
                "WITH r AS (
                   UPDATE {t} AS cur SET expires_at = {new_expiry}
                   WHERE {by_key} AND cur.value = $3 AND {live} RETURNING 1
                 ),
                 l AS (
                   SELECT d.key, d.value FROM ({listing}) AS d
                   WHERE strpos(substr(d.key, length($6::text) + 1), ':') = 0
                 ),
                 v AS (
                   SELECT 'p' || encode(sha256(convert_to(coalesce(string_agg(
                     length(l.key)::text || ':' || l.key || length(l.value)::text || ':' || l.value,
                     '' ORDER BY l.key), ''), 'UTF8')), 'hex') AS version
                   FROM l
                 )
                 SELECT EXISTS (SELECT 1 FROM r), v.version, l.key, l.value
                 FROM v LEFT JOIN l ON v.version IS DISTINCT FROM $7::text
                 ORDER BY l.key",
                listing = listing("$4", "$5"),
            )
            .typed(&[TEXT, INT8, TEXT, TEXT, TEXT, TEXT, TEXT]),
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
        assert_eq!(highest_parameter("a $1, $12 and $3"), 12);
    }
}
