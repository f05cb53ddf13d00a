//! The names of headcount's key index (see the crate README, "Data layout") and of Redis
//! Cluster hash tags, which decide which slot, and so which index, a key belongs to.

use std::time::Duration;

use redis::ScriptInvocation;

/// The index of every key on a single server.
const INDEX_KEY: &str = "headcount:index";
/// The expiry index of every key on a single server.
const EXPIRY_KEY: &str = "headcount:expiry";
/// What follows `{tag}` in the name of the index of the keys with hash tag `tag`.
const INDEX_SUFFIX: &str = ":headcount:index";
/// What follows `{tag}` in the name of the expiry index of the keys with hash tag `tag`.
const EXPIRY_SUFFIX: &str = ":headcount:expiry";
/// What follows `{tag}` in the name of a recorded answer of a replay-protected call on Cluster,
/// before the call's request id (`replay.lua`).
pub(crate) const REQUEST_INFIX: &str = ":headcount:req:";

/// The two sorted sets that record the keys headcount wrote in one hash slot (see the crate
/// README, "Data layout").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexKeys {
    pub(crate) index: String,
    pub(crate) expiry: String,
}

impl IndexKeys {
    pub(crate) fn database() -> Self {
        IndexKeys {
            index: INDEX_KEY.to_owned(),
            expiry: EXPIRY_KEY.to_owned(),
        }
    }

    /// The index of the keys with hash tag `tag`: `{tag}:headcount:index`, in their slot.
    pub(crate) fn of_tag(tag: &str) -> Self {
        IndexKeys {
            index: format!("{{{tag}}}{INDEX_SUFFIX}"),
            expiry: format!("{{{tag}}}{EXPIRY_SUFFIX}"),
        }
    }

    /// Appends the two index keys to a script's `KEYS`, after its data keys.
    pub(crate) fn add_to(&self, call: &mut ScriptInvocation<'_>) {
        call.key(&self.index).key(&self.expiry);
    }

    /// Appends, after the index keys, the other keys of this index a script reads or writes on
    /// its steady path: the quiet marker and the versions of `dirs` (each once). The scripts
    /// find them by name, not by position: they are declared so that on Cluster, while the slot
    /// migrates and one of them has moved, Redis answers `TRYAGAIN` or `ASK` before the script
    /// runs instead of failing it halfway ("Script attempted to access a non local key").
    pub(crate) fn declare<'a>(
        &self,
        call: &mut ScriptInvocation<'_>,
        dirs: impl IntoIterator<Item = &'a str>,
    ) {
        let base = self.base();
        call.key(format!("{base}quiet"));
        let mut seen: Vec<&str> = Vec::new();
        for dir in dirs {
            if !seen.contains(&dir) {
                seen.push(dir);
                call.key(format!("{base}version:{dir}"));
            }
        }
    }

    /// The index's name up to `index`: the marker and the versions are named from it.
    fn base(&self) -> &str {
        self.index.strip_suffix("index").unwrap_or(&self.index)
    }
}

/// The directory of `key` (its text up to its last `:`), whose version a write of it changes.
pub(crate) fn dir_of(key: &str) -> Option<&str> {
    key.rfind(':').map(|i| &key[..=i])
}

/// The shortest life of the quiet marker a heartbeat's sweep sets (index.lua): an index is swept
/// at most this often, and an expiry is noticed at most this long after it comes due (plus the
/// time to the next heartbeat of any member).
pub(crate) fn sweep_period(ttl: Duration) -> Duration {
    (ttl / 12).clamp(Duration::from_millis(10), Duration::from_millis(500))
}

/// Whether `key` is the name of an index (of either deployment): headcount never writes there
/// through the `Store` API, or the index would be overwritten.
pub(crate) fn is_index_name(key: &str) -> bool {
    // The index, the expiry index, the quiet marker and the directory versions (index.lua), and
    // the answers recorded against repeated requests (replay.lua).
    let reserved = |rest: &str| {
        rest == "index"
            || rest == "expiry"
            || rest == "quiet"
            || rest.starts_with("version:")
            || rest.starts_with("req:")
    };
    if let Some(rest) = key.strip_prefix("headcount:") {
        return reserved(rest);
    }
    match key.strip_prefix('{').and_then(|r| r.split_once('}')) {
        Some((tag, rest)) if !tag.is_empty() => {
            rest.strip_prefix(":headcount:").is_some_and(reserved)
        }
        _ => false,
    }
}

/// The hash tag of a key or prefix under Redis Cluster's rule: the text between the first `{`
/// and the first `}` after it, when not empty. Every key that starts with a prefix holding a
/// tag has that same tag, so the prefix pins one slot.
pub(crate) fn tag_of(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The part of a key Redis Cluster hashes: its hash tag, else the whole key.
pub(crate) fn hash_tag(key: &str) -> &str {
    tag_of(key).unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag("hc:{g}:interval:3"), "g");
        assert_eq!(hash_tag("a{}b"), "a{}b");
        assert_eq!(hash_tag("plain"), "plain");
    }

    #[test]
    fn hash_tags_pin_a_slot() {
        assert_eq!(tag_of("hc:{g}:"), Some("g"));
        assert_eq!(tag_of("{g}"), Some("g"));
        assert_eq!(tag_of("a{b{c}d}"), Some("b{c"));
        assert_eq!(tag_of("hc:{g"), None);
        assert_eq!(tag_of("hc:{}:x}"), None);
        assert_eq!(tag_of("hc:"), None);
    }

    #[test]
    fn declared_keys_are_the_ones_the_scripts_name() {
        let ix = IndexKeys::of_tag("g");
        for name in ["{g}:headcount:quiet", "{g}:headcount:version:hc:{g}:slot:"] {
            assert!(is_index_name(name), "{name}");
        }
        assert_eq!(IndexKeys::database().base(), "headcount:");
        assert_eq!(ix.base(), "{g}:headcount:");
        assert_eq!(dir_of("hc:{g}:slot:3"), Some("hc:{g}:slot:"));
        assert_eq!(dir_of("plain"), None);
    }

    #[test]
    fn index_keys_share_the_tag_and_are_reserved() {
        let ix = IndexKeys::of_tag("b{c");
        assert_eq!(ix.index, "{b{c}:headcount:index");
        assert_eq!(tag_of(&ix.index), Some("b{c"));
        assert_eq!(tag_of(&ix.expiry), Some("b{c"));
        for name in [
            "headcount:index",
            "headcount:expiry",
            "{g}:headcount:index",
            "{g}:headcount:expiry",
            "headcount:quiet",
            "{g}:headcount:quiet",
            "headcount:version:hc:{g}:slot:",
            "{g}:headcount:version:hc:{g}:slot:",
            "{g}:headcount:req:0123456789abcdef0",
            "{counter}:headcount:req:0123456789abcdef0",
        ] {
            assert!(is_index_name(name), "{name}");
        }
        for name in [
            "hc:{g}:headcount:index",
            "{}:headcount:index",
            "{g}:headcount:index2",
            "héadcount:index",
            "x",
        ] {
            assert!(!is_index_name(name), "{name}");
        }
    }
}
