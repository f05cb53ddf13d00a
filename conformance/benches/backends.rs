//! Each `Store` primitive on each backend, beside the raw client doing the same thing on the same
//! server in the same run, at concurrency 1 and 16.
//!
//! ```sh
//! HEADCOUNT_REQUIRE_BACKENDS=all cargo bench -p headcount-conformance --bench backends -- \
//!     --warm-up-time 1 --measurement-time 1
//! ```
//!
//! Servers come from the conformance harness (started from their binaries on loopback, or the
//! `HEADCOUNT_TEST_<BACKEND>_URL` stores). Criterion prints its usual estimates per benchmark
//! (one iteration = one round of `concurrency` calls at once); at the end a Markdown table gives,
//! per primitive, backend and concurrency, the throughput in calls per second, the p50 and p99
//! latency of single calls, and the adapter's throughput as a fraction of the raw client's; for
//! the Redis writes also two floors as fractions of raw: that of any design that keeps a key index
//! (`raw+name-index`: the raw commands plus one `ZADD` of the name, in one script), and that of
//! headcount's index design (`raw+records`: the raw commands plus every record the index keeps,
//! name, expiry score and directory version, and nothing else; see [`RECORDS_INCR_LUA`]), and that
//! design with the upkeep its writes do to keep the index bounded and alive (`raw+records+upkeep`:
//! the records, a look for expired names and a read of the index's own expiry; see
//! [`UPKEEP_INCR_LUA`]).
//! `docs/benchmarks.md` holds a run of it.
//!
//! Each side of a row is measured in 3 alternating rounds (`HEADCOUNT_BENCH_ROUNDS`; see
//! `rounds`), and `--measurement-time` is per round.
//!
//! Before measuring, 100,000 unrelated keys are written beside the benchmark's (see
//! `fill_unrelated`), as a store shared with other data holds them.
//!
//! The raw side does what the adapter does, by hand: on Redis the same commands, or the shortest
//! Lua script that does the same (`INCR` + `PEXPIRE NX` in one `MULTI` for incr, a `SCAN` of the
//! prefix for list; no key index), on etcd the same `Txn`s (with one
//! lease granted up front), on PostgreSQL the adapter's statements (the same checks and
//! `RETURNING` clauses, so the server does the same work) prepared up front on one connection
//! per task (and, as a third side, `raw-unnamed`, the same statements sent with every call as the
//! unnamed statement, as the adapter sends them so that it works through a pooler in transaction
//! mode: the last column is what that costs the server), on SQLite the adapter's statements (the same liveness and counter checks) through
//! `spawn_blocking`; on every backend each raw
//! call runs within a 5 s deadline, as the adapter's do (see `raw_deadline`). The adapter adds argument checks, a
//! pool checkout, error mapping and, for etcd, lease sharing and per-key turn-taking; on Redis its
//! scripts also keep the key index (see backend-redis/README.md).

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_enum_variant
)]

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use headcount::{DynStore, Op};
use headcount_conformance::percentile;
use headcount_harness::ServerKind;

const TTL: Duration = Duration::from_secs(60);
const CONCURRENCY: [usize; 2] = [1, 16];
/// The primitives measured: the six every backend implements, and `set_max`.
const PRIMITIVES: [Op; 7] = [
    Op::Incr,
    Op::Get,
    Op::Expire,
    Op::CompareAndSet,
    Op::Delete,
    Op::List,
    Op::SetMax,
];

type BoxFut<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Each primitive's PostgreSQL statement, prepared on one connection, and its SQL.
type PgStatements = BTreeMap<Op, (tokio_postgres::Statement, String)>;

/// One raw client per backend.
enum Raw {
    Redis(redis::aio::MultiplexedConnection),
    Etcd(etcd_client::KvClient, i64),
    /// Per connection, each primitive's statement prepared up front, and its SQL (for the
    /// unnamed side).
    Postgres(Vec<(tokio_postgres::Client, PgStatements)>),
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
}

struct Target {
    backend: &'static str,
    adapter: DynStore,
    raw: Raw,
    prefix: String,
}

// What a client of the raw Redis API sends for the primitives Redis has no command for: a
// compare-and-set and a set-if-greater script, and a SCAN of the prefix (headcount's own scripts
// also keep its key index, which is part of what the adapter's figures pay for).
const CAS_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0";
const LIST_LUA: &str = include_str!("scripts/scan_list.lua");
const SET_MAX_LUA: &str = "local cur = redis.call('GET', KEYS[1]) \
     if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end \
     redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1";

fn key(t: &Target, what: &str, task: usize) -> String {
    format!("{}{what}:{task}", t.prefix)
}

/// The deadline of each raw call: 5 s (the adapter's default `timeout`), as a production client
/// bounds every call; `HEADCOUNT_BENCH_RAW_DEADLINE=none` runs raw calls unbounded. A pending timer
/// is not free: tokio then parks with a timeout, which costs the kernel a timer arm and cancel per
/// wake-up (docs/benchmarks.md has the measurement), so a raw side without one measures less than
/// any real client does.
/// Read once: the environment is not consulted per call.
fn raw_deadline() -> Option<Duration> {
    static DEADLINE: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *DEADLINE.get_or_init(
        || match std::env::var("HEADCOUNT_BENCH_RAW_DEADLINE").as_deref() {
            Ok("none") => None,
            _ => Some(Duration::from_secs(5)),
        },
    )
}

