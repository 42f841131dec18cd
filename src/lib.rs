//! rredcot: a content-addressed workflow orchestrator for reinforcement-learning research on
//! reasoning language models (RREDCoT return redistribution and other credit-assignment methods).
//!
//! - [`engine`]: pipelines, cache keys, store, executors (knows nothing of models)
//! - [`artifact`]: Parquet schemas shared by stages
//! - [`stages`]: builtin stage functions
//! - [`math`]: math answer verifier (extraction, normalization, equivalence)
//! - `model` (feature `ml`): tch decoder LMs

pub mod artifact;
pub mod cli;
pub mod engine;
pub mod math;
#[cfg(feature = "ml")]
pub mod model;
pub mod stages;
