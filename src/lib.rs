//! rredcot: a content-addressed workflow orchestrator for reinforcement-learning research on
//! reasoning language models (RREDCoT return redistribution and other credit-assignment methods).
//!
//! - [`engine`]: pipelines, cache keys, store, executors (knows nothing of models)
//! - [`artifact`]: Parquet schemas shared by stages
//! - [`stages`]: builtin stage functions
//! - [`analysis`]: the paper's analyses (Fig. 3, 4, 7; the first wrong step of a trace) as functions
//! - [`figures`]: plots and tables the report-writing stages share
//! - [`math`]: math answer verifier (extraction, normalization, equivalence)
//! - [`prompt_text`]: a prompt's problem text and the normalized hash that identifies a problem
//! - [`tokenizer_file`]: loading a `tokenizer.json` for the stages that tokenize without the model
//! - [`judge`]: the LLM judge ensemble (templates, votes, OpenAI-compatible client, reply cache)
//!
//! This package never depends on tch: the model core and ML stages are the `rredcot-ml` package
//! (`ml/`), linked only into `rredcot-worker`.

pub mod analysis;
pub mod artifact;
pub mod cli;
pub mod credit;
/// The workflow engine (crate `rredcot-engine`), under its old path.
pub use rredcot_engine as engine;
pub mod evaluation;
pub mod judge;
pub mod math;
pub mod prompt_text;
pub mod figures;
pub mod stages;
pub mod tokenizer_file;

/// rredcot's version and those of the dependencies that shape results (from Cargo.lock at build).
pub fn versions() -> std::collections::BTreeMap<String, String> {
    let mut v = std::collections::BTreeMap::new();
    v.insert("rredcot".into(), env!("CARGO_PKG_VERSION").into());
    for pair in env!("RREDCOT_DEP_VERSIONS")
        .split(',')
        .filter(|s| !s.is_empty())
    {
        if let Some((k, ver)) = pair.split_once('=') {
            v.insert(k.into(), ver.into());
        }
    }
    v
}
