//! Tether's shared vocabulary: identifiers and channels, working-directory
//! URIs, the actions Tether adds to AHP, the session model and projection
//! folds, and the REST bodies. Nothing in this crate performs I/O, so the
//! server, the client SDK and the tests all agree on one definition.

pub mod actions;
pub mod channel;
pub mod config;
pub mod context;
pub mod events;
pub mod export;
pub mod ids;
pub mod model;
pub mod projection;
pub mod rest;
pub mod search;
pub mod toolctx;
pub mod view;
pub mod window;
pub mod workdir;

pub use ids::{NameError, validate_name};