/// How many times each side of a row is measured, alternating (adapter, raw, floors, then floors,
/// raw, adapter, ...): 3, or `HEADCOUNT_BENCH_ROUNDS`. A row's figures sum its rounds, so each
/// side is measured as often early as late: a store that slows or speeds up over a row (a
/// checkpoint, a vacuum, a table growing) does not always favour whichever side runs second.
/// `--measurement-time` is per round.
fn rounds() -> usize {
    std::env::var("HEADCOUNT_BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3)
}

/// One call of `primitive` through the adapter, by task `task` (its own keys), round `n`.
fn adapter_call(t: &Target, primitive: Op, task: usize, n: u64) -> BoxFut<'_> {
    Box::pin(async move {
        let s = &t.adapter;
        match primitive {
            Op::Incr => drop(s.incr(&key(t, "n", task), Some(TTL)).await.unwrap()),
            Op::Get => drop(s.get(&key(t, "n", task)).await.unwrap()),
            Op::Expire => drop(s.expire(&key(t, "n", task), TTL).await.unwrap()),
            Op::CompareAndSet => drop(
                s.compare_and_set(&key(t, "c", task), Some("x"), "x", Some(TTL))
                    .await
                    .unwrap(),
            ),
            Op::Delete => drop(s.delete(&key(t, "absent", task)).await.unwrap()),
            Op::List => drop(s.list(&format!("{}l:", t.prefix)).await.unwrap()),
            Op::SetMax => drop(
                s.set_max(&key(t, "m", task), n as i64, Some(TTL))
                    .await
                    .unwrap(),
            ),
            other => panic!("{other}"),
        }
    })
}

/// The same call by hand with the raw client.
fn raw_call(t: &Target, primitive: Op, task: usize, n: u64) -> BoxFut<'_> {
    raw_call_as(t, primitive, task, n, false)
}

/// [`raw_call`], on PostgreSQL with the unnamed statement when `unnamed`: the SQL and its
/// parameter types sent with every call (`query_typed`), as the adapter does so that it works
/// through a pooler in transaction mode, instead of the statement prepared up front.
fn raw_call_as(t: &Target, primitive: Op, task: usize, n: u64, unnamed: bool) -> BoxFut<'_> {
    Box::pin(async move {
        let ttl_ms = TTL.as_millis() as i64;
        match &t.raw {
            Raw::Redis(conn) => {
                let mut c = conn.clone();
                let k = |w: &str| key(t, w, task);
                match primitive {
                    Op::Incr => {
                        let _: (i64, i64) = redis::pipe()
                            .atomic()
                            .incr(k("rn"), 1)
                            .cmd("PEXPIRE")
                            .arg(k("rn"))
                            .arg(ttl_ms)
                            .arg("NX")
                            .query_async(&mut c)
                            .await
                            .unwrap();
                    }
                    Op::Get => {
                        let _: Option<String> = redis::cmd("GET")
                            .arg(k("n"))
                            .query_async(&mut c)
                            .await
                            .unwrap();
                    }
                    Op::Expire => {
                        let _: i64 = redis::cmd("PEXPIRE")
                            .arg(k("n"))
                            .arg(ttl_ms)
                            .query_async(&mut c)
                            .await
                            .unwrap();
                    }
                    Op::CompareAndSet => {
                        let _: redis::Value = redis::Script::new(CAS_LUA)
                            .key(k("c"))
                            .arg("x")
                            .arg("x")
                            .arg(ttl_ms)
                            .invoke_async(&mut c)
                            .await
                            .unwrap();
                    }
                    Op::Delete => {
                        let _: i64 = redis::cmd("DEL")
                            .arg(k("absent"))
                            .query_async(&mut c)
                            .await
                            .unwrap();
                    }
                    Op::List => {
                        let prefix = format!("{}l:", t.prefix);
                        // The prefix holds no glob character to escape.
                        let pattern = format!("{prefix}*");
                        let _: redis::Value = redis::Script::new(LIST_LUA)
                            .key(&prefix)
                            .arg(pattern)
                            .arg(&prefix)
                            .invoke_async(&mut c)
                            .await
                            .unwrap();
                    }
                    Op::SetMax => {
                        let _: redis::Value = redis::Script::new(SET_MAX_LUA)
                            .key(k("rm"))
                            .arg(n as i64)
                            .arg(ttl_ms)
                            .invoke_async(&mut c)
                            .await
                            .unwrap();
                    }
                    other => panic!("{other}"),
                }
            }
            Raw::Etcd(kv, lease) => {
                use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
                let mut kv = kv.clone();
                let k = |w: &str| key(t, w, task);
                match primitive {
                    Op::Incr | Op::SetMax => {
                        // Read, then write guarded by the revision read (one retry loop).
                        let key = k(if primitive == Op::Incr { "rn" } else { "rm" });
                        loop {
                            let got = kv.get(key.as_str(), None).await.unwrap();
                            let (cur, rev) = got
                                .kvs()
                                .first()
                                .map(|kv| {
                                    (
                                        kv.value_str().unwrap().parse::<i64>().unwrap(),
                                        kv.mod_revision(),
                                    )
                                })
                                .unwrap_or((0, 0));
                            let next = if primitive == Op::Incr {
                                cur + 1
                            } else {
                                n as i64
                            };
                            let txn = Txn::new()
                                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                                .and_then([TxnOp::put(
                                    key.as_str(),
                                    next.to_string(),
                                    Some(PutOptions::new().with_lease(*lease)),
                                )]);
                            if kv.txn(txn).await.unwrap().succeeded() {
                                break;
                            }
                        }
                    }
                    Op::Get => drop(kv.get(k("n"), None).await.unwrap()),
                    Op::Expire => {
                        let txn = Txn::new()
                            .when([Compare::version(k("n"), CompareOp::Greater, 0)])
                            .and_then([TxnOp::put(
                                k("n"),
                                "",
                                Some(PutOptions::new().with_lease(*lease).with_ignore_value()),
                            )]);
                        drop(kv.txn(txn).await.unwrap());
                    }
                    Op::CompareAndSet => {
                        let txn = Txn::new()
                            .when([Compare::value(k("c"), CompareOp::Equal, "x")])
                            .and_then([TxnOp::put(
                                k("c"),
                                "x",
                                Some(PutOptions::new().with_lease(*lease)),
                            )]);
                        drop(kv.txn(txn).await.unwrap());
                    }
                    Op::Delete => drop(kv.delete(k("absent"), None).await.unwrap()),
                    Op::List => drop(
                        kv.get(
                            format!("{}l:", t.prefix),
                            Some(GetOptions::new().with_prefix()),
                        )
                        .await
                        .unwrap(),
                    ),
                    other => panic!("{other}"),
                }
            }
            Raw::Postgres(clients) => {
                let (c, statements) = &clients[task % clients.len()];
                let k = |w: &str| key(t, w, task);
                let (key, arg): (String, i64) = match primitive {
                    Op::Incr => (k("rn"), ttl_ms),
                    Op::Get | Op::Expire => (k("n"), ttl_ms),
                    Op::CompareAndSet => (k("c"), ttl_ms),
                    Op::Delete => (k("absent"), 0),
                    Op::List => (format!("{}l:", t.prefix), 0),
                    _ => (k("rm"), n as i64),
                };
                let (statement, sql) = &statements[&primitive];
                let rows = if unnamed {
                    use tokio_postgres::types::Type;
                    c.query_typed(sql, &[(&key, Type::TEXT), (&arg, Type::INT8)])
                        .await
                } else {
                    c.query(statement, &[&key, &arg]).await
                };
                drop(rows.unwrap());
            }
            Raw::Sqlite(conn) => {
                let conn = conn.clone();
                let k = |w: &str| key(t, w, task);
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                let (key, arg): (String, i64) = match primitive {
                    Op::Incr => (k("rn"), ttl_ms),
                    Op::Get => (k("n"), now_ms),
                    Op::Expire | Op::CompareAndSet => {
                        (k(if primitive == Op::Expire { "n" } else { "c" }), ttl_ms)
                    }
                    Op::Delete => (k("absent"), 0),
                    Op::List => (format!("{}l:", t.prefix), now_ms),
                    _ => (k("rm"), n as i64),
                };
                let sql = sqlite_sql(primitive);
                tokio::task::spawn_blocking(move || {
                    let conn = conn.lock().unwrap();
                    let mut st = conn.prepare_cached(sql).unwrap();
                    let mut rows = st.query(rusqlite::params![key, arg]).unwrap();
                    while rows.next().unwrap().is_some() {}
                })
                .await
                .unwrap();
            }
        }
    })
}

