//! Tether's shared vocabulary: identifiers and their validation, the REST
//! bodies the server answers with and the client reads, and (as the project
//! grows) the pure folds over transcripts. Nothing in this crate performs I/O,
//! so the server, the client SDK and the tests all agree on one definition.

pub mod ids;
pub mod rest;

pub use ids::{NameError, validate_name};
