//! Artifact schemas (DESIGN.md §4) and how each is laid out inside an instance's `outputs/`.
//!
//! Tabular artifacts are one Parquet file `outputs/<name>.parquet`; directory artifacts
//! (checkpoints, tokenizers, reports) are a directory `outputs/<name>/`; a `file` artifact is one
//! file `outputs/<name>` of any format. Column names are the contract between stages, so they live
//! here and nowhere else.

pub mod parquet_io;
pub mod rows;

use std::path::{Path, PathBuf};

use arrow::datatypes::{DataType, Field};

use crate::engine::schema::{Layout, SchemaInfo};

pub use parquet_io::{read_batches, read_rows, read_table_columns, validate_file, write_batch, write_rows, write_table, ArtifactError};

/// The artifact kinds a stage may declare for an input or output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schema {
    Prompts,
    Rollouts,
    Segments,
    Scores,
    Eval,
    /// Any Parquet table (no required columns).
    Table,
    /// A Hugging Face layout checkpoint directory (config.json + model.safetensors).
    Checkpoint,
    /// Any directory (tokenizer, report, optimizer state...).
    Dir,
    /// One file of any format (e.g. a JSONL or Parquet dataset wired as `file:path` to `import`).
    File,
}

impl Schema {
    pub const ALL: [Schema; 9] = [
        Schema::Prompts,
        Schema::Rollouts,
        Schema::Segments,
        Schema::Scores,
        Schema::Eval,
        Schema::Table,
        Schema::Checkpoint,
        Schema::Dir,
        Schema::File,
    ];

    pub fn parse(s: &str) -> Option<Schema> {
        Schema::ALL.iter().copied().find(|k| k.name() == s)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Schema::Prompts => "prompts",
            Schema::Rollouts => "rollouts",
            Schema::Segments => "segments",
            Schema::Scores => "scores",
            Schema::Eval => "eval",
            Schema::Table => "table",
            Schema::Checkpoint => "checkpoint",
            Schema::Dir => "dir",
            Schema::File => "file",
        }
    }

    pub fn is_tabular(self) -> bool {
        !matches!(self, Schema::Checkpoint | Schema::Dir | Schema::File)
    }

    /// Whether the artifact is a directory (the executor creates it before the stage runs).
    pub fn is_dir(self) -> bool {
        matches!(self, Schema::Checkpoint | Schema::Dir)
    }

    /// Where output `name` of this schema lives inside an instance's `outputs/` directory.
    pub fn output_path(self, outputs_dir: &Path, name: &str) -> PathBuf {
        if self.is_tabular() {
            outputs_dir.join(format!("{name}.parquet"))
        } else {
            outputs_dir.join(name)
        }
    }

    /// Float columns whose every value must be finite: a NaN return, value or σ would only fail
    /// (or mislead) the stage that reads it. (Rollouts' entropies are NaN where an engine gave
    /// none, so they are not among them.)
    pub fn finite_columns(self) -> &'static [&'static str] {
        match self {
            Schema::Rollouts => &["reward"],
            Schema::Scores => &["R", "v", "sigma"],
            _ => &[],
        }
    }

    /// Required columns of a tabular schema (extra columns are allowed).
    pub fn columns(self) -> Vec<Field> {
        let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
        let i32f = |n: &str| Field::new(n, DataType::Int32, false);
        let list = |n: &str, t: DataType| Field::new(n, DataType::List(Field::new("item", t, false).into()), false);
        match self {
            Schema::Prompts => vec![
                s("id", false),
                s("prompt", false),
                s("answer", true),
                s("solution", true),
                s("source", false),
                s("meta", false),
            ],
            Schema::Rollouts => vec![
                s("prompt_id", false),
                i32f("sample_idx"),
                list("completion_ids", DataType::Int32),
                s("text", false),
                list("logprobs", DataType::Float32),
                list("entropies", DataType::Float32),
                s("answer_extracted", true),
                Field::new("reward", DataType::Float64, false),
                s("finish_reason", false),
                s("policy_ckpt", false),
                Field::new("cot_end", DataType::Int32, true),
            ],
            Schema::Segments => vec![
                s("prompt_id", false),
                i32f("sample_idx"),
                list("seg_starts", DataType::Int32),
                list("seg_ends", DataType::Int32),
                s("method", false),
            ],
            Schema::Scores => vec![
                s("prompt_id", false),
                i32f("sample_idx"),
                list("R", DataType::Float64),
                list("v", DataType::Float64),
                list("sigma", DataType::Float64),
                s("method", false),
            ],
            Schema::Eval => vec![
                s("prompt_id", false),
                s("benchmark", false),
                i32f("sample_idx"),
                s("question", false),
                s("reference", true),
                s("text", false),
                s("answer", true),
                Field::new("correct_verifier", DataType::Boolean, false),
                Field::new("correct_judge", DataType::Boolean, true),
            ],
            Schema::Table | Schema::Checkpoint | Schema::Dir | Schema::File => vec![],
        }
    }

    /// Files a directory artifact must contain.
    pub fn required_files(self) -> &'static [&'static str] {
        match self {
            Schema::Checkpoint => &["config.json", "model.safetensors"],
            _ => &[],
        }
    }
}