/// The floor of any design that keeps a key index on Redis: the raw side's commands plus one
/// `ZADD` (or `ZREM` for `delete`) of the key's name in a sorted set, in one script, which is the
/// least a write can do to stay listable without a `SCAN` (headcount's index also scores
/// expiries and versions directories). Measured for the write primitives on Redis only.
const FLOOR_INCR_LUA: &str = "local n = redis.call('INCR', KEYS[1]) \
     redis.call('PEXPIRE', KEYS[1], ARGV[1], 'NX') redis.call('ZADD', KEYS[2], 0, KEYS[1]) return n";
const FLOOR_EXPIRE_LUA: &str = "local r = redis.call('PEXPIRE', KEYS[1], ARGV[1]) \
     redis.call('ZADD', KEYS[2], 0, KEYS[1]) return r";
const FLOOR_CAS_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) redis.call('ZADD', KEYS[2], 0, KEYS[1]) \
     return 1 end return 0";
const FLOOR_DELETE_LUA: &str = "local r = redis.call('DEL', KEYS[1]) \
     redis.call('ZREM', KEYS[2], KEYS[1]) return r";
const FLOOR_SET_MAX_LUA: &str = "local cur = redis.call('GET', KEYS[1]) \
     if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end \
     redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) redis.call('ZADD', KEYS[2], 0, KEYS[1]) return 1";

/// The floor of headcount's own index design on Redis: the raw side's commands plus each record
/// its index keeps (see backend-redis/README.md, "Data layout"), each written the cheapest way
/// and nothing else (no sweep, no check of the index's own expiry, no script prelude): the
/// key's name (`ZADD` of score 0, so a listing is O(keys under the prefix)), the key's expiry
/// score when the write sets a TTL (`TIME` and a `ZADD`, so expired names are found without a
/// scan and the index stays bounded), and its directory's version when the write changes what a
/// listing shows (`TIME` and `SET … GET`, so a group member learns in O(1) per heartbeat that
/// nothing changed). `KEYS[2]`, `KEYS[3]` and `KEYS[4]` are the name index, the expiry index and
/// the version key. As the adapter does, a compare-and-set that writes the value the key held
/// and a delete of an absent key change no version, and an increment of a live key moves no
/// expiry.
const RECORDS_INCR_LUA: &str = "local n = redis.call('INCR', KEYS[1]) \
     redis.call('PEXPIRE', KEYS[1], ARGV[1], 'NX') redis.call('ZADD', KEYS[2], 0, KEYS[1]) \
     local t = redis.call('TIME') redis.call('SET', KEYS[4], t[1] .. t[2], 'PX', 3600000, 'GET') \
     return n";
const RECORDS_EXPIRE_LUA: &str = "local r = redis.call('PEXPIRE', KEYS[1], ARGV[1]) \
     if r == 1 then redis.call('ZADD', KEYS[2], 0, KEYS[1]) local t = redis.call('TIME') \
     redis.call('ZADD', KEYS[3], t[1] * 1000 + ARGV[1], KEYS[1]) end return r";
const RECORDS_CAS_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) redis.call('ZADD', KEYS[2], 0, KEYS[1]) \
     local t = redis.call('TIME') redis.call('ZADD', KEYS[3], t[1] * 1000 + ARGV[3], KEYS[1]) \
     if ARGV[1] ~= ARGV[2] then redis.call('SET', KEYS[4], t[1] .. t[2], 'PX', 3600000, 'GET') end \
     return 1 end return 0";
const RECORDS_DELETE_LUA: &str = "local r = redis.call('DEL', KEYS[1]) \
     redis.call('ZREM', KEYS[2], KEYS[1]) redis.call('ZREM', KEYS[3], KEYS[1]) \
     if r == 1 then local t = redis.call('TIME') \
     redis.call('SET', KEYS[4], t[1] .. t[2], 'PX', 3600000, 'GET') end return r";
