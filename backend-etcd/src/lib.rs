#![doc = include_str!("../README.md")]

mod config;
mod connection;
mod endpoints;
mod errors;
mod leases;
mod notify;
mod probe;
mod store;

pub use config::{EtcdConfig, DEFAULT_PORT};
/// The client crate of [`EtcdStore::from_client`], re-exported so an application names the same
/// version.
pub use etcd_client;
pub use store::EtcdStore;
