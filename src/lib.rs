//! rredcot: a content-addressed workflow orchestrator for reinforcement-learning research on
//! reasoning language models (RREDCoT return redistribution and other credit-assignment methods).
//!
//! - [`engine`]: pipelines, cache keys, store, executors (knows nothing of models)
//! - [`artifact`]: Parquet schemas shared by stages
//! - [`stages`]: builtin stage functions
//! - [`analysis`]: the paper's analysis figures (Fig. 3, 4, 7) from scored traces
//! - [`math`]: math answer verifier (extraction, normalization, equivalence)
//! - [`judge`]: the LLM judge ensemble (templates, votes, OpenAI-compatible client, reply cache)
//!
//! This package never depends on tch: the model core and ML stages are the `rredcot-ml` package
//! (`ml/`), linked only into `rredcot-worker`.

pub mod analysis;
pub mod artifact;
pub mod cli;
pub mod credit;
pub mod engine;
pub mod evaluation;
pub mod judge;
pub mod math;
pub mod report;
pub mod stages;
