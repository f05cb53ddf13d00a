//! The checker of the partition tests: given everything that happened in a run (every grant each
//! member reported, every write it sent to the fenced sink and the answer it got, the rows the
//! sink holds in the order it accepted them, and when each fault started and healed), it finds
//! what the protocol promises never happens, as Jepsen's checkers do over a history:
//!
//! * [`Anomaly::TwoOwners`]: one key granted to two members under the same token (the fence
//!   cannot tell them apart);
//! * [`Anomaly::StaleGrant`]: a member granted a key with an older token after another member
//!   had already been granted it with a newer one (the old owner did not stop in time);
//! * [`Anomaly::FenceOrder`]: the sink accepted a write with an older token after one with a
//!   newer token for the same key (the fence let a deposed owner through);
//! * [`Anomaly::LostAck`]: a member was told a write was accepted that the sink does not hold;
//! * [`Anomaly::Duplicate`] / [`Anomaly::Unprocessed`]: an id accepted twice, or never;
//! * [`Anomaly::GrantPastLease`]: a member cut from the store granted a key after its lease
//!   deadline, or reported a deadline later than its lease allows, from its own reports.
//!
//! It also measures, per fault window, how long keys went ungranted during the fault and after
//! it healed, and how many keys changed owner ([`Window`], [`window_stats`]).
//!
//! Times are wall-clock milliseconds of one machine (members and the test share its clock).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// A member took a grant for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantEvent {
    /// The member's name.
    pub member: String,
    /// The key.
    pub key: String,
    /// The grant's fencing token.
    pub token: u64,
    /// Wall time just before the member asked for the grant: the grant was valid at or after it.
    pub asked: u64,
    /// Wall time once it had the grant: the grant was valid at or before it.
    pub at: u64,
    /// The wall time its lease runs to, as it saw it when it had the grant, if it said.
    pub deadline: Option<u64>,
}

/// A member's write to the sink under a grant, and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteEvent {
    /// The member's name.
    pub member: String,
    /// The key.
    pub key: String,
    /// The token the write carried.
    pub token: u64,
    /// Wall time of the answer.
    pub at: u64,
    /// How many ids the sink said it accepted (0 when fenced).
    pub accepted: u64,
}

/// One id the sink accepted, in the sink's own order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRow {
    /// The sink's sequence number: accepted rows in commit order for one key.
    pub seq: u64,
    /// The id.
    pub id: u64,
    /// The key it belongs to.
    pub key: String,
    /// The token the write carried.
    pub token: u64,
    /// The member that wrote it.
    pub member: String,
}

/// A member cut from every node of the store, from `from` until `to` (`None`: until the end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// The member.
    pub member: String,
    /// When the cut started.
    pub from: u64,
    /// When it healed.
    pub to: Option<u64>,
}

/// Everything the checker reads.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// The members' lease TTL (milliseconds).
    pub ttl_ms: u64,
    /// Slack for the members' own clock readings against the harness's (milliseconds).
    pub slack_ms: u64,
    /// Every grant reported.
    pub grants: Vec<GrantEvent>,
    /// Every write answered.
    pub writes: Vec<WriteEvent>,
    /// Every row the sink holds.
    pub sink: Vec<SinkRow>,
    /// The ids offered to the sink: `0..offered`.
    pub offered: u64,
    /// The members cut from the store, and when.
    pub cuts: Vec<Cut>,
}

