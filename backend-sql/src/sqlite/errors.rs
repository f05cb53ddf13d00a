//! Mapping rusqlite errors onto headcount's [`Error`]: lock contention and I/O trouble may pass
//! (the retryable [`Error::Unavailable`]); anything else (corruption, a schema we did not create,
//! a read-only file) will not ([`Error::Rejected`], or [`Error::InvalidConfig`] when opening).

use headcount_core::{Error, Result};
use rusqlite::ErrorCode;

use super::config::Location;

pub(crate) const BACKEND: &str = "sqlite";

/// The worker thread that owns the connection is gone: it could not start, or it stopped.
pub(crate) fn worker_gone() -> Error {
    Error::Unavailable {
        backend: BACKEND,
        message: "the SQLite worker thread stopped".into(),
        source: None,
    }
}

/// Maps an error met while opening the database at `location`: one that opening again cannot
/// mend names the file as a configuration error.
pub(crate) fn open_error(location: &Location, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            Error::config(format!("`{location}` exists but is not a SQLite database"))
        }
        Some(
            ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::DatabaseCorrupt,
        ) => Error::config(format!("cannot open SQLite database `{location}`: {e}")),
        _ => sql_error(e),
    }
}

/// Maps a rusqlite error: lock contention and I/O trouble may pass (retryable); anything else
/// (corruption, a schema we did not create, a read-only file) will not.
pub(crate) fn sql_error(e: rusqlite::Error) -> Error {
    let retryable = matches!(
        e.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::SystemIoFailure
                | ErrorCode::DiskFull
                | ErrorCode::CannotOpen
                | ErrorCode::OutOfMemory
                | ErrorCode::FileLockingProtocolFailed
                | ErrorCode::OperationInterrupted
        )
    );
    let message = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            format!("the database stayed locked by another connection past busy_timeout ({e})")
        }
        _ => e.to_string(),
    };
    if retryable {
        Error::unavailable(BACKEND, message, e)
    } else {
        Error::rejected(BACKEND, message, e)
    }
}

/// `?` for rusqlite results inside the worker.
pub(crate) trait Sql<T> {
    fn sql(self) -> Result<T>;
}

impl<T> Sql<T> for rusqlite::Result<T> {
    fn sql(self) -> Result<T> {
        self.map_err(sql_error)
    }
}
