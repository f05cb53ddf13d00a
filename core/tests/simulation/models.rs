//! The stores the group simulation runs on: the in-memory store, whose directory versions are
//! digests of the contents, and the Redis model, whose versions are counters the writes bump
//! and whose listings read a key index that faults can take away.
//!
//! `HEADCOUNT_SIM_MODEL=memory` or `=redis` runs every seed on one of them; by default the
//! seeds alternate, four at a time (bit 2 of the seed, so the model is independent of the
//! assignor, chosen by the seed modulo 4, and of which members use change checks).
//! `HEADCOUNT_SIM_REDIS_REPAIR=0` runs the Redis model's index as it was before it healed
//! itself (issue 32, finding 1); `HEADCOUNT_SIM_REDIS_FAULTS` adds faults that break the
//! version contract on purpose (`drop-bumps`, `reuse-counters`, comma-separated).

// Test support: a bad variable is a mistake of whoever runs the test, said at once.
#![allow(clippy::panic)]

use std::sync::Arc;

use headcount_core::memory::{MemoryStore, Snapshot};
use headcount_core::sim::{ModelFaults, ModelSnapshot, RedisModel, SimClock};
use headcount_core::DynStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which store a seed runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    Memory,
    Redis,
}

/// The models of a run, and how the Redis model behaves.
#[derive(Debug, Clone, Copy)]
pub struct Models {
    /// Every seed on this model, else alternating by seed.
    pub only: Option<ModelKind>,
    /// Whether the Redis model's index heals itself (see [`RedisModel::with_repair`]).
    pub repair: bool,
    /// Faults that break the version contract.
    pub faults: ModelFaults,
}

impl Models {
    /// What the `HEADCOUNT_SIM_*` variables say (see the module docs).
    pub fn from_env() -> Models {
        let only = match std::env::var("HEADCOUNT_SIM_MODEL").ok().as_deref() {
            None | Some("" | "both") => None,
            Some("memory") => Some(ModelKind::Memory),
            Some("redis") => Some(ModelKind::Redis),
            Some(other) => panic!("HEADCOUNT_SIM_MODEL={other}: memory, redis or both"),
        };
        let repair = std::env::var("HEADCOUNT_SIM_REDIS_REPAIR").as_deref() != Ok("0");
        let mut faults = ModelFaults::default();
        let var = std::env::var("HEADCOUNT_SIM_REDIS_FAULTS").unwrap_or_default();
        for f in var.split(',').filter(|f| !f.is_empty()) {
            match f {
                "drop-bumps" => faults.drop_bumps = 0.02,
                "reuse-counters" => faults.reuse_counters = true,
                other => panic!("HEADCOUNT_SIM_REDIS_FAULTS: unknown fault {other}"),
            }
        }
        Models {
            only,
            repair,
            faults,
        }
    }

    /// The model `seed` runs on.
    pub fn for_seed(&self, seed: u64) -> ModelKind {
        match self.only {
            Some(kind) => kind,
            None if seed & 4 == 0 => ModelKind::Memory,
            None => ModelKind::Redis,
        }
    }

    /// The variables that choose these models, as a replay command's prefix.
    pub fn replay_env(&self) -> String {
        let mut env = String::new();
        match self.only {
            Some(ModelKind::Memory) => env.push_str("HEADCOUNT_SIM_MODEL=memory "),
            Some(ModelKind::Redis) => env.push_str("HEADCOUNT_SIM_MODEL=redis "),
            None => {}
        }
        if !self.repair {
            env.push_str("HEADCOUNT_SIM_REDIS_REPAIR=0 ");
        }
        let mut faults = Vec::new();
        if self.faults.drop_bumps > 0.0 {
            faults.push("drop-bumps");
        }
        if self.faults.reuse_counters {
            faults.push("reuse-counters");
        }
        if !faults.is_empty() {
            env.push_str(&format!("HEADCOUNT_SIM_REDIS_FAULTS={} ", faults.join(",")));
        }
        env
    }
}

/// How a Redis seed loses its index: the chance per 10 ms tick of the faulty phase.
#[derive(Debug, Clone, Copy)]
struct IndexFaults {
    per_tick: f64,
}

/// The store of one seed, and what the simulation rolls back.
pub struct SimStore {
    pub kind: ModelKind,
    memory: MemoryStore,
    redis: Option<RedisModel>,
    /// Draws for the index faults, apart from the schedule's generator so that a seed's events
    /// are the same on both models.
    rng: StdRng,
    index_faults: Option<IndexFaults>,
}

/// A store's contents at one instant.
#[derive(Clone)]
pub enum SimSnapshot {
    Memory(Snapshot),
    Redis(ModelSnapshot),
}

impl SimStore {
    /// The store of `seed`: on half the Redis seeds the index is lost now and then.
    pub fn new(models: &Models, clock: &SimClock, seed: u64) -> SimStore {
        let kind = models.for_seed(seed);
        let memory = MemoryStore::with_clock(Arc::new(clock.clone()));
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1de7_0fa1);
        let redis = (kind == ModelKind::Redis).then(|| {
            let model = RedisModel::new(memory.clone(), seed).with_repair(models.repair);
            model.set_faults(models.faults);
            model
        });
        let index_faults =
            (kind == ModelKind::Redis && rng.random_bool(0.5)).then(|| IndexFaults {
                per_tick: rng.random_range(0.001..0.01),
            });
        SimStore {
            kind,
            memory,
            redis,
            rng,
            index_faults,
        }
    }

    /// The store the members use (each wraps it in its own fault layer).
    pub fn store(&self) -> DynStore {
        match &self.redis {
            Some(m) => Arc::new(m.clone()),
            None => Arc::new(self.memory.clone()),
        }
    }

    pub fn snapshot(&self) -> SimSnapshot {
        match &self.redis {
            Some(m) => SimSnapshot::Redis(m.snapshot()),
            None => SimSnapshot::Memory(self.memory.snapshot()),
        }
    }

    pub fn restore(&self, snapshot: &SimSnapshot) {
        match (snapshot, &self.redis) {
            (SimSnapshot::Redis(s), Some(m)) => m.restore(s),
            (SimSnapshot::Memory(s), None) => self.memory.restore(s),
            _ => panic!("a snapshot of another model"),
        }
    }

    /// Whether this seed's store loses its index now and then.
    pub fn loses_index(&self) -> bool {
        self.index_faults.is_some()
    }

    /// At one tick of the faulty phase, perhaps loses (part of) the Redis index: what it did.
    pub fn index_fault(&mut self) -> Option<String> {
        let (Some(faults), Some(m)) = (self.index_faults, &self.redis) else {
            return None;
        };
        if !self.rng.random_bool(faults.per_tick) {
            return None;
        }
        match self.rng.random_range(0..4) {
            0 | 1 => {
                let n = self.rng.random_range(0..usize::MAX);
                let lost = m.lose_index_entry(n)?;
                Some(format!("index entry {lost} lost"))
            }
            2 => {
                m.lose_index();
                Some("index lost (DEL headcount:index headcount:expiry)".into())
            }
            _ => {
                m.lose_metadata();
                Some("index, versions and quiet marker lost (keys copied without them)".into())
            }
        }
    }
}