/// A broken promise found in a [`History`], with the events that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Anomaly {
    /// The same key and token granted to two members.
    TwoOwners {
        /// The key.
        key: String,
        /// The token.
        token: u64,
        /// The grants, one per member.
        grants: Vec<GrantEvent>,
    },
    /// A grant with an older token asked for after a newer token's grant was in place.
    StaleGrant {
        /// The newer grant.
        newer: GrantEvent,
        /// The older one, taken after it.
        older: GrantEvent,
    },
    /// The sink accepted an older token after a newer one for a key.
    FenceOrder {
        /// The row with the newer token.
        newer: SinkRow,
        /// The row with the older token, accepted after it.
        older: SinkRow,
    },
    /// Writes acknowledged to a member that the sink does not hold.
    LostAck {
        /// The member.
        member: String,
        /// The key.
        key: String,
        /// The token.
        token: u64,
        /// Ids acknowledged.
        acked: u64,
        /// Ids the sink holds from it.
        stored: u64,
    },
    /// An id accepted more than once.
    Duplicate {
        /// The rows holding it.
        rows: Vec<SinkRow>,
    },
    /// Ids offered but never accepted.
    Unprocessed {
        /// How many.
        count: u64,
        /// The first few.
        sample: Vec<u64>,
    },
    /// A member cut from the store granted past its lease deadline.
    GrantPastLease {
        /// The cut.
        cut: Cut,
        /// The grant.
        grant: GrantEvent,
        /// The latest instant its lease could have run to: the cut's start plus the lease.
        deadline: u64,
    },
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Anomaly::TwoOwners { key, token, grants } => {
                writeln!(f, "key {key} granted under token {token} to two members:")?;
                grants.iter().try_for_each(|g| writeln!(f, "  {g:?}"))
            }
            Anomaly::StaleGrant { newer, older } => writeln!(
                f,
                "key {} granted to {} under token {} at {}, then to {} under older token {} \
                 asked at {}:\n  {newer:?}\n  {older:?}",
                newer.key,
                newer.member,
                newer.token,
                newer.at,
                older.member,
                older.token,
                older.asked
            ),
            Anomaly::FenceOrder { newer, older } => writeln!(
                f,
                "the sink accepted token {} for {} after token {} (seq {} after {}):\n  \
                 {newer:?}\n  {older:?}",
                older.token, older.key, newer.token, older.seq, newer.seq
            ),
            Anomaly::LostAck {
                member,
                key,
                token,
                acked,
                stored,
            } => writeln!(
                f,
                "{member} was told {acked} ids of {key} under token {token} were accepted; \
                 the sink holds {stored}"
            ),
            Anomaly::Duplicate { rows } => {
                writeln!(f, "an id accepted {} times:", rows.len())?;
                rows.iter().try_for_each(|r| writeln!(f, "  {r:?}"))
            }
            Anomaly::Unprocessed { count, sample } => {
                writeln!(f, "{count} ids never accepted, such as {sample:?}")
            }
            Anomaly::GrantPastLease {
                cut,
                grant,
                deadline,
            } => writeln!(
                f,
                "{} was cut from the store at {} and its lease ran out by {deadline}, yet it \
                 granted {} (asked at {}, its lease running to {:?}):\n  {cut:?}\n  {grant:?}",
                cut.member, cut.from, grant.key, grant.asked, grant.deadline
            ),
        }
    }
}

/// Every anomaly in `h`, in the order of the list in the module docs.
pub fn check(h: &History) -> Vec<Anomaly> {
    let mut found = Vec::new();
    two_owners(h, &mut found);
    stale_grants(h, &mut found);
    fence_order(h, &mut found);
    lost_acks(h, &mut found);
    exactly_once(h, &mut found);
    past_lease(h, &mut found);
    found
}

fn two_owners(h: &History, found: &mut Vec<Anomaly>) {
    let mut by: BTreeMap<(&str, u64), BTreeMap<&str, &GrantEvent>> = BTreeMap::new();
    for g in &h.grants {
        by.entry((&g.key, g.token))
            .or_default()
            .entry(&g.member)
            .or_insert(g);
    }
    for ((key, token), members) in by {
        if members.len() > 1 {
            found.push(Anomaly::TwoOwners {
                key: key.to_owned(),
                token,
                grants: members.into_values().cloned().collect(),
            });
        }
    }
}

fn stale_grants(h: &History, found: &mut Vec<Anomaly>) {
    let mut by_key: BTreeMap<&str, Vec<&GrantEvent>> = BTreeMap::new();
    for g in &h.grants {
        by_key.entry(&g.key).or_default().push(g);
    }
    for grants in by_key.values_mut() {
        grants.sort_by_key(|g| g.at);
        // The first grant of each token, and for every grant the newest token granted surely
        // before it was asked for.
        let mut firsts: Vec<&GrantEvent> = Vec::new();
        for g in grants.iter() {
            if firsts.iter().all(|f| f.token != g.token) {
                firsts.push(g);
            }
        }
        for g in grants.iter() {
            let newer = firsts
                .iter()
                .filter(|f| f.token > g.token && f.member != g.member && f.at < g.asked)
                .min_by_key(|f| f.at);
            if let Some(newer) = newer {
                found.push(Anomaly::StaleGrant {
                    newer: (*newer).clone(),
                    older: (*g).clone(),
                });
                // One per key is enough to show it.
                break;
            }
        }
    }
}

