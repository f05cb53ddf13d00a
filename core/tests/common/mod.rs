//! What the simulations share: which seeds to run.

// Test support: a bad seed variable is a mistake of whoever runs the test, said at once.
#![allow(clippy::panic)]

/// The seeds to run: `HEADCOUNT_SIM_SEED=S` alone (a replay), else `HEADCOUNT_SIM_SEEDS`
/// (default `count`) seeds from `HEADCOUNT_SIM_FIRST_SEED` (default 0). The flag says whether
/// it is a replay.
pub fn seeds(count: u64) -> (Vec<u64>, bool) {
    let number = |var: &str| {
        std::env::var(var).ok().map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| panic!("{var}={s} is not a number"))
        })
    };
    if let Some(seed) = number("HEADCOUNT_SIM_SEED") {
        return (vec![seed], true);
    }
    let first = number("HEADCOUNT_SIM_FIRST_SEED").unwrap_or(0);
    let n = number("HEADCOUNT_SIM_SEEDS").unwrap_or(count);
    ((first..first + n).collect(), false)
}
