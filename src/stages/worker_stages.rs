//! The builtins whose code is in the ML worker (`ml/src/stages/`), by name and code version as
//! their modules declare them, so `rredcot` keys them without linking libtorch.
//!
//! Generated: `RREDCOT_REGEN=1 cargo test -p rredcot-ml --lib worker_stages` rewrites this file,
//! and that test fails while it differs from the modules' declarations.

use crate::engine::BuiltinInfo;
use crate::engine::Executable::Worker;

pub const WORKER_STAGES: &[BuiltinInfo] = &[
    BuiltinInfo { name: "bootstrap_sft", version: "4", runs_in: Worker },
    BuiltinInfo { name: "rollout", version: "12", runs_in: Worker },
    BuiltinInfo { name: "score_sigma", version: "7", runs_in: Worker },
    BuiltinInfo { name: "score_mc", version: "12", runs_in: Worker },
    BuiltinInfo { name: "score_loo", version: "4", runs_in: Worker },
    BuiltinInfo { name: "score_grad", version: "4", runs_in: Worker },
    BuiltinInfo { name: "score_progress", version: "12", runs_in: Worker },
    BuiltinInfo { name: "reset", version: "13", runs_in: Worker },
    BuiltinInfo { name: "update", version: "5", runs_in: Worker },
    BuiltinInfo { name: "eval", version: "12", runs_in: Worker },
    BuiltinInfo { name: "judge_local", version: "2", runs_in: Worker },
];