const RECORDS_SET_MAX_LUA: &str = "local cur = redis.call('GET', KEYS[1]) \
     if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end \
     redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) redis.call('ZADD', KEYS[2], 0, KEYS[1]) \
     local t = redis.call('TIME') redis.call('ZADD', KEYS[3], t[1] * 1000 + ARGV[2], KEYS[1]) \
     redis.call('SET', KEYS[4], t[1] .. t[2], 'PX', 3600000, 'GET') return 1";

/// The upkeep floor's look for expired names (with `t`, the reply of `TIME`), shared by its
/// scripts: up to 8 names whose score has passed, removed.
macro_rules! upkeep_sweep {
    () => {
        "local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', t[1] * 1000, 'LIMIT', 0, 8) \
         if #due > 0 then redis.call('ZREM', KEYS[3], unpack(due)) end "
    };
}
/// The upkeep floor's read of the index's own expiry after a write that gave its key `p` ms to
/// live, and the extension of both index keys in the rare call that finds it too short.
macro_rules! upkeep_cover {
    () => {
        "local pi = redis.call('PTTL', KEYS[2]) if pi >= 0 and pi < p + 6000 then \
         redis.call('PEXPIRE', KEYS[2], p + 36000) redis.call('PEXPIRE', KEYS[3], p + 36000) end "
    };
}
/// The floor of headcount's index design with the upkeep each of its writes does, beside the
/// records ([`RECORDS_INCR_LUA`]): so the index stays bounded, every write that records a name
/// looks for names whose expiry has passed (`ZRANGEBYSCORE … LIMIT 0 8` on the expiry index,
/// here with a `ZREM` of any it finds), and so the index never expires before a key it holds,
/// every write that moves a key's expiry reads the index's own (`PTTL`, and a `PEXPIRE` of
/// both index keys in the rare call that finds it too short). A delete records no name and
/// moves no expiry, so its upkeep floor is its records floor. Still no script prelude and no
/// other logic: what is left between this and the adapter is the cost of running headcount's
/// scripts as they are written (see docs/benchmarks.md).
const UPKEEP_INCR_LUA: &str = concat!(
    "local n = redis.call('INCR', KEYS[1]) \
     redis.call('PEXPIRE', KEYS[1], ARGV[1], 'NX') redis.call('ZADD', KEYS[2], 0, KEYS[1]) \
     local t = redis.call('TIME') redis.call('SET', KEYS[4], t[1] .. t[2], 'PX', 3600000, 'GET') ",
    upkeep_sweep!(),
    "return n"
);
const UPKEEP_EXPIRE_LUA: &str = concat!(
    "local r = redis.call('PEXPIRE', KEYS[1], ARGV[1]) \
     if r == 1 then redis.call('ZADD', KEYS[2], 0, KEYS[1]) local t = redis.call('TIME') \
     local p = tonumber(ARGV[1]) redis.call('ZADD', KEYS[3], t[1] * 1000 + p, KEYS[1]) ",
    upkeep_cover!(),
    upkeep_sweep!(),
    "end return r"
);
const UPKEEP_CAS_LUA: &str = concat!(
    "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) redis.call('ZADD', KEYS[2], 0, KEYS[1]) \
     local t = redis.call('TIME') local p = tonumber(ARGV[3]) \
     redis.call('ZADD', KEYS[3], t[1] * 1000 + p, KEYS[1]) \
     if ARGV[1] ~= ARGV[2] then redis.call('SET', KEYS[4], t[1] .. t[2], 'PX', 3600000, 'GET') end ",
    upkeep_cover!(),
    upkeep_sweep!(),
    "return 1 end return 0"
);
const UPKEEP_SET_MAX_LUA: &str = concat!(
    "local cur = redis.call('GET', KEYS[1]) \
     if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end \
     redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) redis.call('ZADD', KEYS[2], 0, KEYS[1]) \
     local t = redis.call('TIME') local p = tonumber(ARGV[2]) \
     redis.call('ZADD', KEYS[3], t[1] * 1000 + p, KEYS[1]) \
     redis.call('SET', KEYS[4], t[1] .. t[2], 'PX', 3600000, 'GET') ",
    upkeep_cover!(),
    upkeep_sweep!(),
    "return 1"
);

/// Whether the floors are measured for `primitive` on `backend`.
fn has_floor(backend: &str, primitive: Op) -> bool {
    backend == "redis" && !matches!(primitive, Op::Get | Op::List)
}

