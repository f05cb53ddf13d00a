//! The Lua scripts of the primitives, loaded once per store and called by their SHA.

use std::time::Duration;

use headcount_core::backend::ttl_millis;
use redis::Script;

/// The Lua sources, kept as files next to this one. Every script that writes or lists keys starts
/// with `local D = <its number of data keys>`, `local REPLAY = <whether it is replay-protected>`
/// and `index.lua` (the key index: the data keys come first in `KEYS`, then the two index keys,
/// when the key has an index, then the request key of a replay-protected call on Cluster).
/// The increments add `counter.lua` and the heartbeats `heartbeat.lua`, the helpers only they
/// call: Lua creates every function of a script on each call (about 0.1 µs each on the test
/// machine), so a script carries only the helpers it may call.
macro_rules! indexed {
    (@replay $replay:literal, $data_keys:literal, $($part:expr),+ $(,)?) => {
        concat!(
            "local D = ",
            $data_keys,
            "\nlocal REPLAY = ",
            $replay,
            "\n",
            include_str!("scripts/index.lua"),
            $($part),+
        )
    };
    ($data_keys:literal, $($part:expr),+ $(,)?) => {
        indexed!(@replay "false", $data_keys, $($part),+)
    };
}
/// A write script whose repeat must not apply twice (see `replay.lua`): its body runs as a
/// function, after which the answer is recorded under the call's request id (its last argument)
/// at the request key (its last key), both from `RedisStore::index_and_request`.
macro_rules! replayable {
    ($data_keys:literal, $body:expr) => {
        replayable!($data_keys, [], $body)
    };
    ($data_keys:literal, [$($helpers:expr),*], $body:expr) => {
        indexed!(
            @replay "true",
            $data_keys,
            $($helpers,)*
            "local function body()\n",
            $body,
            include_str!("scripts/replay.lua")
        )
    };
}

const INCR_LUA: &str = replayable!(
    1,
    [include_str!("scripts/counter.lua")],
    include_str!("scripts/incr.lua")
);
const CAS_LUA: &str = replayable!(1, include_str!("scripts/cas.lua"));
const SET_MAX_LUA: &str = replayable!(1, include_str!("scripts/set_max.lua"));
const EXPIRE_LUA: &str = indexed!(1, include_str!("scripts/expire.lua"));
const DELETE_LUA: &str = replayable!(1, include_str!("scripts/delete.lua"));
const COMPARE_AND_DELETE_LUA: &str = replayable!(1, include_str!("scripts/compare_and_delete.lua"));
/// `list` and `renew_and_list` share the listing (`list_body.lua` builds `out`); each adds its
/// own ending, and `renew_and_list` its renewal in front.
const LIST_LUA: &str = indexed!(0, include_str!("scripts/list_body.lua"), "return out\n");
/// `list_with_ttl`: the listing, then each listed key's `PTTL`, answered as `{out, ttls}`.
const LIST_WITH_TTL_LUA: &str = indexed!(
    0,
    include_str!("scripts/list_body.lua"),
    "local ttls = {}\nfor i = 2, #out, 2 do ttls[#ttls + 1] = redis.call('PTTL', out[i]) end\nreturn {out, ttls}\n"
);
const RENEW_AND_LIST_LUA: &str = indexed!(
    1,
    include_str!("scripts/renew_head.lua"),
    include_str!("scripts/list_body.lua"),
    "settle()\ntable.insert(out, 1, renewed)\nreturn out\n"
);
const INCR_AND_GET_LUA: &str = replayable!(
    2,
    [include_str!("scripts/counter.lua")],
    include_str!("scripts/incr_and_get.lua")
);
/// `renew_and_list_if_changed`: the renewal and version check, then (when the version changed)
/// the shared listing.
const RENEW_CHECK_LUA: &str = indexed!(
    1,
    include_str!("scripts/heartbeat.lua"),
    include_str!("scripts/renew_check.lua"),
    include_str!("scripts/list_body.lua"),
    "table.insert(out, 1, version)\ntable.insert(out, 1, renewed)\nreturn out\n"
);
/// `renew_and_versions`: the renewal and the versions of several directories, no listing.
const RENEW_VERSIONS_LUA: &str = indexed!(
    1,
    include_str!("scripts/heartbeat.lua"),
    include_str!("scripts/renew_versions.lua")
);

/// The loaded scripts. `Script` sends `EVALSHA` and, on `NOSCRIPT` (a restarted or flushed
/// server, a new Cluster node), loads the script and retries once.
pub(crate) struct Scripts {
    pub(crate) incr: Script,
    pub(crate) cas: Script,
    pub(crate) set_max: Script,
    pub(crate) expire: Script,
    pub(crate) delete: Script,
    pub(crate) compare_and_delete: Script,
    pub(crate) list: Script,
    pub(crate) list_with_ttl: Script,
    pub(crate) incr_and_get: Script,
    pub(crate) renew_and_list: Script,
    pub(crate) renew_check: Script,
    pub(crate) renew_versions: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            incr: Script::new(INCR_LUA),
            cas: Script::new(CAS_LUA),
            set_max: Script::new(SET_MAX_LUA),
            expire: Script::new(EXPIRE_LUA),
            delete: Script::new(DELETE_LUA),
            compare_and_delete: Script::new(COMPARE_AND_DELETE_LUA),
            list: Script::new(LIST_LUA),
            list_with_ttl: Script::new(LIST_WITH_TTL_LUA),
            incr_and_get: Script::new(INCR_AND_GET_LUA),
            renew_and_list: Script::new(RENEW_AND_LIST_LUA),
            renew_check: Script::new(RENEW_CHECK_LUA),
            renew_versions: Script::new(RENEW_VERSIONS_LUA),
        }
    }
}

/// The TTL argument of a script: milliseconds, or empty for none.
pub(crate) fn ttl_arg(ttl: Option<Duration>) -> String {
    ttl.map(|t| ttl_millis(t).to_string()).unwrap_or_default()
}