/// Every schema as the engine sees it (registered through `stages::CATALOG` and the worker's catalog), in `Schema::ALL`
/// order.
pub const SCHEMAS: &[SchemaInfo] = &[
    Schema::Prompts.registered::<0>(),
    Schema::Rollouts.registered::<1>(),
    Schema::Segments.registered::<2>(),
    Schema::Scores.registered::<3>(),
    Schema::Eval.registered::<4>(),
    Schema::Table.registered::<5>(),
    Schema::Checkpoint.registered::<6>(),
    Schema::Dir.registered::<7>(),
    Schema::File.registered::<8>(),
];

/// `validate_output` for `Schema::ALL[I]`, as a plain function the engine can hold.
fn validate_nth<const I: usize>(path: &Path) -> Result<(), String> {
    validate_output(Schema::ALL[I], path).map_err(|e| e.to_string())
}

impl Schema {
    /// The engine's description of this schema.
    pub fn info(self) -> SchemaInfo {
        SCHEMAS[Schema::ALL.iter().position(|s| *s == self).expect("every schema is in ALL")]
    }

    /// The engine's description of this schema; `I` is its index in `Schema::ALL`.
    const fn registered<const I: usize>(self) -> SchemaInfo {
        let layout = match self {
            Schema::Checkpoint | Schema::Dir => Layout::Dir,
            Schema::File => Layout::File,
            _ => Layout::Table,
        };
        SchemaInfo { name: self.name(), layout, generic: matches!(self, Schema::Table | Schema::Dir | Schema::File), validate: validate_nth::<I> }
    }
}

impl std::fmt::Display for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Check that an output on disk matches its declared schema.
pub fn validate_output(schema: Schema, path: &Path) -> Result<(), ArtifactError> {
    if schema.is_tabular() {
        return validate_file(path, schema).map(|_| ());
    }
    if schema == Schema::File {
        if !path.is_file() {
            return Err(ArtifactError::Missing { path: path.to_path_buf(), what: "file".into() });
        }
        return Ok(());
    }
    if !path.is_dir() {
        return Err(ArtifactError::Missing { path: path.to_path_buf(), what: format!("{schema} directory") });
    }
    for f in schema.required_files() {
        if !path.join(f).is_file() {
            return Err(ArtifactError::Missing { path: path.join(f), what: format!("file required by schema `{schema}`") });
        }
    }
    Ok(())
}

#[cfg(test)]
mod registration_tests {
    use super::*;

    #[test]
    fn every_schema_is_registered_under_its_own_name_layout_and_validator() {
        assert_eq!(SCHEMAS.len(), Schema::ALL.len());
        let dir = tempfile::tempdir().unwrap();
        for (info, s) in SCHEMAS.iter().zip(Schema::ALL) {
            assert_eq!(info.name, s.name());
            assert_eq!(info.output_path(dir.path(), "x"), s.output_path(dir.path(), "x"), "{s}");
            assert_eq!(info.layout == Layout::Dir, s.is_dir(), "{s}");
            // Each validator is its own schema's: a missing artifact is reported with that name.
            let err = (info.validate)(&dir.path().join("missing")).unwrap_err();
            assert!(!err.is_empty(), "{s}");
        }
        // The catch-alls accept any upstream; `file` no directory; a named schema only itself.
        let by = |n: &str| *SCHEMAS.iter().find(|i| i.name == n).unwrap();
        assert!(by("table").accepts(&by("rollouts")) && by("dir").accepts(&by("checkpoint")));
        assert!(by("file").accepts(&by("prompts")) && !by("file").accepts(&by("checkpoint")));
        assert!(!by("rollouts").accepts(&by("prompts")) && by("rollouts").accepts(&by("rollouts")));
    }
}