/// One call of a floor: the name index alone ([`FLOOR_INCR_LUA`]), every record of headcount's
/// index ([`RECORDS_INCR_LUA`]) or the records and their upkeep ([`UPKEEP_INCR_LUA`]), `side`
/// says which.
fn floor_call(t: &Target, side: Side, primitive: Op, task: usize, n: u64) -> BoxFut<'_> {
    Box::pin(async move {
        let Raw::Redis(conn) = &t.raw else {
            panic!("the floors are measured on Redis only")
        };
        let mut c = conn.clone();
        let ttl_ms = TTL.as_millis() as i64;
        // The upkeep floor keeps the records floor's index keys (it sweeps them as it goes).
        let records = matches!(side, Side::Records | Side::Upkeep);
        let pick = |floor: &'static str, all: &'static str, upkeep: &'static str| match side {
            Side::Floor => floor,
            Side::Records => all,
            _ => upkeep,
        };
        let k = |w: &str| key(t, w, task);
        // The script, its key and its arguments after the index keys, as the raw side sends
        // them (its scripts are built per call too). The keys written are the floor's own
        // (`fn`, `fm`: each floor starts where the other left them), the others are the keys
        // the adapter and raw read or write too.
        let (src, key, args): (&str, String, Vec<String>) = match primitive {
            Op::Incr => (
                pick(FLOOR_INCR_LUA, RECORDS_INCR_LUA, UPKEEP_INCR_LUA),
                k("fn"),
                vec![ttl_ms.to_string()],
            ),
            Op::Expire => (
                pick(FLOOR_EXPIRE_LUA, RECORDS_EXPIRE_LUA, UPKEEP_EXPIRE_LUA),
                k("n"),
                vec![ttl_ms.to_string()],
            ),
            Op::CompareAndSet => (
                pick(FLOOR_CAS_LUA, RECORDS_CAS_LUA, UPKEEP_CAS_LUA),
                k("c"),
                vec!["x".into(), "x".into(), ttl_ms.to_string()],
            ),
            Op::Delete => (
                pick(FLOOR_DELETE_LUA, RECORDS_DELETE_LUA, RECORDS_DELETE_LUA),
                k("absent"),
                vec![],
            ),
            Op::SetMax => (
                pick(FLOOR_SET_MAX_LUA, RECORDS_SET_MAX_LUA, UPKEEP_SET_MAX_LUA),
                k("fm"),
                vec![n.to_string(), ttl_ms.to_string()],
            ),
            other => panic!("no floor for {other}"),
        };
        let script = redis::Script::new(src);
        let mut call = script.key(&key);
        if records {
            // As the adapter's, one version per directory (the key up to its last `:`), shared
            // by the tasks.
            let version = format!(
                "{}records-version:{}",
                t.prefix,
                &key[..key.rfind(':').map_or(0, |i| i + 1)]
            );
            call.key(format!("{}records-index", t.prefix))
                .key(format!("{}records-expiry", t.prefix))
                .key(version);
        } else {
            call.key(format!("{}floor-index", t.prefix));
        }
        for a in args {
            call.arg(a);
        }
        let _: redis::Value = call.invoke_async(&mut c).await.unwrap();
    })
}

/// The SQL of the raw SQLite side (`?1` the key or prefix, `?2` the TTL in ms, the number, or
/// the time for a read): the adapter's statements, with its checks (liveness on the store's
/// clock, read by SQLite inside the statement; a stored counter must be canonical decimal), so
/// SQLite does the same work on both sides and the rows compare the clients.
fn sqlite_sql(primitive: Op) -> &'static str {
    static SQL: std::sync::OnceLock<BTreeMap<Op, String>> = std::sync::OnceLock::new();
    let all = SQL.get_or_init(|| {
        let now = "(CAST(ROUND(unixepoch('now', 'subsec') * 1000) AS INTEGER) + 0)";
        let live = format!("(headcount_kv.expires_at IS NULL OR headcount_kv.expires_at > {now})");
        let counter = "(typeof(headcount_kv.value) = 'text' \
             AND CAST(CAST(headcount_kv.value AS INTEGER) AS TEXT) = headcount_kv.value)";
        BTreeMap::from([
            (Op::Incr, format!(
                "INSERT INTO headcount_kv (key, value, expires_at) VALUES (?1, '1', {now} + ?2 + 1) \
                 ON CONFLICT (key) DO UPDATE SET \
                 value = CASE WHEN {live} THEN CAST(CAST(headcount_kv.value AS INTEGER) + 1 AS TEXT) ELSE excluded.value END, \
                 expires_at = CASE WHEN {live} THEN headcount_kv.expires_at ELSE excluded.expires_at END \
                 WHERE NOT {live} OR ({counter} AND CAST(headcount_kv.value AS INTEGER) < 9223372036854775807) \
                 RETURNING CAST(value AS INTEGER)"
            )),
            (Op::Get, "SELECT value FROM headcount_kv WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)".to_owned()),
            (Op::Expire, format!(
                "UPDATE headcount_kv SET expires_at = {now} + ?2 + 1 WHERE key = ?1 AND {live}"
            )),
            (Op::CompareAndSet, format!(
                "UPDATE headcount_kv SET value = 'x', expires_at = {now} + ?2 + 1 \
                 WHERE key = ?1 AND value = 'x' AND {live}"
            )),
            (Op::Delete, format!(
                "DELETE FROM headcount_kv WHERE key = ?1 AND ?2 IS NOT NULL RETURNING {live}"
            )),
            (Op::List, "SELECT key, value FROM headcount_kv WHERE key >= ?1 AND key < ?1 || x'ff' \
                 AND (expires_at IS NULL OR expires_at > ?2) ORDER BY key".to_owned()),
            (Op::SetMax, format!(
                "INSERT INTO headcount_kv (key, value, expires_at) VALUES (?1, CAST(?2 AS TEXT), {now} + 60000 + 1) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at \
                 WHERE NOT {live} OR ({counter} AND CAST(headcount_kv.value AS INTEGER) < ?2)"
            )),
        ])
    });
    &all[&primitive]
}

