//! Tests of the tests: every case passes against an in-memory store that follows the contract,
//! and fails against stores with one planted bug each. (A backend cannot skip an argument check:
//! `Store` checks the arguments before any `Backend` method runs, so no bug is planted there.)

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use headcount::backend::parse_counter;
use headcount::{Capabilities, DynStore, Result, Store};
use headcount_conformance::{run_suite, Case, Ctx, Outcome, SuiteOptions};
use tokio::time::Instant;

/// A bug to plant in the reference store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    None,
    /// incr reads, yields, then writes: lost updates under concurrency.
    RacyIncr,
    /// incr with a TTL resets the expiry of a live key.
    IncrRefreshesTtl,
    /// expired keys stay readable.
    NoExpiry,
    /// list treats `_` in the prefix as "any character" (an unescaped SQL LIKE).
    ListLikeUnderscore,
    /// list returns keys in insertion order, not sorted.
    ListUnsorted,
    /// a non-numeric value counts as 0.
    ForeignAsZero,
    /// CAS compares before it yields and writes after: several winners.
    RacyCas,
    /// set_max writes whatever it is given.
    SetMaxOverwrites,
    /// set_max believes the number it wrote last is still there, and writes nothing below it.
    SetMaxTrustsItsLastWrite,
    /// expire returns true on an absent key.
    ExpireAbsentTrue,
    /// delete returns true for an expired key.
    DeleteExpiredTrue,
    /// renew_and_list renews the key whoever holds it.
    RenewAnyHolder,
    /// renew_and_list says it renewed but leaves the TTL as it was.
    RenewKeepsTtl,
    /// renew_and_list creates an absent key.
    RenewCreatesAbsent,
}

/// Value, expiry, and write sequence number.
type Entry = (String, Option<Instant>, u64);

#[derive(Debug)]
struct Memory {
    bug: Bug,
    map: Mutex<BTreeMap<String, Entry>>,
    seq: Mutex<u64>,
    /// What set_max wrote last, per key (for [`Bug::SetMaxTrustsItsLastWrite`]).
    set_max_wrote: Mutex<BTreeMap<String, i64>>,
}

impl Memory {
    fn store(bug: Bug) -> DynStore {
        std::sync::Arc::new(Memory {
            bug,
            map: Mutex::default(),
            seq: Mutex::default(),
            set_max_wrote: Mutex::default(),
        })
    }

    fn live(&self, entry: Option<&Entry>) -> Option<String> {
        let (v, exp, _) = entry?;
        match exp {
            Some(at) if *at <= Instant::now() && self.bug != Bug::NoExpiry => None,
            _ => Some(v.clone()),
        }
    }

    fn deadline(ttl: Option<Duration>) -> Option<Instant> {
        ttl.map(|t| Instant::now() + t)
    }

    fn next_seq(&self) -> u64 {
        let mut s = self.seq.lock().unwrap();
        *s += 1;
        *s
    }
}

