//! The workflow engine: stage/pipeline files, cache keys, the content-addressed store, run
//! records, locking and executors.
//!
//! The engine knows nothing of models or of what stages compute, and being its own crate the
//! compiler keeps it so: the application hands it a `Runtime` (a `Catalog` of the builtin stages as
//! their modules declare them and of its artifact schemas, and the name of its worker binary);
//! everything else is an external command.

pub mod cache;
pub mod catalog;
pub mod context;
pub mod defs;
mod display;
pub mod error;
pub mod exec;
pub mod file_hashes;
pub mod group;
pub mod hash;
pub mod local;
pub mod plan;
pub mod programs;
pub mod record;
pub mod resolve;
pub mod runner;
pub mod schema;
pub mod slurm;
pub mod spec;
pub mod store;
pub mod warm;

pub use context::{BuiltinFn, Progress, StageContext};
pub use error::{EngineError, Result};
pub use exec::Runtime;
pub use catalog::{Builtin, BuiltinInfo, Catalog};
pub use plan::{load_plan, Plan, SetArg};
pub use programs::{Executable, Programs};
pub use schema::{Layout, SchemaInfo};
pub use store::Store;