/// The SQL of the raw PostgreSQL side (`$1` the key, `$2` the TTL in ms or the number): the
/// adapter's statements, with what they check and return (a stored counter must be canonical
/// decimal; `expire`, `compare_and_set`, `delete` and `set_max` return whether they applied), so
/// the server does the same work on both sides.
fn pg_sql(primitive: Op) -> String {
    let hash = r"sha256(replace($1::text, E'\\', E'\\\\')::bytea)";
    let live = "(cur.expires_at IS NULL OR cur.expires_at > now())";
    let expired = "(cur.expires_at IS NOT NULL AND cur.expires_at <= now())";
    let stored_int =
        "(CASE WHEN cur.value ~ '^(0|-?[1-9][0-9]*)$' THEN cur.value ELSE 'x' END)::bigint";
    match primitive {
                    Op::Incr => format!(
                        "INSERT INTO headcount_kv AS cur (key, value, expires_at) VALUES ($1, '1', now() + $2::bigint * interval '1 millisecond') \
                         ON CONFLICT (key_hash) DO UPDATE SET value = CASE WHEN {live} THEN ({stored_int} + 1)::text ELSE '1' END, \
                         expires_at = CASE WHEN {live} THEN cur.expires_at ELSE EXCLUDED.expires_at END RETURNING cur.value::bigint"
                    ),
                    Op::Get => format!("SELECT cur.value FROM headcount_kv AS cur WHERE cur.key_hash = {hash} AND {live} AND $2::bigint IS NOT NULL"),
                    Op::Expire => format!("UPDATE headcount_kv AS cur SET expires_at = now() + $2::bigint * interval '1 millisecond' WHERE cur.key_hash = {hash} AND {live} RETURNING 1"),
                    Op::CompareAndSet => format!("UPDATE headcount_kv AS cur SET value = 'x', expires_at = now() + $2::bigint * interval '1 millisecond' WHERE cur.key_hash = {hash} AND cur.value = 'x' AND {live} RETURNING 1"),
                    Op::Delete => format!("DELETE FROM headcount_kv AS cur WHERE cur.key_hash = {hash} AND $2::bigint IS NOT NULL RETURNING {live}"),
                    Op::List => format!("SELECT cur.key, cur.value FROM headcount_kv AS cur WHERE left(cur.key, 512) LIKE $1 || '%' AND cur.key LIKE $1 || '%' AND {live} AND $2::bigint IS NOT NULL ORDER BY cur.key"),
                    Op::SetMax => format!("INSERT INTO headcount_kv AS cur (key, value, expires_at) VALUES ($1, $2::bigint::text, now() + interval '60 seconds') \
                         ON CONFLICT (key_hash) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at \
                         WHERE CASE WHEN {expired} THEN true ELSE {stored_int} < $2::bigint END RETURNING 1"),
                    other => panic!("{other}"),
    }
}

/// Latency samples and totals of one benchmark.
#[derive(Default)]
struct Stats {
    latencies: Vec<Duration>,
    ops: u64,
    elapsed: Duration,
    /// Calls and time of each round (see [`rounds`]).
    rounds: BTreeMap<usize, (u64, Duration)>,
}

/// Who makes the calls: headcount's adapter, the raw client, or the raw client keeping one of
/// the floors' key indexes (Redis writes only: the least index, [`FLOOR_INCR_LUA`]; the records
/// of headcount's, [`RECORDS_INCR_LUA`]; those and their upkeep, [`UPKEEP_INCR_LUA`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Adapter,
    Raw,
    Floor,
    Records,
    Upkeep,
    /// PostgreSQL only: the raw client with the unnamed statement ([`raw_call_as`]).
    Unnamed,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Adapter => "adapter",
            Side::Raw => "raw",
            Side::Floor => "raw+name-index",
            Side::Records => "raw+records",
            Side::Upkeep => "raw+records+upkeep",
            Side::Unnamed => "raw-unnamed",
        }
    }
}

type Results = Arc<Mutex<BTreeMap<(String, Op, usize, Side), Stats>>>;

async fn setup(backend: ServerKind) -> Option<Target> {
    let url = match backend.shared().await {
        Ok(url) => url,
        Err(e) => {
            assert!(!backend.required(), "{}: {e}", backend.name());
            eprintln!("SKIP bench {}: {e}", backend.name());
            return None;
        }
    };
    let adapter = headcount::connect(&url).await.unwrap();
    let prefix = format!("hcb:{{{:08x}}}:", rand::random::<u32>());
    let raw = match backend {
        ServerKind::Redis => {
            let client = redis::Client::open(url.as_str()).unwrap();
            Raw::Redis(client.get_multiplexed_async_connection().await.unwrap())
        }
        ServerKind::Etcd => {
            let endpoint = url.trim_start_matches("etcd://").to_owned();
            let mut client = etcd_client::Client::connect([endpoint], None)
                .await
                .unwrap();
            let lease = client.lease_grant(3600, None).await.unwrap().id();
            Raw::Etcd(client.kv_client(), lease)
        }
        ServerKind::Postgres => {
            let mut clients = Vec::new();
            for _ in 0..16 {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                let mut statements = BTreeMap::new();
                for p in PRIMITIVES {
                    let sql = pg_sql(p);
                    statements.insert(p, (client.prepare(&sql).await.unwrap(), sql));
                }
                clients.push((client, statements));
            }
            Raw::Postgres(clients)
        }
        _ => {
            let path = url.trim_start_matches("sqlite://").to_owned();
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            // The adapter's durability (WAL, which the file already is, and synchronous=NORMAL),
            // so the write rows compare two clients, not two fsync policies.
            conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
            Raw::Sqlite(Arc::new(Mutex::new(conn)))
        }
    };
    let t = Target {
        backend: backend.name(),
        adapter,
        raw,
        prefix,
    };
    for primitive in [Op::Get, Op::CompareAndSet, Op::List] {
        keep_alive(&t, primitive).await;
    }
    fill_unrelated(&t).await;
    Some(t)
}

/// Unrelated keys written before measuring, as a store shared with other data holds them:
/// 100,000, or `HEADCOUNT_BENCH_UNRELATED`.
fn unrelated() -> usize {
    std::env::var("HEADCOUNT_BENCH_UNRELATED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000)
}

/// Makes sure the keys `primitive`'s row reads are there, each with a whole [`TTL`] to live, as
/// the row's calls expect: the counters `get` and `expire` find, the value "x" every
/// compare-and-set expects (each side writes it back), the 10 keys `list` lists. Called at setup
/// and before each side's measurement: a row comes minutes after setup, longer than the TTL, and
/// its keys must not expire under it, or the row would time calls that find nothing to do (an
/// `expire` of an absent key, a compare-and-set that fails at once) instead of the work a
/// live key costs ("How to read a row" in docs/benchmarks.md).
async fn keep_alive(t: &Target, primitive: Op) {
    let s = &t.adapter;
    let refreshed = |k: String, v: &'static str| async move {
        if !s.expire(&k, TTL).await.unwrap() {
            assert!(
                s.compare_and_set(&k, None, v, Some(TTL)).await.unwrap(),
                "{k} was absent a moment ago"
            );
        }
    };
    match primitive {
        Op::Get | Op::Expire => {
            for task in 0..16 {
                if !s.expire(&key(t, "n", task), TTL).await.unwrap() {
                    s.incr(&key(t, "n", task), Some(TTL)).await.unwrap();
                }
            }
        }
        Op::CompareAndSet => {
            for task in 0..16 {
                refreshed(key(t, "c", task), "x").await;
            }
        }
        Op::List => {
            for i in 0..10 {
                refreshed(format!("{}l:{i}", t.prefix), "v").await;
            }
        }
        _ => {}
    }
}

