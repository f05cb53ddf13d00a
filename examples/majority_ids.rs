//! Majority IDs (fencing tokens): over an odd number of independent stores, read a majority,
//! propose the maximum plus one everywhere, and return it only once a majority stored it. Every
//! ID is greater than every ID returned before it was asked for, across processes.
//!
//! Use stores on different machines (any mix of backends); each must be durable (Redis with
//! `appendfsync always`, PostgreSQL with `synchronous_commit`, SQLite `synchronous=full`):
//!
//! ```sh
//! S=synchronous=full
//! cargo run --example majority_ids -- "sqlite://ids-1.db?$S,sqlite://ids-2.db?$S,sqlite://ids-3.db?$S"
//! cargo run --features full --example majority_ids -- \
//!   redis://r1:6379,postgres://app:pass@db/app,etcd://e1:2379
//! ```
//!
//! A second argument is how many IDs to print (default 5).

use headcount::recipes::ids::{IdsConfig, MajorityIds};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let urls = std::env::args().nth(1).unwrap_or_else(|| {
        "sqlite://ids-1.db?synchronous=full,sqlite://ids-2.db?synchronous=full,\
             sqlite://ids-3.db?synchronous=full"
            .into()
    });
    let count: u64 = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(5);
    let mut stores = Vec::new();
    for url in urls.split(',') {
        stores.push(headcount::connect(url).await?);
    }
    // Refuses a store that is not durable: a crash of one could repeat an ID.
    let ids = MajorityIds::new(stores, IdsConfig::new("orders")).await?;
    for _ in 0..count {
        println!("{}", ids.next().await?);
    }
    Ok(())
}
