#![doc = include_str!("../README.md")]

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
