//! One call of the Redis model: the index upkeep of `backend-redis/src/scripts/index.lua` and
//! `heartbeat.lua`, function for function, over the in-memory data and the model's index. A
//! [`Script`] lives for one call, holding both locks, so every call is atomic as a Lua script is.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use rand::Rng;

use super::{Control, Meta};
use headcount_core::store_models::Data;

/// The longest a quiet marker lives (index.lua's `MAX_QUIET_MS`).
const MAX_QUIET: Duration = Duration::from_secs(5);
/// Due names a write or a listing sweeps (`SWEEP`), and a heartbeat's sweep (`limit`).
const SWEEP: usize = 8;
const HEARTBEAT_SWEEP: usize = 32;

/// The directory of key `k` (its text up to its last `:`), or `None` without a `:`.
fn dir_of(k: &str) -> Option<&str> {
    k.rfind(':').map(|i| &k[..=i])
}

/// One script run: the data, the model's index and versions, and what it bumped so far.
pub(super) struct Script<'a> {
    pub(super) data: &'a mut Data,
    pub(super) meta: &'a mut Meta,
    pub(super) ctl: &'a mut Control,
    pub(super) now: SystemTime,
    /// The versions this call set, by directory (`bumped`): one change per call.
    bumped: BTreeMap<String, String>,
    /// A heartbeat's own sweep, which sets the marker afterwards (`sweeping`).
    sweeping: bool,
    /// The directories whose version this call bumped: each `PUBLISH`ed on its channel.
    pub(super) published: Vec<String>,
}

impl<'a> Script<'a> {
    pub(super) fn new(
        data: &'a mut Data,
        meta: &'a mut Meta,
        ctl: &'a mut Control,
        now: SystemTime,
    ) -> Self {
        Script {
            data,
            meta,
            ctl,
            now,
            bumped: BTreeMap::new(),
            sweeping: false,
            published: Vec::new(),
        }
    }

    /// The value of the live key `k`.
    pub(super) fn value(&mut self, k: &str) -> Option<String> {
        self.data.live(k, self.now).map(|e| e.value.clone())
    }

    /// The expiry of the live key `k`: `None` when absent, `Some(None)` without TTL (`PTTL`).
    fn pttl(&mut self, k: &str) -> Option<Option<SystemTime>> {
        self.data.live(k, self.now).map(|e| e.expires)
    }

    /// Sets a new version of `dir` (`bump`): one above its last, with a nonce no rollback
    /// brings back (the random suffix), unless the model reuses counters, and publishes the
    /// directory's change. A dropped bump (a fault) leaves the version as it was, and publishes
    /// nothing: the change goes unseen.
    fn bump(&mut self, dir: &str) {
        let drop = self.ctl.drop_bumps;
        if drop > 0.0 && self.ctl.rng.random_bool(drop.min(1.0)) {
            let kept = self.meta.versions.get(dir).map(|(_, t)| t.clone());
            if let Some(text) = kept {
                self.bumped.insert(dir.to_owned(), text);
                return;
            }
        }
        let n = self.meta.versions.get(dir).map_or(0, |(n, _)| *n) + 1;
        let text = if self.ctl.reuse_counters {
            n.to_string()
        } else {
            self.ctl.nonce += 1;
            format!("{n}.{:x}", self.ctl.nonce)
        };
        self.meta.versions.insert(dir.to_owned(), (n, text.clone()));
        self.bumped.insert(dir.to_owned(), text);
        self.published.push(dir.to_owned());
    }

    /// Records that key `k`'s directory changed, once per call (`changed`).
    pub(super) fn changed(&mut self, k: &str) {
        if let Some(dir) = dir_of(k) {
            if !self.bumped.contains_key(dir) {
                self.bump(dir);
            }
        }
    }

    /// Ends the quiet marker by `at`, a new expiry score (`due_by`).
    fn due_by(&mut self, at: SystemTime) {
        if self.sweeping {
            return;
        }
        if let Some((t, until)) = self.meta.quiet {
            if until > at {
                self.meta.quiet = Some((t, at));
            }
        }
    }

    /// Scores key `k`, which expires at `at` (`score`).
    fn score(&mut self, k: &str, at: SystemTime) {
        self.meta.expiry.insert(k.to_owned(), at);
        if at < self.now + MAX_QUIET {
            self.due_by(at);
        }
    }

    /// Scores `k` by `expires`, or takes it out of the expiry index without one.
    fn score_or_unscore(&mut self, k: &str, expires: Option<SystemTime>) {
        match expires {
            Some(at) => self.score(k, at),
            None => {
                self.meta.expiry.remove(k);
            }
        }
    }

    /// Puts the live key `k` back in the index when it is missing there, changing its
    /// directory's version (`repair`); without it (`RedisModel::with_repair(false)`) nothing
    /// does.
    pub(super) fn repair(&mut self, k: &str) -> bool {
        if !self.ctl.repair || !self.meta.index.insert(k.to_owned()) {
            return false;
        }
        let Some(expires) = self.pttl(k) else {
            self.meta.index.remove(k);
            return false;
        };
        self.score_or_unscore(k, expires);
        self.changed(k);
        true
    }

    /// Forgets key `k`; whether the index held it (`untrack`).
    pub(super) fn untrack(&mut self, k: &str) -> bool {
        let held = self.meta.index.remove(k);
        let scored = self.meta.expiry.remove(k).is_some();
        if held || scored {
            self.changed(k);
        }
        held || scored
    }