#[async_trait]
impl headcount::backend::Backend for Memory {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new("memory");
        caps.native_compare_and_delete = true;
        caps
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        let read = |map: &BTreeMap<String, Entry>| {
            let entry = map.get(key);
            self.live(entry).map(|v| (v, entry.and_then(|e| e.1)))
        };
        let mut current = read(&self.map.lock().unwrap());
        if self.bug == Bug::RacyIncr {
            tokio::task::yield_now().await;
        }
        let mut map = self.map.lock().unwrap();
        if self.bug != Bug::RacyIncr {
            // Read and write under one lock: atomic.
            current = read(&map);
        }
        let (n, expiry) = match current {
            None => (1, Self::deadline(ttl)),
            Some((text, exp)) => {
                let n = match parse_counter(key, &text) {
                    Ok(n) => n,
                    Err(_) if self.bug == Bug::ForeignAsZero => 0,
                    Err(e) => return Err(e),
                };
                let exp = if self.bug == Bug::IncrRefreshesTtl && ttl.is_some() {
                    Self::deadline(ttl)
                } else {
                    exp
                };
                (n + 1, exp)
            }
        };
        let seq = self.next_seq();
        map.insert(key.to_owned(), (n.to_string(), expiry, seq));
        Ok(n)
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        Ok(self.live(self.map.lock().unwrap().get(key)))
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        let mut map = self.map.lock().unwrap();
        if self.live(map.get(key)).is_none() {
            return Ok(self.bug == Bug::ExpireAbsentTrue);
        }
        if let Some(e) = map.get_mut(key) {
            e.1 = Self::deadline(Some(ttl));
        }
        Ok(true)
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        let matches = self.live(self.map.lock().unwrap().get(key)).as_deref() == expected;
        if self.bug == Bug::RacyCas {
            tokio::task::yield_now().await;
        }
        let mut map = self.map.lock().unwrap();
        let matches = if self.bug == Bug::RacyCas {
            matches
        } else {
            self.live(map.get(key)).as_deref() == expected
        };
        if !matches {
            return Ok(false);
        }
        let seq = self.next_seq();
        map.insert(key.to_owned(), (new.to_owned(), Self::deadline(ttl), seq));
        Ok(true)
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let mut map = self.map.lock().unwrap();
        let existed = map.contains_key(key);
        let live = self.live(map.get(key)).is_some();
        map.remove(key);
        Ok(live || (existed && self.bug == Bug::DeleteExpiredTrue))
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let mut map = self.map.lock().unwrap();
        if self.live(map.get(key)).as_deref() != Some(expected) {
            return Ok(false);
        }
        map.remove(key);
        Ok(true)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let map = self.map.lock().unwrap();
        let matches = |k: &str| {
            if self.bug == Bug::ListLikeUnderscore {
                k.len() >= prefix.len()
                    && k.bytes()
                        .zip(prefix.bytes())
                        .all(|(a, b)| b == b'_' || a == b)
            } else {
                k.starts_with(prefix)
            }
        };
        let mut out: Vec<(u64, String, String)> = map
            .iter()
            .filter(|(k, _)| matches(k))
            .filter_map(|(k, e)| Some((e.2, k.clone(), self.live(Some(e))?)))
            .collect();
        if self.bug == Bug::ListUnsorted {
            out.sort_by_key(|e| e.0);
        }
        Ok(out.into_iter().map(|(_, k, v)| (k, v)).collect())
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        if self.bug == Bug::SetMaxTrustsItsLastWrite {
            let wrote = self.set_max_wrote.lock().unwrap().get(key).copied();
            if wrote.is_some_and(|w| w >= value) {
                return Ok(false);
            }
            self.set_max_wrote
                .lock()
                .unwrap()
                .insert(key.to_owned(), value);
        }
        if self.bug != Bug::SetMaxOverwrites {
            // The provided CAS loop, as a backend without a native one would use.
            let new = value.to_string();
            loop {
                match Store::get(self, key).await? {
                    None => {
                        if Store::compare_and_set(self, key, None, &new, ttl).await? {
                            return Ok(true);
                        }
                    }
                    Some(text) => {
                        if parse_counter(key, &text)? >= value {
                            return Ok(false);
                        }
                        if Store::compare_and_set(self, key, Some(&text), &new, ttl).await? {
                            return Ok(true);
                        }
                    }
                }
            }
        }
        let seq = self.next_seq();
        self.map.lock().unwrap().insert(
            key.to_owned(),
            (value.to_string(), Self::deadline(ttl), seq),
        );
        Ok(true)
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        let renew_bug = matches!(
            self.bug,
            Bug::RenewAnyHolder | Bug::RenewKeepsTtl | Bug::RenewCreatesAbsent
        );
        if !renew_bug {
            // The provided method's two calls, as a backend without a native one makes them.
            let renewed =
                Store::compare_and_set(self, key, Some(holder), holder, Some(ttl)).await?;
            return Ok((renewed, Store::list(self, prefix).await?));
        }
        let renewed = {
            let mut map = self.map.lock().unwrap();
            let current = self.live(map.get(key));
            let seq = self.next_seq();
            match current {
                Some(v) if v == holder || self.bug == Bug::RenewAnyHolder => {
                    if self.bug != Bug::RenewKeepsTtl {
                        map.insert(key.to_owned(), (v, Self::deadline(Some(ttl)), seq));
                    }
                    true
                }
                None if self.bug == Bug::RenewCreatesAbsent => {
                    map.insert(
                        key.to_owned(),
                        (holder.to_owned(), Self::deadline(Some(ttl)), seq),
                    );
                    true
                }
                _ => false,
            }
        };
        Ok((renewed, Store::list(self, prefix).await?))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_case_passes_on_the_reference_store() {
    let report = run_suite(Memory::store(Bug::None), SuiteOptions::default()).await;
    for case in &report.cases {
        match &case.outcome {
            Outcome::Passed => {}
            Outcome::Skipped(why) => {
                let needs = Case::find(case.name).map(|c| c.needs);
                assert!(
                    needs.is_some_and(|n| n != headcount_conformance::Needs::Store),
                    "{} skipped: {why}",
                    case.name
                );
            }
            Outcome::Failed(why) => panic!("{} failed on the reference store: {why}", case.name),
        }
    }
    assert!(report.passed());
    assert_eq!(report.cases.len(), headcount_conformance::CASES.len());
    let primitives: Vec<_> = report.latency.iter().map(|p| p.primitive).collect();
    for p in [
        "incr",
        "get",
        "expire",
        "compare_and_set",
        "delete",
        "list",
        "set_max",
    ] {
        assert!(
            primitives.contains(&p),
            "no latency for {p}: {primitives:?}"
        );
    }
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["cases"][0]["outcome"]["status"], "passed", "{json}");
    assert!(json["latency"][0]["p99_ms"].is_number(), "{json}");
}

