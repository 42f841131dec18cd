//! Builtin stages without libtorch, one module per stage kind, each declaring itself (`STAGE`:
//! name, code version, executable, run function). The ML stages live in the `rredcot-ml` package
//! (`ml/`), run by `rredcot-worker`; this binary keys them from [`WORKER_STAGES`], a list generated
//! from their declarations (a test in that package fails while the two differ).

pub mod analysis;
pub mod credit_benchmark;
pub mod demo;
pub mod filter;
pub mod import;
pub mod judge;
pub mod locate_errors;
pub mod report;
pub mod segment;
pub mod skipped;
pub mod taskgen;
pub mod tokenizer_train;

mod worker_stages;

use crate::engine::{Builtin, Catalog, Runtime};

/// The builtins of this package, each as its module declares it.
pub const STAGES: &[Builtin] = &[
    demo::numbers::STAGE,
    demo::scale::STAGE,
    demo::sum::STAGE,
    demo::step::STAGE,
    taskgen::STAGE,
    tokenizer_train::STAGE,
    import::STAGE,
    filter::STAGE,
    segment::STAGE,
    report::STAGE,
    analysis::STAGE,
    credit_benchmark::STAGE,
    locate_errors::STAGE,
    judge::STAGE,
];

pub use worker_stages::WORKER_STAGES;

/// What `rredcot` knows: its own builtins, the worker's by name and version, and the schemas.
pub const CATALOG: Catalog = Catalog { builtins: &[STAGES], worker_builtins: WORKER_STAGES, schemas: crate::artifact::SCHEMAS };

pub const LIGHT_RUNTIME: Runtime = Runtime { catalog: &CATALOG, worker: WORKER, versions: crate::versions, after_instance: crate::engine::exec::keep_serving };

/// The binary that runs the stages tagged `Worker` (it links libtorch; `rredcot` does not).
pub const WORKER: &str = "rredcot-worker";

/// The `[params]` of a shipped stage file (`stages/KIND.toml`, its `extends` applied):
/// tests (here and in the ML package) check that a stage's params struct reads them, so file and
/// code cannot drift apart.
#[doc(hidden)]
pub fn shipped_defaults(kind: &str) -> serde_json::Map<String, serde_json::Value> {
    let stages = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("stages");
    let k = crate::engine::plan::load_stage_kind(&[stages], kind, &CATALOG).unwrap_or_else(|e| panic!("{kind}: {e}"));
    k.defaults.clone()
}

#[cfg(test)]
mod params_tests {
    use crate::engine::context::parse_params;

    #[test]
    fn every_builtin_is_declared_once() {
        assert_eq!(super::CATALOG.duplicate_names(), Vec::<&str>::new());
    }

    #[test]
    fn the_shipped_stage_files_params_are_what_the_params_structs_read() {
        parse_params::<super::taskgen::TaskgenParams>("taskgen", &super::shipped_defaults("taskgen")).unwrap();
        parse_params::<super::segment::SegmentParams>("segment", &super::shipped_defaults("segment")).unwrap();
        parse_params::<super::filter::FilterParams>("filter", &super::shipped_defaults("filter")).unwrap();
        parse_params::<super::filter::FilterParams>("filter_tokens", &super::shipped_defaults("filter_tokens")).unwrap();
        parse_params::<super::tokenizer_train::TokenizerParams>("tokenizer_train", &super::shipped_defaults("tokenizer_train")).unwrap();
        parse_params::<super::locate_errors::LocateParams>("locate_errors", &super::shipped_defaults("locate_errors")).unwrap();
        parse_params::<super::import::ImportParams>("import", &super::shipped_defaults("import")).unwrap();
        parse_params::<super::judge::JudgeParams>("judge", &super::shipped_defaults("judge")).unwrap();
        // A param the code would not read is an error naming it.
        let mut extra = super::shipped_defaults("segment");
        extra.insert("max_segmnts".into(), 3.into());
        let e = parse_params::<super::segment::SegmentParams>("segment", &extra).unwrap_err().to_string();
        assert!(e.contains("unknown field `max_segmnts`"), "{e}");
    }
}
