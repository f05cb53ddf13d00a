//! Health records: [`PeerHealth`], [`live_peers`], and the record's text.

use super::layout::IntervalLayout;
use super::Pair;
use crate::error::Result;
use crate::keys::Keyspace;
use crate::DynStore;

/// One live peer, from its health record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerHealth {
    /// The member id.
    pub member: String,
    /// The interval number of its last tick.
    pub tick: u64,
    /// Its pair at that tick, if it had one: `(index, replicas)`.
    pub pair: Option<(u64, u64)>,
    /// Its declared capacity.
    pub capacity: u64,
}

/// The live peers of `group`'s interval indexer under `prefix`, from their health records, sorted
/// by member id. Records that do not parse are skipped with a warning.
pub async fn live_peers(store: &DynStore, prefix: &str, group: &str) -> Result<Vec<PeerHealth>> {
    let layout = IntervalLayout {
        space: Keyspace::with_prefix(prefix, group)?,
    };
    list_health(store.as_ref(), &layout.health_prefix()).await
}

pub(super) async fn list_health(store: &dyn crate::Store, prefix: &str) -> Result<Vec<PeerHealth>> {
    let mut out = Vec::new();
    for (key, value) in store.list(prefix).await? {
        let member = key.strip_prefix(prefix).unwrap_or(&key).to_owned();
        match parse_health(&member, &value) {
            Some(h) => out.push(h),
            None => tracing::warn!(%key, %value, "skipping a health record that does not parse"),
        }
    }
    Ok(out)
}

pub(super) fn health_value(tick: u64, pair: Option<Pair>, capacity: u64) -> String {
    match pair {
        Some(p) => format!(
            "tick={tick} index={} replicas={} capacity={capacity}",
            p.index, p.replicas
        ),
        None => format!("tick={tick} index=- replicas=- capacity={capacity}"),
    }
}

fn parse_health(member: &str, value: &str) -> Option<PeerHealth> {
    let mut tick = None;
    let mut index = None;
    let mut replicas = None;
    let mut capacity = None;
    for part in value.split(' ') {
        let (k, v) = part.split_once('=')?;
        let n = if v == "-" {
            None
        } else {
            Some(v.parse::<u64>().ok()?)
        };
        match k {
            "tick" => tick = n,
            "index" => index = n,
            "replicas" => replicas = n,
            "capacity" => capacity = n,
            _ => return None,
        }
    }
    Some(PeerHealth {
        member: member.to_owned(),
        tick: tick?,
        pair: index.zip(replicas),
        capacity: capacity?,
    })
}

#[cfg(test)]
mod tests {
    use super::{health_value, parse_health, Pair, PeerHealth};

    #[test]
    fn health_records_round_trip() {
        let pair = Pair {
            epoch: 7,
            index: 2,
            replicas: 3,
            capacity: 1,
        };
        let v = health_value(7, Some(pair), 1);
        assert_eq!(
            parse_health("m", &v),
            Some(PeerHealth {
                member: "m".into(),
                tick: 7,
                pair: Some((2, 3)),
                capacity: 1
            })
        );
        assert_eq!(
            parse_health("m", &health_value(7, None, 2)).map(|h| h.pair),
            Some(None)
        );
        assert!(parse_health("m", "alive").is_none());
    }
}