fn fence_order(h: &History, found: &mut Vec<Anomaly>) {
    let mut by_key: BTreeMap<&str, Vec<&SinkRow>> = BTreeMap::new();
    for r in &h.sink {
        by_key.entry(&r.key).or_default().push(r);
    }
    for rows in by_key.values_mut() {
        rows.sort_by_key(|r| r.seq);
        let mut newest: Option<&SinkRow> = None;
        for r in rows.iter() {
            match newest {
                Some(n) if r.token < n.token => {
                    found.push(Anomaly::FenceOrder {
                        newer: n.clone(),
                        older: (*r).clone(),
                    });
                    break;
                }
                Some(n) if r.token == n.token && r.member != n.member => {
                    // Two members wrote under one token: the fence could not tell them apart.
                    found.push(Anomaly::FenceOrder {
                        newer: n.clone(),
                        older: (*r).clone(),
                    });
                    break;
                }
                _ => newest = Some(r),
            }
        }
    }
}

fn lost_acks(h: &History, found: &mut Vec<Anomaly>) {
    let mut acked: BTreeMap<(&str, &str, u64), u64> = BTreeMap::new();
    for w in &h.writes {
        *acked.entry((&w.member, &w.key, w.token)).or_default() += w.accepted;
    }
    let mut stored: HashMap<(&str, &str, u64), u64> = HashMap::new();
    for r in &h.sink {
        *stored.entry((&r.member, &r.key, r.token)).or_default() += 1;
    }
    for ((member, key, token), acked) in acked {
        let stored = stored.get(&(member, key, token)).copied().unwrap_or(0);
        if stored < acked {
            found.push(Anomaly::LostAck {
                member: member.to_owned(),
                key: key.to_owned(),
                token,
                acked,
                stored,
            });
        }
    }
}

fn exactly_once(h: &History, found: &mut Vec<Anomaly>) {
    let mut by_id: BTreeMap<u64, Vec<&SinkRow>> = BTreeMap::new();
    for r in &h.sink {
        by_id.entry(r.id).or_default().push(r);
    }
    for rows in by_id.values().filter(|r| r.len() > 1).take(5) {
        found.push(Anomaly::Duplicate {
            rows: rows.iter().map(|r| (*r).clone()).collect(),
        });
    }
    let missing: Vec<u64> = (0..h.offered).filter(|i| !by_id.contains_key(i)).collect();
    if !missing.is_empty() {
        found.push(Anomaly::Unprocessed {
            count: missing.len() as u64,
            sample: missing.into_iter().take(10).collect(),
        });
    }
}

fn past_lease(h: &History, found: &mut Vec<Anomaly>) {
    for cut in &h.cuts {
        // The last renewal that can have succeeded was sent before the cut; the lease runs at
        // most a TTL from its send time.
        let deadline = cut.from + h.ttl_ms + h.slack_ms;
        let late = h.grants.iter().find(|g| {
            g.member == cut.member
                && g.asked >= cut.from
                && cut.to.is_none_or(|to| g.asked < to)
                && (g.asked > deadline || g.deadline.is_some_and(|d| d > deadline))
        });
        if let Some(g) = late {
            found.push(Anomaly::GrantPastLease {
                cut: cut.clone(),
                grant: g.clone(),
                deadline,
            });
        }
    }
}

/// How long after `cut` started its member still took grants: the latest grant it asked for
/// while cut off, from the cut's start (ms); `None` when it took none. What
/// [`Anomaly::GrantPastLease`] bounds by the TTL.
pub fn granted_after_cut(h: &History, cut: &Cut) -> Option<u64> {
    h.grants
        .iter()
        .filter(|g| {
            g.member == cut.member && g.asked >= cut.from && cut.to.is_none_or(|to| g.asked < to)
        })
        .map(|g| g.asked - cut.from)
        .max()
}

