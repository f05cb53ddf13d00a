//! The stores the group simulation runs on: the in-memory store, whose directory versions are
//! digests of the contents; the Redis model, whose versions are counters the writes bump and
//! whose listings read a key index that faults can take away; the etcd model, whose versions are
//! a directory's count of keys and newest revision, and whose rollbacks are restores that hand
//! the lost revisions out again; and the SQL model, digests like the in-memory store's answered
//! one directory at a time, as SQLite and PostgreSQL answer them.
//!
//! `HEADCOUNT_SIM_MODEL=memory`, `redis`, `etcd` or `sql` runs every seed on one of them; by
//! default (or `all`) bits 2 and 3 of the seed choose, four seeds at a time (memory, redis, sql,
//! etcd: bit 2 still tells the in-memory store and the SQL model from the Redis and etcd
//! models), so the model is independent of the assignor, chosen by the seed modulo 4, and of
//! which members use change checks. A failure's replay command names its seed's model.
//! `HEADCOUNT_SIM_REDIS_REPAIR=0` runs the Redis model's index without its self-repair;
//! `HEADCOUNT_SIM_REDIS_FAULTS` adds faults that break the
//! version contract on purpose (`drop-bumps`, `reuse-counters`, comma-separated).
//! `HEADCOUNT_SIM_ETCD_WATCH=0` runs the etcd model's clients without the revision watch that
//! notices a restore. On a quarter of the etcd seeds the restores bump the
//! revision, as `etcdutl snapshot restore --bump-revision` does.

// Test support: a bad variable is a mistake of whoever runs the test, said at once.
#![allow(clippy::panic)]

use std::sync::Arc;

use headcount_core::memory::{MemoryStore, Snapshot};
use headcount_core::sim::SimClock;
use headcount_core::DynStore;
use headcount_sim::{EtcdModel, EtcdSnapshot, ModelFaults, ModelSnapshot, RedisModel, SqlModel};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which store a seed runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    Memory,
    Redis,
    Etcd,
    Sql,
}

impl ModelKind {
    /// By bits 2 and 3 of the seed.
    const BY_SEED: [ModelKind; 4] = [
        ModelKind::Memory,
        ModelKind::Redis,
        ModelKind::Sql,
        ModelKind::Etcd,
    ];

    /// Its name in `HEADCOUNT_SIM_MODEL`.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Memory => "memory",
            ModelKind::Redis => "redis",
            ModelKind::Etcd => "etcd",
            ModelKind::Sql => "sql",
        }
    }
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
    /// Whether the etcd model's clients watch the revisions (see [`EtcdModel::with_watch`]).
    pub etcd_watch: bool,
}

impl Models {
    /// What the `HEADCOUNT_SIM_*` variables say (see the module docs).
    pub fn from_env() -> Models {
        let only = match std::env::var("HEADCOUNT_SIM_MODEL").ok().as_deref() {
            None | Some("" | "all") => None,
            Some(name) => Some(
                ModelKind::BY_SEED
                    .into_iter()
                    .find(|k| k.name() == name)
                    .unwrap_or_else(|| {
                        panic!("HEADCOUNT_SIM_MODEL={name}: memory, redis, etcd, sql or all")
                    }),
            ),
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
            etcd_watch: std::env::var("HEADCOUNT_SIM_ETCD_WATCH").as_deref() != Ok("0"),
        }
    }

    /// The model `seed` runs on.
    pub fn for_seed(&self, seed: u64) -> ModelKind {
        match self.only {
            Some(kind) => kind,
            None => ModelKind::BY_SEED[((seed >> 2) & 3) as usize],
        }
    }

