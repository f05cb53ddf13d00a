//! Judging whether a Redis server (or every primary of a Cluster) keeps acknowledged writes:
//! its `CONFIG GET append*` and `INFO replication` replies.

use headcount_core::Durability;
use redis::Value;

/// Judges `INFO replication` (of one or several nodes) on top of durable settings: Redis
/// replicates asynchronously, so a replica promoted after a failover can lack writes its primary
/// acknowledged, and a replica itself is read-only.
pub(crate) fn replication_of(reply: &Value, settings: Durability) -> Durability {
    let mut texts = Vec::new();
    flatten_strings(reply, &mut texts);
    let mut replicas = 0u64;
    let mut is_replica = false;
    for line in texts.iter().flat_map(|t| t.lines()) {
        if let Some(n) = line.trim().strip_prefix("connected_slaves:") {
            replicas += n.parse::<u64>().unwrap_or(0);
        }
        if line.trim() == "role:slave" {
            is_replica = true;
        }
    }
    let judged = if is_replica {
        Durability::not_durable(format!(
            "{}; the server is a replica (read-only)",
            settings.detail
        ))
    } else if replicas > 0 {
        Durability::not_durable(format!(
            "{}, {replicas} connected replica(s) (Redis replicates asynchronously: a replica promoted after a failover can lack acknowledged writes)",
            settings.detail
        ))
    } else {
        Durability::durable(format!("{}, no replicas", settings.detail))
    };
    match settings.evicts {
        Some(why) => judged.with_eviction(why),
        None => judged,
    }
}

