//! The members the engine's handler tests start from: a claim on a slot, a view, a table, on a
//! manual clock. No store: the tests play the driver.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use super::round::{Answer, Call, Round};
use super::{Claim, Engine, WrittenAck};
use crate::clock::{Clock as _, ManualClock};
use crate::keys::Keyspace;
use crate::recipes::group::grants::Shared;
use crate::recipes::group::records::{AckRecord, Holder, SlotRecord, ViewRecord};
use crate::recipes::group::table::SlotTable;
use crate::recipes::group::view::GroupPhase;
use crate::recipes::group::GroupConfig;
use crate::store::Store as _;
use crate::MemoryStore;

pub(super) const TTL: Duration = Duration::from_millis(900);
pub(super) const HB: Duration = Duration::from_millis(300);

pub(super) fn nonce(slot: u32) -> u64 {
    u64::from(slot) + 100
}

pub(super) fn holder(slot: u32) -> Holder {
    Holder {
        slot,
        nonce: nonce(slot),
    }
}

/// The record of `slot`'s claim, which acknowledged up to `acked`.
pub(super) fn record(slot: u32, acked: u64) -> SlotRecord {
    SlotRecord {
        member: format!("m{slot}"),
        nonce: nonce(slot),
        since_ms: 0,
        ttl_ms: 900,
        acked,
        view: 0,
        parked: None,
        grace: None,
    }
}

pub(super) fn view(epoch: u64, slots: &[u32]) -> ViewRecord {
    ViewRecord {
        epoch,
        holders: slots.iter().map(|&s| holder(s)).collect(),
        assignor: Some(crate::assign::AssignorKind::Modulo),
        owners: None,
    }
}

/// A table with `slots` live (each acknowledged up to `acked`) and `published` as its view.
pub(super) fn table(slots: &[u32], acked: u64, published: Option<ViewRecord>) -> SlotTable {
    let mut t = SlotTable::default();
    for &s in slots {
        t.slots.insert(s, record(s, acked));
    }
    t.view_text = published.as_ref().map(ToString::to_string);
    t.view = published;
    t
}

/// A member holding `slot`, on the manual clock, at 10 s.
pub(super) struct Member {
    pub(super) engine: Engine,
    pub(super) clock: Arc<ManualClock>,
}

impl Member {
    pub(super) fn at(slot: u32) -> Member {
        let clock = Arc::new(ManualClock::at_unix_secs(1_800_000_000));
        clock.advance(Duration::from_secs(10));
        let config = GroupConfig::new("g", TTL)
            .with_member(format!("m{slot}"))
            .with_assignor(crate::assign::AssignorKind::Modulo)
            .with_clock(clock.clone());
        let shared = Arc::new(Shared::new(clock.clone(), format!("m{slot}")));
        let caps = MemoryStore::new().capabilities();
        let mut engine = Engine::new(
            &caps,
            &config,
            Keyspace::new("g").unwrap(),
            format!("m{slot}"),
            shared,
        );
        engine.claims.current = Some(Claim {
            slot,
            record: record(slot, 0),
        });
        {
            let mut st = engine.shared.lock();
            st.holder = Some(holder(slot));
            // A lease renewed long ahead: these tests are not about its deadline.
            st.deadline = Some(Duration::from_secs(3600));
        }
        Member { engine, clock }
    }

    /// The same member, active under `active`.
    pub(super) fn active(slot: u32, active: &ViewRecord) -> Member {
        let mut m = Member::at(slot);
        m.engine.adopt(active.clone());
        let pending = m.engine.pending().unwrap();
        m.engine.activate(pending, holder(slot));
        m
    }

    /// The same member, active under `active`, `next` adopted, and its acknowledgement of
    /// `next` written: a hand-off waiting for the others.
    pub(super) fn acked(slot: u32, active: &ViewRecord, next: &ViewRecord) -> Member {
        let mut m = Member::active(slot, active);
        m.engine.adopt(next.clone());
        let digest = m.engine.pending().unwrap().digest;
        let ack = AckRecord {
            nonce: nonce(slot),
            acked: next.epoch,
            view: digest,
        };
        m.engine.claims.ack = Some(WrittenAck {
            record: ack,
            text: ack.to_string(),
            at: m.clock_now(),
        });
        m
    }

    /// The digest of the view the member works towards.
    pub(super) fn target_digest(&self) -> u64 {
        self.engine.target().unwrap().digest
    }

    /// Starts `round`: the call it asks for first.
    pub(super) fn start(&mut self, round: &mut Round) -> Option<Call> {
        self.engine.advance(round, None)
    }

    pub(super) fn answer(&mut self, round: &mut Round, answer: Answer) -> Option<Call> {
        self.engine.advance(round, Some(answer))
    }

    pub(super) fn phase(&self) -> GroupPhase {
        self.engine.shared.assignment.borrow().phase
    }
}

impl Member {
    /// The member's monotonic time.
    pub(super) fn clock_now(&self) -> Duration {
        self.clock.monotonic()
    }
}
