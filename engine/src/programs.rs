//! Which program runs an instance: decided here and nowhere else.
//!
//! A builtin runs in a binary that has its code. A binary that lacks the code of a builtin tagged
//! [`Executable::Worker`] hands it to its companion *worker* binary, which sits next to it and is
//! named by the application in its [`Runtime`]. Everything else (builtins it has, external
//! commands) runs in the binary itself.

use std::path::{Path, PathBuf};

use super::catalog::Catalog;
use super::exec::Runtime;
use super::spec::RunnerSpec;

/// Where a builtin's code lives: the binary that plans pipelines, or the companion worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executable {
    Engine,
    Worker,
}

/// The programs of one process: itself and, when it exists, its worker.
#[derive(Clone)]
pub struct Programs {
    this: PathBuf,
    worker_name: &'static str,
    catalog: &'static Catalog,
}

impl Programs {
    /// The running binary and the worker named by its runtime.
    pub fn of(rt: &Runtime) -> Programs {
        let this = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("rredcot"));
        Programs::at(this, rt)
    }

    pub fn at(this: PathBuf, rt: &Runtime) -> Programs {
        Programs { this, worker_name: rt.worker, catalog: rt.catalog }
    }

    pub fn this(&self) -> &Path {
        &self.this
    }

    /// The program that runs an instance with this runner, or why none can.
    pub fn for_runner(&self, runner: &RunnerSpec) -> Result<PathBuf, String> {
        match runner {
            RunnerSpec::Builtin { name, in_worker: true } if self.catalog.code(name).is_none() => self.worker(&format!("builtin `{name}`")),
            _ => Ok(self.this.clone()),
        }
    }

    /// The worker binary, or an error saying that `what` needs it and how to build it.
    pub fn worker(&self, what: &str) -> Result<PathBuf, String> {
        let w = self.this.with_file_name(self.worker_name);
        if w.is_file() {
            Ok(w)
        } else {
            Err(format!(
                "{what} runs in the worker `{}`, which is not next to {} (build both: cargo build --workspace --bins)",
                self.worker_name,
                self.this.display()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::StageContext;
    use crate::spec::RunnerSpec;
    use crate::{Builtin, Catalog};

    fn light(_: &mut StageContext) -> anyhow::Result<()> {
        Ok(())
    }

    const LIGHT: Builtin = Builtin { name: "light", version: "1", runs_in: Executable::Worker, run: light };
    const RT: Runtime = Runtime {
        catalog: &Catalog { builtins: &[&[LIGHT]], worker_builtins: &[], schemas: &[] },
        worker: "the-worker",
        versions: std::collections::BTreeMap::new,
        after_instance: crate::exec::keep_serving,
    };

    fn builtin(name: &str, in_worker: bool) -> RunnerSpec {
        RunnerSpec::Builtin { name: name.into(), in_worker }
    }

    #[test]
    fn a_missing_worker_builtin_goes_to_the_worker_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let this = dir.path().join("engine");
        let p = Programs::at(this.clone(), &RT);
        // Without the worker next to it: a clear error naming the builtin, the worker and the fix.
        let err = p.for_runner(&builtin("heavy", true)).unwrap_err();
        assert!(err.contains("builtin `heavy`") && err.contains("`the-worker`") && err.contains("cargo build --workspace --bins"), "{err}");
        std::fs::write(dir.path().join("the-worker"), "").unwrap();
        assert_eq!(p.for_runner(&builtin("heavy", true)).unwrap(), dir.path().join("the-worker"));
        // Builtins this binary has, and untagged ones, run here (a missing untagged one is
        // reported by `stage exec` as not in this build).
        assert_eq!(p.for_runner(&builtin("light", true)).unwrap(), this);
        assert_eq!(p.for_runner(&builtin("other", false)).unwrap(), this);
    }
}
