//! Builtin stage functions, one module per stage kind, and the catalog of their names and code
//! versions. The catalog is plain data so the engine binary can compute keys for ML stages
//! without linking them; their code lives in the `rredcot-ml` package (`ml/`), run by `rredcot-worker`.

pub mod demo;
pub mod filter;
pub mod import;
pub mod judge;
pub mod locate_errors;
pub mod segment;
pub mod skipped;
pub mod taskgen;
pub mod tokenizer_train;

use crate::engine::Executable::{Engine, Worker};
use crate::engine::{BuiltinFn, BuiltinInfo, Catalog, Runtime};

/// Every builtin this project ships and the artifact schemas its stage files may name.
pub const CATALOG: Catalog = Catalog { builtins: BUILTINS, schemas: crate::artifact::SCHEMAS };

/// Every builtin this project ships: bump a version when the stage's output for the same inputs
/// and params changes.
const BUILTINS: &[BuiltinInfo] = &[
    BuiltinInfo { name: "demo_numbers", version: "1", runs_in: Engine },
    BuiltinInfo { name: "demo_scale", version: "1", runs_in: Engine },
    BuiltinInfo { name: "demo_sum", version: "1", runs_in: Engine },
    BuiltinInfo { name: "demo_step", version: "1", runs_in: Engine },
    BuiltinInfo { name: "taskgen", version: "2", runs_in: Engine },
    BuiltinInfo { name: "tokenizer_train", version: "2", runs_in: Engine },
    BuiltinInfo { name: "import", version: "2", runs_in: Engine },
    BuiltinInfo { name: "filter", version: "2", runs_in: Engine },
    BuiltinInfo { name: "bootstrap_sft", version: "2", runs_in: Worker },
    BuiltinInfo { name: "segment", version: "2", runs_in: Engine },
    BuiltinInfo { name: "rollout", version: "2", runs_in: Worker },
    BuiltinInfo { name: "score_sigma", version: "2", runs_in: Worker },
    BuiltinInfo { name: "score_mc", version: "3", runs_in: Worker },
    BuiltinInfo { name: "score_loo", version: "2", runs_in: Worker },
    BuiltinInfo { name: "score_grad", version: "2", runs_in: Worker },
    BuiltinInfo { name: "score_progress", version: "2", runs_in: Worker },
    BuiltinInfo { name: "reset", version: "2", runs_in: Worker },
    BuiltinInfo { name: "update", version: "2", runs_in: Worker },
    BuiltinInfo { name: "eval", version: "2", runs_in: Worker },
    BuiltinInfo { name: "report", version: "2", runs_in: Engine },
    BuiltinInfo { name: "analysis", version: "1", runs_in: Engine },
    BuiltinInfo { name: "credit_benchmark", version: "1", runs_in: Engine },
    BuiltinInfo { name: "locate_errors", version: "1", runs_in: Engine },
    BuiltinInfo { name: "judge", version: "1", runs_in: Engine },
    BuiltinInfo { name: "judge_local", version: "1", runs_in: Worker },
];

/// Builtins that run without libtorch.
pub fn light_builtin(name: &str) -> Option<BuiltinFn> {
    Some(match name {
        "demo_numbers" => demo::numbers,
        "demo_scale" => demo::scale,
        "demo_sum" => demo::sum,
        "demo_step" => demo::step,
        "taskgen" => taskgen::run,
        "tokenizer_train" => tokenizer_train::run,
        "import" => import::run,
        "filter" => filter::run,
        "segment" => segment::run,
        "report" => crate::report::run,
        "analysis" => crate::analysis::run,
        "credit_benchmark" => crate::analysis::credit_benchmark::run,
        "locate_errors" => locate_errors::run,
        "judge" => judge::run,
        _ => return None,
    })
}

pub const LIGHT_RUNTIME: Runtime = Runtime { catalog: &CATALOG, resolve: light_builtin, worker: WORKER, versions: crate::versions };

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