/// A stretch of a run to measure: a fault from `from` until it healed at `healed`, and how long
/// after the heal to keep looking (`after_heal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// What the fault was.
    pub what: String,
    /// When it started.
    pub from: u64,
    /// When it healed.
    pub healed: u64,
    /// How long after the heal the measure runs (until the next fault).
    pub after_heal: u64,
    /// The members the fault struck (cut off, delayed, paused, on the minority's side): the
    /// keys they owned when it started are its side.
    pub side: Vec<String>,
}

/// What a [`Window`] cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowStats {
    /// What the fault was.
    pub what: String,
    /// The longest time one key of the struck members' side (owned by one of them when the
    /// fault started) went without any grant between the fault's start and its heal (ms).
    pub gap_side: u64,
    /// The same for the other keys: what the rest of the group saw (ms).
    pub gap_others: u64,
    /// The longest time one key went without any grant from the heal until `after_heal` ms
    /// after it (ms).
    pub gap_after: u64,
    /// Keys whose owner `after_heal` ms after the heal differs from their owner before the fault.
    pub moved: usize,
}

/// Measures each window over the grants of `h`.
pub fn window_stats(h: &History, windows: &[Window]) -> Vec<WindowStats> {
    let mut by_key: BTreeMap<&str, Vec<&GrantEvent>> = BTreeMap::new();
    for g in &h.grants {
        by_key.entry(&g.key).or_default().push(g);
    }
    for grants in by_key.values_mut() {
        grants.sort_by_key(|g| g.at);
    }
    windows
        .iter()
        .map(|w| {
            let end = w.healed + w.after_heal;
            let mut gap_side = 0;
            let mut gap_others = 0;
            let mut gap_after = 0;
            let mut moved = BTreeSet::new();
            for (key, grants) in &by_key {
                let owner = |t: u64| grants.iter().rev().find(|g| g.at <= t).map(|g| &g.member);
                let during = longest_gap(grants, w.from, w.healed);
                if owner(w.from).is_some_and(|o| w.side.contains(o)) {
                    gap_side = gap_side.max(during);
                } else {
                    gap_others = gap_others.max(during);
                }
                gap_after = gap_after.max(longest_gap(grants, w.healed, end));
                if owner(w.from) != owner(end) {
                    moved.insert(*key);
                }
            }
            WindowStats {
                what: w.what.clone(),
                gap_side,
                gap_others,
                gap_after,
                moved: moved.len(),
            }
        })
        .collect()
}

/// The longest stretch of `[from, to]` with no grant in `grants` (sorted by time).
fn longest_gap(grants: &[&GrantEvent], from: u64, to: u64) -> u64 {
    let mut last = from;
    let mut longest = 0;
    for g in grants.iter().filter(|g| g.at > from && g.at <= to) {
        longest = longest.max(g.at - last);
        last = g.at;
    }
    longest.max(to.saturating_sub(last))
}

