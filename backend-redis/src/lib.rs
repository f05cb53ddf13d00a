#![doc = include_str!("../README.md")]

mod config;
mod connection;
mod durability;
mod errors;
mod fence;
mod index;
mod notify;
mod reconnect;
mod replies;
mod scripts;
mod sentinel;
mod store;

pub use config::{Deployment, RedisConfig, DEFAULT_PORT, DEFAULT_SENTINEL_PORT};
pub use fence::RedisFence;
/// The client crate of [`RedisStore::from_client`] and [`RedisStore::from_manager`],
/// re-exported so an application names the same version.
pub use redis;
pub use store::RedisStore;