/// Writes [`unrelated`] keys beside the benchmark's, with the raw client, under a name of their
/// own: plain strings another application keeps in Redis, keys of another application in etcd,
/// and rows of another prefix in headcount's own table on PostgreSQL and SQLite (the only
/// keyspace the adapter's statements touch there). Both sides then run on the same store: the
/// raw Redis `list`, a `SCAN` of the whole keyspace, pays for them, the adapter's key index
/// does not.
async fn fill_unrelated(t: &Target) {
    let count = unrelated();
    let base = format!("hcb-unrelated:{}", t.prefix);
    let name = |i: usize| format!("{base}{i}");
    match &t.raw {
        Raw::Redis(conn) => {
            let mut c = conn.clone();
            for chunk in (0..count).collect::<Vec<_>>().chunks(1000) {
                let mut mset = redis::cmd("MSET");
                for &i in chunk {
                    mset.arg(name(i)).arg("unrelated value");
                }
                let () = mset.query_async(&mut c).await.unwrap();
            }
        }
        Raw::Etcd(kv, _) => {
            use etcd_client::{Txn, TxnOp};
            let mut kv = kv.clone();
            // etcd allows 128 operations per transaction by default.
            for chunk in (0..count).collect::<Vec<_>>().chunks(128) {
                let puts: Vec<TxnOp> = chunk
                    .iter()
                    .map(|&i| TxnOp::put(name(i), "unrelated value", None))
                    .collect();
                kv.txn(Txn::new().and_then(puts)).await.unwrap();
            }
        }
        Raw::Postgres(clients) => {
            clients[0]
                .0
                .execute(
                    "INSERT INTO headcount_kv (key, value) \
                     SELECT $1 || i, 'unrelated value' FROM generate_series(0, $2::bigint - 1) AS i \
                     ON CONFLICT DO NOTHING",
                    &[&base, &(count as i64)],
                )
                .await
                .unwrap();
        }
        Raw::Sqlite(conn) => {
            let conn = conn.clone();
            let base = base.clone();
            tokio::task::spawn_blocking(move || {
                conn.lock()
                    .unwrap()
                    .execute(
                        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2) \
                         INSERT OR IGNORE INTO headcount_kv (key, value) SELECT ?1 || i, 'unrelated value' FROM n",
                        rusqlite::params![base, count as i64],
                    )
                    .unwrap();
            })
            .await
            .unwrap();
        }
    }
}

/// Removes what [`fill_unrelated`] wrote, and on Redis the floors' index keys (which have no
/// TTL), so a store named by `HEADCOUNT_TEST_<BACKEND>_URL` (someone's server, not the harness's
/// throwaway one) is left as the bench found it; the benchmark's own keys expire.
async fn drop_unrelated(t: &Target) {
    let base = format!("hcb-unrelated:{}", t.prefix);
    match &t.raw {
        Raw::Redis(conn) => {
            let mut c = conn.clone();
            let p = &t.prefix;
            let mut floors = redis::cmd("DEL");
            floors
                .arg(format!("{p}floor-index"))
                .arg(format!("{p}records-index"))
                .arg(format!("{p}records-expiry"));
            for dir in ["fn:", "n:", "c:", "absent:", "fm:"] {
                floors.arg(format!("{p}records-version:{p}{dir}"));
            }
            let _: i64 = floors.query_async(&mut c).await.unwrap();
            for chunk in (0..unrelated()).collect::<Vec<_>>().chunks(1000) {
                let mut del = redis::cmd("DEL");
                for &i in chunk {
                    del.arg(format!("{base}{i}"));
                }
                let _: i64 = del.query_async(&mut c).await.unwrap();
            }
        }
        Raw::Etcd(kv, _) => {
            let mut kv = kv.clone();
            kv.delete(base, Some(etcd_client::DeleteOptions::new().with_prefix()))
                .await
                .unwrap();
        }
        Raw::Postgres(clients) => {
            clients[0]
                .0
                .execute(
                    "DELETE FROM headcount_kv WHERE starts_with(key, $1)",
                    &[&base],
                )
                .await
                .unwrap();
        }
        Raw::Sqlite(conn) => {
            let conn = conn.clone();
            tokio::task::spawn_blocking(move || {
                conn.lock()
                    .unwrap()
                    .execute(
                        "DELETE FROM headcount_kv WHERE key >= ?1 AND key < ?1 || x'ff'",
                        [base],
                    )
                    .unwrap();
            })
            .await
            .unwrap();
        }
    }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let results: Results = Arc::default();
    let mut targets = Vec::new();
    for backend in [
        ServerKind::Redis,
        ServerKind::Etcd,
        ServerKind::Postgres,
        ServerKind::Sqlite,
    ] {
        if let Some(t) = runtime.block_on(setup(backend)) {
            targets.push(Arc::new(t));
        }
    }
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(1));
    for t in &targets {
        for primitive in PRIMITIVES {
            let mut group = c.benchmark_group(format!("{}/{primitive}", t.backend));
            if t.backend == "redis" && primitive == Op::List {
                // The raw listing scans the unrelated keys too: ~0.1 s a call, so the fewest
                // samples criterion takes, not its usual 100.
                group.sample_size(10);
            }
            let rounds = rounds();
            for concurrency in CONCURRENCY {
                let sides = (0..rounds).flat_map(|round| {
                    let mut sides = [
                        Side::Adapter,
                        Side::Raw,
                        Side::Unnamed,
                        Side::Floor,
                        Side::Records,
                        Side::Upkeep,
                    ];
                    if round % 2 == 1 {
                        sides.reverse();
                    }
                    sides.map(|side| (round, side))
                });
                for (round, side) in sides {
                    if matches!(side, Side::Floor | Side::Records | Side::Upkeep)
                        && !has_floor(t.backend, primitive)
                    {
                        continue;
                    }
                    if side == Side::Unnamed && t.backend != "postgres" {
                        continue;
                    }
                    let id = if rounds == 1 {
                        format!("{}/c{concurrency}", side.name())
                    } else {
                        format!("{}/c{concurrency}/round{}", side.name(), round + 1)
                    };
                    runtime.block_on(keep_alive(t, primitive));
                    let results = results.clone();
                    let counter = counter.clone();
                    let t = t.clone();
                    group.bench_function(id, |b| {
                        b.iter_custom(|iters| {
                            let t2 = t.clone();
                            let counter = counter.clone();
                            let (lat, elapsed) = runtime.block_on(async move {
                                let started = Instant::now();
                                let mut lat = Vec::with_capacity(iters as usize * concurrency);
                                for _ in 0..iters {
                                    let n =
                                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let calls = (0..concurrency).map(|task| {
                                        let t = &t2;
                                        async move {
                                            let s = Instant::now();
                                            let call = match side {
                                                Side::Adapter => {
                                                    adapter_call(t, primitive, task, n).await;
                                                    None
                                                }
                                                Side::Raw => Some(raw_call(t, primitive, task, n)),
                                                Side::Unnamed => {
                                                    Some(raw_call_as(t, primitive, task, n, true))
                                                }
                                                Side::Floor | Side::Records | Side::Upkeep => {
                                                    Some(floor_call(t, side, primitive, task, n))
                                                }
                                            };
                                            if let Some(call) = call {
                                                match raw_deadline() {
                                                    Some(d) => tokio::time::timeout(d, call)
                                                        .await
                                                        .expect("a raw call within its deadline"),
                                                    None => call.await,
                                                }
                                            }
                                            s.elapsed()
                                        }
                                    });
                                    lat.extend(futures::future::join_all(calls).await);
                                }
                                (lat, started.elapsed())
                            });
                            let mut r = results.lock().unwrap();
                            let s = r
                                .entry((t.backend.to_owned(), primitive, concurrency, side))
                                .or_default();
                            s.ops += lat.len() as u64;
                            s.elapsed += elapsed;
                            let r = s.rounds.entry(round).or_default();
                            r.0 += lat.len() as u64;
                            r.1 += elapsed;
                            s.latencies.extend(lat);
                            elapsed
                        });
                    });
                }
            }
            group.finish();
        }
    }
    print_table(&results.lock().unwrap());
    for t in &targets {
        runtime.block_on(drop_unrelated(t));
    }
}

