//! The standby's decisions, one at a time: the record it stands by with, what a refused
//! renewal means, what a slot holds for an heir, and which standby a leaving member picks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::super::fixture::{record, Member};
use super::{Handing, Standing};
use crate::recipes::group::records::StandbyRecord;

fn standby(nonce: u64, since_ms: u64, heir_of: Option<(u32, u64)>) -> StandbyRecord {
    StandbyRecord {
        nonce,
        since_ms,
        heir_of,
    }
}

/// A standby starts with a new record, unless a previous process of its id was chosen as an
/// heir: then it goes on with that inheritance.
#[test]
fn a_standby_starts_afresh_or_goes_on_with_an_inheritance() {
    let m = Member::at(0);
    assert!(matches!(m.engine.standby_record(None), Standing::New(r) if r.heir_of.is_none()));
    let plain = standby(5, 1, None).to_string();
    assert!(matches!(
        m.engine.standby_record(Some(&plain)),
        Standing::New(_)
    ));
    let chosen = standby(5, 1, Some((3, 103))).to_string();
    assert!(matches!(
        m.engine.standby_record(Some(&chosen)),
        Standing::Inheriting(r) if r.heir_of == Some((3, 103))
    ));
}

/// A refused renewal: the same record, marked, is an inheritance; anything else means another
/// process stands by with the id (join now).
#[test]
fn a_refused_standby_renewal_is_a_mark_or_a_replacement() {
    let m = Member::at(0);
    let mine = standby(5, 1, None);
    let marked = standby(5, 1, Some((3, 103)));
    assert_eq!(
        m.engine.standby_refused(&marked.to_string(), &mine),
        Some(marked)
    );
    assert_eq!(
        m.engine
            .standby_refused(&standby(6, 1, None).to_string(), &mine),
        None
    );
    assert_eq!(m.engine.standby_refused("junk", &mine), None);
}

/// What a slot holds for the heir: the leaving claim parked under the heir's id, the leaving
/// claim still live, or anything else.
#[test]
fn a_slot_holds_the_parked_claim_the_live_one_or_nothing_for_the_heir() {
    let m = Member::at(0);
    let from = record(3, 1);
    let mut parked = from.clone();
    parked.member = "m0".into();
    parked.parked = Some(1);
    assert!(matches!(
        m.engine.handing_of(Some(parked.to_string()), from.nonce),
        Handing::Parked(t) if t == parked.to_string()
    ));
    assert!(matches!(
        m.engine.handing_of(Some(from.to_string()), from.nonce),
        Handing::Pending
    ));
    assert!(matches!(
        m.engine.handing_of(Some(from.to_string()), 1),
        Handing::Not
    ));
    assert!(matches!(
        m.engine.handing_of(None, from.nonce),
        Handing::Not
    ));
    // Parked for another member id: not this heir's.
    parked.member = "other".into();
    assert!(matches!(
        m.engine.handing_of(Some(parked.to_string()), from.nonce),
        Handing::Not
    ));
}

/// A leaving member picks among unmarked standbys of other valid ids, the oldest first.
#[test]
fn the_oldest_unmarked_standby_is_the_heir() {
    let m = Member::at(0);
    let dir = m.engine.cfg.layout.standbys.clone();
    let listing = vec![
        (format!("{dir}young"), standby(1, 20, None).to_string()),
        (format!("{dir}old"), standby(2, 10, None).to_string()),
        (
            format!("{dir}marked"),
            standby(3, 5, Some((1, 1))).to_string(),
        ),
        (format!("{dir}m0"), standby(4, 1, None).to_string()),
        (format!("{dir}junk"), "junk".into()),
    ];
    let heirs: Vec<String> = m
        .engine
        .heirs(listing)
        .into_iter()
        .map(|(member, _, _)| member)
        .collect();
    assert_eq!(heirs, vec!["old".to_string(), "young".to_string()]);
}

/// The claim handed over is parked under the heir's id, acknowledging everything it saw.
#[test]
fn a_handed_claim_is_parked_under_the_heirs_id() {
    let mut m = Member::at(0);
    m.engine.cache.highest = 9;
    let claim = m.engine.claims.current.clone().unwrap();
    let parked = m.engine.parked_for(&claim, "heir");
    assert_eq!(parked.member, "heir");
    assert_eq!(parked.nonce, claim.record.nonce);
    assert_eq!(parked.acked, 9);
    assert!(parked.is_parked());
}
