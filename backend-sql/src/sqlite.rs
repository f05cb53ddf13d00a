//! SQLite backend (placeholder, being written).
