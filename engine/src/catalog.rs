//! What a binary knows about stages without running them: the builtins it has the code of (as
//! their modules declare them), the builtins only its worker has, and the artifact schemas stage
//! files may name.

use super::context::BuiltinFn;
use super::programs::Executable;
use super::schema::SchemaInfo;

/// A builtin stage as its module declares it: `pub const STAGE: Builtin = Builtin { .. }`.
#[derive(Clone, Copy)]
pub struct Builtin {
    /// What stage files name in `builtin = "…"`.
    pub name: &'static str,
    /// Bump when the stage's output for the same inputs and params changes (part of the key).
    pub version: &'static str,
    /// The binary that has this code: the engine (no libtorch) or its worker.
    pub runs_in: Executable,
    pub run: BuiltinFn,
}

impl Builtin {
    pub const fn info(&self) -> BuiltinInfo {
        BuiltinInfo { name: self.name, version: self.version, runs_in: self.runs_in }
    }
}

/// What keys a builtin: its name, code version and executable (without its code, which for the
/// worker's builtins this binary does not have).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltinInfo {
    pub name: &'static str,
    pub version: &'static str,
    pub runs_in: Executable,
}

pub struct Catalog {
    /// The builtins whose code is in this binary, one list per package that declares them.
    pub builtins: &'static [&'static [Builtin]],
    /// The builtins only the worker has: keyed here, run there.
    pub worker_builtins: &'static [BuiltinInfo],
    pub schemas: &'static [SchemaInfo],
}

impl Catalog {
    /// The code of builtin `name`, when this binary has it.
    pub fn code(&self, name: &str) -> Option<BuiltinFn> {
        self.here().find(|b| b.name == name).map(|b| b.run)
    }

    /// Builtin `name`'s version and executable, whether or not this binary has its code.
    pub fn builtin(&self, name: &str) -> Option<BuiltinInfo> {
        self.infos().find(|i| i.name == name)
    }

    pub fn builtin_names(&self) -> String {
        self.infos().map(|i| i.name).collect::<Vec<_>>().join(", ")
    }

    /// The builtins whose code is in this binary.
    fn here(&self) -> impl Iterator<Item = &Builtin> + '_ {
        self.builtins.iter().flat_map(|b| b.iter())
    }

    fn infos(&self) -> impl Iterator<Item = BuiltinInfo> + '_ {
        self.here().map(Builtin::info).chain(self.worker_builtins.iter().copied())
    }

    /// Names declared twice (in this binary's lists or beside the worker's): each must be one stage.
    pub fn duplicate_names(&self) -> Vec<&'static str> {
        let mut seen = std::collections::BTreeSet::new();
        self.infos().filter(|i| !seen.insert(i.name)).map(|i| i.name).collect()
    }

    pub fn schema(&self, name: &str) -> Option<SchemaInfo> {
        self.schemas.iter().find(|s| s.name == name).copied()
    }

    pub fn schema_names(&self) -> String {
        self.schemas.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
    }
}

/// A catalog with nothing in it (engine tests).
#[cfg(test)]
pub(crate) const EMPTY: Catalog = Catalog { builtins: &[], worker_builtins: &[], schemas: &[] };