/// The `master_replid` of each node in `INFO replication`: the id of the data set a server
/// serves, shared by its databases and by a primary and its replicas.
pub(crate) fn replication_ids(reply: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    flatten_strings(reply, &mut texts);
    let mut ids: Vec<String> = texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|line| line.trim().strip_prefix("master_replid:"))
        .map(|id| format!("redis replication id {id}"))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Judges the reply of `CONFIG GET append*` (one or several nodes' pairs, concatenated).
pub(crate) fn durability_of(reply: &Value) -> Durability {
    let mut words = Vec::new();
    flatten_strings(reply, &mut words);
    let mut appendonly = Vec::new();
    let mut appendfsync = Vec::new();
    let mut eviction = Vec::new();
    let mut maxmemory = Vec::new();
    for pair in words.chunks_exact(2) {
        match pair[0].as_str() {
            "appendonly" => appendonly.push(pair[1].clone()),
            "appendfsync" => appendfsync.push(pair[1].clone()),
            "maxmemory-policy" => eviction.push(pair[1].clone()),
            "maxmemory" => maxmemory.push(pair[1].clone()),
            _ => {}
        }
    }
    let judged = judge_settings(&appendonly, &appendfsync, &eviction);
    match evicting(&eviction, &maxmemory) {
        Some(why) => judged.with_eviction(why),
        None => judged,
    }
}

/// Why a server (or a node of a Cluster) with these settings may evict keys before they
/// expire: a `maxmemory` limit (`0` is none) with a policy other than `noeviction`. A limit the
/// server did not report counts as set.
fn evicting(policies: &[String], maxmemory: &[String]) -> Option<String> {
    let limited = maxmemory.is_empty() || maxmemory.iter().any(|m| m != "0");
    let policy = policies.iter().find(|p| *p != "noeviction")?;
    limited.then(|| {
        format!(
            "maxmemory-policy {policy} with maxmemory {} (Redis evicts keys under memory pressure, leases included)",
            show_settings(maxmemory)
        )
    })
}

/// Judges the persistence settings and, for majority IDs, an `allkeys-*` policy.
fn judge_settings(
    appendonly: &[String],
    appendfsync: &[String],
    eviction: &[String],
) -> Durability {
    let detail = format!(
        "appendonly {}, appendfsync {}",
        show_settings(appendonly),
        show_settings(appendfsync)
    );
    // allkeys-* may evict a key that has no TTL (a majority-IDs counter) under memory pressure:
    // the next ID would start again from the other stores' values, or from 1.
    if let Some(policy) = eviction.iter().find(|p| p.starts_with("allkeys-")) {
        return Durability::not_durable(format!(
            "{detail}, maxmemory-policy {policy} (it may evict keys without a TTL; use noeviction or a volatile-* policy)"
        ));
    }
    let durable = !appendonly.is_empty()
        && !appendfsync.is_empty()
        && appendonly.iter().all(|v| v == "yes")
        && appendfsync.iter().all(|v| v == "always");
    if durable {
        Durability::durable(detail)
    } else {
        Durability::not_durable(format!(
            "{detail} (durable needs appendonly yes and appendfsync always)"
        ))
    }
}

/// The values one setting has across nodes, deduplicated: `yes`, or `yes/no` when nodes differ.
fn show_settings(values: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for v in values {
        if !seen.contains(&v.as_str()) {
            seen.push(v);
        }
    }
    if seen.is_empty() {
        "(not reported)".to_owned()
    } else {
        seen.join("/")
    }
}

/// Every string of a reply in order, maps flattened to key, value.
fn flatten_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::Array(items) | Value::Set(items) => {
            items.iter().for_each(|v| flatten_strings(v, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten_strings(k, out);
            flatten_strings(v, out);
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_needs_aof_always_on_every_node() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = |pairs: &[(&str, &str)]| {
            Value::Array(pairs.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]).collect())
        };
        let durable = reply(&[("appendonly", "yes"), ("appendfsync", "always")]);
        let d = durability_of(&durable);
        assert!(
            d.durable && d.detail == "appendonly yes, appendfsync always",
            "{d:?}"
        );
        let everysec = durability_of(&reply(&[
            ("appendonly", "yes"),
            ("appendfsync", "everysec"),
        ]));
        assert!(!everysec.durable && everysec.detail.contains("everysec"));
        let mixed = reply(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("appendonly", "no"),
            ("appendfsync", "always"),
        ]);
        let d = durability_of(&mixed);
        assert!(!d.durable && d.detail.contains("yes/no"), "{d:?}");
        assert!(!durability_of(&Value::Array(vec![])).durable);
        let map = Value::Map(vec![
            (bulk("appendonly"), bulk("yes")),
            (bulk("appendfsync"), bulk("always")),
        ]);
        assert!(durability_of(&map).durable);
        let lru = durability_of(&reply(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("maxmemory-policy", "allkeys-lru"),
        ]));
        assert!(
            !lru.durable && lru.detail.contains("allkeys-lru"),
            "{lru:?}"
        );
        let volatile = reply(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("maxmemory-policy", "volatile-lru"),
        ]);
        assert!(durability_of(&volatile).durable);
        // Eviction needs a memory limit; one not reported counts as set.
        assert!(durability_of(&volatile).evicts.is_some());
        let with = |policy: &str, max: &str| {
            durability_of(&reply(&[("maxmemory-policy", policy), ("maxmemory", max)])).evicts
        };
        assert_eq!(with("noeviction", "100mb"), None);
        assert_eq!(with("volatile-ttl", "0"), None);
        let why = with("volatile-ttl", "104857600").unwrap();
        assert!(
            why.contains("volatile-ttl") && why.contains("104857600"),
            "{why}"
        );
        assert!(with("allkeys-lru", "1").is_some());
        assert_eq!(
            durability_of(&reply(&[("maxmemory-policy", "noeviction")])).evicts,
            None
        );
    }

    #[test]
    fn replicas_make_a_store_not_durable() {
        let ok = || Durability::durable("appendonly yes, appendfsync always");
        let info = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let alone = info("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n");
        assert!(replication_of(&alone, ok()).durable);
        let replicated = info("# Replication\r\nrole:master\r\nconnected_slaves:1\r\n");
        let d = replication_of(&replicated, ok());
        assert!(
            !d.durable && d.detail.contains("1 connected replica"),
            "{d:?}"
        );
        let evicting = ok().with_eviction("maxmemory-policy allkeys-lru");
        assert!(replication_of(&replicated, evicting).evicts.is_some());
        let replica = info("# Replication\r\nrole:slave\r\n");
        assert!(!replication_of(&replica, ok()).durable);
        let cluster = Value::Map(vec![
            (info("n1"), alone.clone()),
            (info("n2"), replicated.clone()),
        ]);
        assert!(!replication_of(&cluster, ok()).durable);
    }
}
