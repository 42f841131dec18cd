//! Builtin stages that need the model core. Their names and code versions are in the engine's
//! catalog (`rredcot::stages::CATALOG`, `needs_ml = true`) so the engine binary can key them
//! without linking libtorch.

pub mod bootstrap_sft;

use rredcot::engine::{BuiltinFn, Runtime};
use rredcot::stages::{light_builtin, CATALOG};

/// Builtins of the ML worker (light ones included).
pub fn full_builtin(name: &str) -> Option<BuiltinFn> {
    Some(match name {
        "bootstrap_sft" => bootstrap_sft::run,
        _ => return light_builtin(name),
    })
}

pub const FULL_RUNTIME: Runtime = Runtime { builtins: CATALOG, resolve: full_builtin };