fn print_table(results: &BTreeMap<(String, Op, usize, Side), Stats>) {
    println!();
    println!("| backend | primitive | conc. | adapter ops/s | p50 | p99 | raw ops/s | p50 | p99 | adapter/raw | per round | raw, slowest/fastest round | raw+name-index/raw | raw+records/raw | raw+records+upkeep/raw | raw-unnamed/raw (per round) |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    let rate = |s: &Stats| s.ops as f64 / s.elapsed.as_secs_f64().max(1e-9);
    let round_rate =
        |&(ops, elapsed): &(u64, Duration)| ops as f64 / elapsed.as_secs_f64().max(1e-9);
    for backend in ["redis", "etcd", "postgres", "sqlite"] {
        for primitive in PRIMITIVES {
            for concurrency in CONCURRENCY {
                let get = |side| results.get(&(backend.to_owned(), primitive, concurrency, side));
                let (Some(a), Some(r)) = (get(Side::Adapter), get(Side::Raw)) else {
                    continue;
                };
                let mut al = a.latencies.clone();
                al.sort_unstable();
                let mut rl = r.latencies.clone();
                rl.sort_unstable();
                let ratio = rate(a) / rate(r).max(1e-9);
                // The adapter against raw within each round (measured next to each other), and
                // how far raw's own rounds differ: a gap smaller than that is noise.
                let per_round_of = |x: &Stats| {
                    x.rounds
                        .iter()
                        .filter_map(|(round, xr)| {
                            let rr = r.rounds.get(round)?;
                            Some(format!("{:.2}", round_rate(xr) / round_rate(rr).max(1e-9)))
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let per_round = per_round_of(a);
                // PostgreSQL: the unnamed statement against the one prepared up front.
                let unnamed = get(Side::Unnamed)
                    .map(|u| format!("{:.2} ({})", rate(u) / rate(r).max(1e-9), per_round_of(u)))
                    .unwrap_or_default();
                let raw_rates = r.rounds.values().map(round_rate);
                let spread = raw_rates.clone().fold(f64::INFINITY, f64::min)
                    / raw_rates.fold(0.0, f64::max).max(1e-9);
                let of_raw = |side| {
                    get(side)
                        .map(|f| format!("{:.2}", rate(f) / rate(r).max(1e-9)))
                        .unwrap_or_default()
                };
                let (floor, records, upkeep) = (
                    of_raw(Side::Floor),
                    of_raw(Side::Records),
                    of_raw(Side::Upkeep),
                );
                println!(
                    "| {backend} | {primitive} | {concurrency} | {:.0} | {} | {} | {:.0} | {} | {} | {:.2}{} | {per_round} | {spread:.2} | {floor} | {records} | {upkeep} | {unnamed} |",
                    rate(a),
                    ms(percentile(&al, 50)),
                    ms(percentile(&al, 99)),
                    rate(r),
                    ms(percentile(&rl, 50)),
                    ms(percentile(&rl, 99)),
                    ratio,
                    if ratio < 0.9 { " ✗" } else { "" }
                );
            }
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