async fn fails(bug: Bug, case: &str) -> String {
    let case = Case::find(case).unwrap_or_else(|| panic!("no case {case}"));
    let ctx = Ctx::new(Memory::store(bug), None);
    let result = (case.run)(&ctx).await;
    ctx.cleanup().await.unwrap();
    match result {
        Err(failure) => failure.to_string(),
        Ok(()) => panic!("{} passed on a store with {bug:?}", case.name),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn planted_bugs_are_caught() {
    let checks = [
        (Bug::RacyIncr, "incr_50x100_exact"),
        (Bug::IncrRefreshesTtl, "incr_ttl_set_on_create"),
        (Bug::NoExpiry, "ttl_on_store_clock"),
        (Bug::NoExpiry, "incr_from_expired"),
        (Bug::ListLikeUnderscore, "list_prefix_is_literal"),
        (Bug::ListUnsorted, "list_live_under_prefix"),
        (Bug::ForeignAsZero, "foreign_value_typed_error"),
        (Bug::RacyCas, "cas_32_concurrent_one_winner"),
        (Bug::SetMaxOverwrites, "set_max_smaller_equal_larger"),
        (Bug::SetMaxOverwrites, "set_max_concurrent_monotonic"),
        (Bug::SetMaxTrustsItsLastWrite, "set_max_after_other_writes"),
        (Bug::ExpireAbsentTrue, "expire_absent"),
        (Bug::DeleteExpiredTrue, "delete_live_absent_expired"),
        (Bug::RenewAnyHolder, "renew_and_list_refuses_others"),
        (Bug::RenewCreatesAbsent, "renew_and_list_refuses_others"),
        (Bug::RenewKeepsTtl, "renew_and_list_extends_ttl"),
    ];
    let runs = checks.iter().map(|&(bug, case)| async move {
        let why = fails(bug, case).await;
        eprintln!("{bug:?} / {case}: {why}");
    });
    futures::future::join_all(runs).await;
}

#[tokio::test]
async fn fault_cases_without_control_fail_cleanly() {
    let why = fails(Bug::None, "server_killed_retryable_then_recovers").await;
    assert!(why.contains("ServerControl"), "{why}");
}