    /// The variables that run a seed on `kind` with these models, as a replay command's prefix.
    pub fn replay_env(&self, kind: ModelKind) -> String {
        let mut env = format!("HEADCOUNT_SIM_MODEL={} ", kind.name());
        if !self.etcd_watch {
            env.push_str("HEADCOUNT_SIM_ETCD_WATCH=0 ");
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

/// The model over the in-memory data, when the seed runs on one.
enum Model {
    Memory,
    Redis(RedisModel),
    /// With whether its restores bump the revision.
    Etcd(EtcdModel, bool),
    Sql(SqlModel),
}

/// How far a restore with `--bump-revision` moves the revision on (etcd's documentation
/// suggests a billion).
const REVISION_BUMP: i64 = 1_000_000_000;

/// The store of one seed, and what the simulation rolls back.
pub struct SimStore {
    pub kind: ModelKind,
    memory: MemoryStore,
    model: Model,
    /// Draws for the index faults, apart from the schedule's generator so that a seed's events
    /// are the same on every model.
    rng: StdRng,
    index_faults: Option<IndexFaults>,
    /// How many of the etcd model's unseen hidden changes were reported.
    unseen: usize,
}

/// A store's contents at one instant.
#[derive(Clone)]
pub enum SimSnapshot {
    Memory(Snapshot),
    Redis(ModelSnapshot),
    Etcd(EtcdSnapshot),
}

impl SimStore {
    /// The store of `seed`: on half the Redis seeds the index is lost now and then.
    pub fn new(models: &Models, clock: &SimClock, seed: u64) -> SimStore {
        let kind = models.for_seed(seed);
        let memory = MemoryStore::with_clock(Arc::new(clock.clone()));
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1de7_0fa1);
        let model = match kind {
            ModelKind::Memory => Model::Memory,
            ModelKind::Redis => {
                let model = RedisModel::new(memory.clone(), seed).with_repair(models.repair);
                model.set_faults(models.faults);
                Model::Redis(model)
            }
            ModelKind::Etcd => Model::Etcd(
                EtcdModel::new(memory.clone()).with_watch(models.etcd_watch),
                rng.random_bool(0.25),
            ),
            ModelKind::Sql => Model::Sql(SqlModel::new(memory.clone())),
        };
        let index_faults =
            (kind == ModelKind::Redis && rng.random_bool(0.5)).then(|| IndexFaults {
                per_tick: rng.random_range(0.001..0.01),
            });
        SimStore {
            kind,
            memory,
            model,
            rng,
            index_faults,
            unseen: 0,
        }
    }

    /// The store a member's process uses (each wraps it in its own fault layer): a client of
    /// its own on the etcd model.
    pub fn store(&self) -> DynStore {
        match &self.model {
            Model::Memory => Arc::new(self.memory.clone()),
            Model::Redis(m) => Arc::new(m.clone()),
            Model::Etcd(m, _) => Arc::new(m.handle()),
            Model::Sql(m) => Arc::new(m.clone()),
        }
    }

    /// What the seed's log says of the store.
    pub fn describe(&self) -> String {
        let mut what = format!("{:?}", self.kind);
        if self.index_faults.is_some() {
            what.push_str(" losing its index");
        }
        if let Model::Etcd(_, true) = self.model {
            what.push_str(" restored with --bump-revision");
        }
        what
    }

    /// The first version the etcd model answered for other contents than before where the
    /// client's revision watch saw the store go back (see [`EtcdModel::hidden`]).
    pub fn hidden_change(&self) -> Option<String> {
        match &self.model {
            Model::Etcd(m, _) => m.hidden().into_iter().next(),
            _ => None,
        }
    }

    /// A hidden change the watch could not see, new since the last call (see
    /// [`EtcdModel::unseen`]): the store broke its contract, as a rollback does.
    pub fn unseen_restore(&mut self) -> Option<String> {
        let Model::Etcd(m, _) = &self.model else {
            return None;
        };
        let unseen = m.unseen();
        let new = unseen.get(self.unseen)?.clone();
        self.unseen = unseen.len();
        Some(format!("a restore no watch saw hid a change: {new}"))
    }

    pub fn snapshot(&self) -> SimSnapshot {
        match &self.model {
            Model::Redis(m) => SimSnapshot::Redis(m.snapshot()),
            Model::Etcd(m, _) => SimSnapshot::Etcd(m.snapshot()),
            Model::Memory | Model::Sql(_) => SimSnapshot::Memory(self.memory.snapshot()),
        }
    }

    pub fn restore(&self, snapshot: &SimSnapshot) {
        match (snapshot, &self.model) {
            (SimSnapshot::Redis(s), Model::Redis(m)) => m.restore(s),
            (SimSnapshot::Etcd(s), Model::Etcd(m, bump)) => {
                m.restore_bumped(s, if *bump { REVISION_BUMP } else { 0 });
            }
            (SimSnapshot::Memory(s), Model::Memory | Model::Sql(_)) => self.memory.restore(s),
            _ => panic!("a snapshot of another model"),
        }
    }

    /// At one tick of the faulty phase, perhaps loses (part of) the Redis index: what it did.
    pub fn index_fault(&mut self) -> Option<String> {
        let (Some(faults), Model::Redis(m)) = (self.index_faults, &self.model) else {
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
