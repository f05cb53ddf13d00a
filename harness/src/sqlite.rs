//! SQLite needs no server: one database file in a temp dir per test process.

use std::sync::OnceLock;

use super::{process, Unavailable};

/// The URL of this process's shared SQLite file, in a temp dir removed at exit.
pub fn shared_url() -> Result<String, Unavailable> {
    static URL: OnceLock<Result<String, Unavailable>> = OnceLock::new();
    URL.get_or_init(|| {
        let dir = process::temp_dir("sqlite")
            .map_err(|e| Unavailable::Failed(format!("sqlite: making a temp dir: {e}")))?;
        Ok(format!("sqlite://{}/store.db", dir.display()))
    })
    .clone()
}
