//! PostgreSQL backend (placeholder, being written).
