//! Artifact schemas as data: the application registers each one (name, layout on disk, whether it
//! accepts any upstream artifact, a validator); the engine only wires, lays out and validates by
//! these, and knows no schema by name.

use std::path::{Path, PathBuf};

/// How an artifact lies inside an instance's `outputs/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One Parquet file `outputs/<name>.parquet`.
    Table,
    /// A directory `outputs/<name>/` (the executor creates it before the stage runs).
    Dir,
    /// One file `outputs/<name>` of any format.
    File,
}

/// One artifact schema a stage may declare for an input or output.
#[derive(Clone, Copy)]
pub struct SchemaInfo {
    pub name: &'static str,
    pub layout: Layout,
    /// A catch-all (`table`, `dir`, `file`): as an input it accepts an upstream artifact of any
    /// schema, except that a `File` catch-all takes no directory.
    pub generic: bool,
    /// Checks an artifact on disk (a stage's output before it is committed).
    pub validate: fn(&Path) -> Result<(), String>,
}

impl SchemaInfo {
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Where output `name` of this schema lives inside an instance's `outputs/` directory.
    pub fn output_path(&self, outputs_dir: &Path, name: &str) -> PathBuf {
        match self.layout {
            Layout::Table => outputs_dir.join(format!("{name}.parquet")),
            Layout::Dir | Layout::File => outputs_dir.join(name),
        }
    }

    /// Whether an input declared with this schema may be wired to an upstream output of `up`.
    pub fn accepts(&self, up: &SchemaInfo) -> bool {
        self.name == up.name || (self.generic && (self.layout != Layout::File || up.layout != Layout::Dir))
    }
}

impl PartialEq for SchemaInfo {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl std::fmt::Debug for SchemaInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl std::fmt::Display for SchemaInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}