    /// Removes up to `limit` due names whose key is gone, re-scores the live ones and puts
    /// them back in the index if it lost them (`sweep`). Returns how many were due.
    fn sweep(&mut self, limit: usize) -> usize {
        let mut due: Vec<(SystemTime, String)> = self
            .meta
            .expiry
            .iter()
            .filter(|(_, at)| **at <= self.now)
            .map(|(k, at)| (*at, k.clone()))
            .collect();
        due.sort();
        due.truncate(limit);
        for (_, k) in &due {
            match self.pttl(k) {
                None => {
                    self.untrack(k);
                }
                Some(expires) => {
                    self.score_or_unscore(k, expires);
                    if self.ctl.repair && self.meta.index.insert(k.clone()) {
                        self.changed(k);
                    }
                }
            }
        }
        due.len()
    }

    /// Records key `k`, just written with expiry `expires`, then sweeps (`track`).
    pub(super) fn track(&mut self, k: &str, expires: Option<SystemTime>, moved: bool) {
        if self.meta.index.insert(k.to_owned()) {
            self.score_or_unscore(k, expires);
            // New to every listing: created, written by another client, or lost by the index.
            if self.ctl.repair {
                self.changed(k);
            }
        } else if moved {
            self.score_or_unscore(k, expires);
        }
        self.sweep(SWEEP);
    }

    /// [`Self::list`], with each listed key's `PTTL` (the list-with-TTL script).
    pub(super) fn list_with_ttl(
        &mut self,
        prefix: &str,
    ) -> Vec<(String, String, Option<std::time::Duration>)> {
        let listed = self.list(prefix);
        let now = self.now;
        listed
            .into_iter()
            .map(|(k, v)| {
                let left = self
                    .pttl(&k)
                    .flatten()
                    .map(|t| t.duration_since(now).unwrap_or_default());
                (k, v, left)
            })
            .collect()
    }

    /// The live keys under `prefix` the index holds, sorted (`list_body.lua`).
    pub(super) fn list(&mut self, prefix: &str) -> Vec<(String, String)> {
        let names: Vec<String> = self
            .meta
            .index
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        self.sweep(SWEEP);
        let mut out = Vec::new();
        for k in names {
            match self.value(&k) {
                Some(v) => out.push((k, v)),
                None => {
                    self.untrack(&k);
                }
            }
        }
        out
    }

    /// A heartbeat (`heartbeat.lua`): renews `key` when it holds `holder`, upkeeps the index
    /// as the quiet marker says, and answers each directory's version.
    pub(super) fn heartbeat(
        &mut self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[&str],
    ) -> (bool, Vec<String>) {
        let renewed = self.data.renew(key, holder, ttl, self.now);
        if !renewed && self.value(key).is_some() {
            self.repair(key);
        }
        let mark = self.meta.quiet.filter(|(_, until)| self.now < *until);
        if let Some((t, _)) = mark {
            if renewed {
                // The name is checked in the index only when the expiry index lacked it (a
                // loss of the index alone is healed by the next sweep: `heal_index`).
                let fresh = !self.meta.expiry.contains_key(key);
                self.score(key, t + ttl);
                if fresh && self.ctl.repair && self.meta.index.insert(key.to_owned()) {
                    self.changed(key);
                }
            }
        } else {
            self.sweeping = true;
            let n = self.sweep(HEARTBEAT_SWEEP);
            self.sweeping = false;
            let t = self.now;
            if renewed {
                let fresh = self.meta.expiry.insert(key.to_owned(), t + ttl).is_none();
                if !self.ctl.repair {
                    // The model without the repair (`with_repair(false)`) puts the name back
                    // at every sweep, without a new version.
                    self.meta.index.insert(key.to_owned());
                } else if fresh && self.meta.index.insert(key.to_owned()) {
                    self.changed(key);
                }
            }
            if n < HEARTBEAT_SWEEP {
                let period = crate::redis::sweep_period(ttl);
                let mut life = (ttl / 2).min(MAX_QUIET);
                if let Some(first) = self.meta.expiry.values().min() {
                    life = life.min(first.duration_since(t).unwrap_or_default());
                }
                let life = life.max(period).max(Duration::from_millis(1));
                self.meta.quiet = Some((t, t + life));
            } else {
                self.meta.quiet = None;
            }
        }
        if mark.is_none() && self.ctl.repair {
            self.heal_index();
        }
        let versions = dirs
            .iter()
            .map(|dir| {
                if let Some(v) = self.bumped.get(*dir) {
                    return v.clone();
                }
                if let Some((_, v)) = self.meta.versions.get(*dir) {
                    return v.clone();
                }
                // Never written, or lost: a new version.
                self.bump(dir);
                self.bumped.get(*dir).cloned().unwrap_or_default()
            })
            .collect();
        (renewed, versions)
    }
}

impl Script<'_> {
    /// A sweep's check that the index holds every name of the expiry index (`heal_index`):
    /// after a loss, every name of the expiry index is put back and each of their directories'
    /// versions changes.
    fn heal_index(&mut self) {
        if self.meta.expiry.keys().all(|k| self.meta.index.contains(k)) {
            return;
        }
        let expiry: Vec<String> = self.meta.expiry.keys().cloned().collect();
        for k in &expiry {
            self.meta.index.insert(k.clone());
            self.changed(k);
        }
    }
}

/// The names of an index at one instant, for a fault that drops one of them.
pub(super) fn nth(index: &BTreeSet<String>, n: usize) -> Option<String> {
    if index.is_empty() {
        return None;
    }
    index.iter().nth(n % index.len()).cloned()
}