/// When the members are active under one view: `latest` holds each live member's latest
/// assignment event (a member process's `{"ev":"assign",...}` line, `None` for a member that has
/// printed none), and every one must be `active` under one epoch whose `live` slots are exactly
/// the members' slots. Answers the time (`t`) of the latest of those events.
pub fn one_active_view<'a>(
    latest: impl IntoIterator<Item = Option<&'a serde_json::Value>>,
) -> Option<u64> {
    let mut epoch = None;
    let mut slots = BTreeSet::new();
    let mut view: Option<Vec<u64>> = None;
    let mut at = 0;
    for a in latest {
        let a = a?;
        if a["phase"] != "active" {
            return None;
        }
        let e = a["epoch"].as_u64()?;
        if *epoch.get_or_insert(e) != e {
            return None;
        }
        slots.insert(a["slot"].as_u64()?);
        let live: Vec<u64> = a["live"]
            .as_array()?
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .collect();
        if view.get_or_insert_with(|| live.clone()) != &live {
            return None;
        }
        at = at.max(a["t"].as_u64()?);
    }
    (view? == slots.into_iter().collect::<Vec<_>>()).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(member: &str, key: &str, token: u64, asked: u64, lease_ms: u64) -> GrantEvent {
        GrantEvent {
            member: member.into(),
            key: key.into(),
            token,
            asked,
            at: asked + 1,
            deadline: Some(asked + 1 + lease_ms),
        }
    }

    fn row(seq: u64, id: u64, key: &str, token: u64, member: &str) -> SinkRow {
        SinkRow {
            seq,
            id,
            key: key.into(),
            token,
            member: member.into(),
        }
    }

    fn write(member: &str, key: &str, token: u64, accepted: u64) -> WriteEvent {
        WriteEvent {
            member: member.into(),
            key: key.into(),
            token,
            at: 0,
            accepted,
        }
    }

    /// A clean hand-off: m1 owns p0 under token 3, its lease lapses during a cut, m2 takes it
    /// under token 5 after the lease; both wrote once, the sink holds both in order.
    fn clean() -> History {
        History {
            ttl_ms: 1000,
            slack_ms: 20,
            grants: vec![
                grant("m1", "p0", 3, 100, 800),
                grant("m1", "p0", 3, 900, 100),
                grant("m2", "p0", 5, 2100, 900),
            ],
            writes: vec![write("m1", "p0", 3, 1), write("m2", "p0", 5, 1)],
            sink: vec![row(1, 0, "p0", 3, "m1"), row(2, 1, "p0", 5, "m2")],
            offered: 2,
            cuts: vec![Cut {
                member: "m1".into(),
                from: 950,
                to: Some(4000),
            }],
        }
    }

    #[test]
    fn a_clean_history_has_no_anomaly() {
        assert_eq!(check(&clean()), vec![]);
    }

    #[test]
    fn a_bad_history_is_flagged_for_each_broken_promise() {
        let mut h = clean();
        // m1 grants p0 again under its old token after m2 had it under 5, and past its lease.
        h.grants.push(grant("m1", "p0", 3, 2200, 500));
        // m3 is granted p0 under m2's token.
        h.grants.push(grant("m3", "p0", 5, 2300, 900));
        // The sink took m1's old token after m2's newer one; id 1 twice; id 2 never.
        h.sink.push(row(3, 1, "p0", 3, "m1"));
        h.offered = 3;
        // m2 was told 2 ids were accepted; the sink holds 1.
        h.writes.push(write("m2", "p0", 5, 1));
        let found = check(&h);
        let kinds: Vec<&str> = found
            .iter()
            .map(|a| match a {
                Anomaly::TwoOwners { .. } => "two owners",
                Anomaly::StaleGrant { .. } => "stale grant",
                Anomaly::FenceOrder { .. } => "fence order",
                Anomaly::LostAck { .. } => "lost ack",
                Anomaly::Duplicate { .. } => "duplicate",
                Anomaly::Unprocessed { .. } => "unprocessed",
                Anomaly::GrantPastLease { .. } => "past lease",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "two owners",
                "stale grant",
                "fence order",
                "lost ack",
                "duplicate",
                "unprocessed",
                "past lease"
            ],
            "{found:#?}"
        );
        // Each prints its events.
        assert!(found[0].to_string().contains("m3"), "{}", found[0]);
    }

    #[test]
    fn a_lease_reported_past_the_cut_is_flagged_even_before_the_deadline() {
        let mut h = clean();
        // Asked before the deadline (950 + 1000), but says its lease runs 900 ms more.
        h.grants.push(grant("m1", "p1", 3, 1200, 900));
        let found = check(&h);
        assert!(
            matches!(found.as_slice(), [Anomaly::GrantPastLease { grant, .. }] if grant.key == "p1"),
            "{found:#?}"
        );
    }

    #[test]
    fn a_cut_member_stops_granting_when_its_lease_runs_out() {
        let h = clean();
        // m1 asked at 900 (before the cut at 950) and not again while cut.
        assert_eq!(granted_after_cut(&h, &h.cuts[0]), None);
        let mut h = clean();
        h.grants.push(grant("m1", "p0", 3, 1500, 300));
        assert_eq!(granted_after_cut(&h, &h.cuts[0]), Some(550));
    }

    #[test]
    fn windows_measure_gaps_and_moves() {
        let h = clean();
        let stats = window_stats(
            &h,
            &[Window {
                what: "cut m1".into(),
                from: 950,
                healed: 4000,
                after_heal: 1000,
                side: vec!["m1".into()],
            }],
        );
        assert_eq!(
            stats,
            vec![WindowStats {
                what: "cut m1".into(),
                // p0 (m1's when the cut started): granted at 901, then at 2101, then nothing
                // until the heal at 4000.
                gap_side: 1899,
                gap_others: 0,
                gap_after: 1000,
                moved: 1,
            }]
        );
    }
}
