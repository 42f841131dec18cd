//! Deterministic Parquet I/O with schema validation.
//!
//! Written bytes depend only on the rows: zstd, a fixed `created_by`, no timestamps, one row group
//! per batch in the order given. Reading casts compatible types (e.g. a Python writer's int64 or
//! large_string) to the contract's types, and names the file and column when it cannot.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, FieldRef, Schema as ArrowSchema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::{de::DeserializeOwned, Serialize};

use super::Schema;

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    // The message prints the cause, so it is not also the error's `source`.
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: not a readable Parquet file: {message}")]
    Parquet { path: PathBuf, message: String },
    #[error("{path}: writing Parquet: {message}")]
    ParquetWrite { path: PathBuf, message: String },
    #[error("{path}: missing column `{column}` (expected type {expected}) required by schema `{schema}`")]
    MissingColumn { path: PathBuf, column: String, expected: String, schema: Schema },
    #[error("{path}: column `{column}` has type {found}, expected {expected} (schema `{schema}`)")]
    ColumnType { path: PathBuf, column: String, found: String, expected: String, schema: Schema },
    #[error("{path}: column `{column}` row {row}: null where schema `{schema}` requires a value")]
    NullValue { path: PathBuf, column: String, row: usize, schema: Schema },
    #[error("{path}: column `{column}` row {row}: {value} where schema `{schema}` needs a finite number")]
    NotFinite { path: PathBuf, column: String, row: usize, value: f64, schema: Schema },
    #[error("{path}: missing {what}")]
    Missing { path: PathBuf, what: String },
    #[error("{path}: rows do not match schema `{schema}`: {message}")]
    Rows { path: PathBuf, schema: Schema, message: String },
}

fn writer_props() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).expect("valid zstd level")))
        .set_created_by("rredcot".to_string())
        .build()
}

/// Write one record batch as a Parquet file (deterministic bytes for equal batches).
pub fn write_batch(path: &Path, batch: &RecordBatch) -> Result<(), ArtifactError> {
    let perr = |e: parquet::errors::ParquetError| ArtifactError::ParquetWrite { path: path.to_path_buf(), message: e.to_string() };
    let file = File::create(path).map_err(|error| ArtifactError::Io { path: path.to_path_buf(), error })?;
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(writer_props())).map_err(perr)?;
    writer.write(batch).map_err(perr)?;
    let file = writer.into_inner().map_err(perr)?;
    file.sync_all().map_err(|error| ArtifactError::Io { path: path.to_path_buf(), error })?;
    Ok(())
}

/// Read every batch of a Parquet file and concatenate them.
pub fn read_batches(path: &Path) -> Result<RecordBatch, ArtifactError> {
    let perr = |m: String| ArtifactError::Parquet { path: path.to_path_buf(), message: m };
    let file = File::open(path).map_err(|error| ArtifactError::Io { path: path.to_path_buf(), error })?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| perr(e.to_string()))?;
    let schema = builder.schema().clone();
    let reader = builder.build().map_err(|e| perr(e.to_string()))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| perr(e.to_string()))?);
    }
    arrow::compute::concat_batches(&schema, &batches).map_err(|e| perr(e.to_string()))
}

/// Types equal up to list child names/nullability and string/large-string, int widths.
fn cast_target(found: &DataType, expected: &DataType) -> bool {
    use DataType::*;
    match (found, expected) {
        (a, b) if a == b => true,
        (Utf8 | LargeUtf8 | Utf8View, Utf8) => true,
        (Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32, Int32) => true,
        (Float16 | Float32 | Float64, Float32 | Float64) => true,
        (Int8 | Int16 | Int32 | Int64, Float64) => true,
        (List(a) | LargeList(a), List(b)) => cast_target(a.data_type(), b.data_type()),
        (Null, _) => true,
        _ => false,
    }
}

/// Validate a batch against a schema and cast its required columns to the contract's types.
pub fn conform(path: &Path, batch: &RecordBatch, schema: Schema) -> Result<RecordBatch, ArtifactError> {
    let mut fields: Vec<FieldRef> = batch.schema().fields().iter().cloned().collect();
    let mut columns = batch.columns().to_vec();
    for want in schema.columns() {
        let Some(idx) = fields.iter().position(|f| f.name() == want.name()) else {
            return Err(ArtifactError::MissingColumn {
                path: path.to_path_buf(),
                column: want.name().clone(),
                expected: want.data_type().to_string(),
                schema,
            });
        };
        let found = columns[idx].data_type().clone();
        if !cast_target(&found, want.data_type()) {
            return Err(ArtifactError::ColumnType {
                path: path.to_path_buf(),
                column: want.name().clone(),
                found: found.to_string(),
                expected: want.data_type().to_string(),
                schema,
            });
        }
        let casted = if &found == want.data_type() {
            columns[idx].clone()
        } else {
            // Not the safe cast: it turns a value that does not fit (5e9 into int32) into a null.
            let exact = CastOptions { safe: false, ..Default::default() };
            cast_with_options(&columns[idx], want.data_type(), &exact).map_err(|e| ArtifactError::ColumnType {
                path: path.to_path_buf(),
                column: want.name().clone(),
                found: format!("{found} ({e})"),
                expected: want.data_type().to_string(),
                schema,
            })?
        };
        if !want.is_nullable() && casted.null_count() > 0 {
            let row = (0..casted.len()).find(|&i| casted.is_null(i)).unwrap_or(0);
            return Err(ArtifactError::NullValue { path: path.to_path_buf(), column: want.name().clone(), row, schema });
        }
        check_finite(path, schema, want.name(), &casted)?;
        fields[idx] = Arc::new(want.clone());
        columns[idx] = casted;
    }
    RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)
        .map_err(|e| ArtifactError::Rows { path: path.to_path_buf(), schema, message: e.to_string() })
}

/// Column `name` of `schema` holds only finite numbers, if the schema says it must.
fn check_finite(path: &Path, schema: Schema, name: &str, col: &arrow::array::ArrayRef) -> Result<(), ArtifactError> {
    if !schema.finite_columns().contains(&name) {
        return Ok(());
    }
    match first_non_finite(col) {
        Some((row, value)) => Err(ArtifactError::NotFinite { path: path.to_path_buf(), column: name.to_string(), row, value, schema }),
        None => Ok(()),
    }
}

/// The first row of a float64 (or list of float64) column holding NaN or an infinity, with it.
fn first_non_finite(col: &arrow::array::ArrayRef) -> Option<(usize, f64)> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Float64Type;
    match col.data_type() {
        DataType::Float64 => {
            let a = col.as_primitive::<Float64Type>();
            (0..a.len()).find(|&i| !a.is_null(i) && !a.value(i).is_finite()).map(|i| (i, a.value(i)))
        }
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            let values = l.values().as_primitive_opt::<Float64Type>()?;
            let offsets = l.value_offsets();
            (0..l.len()).find_map(|row| {
                (offsets[row] as usize..offsets[row + 1] as usize).map(|j| values.value(j)).find(|v| !v.is_finite()).map(|v| (row, v))
            })
        }
        _ => None,
    }
}

/// Read and validate a Parquet artifact of the given schema.
pub fn validate_file(path: &Path, schema: Schema) -> Result<RecordBatch, ArtifactError> {
    if !path.is_file() {
        return Err(ArtifactError::Missing { path: path.to_path_buf(), what: format!("Parquet file for schema `{schema}`") });
    }
    let batch = read_batches(path)?;
    conform(path, &batch, schema)
}

/// Write typed rows (see `rows`) as a Parquet artifact of `schema`. A `table` (no required columns) takes its columns from the rows' fields.
pub fn write_rows<T: Serialize>(path: &Path, schema: Schema, rows: &[T]) -> Result<(), ArtifactError> {
    let err = |e: serde_arrow::Error| ArtifactError::Rows { path: path.to_path_buf(), schema, message: e.to_string() };
    let fields: Vec<FieldRef> = if schema.columns().is_empty() {
        use serde_arrow::schema::{SchemaLike, TracingOptions};
        Vec::<FieldRef>::from_samples(rows, TracingOptions::default()).map_err(err)?
    } else {
        schema.columns().into_iter().map(Arc::new).collect()
    };
    let batch = serde_arrow::to_record_batch(&fields, &rows).map_err(err)?;
    // Refused where it is written, naming the row, rather than when the output is committed.
    for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
        check_finite(path, schema, field.name(), col)?;
    }
    write_batch(path, &batch)
}

/// A free-form `table` whose columns come from the row type, not from sample rows, so an empty
/// table still has them (e.g. "no resets this step").
pub fn write_table<T: Serialize + DeserializeOwned>(path: &Path, rows: &[T]) -> Result<(), ArtifactError> {
    use serde_arrow::schema::{SchemaLike, TracingOptions};
    let err = |e: serde_arrow::Error| ArtifactError::Rows { path: path.to_path_buf(), schema: Schema::Table, message: e.to_string() };
    let fields = Vec::<FieldRef>::from_type::<T>(TracingOptions::default()).map_err(err)?;
    let batch = serde_arrow::to_record_batch(&fields, &rows).map_err(err)?;
    write_batch(path, &batch)
}

/// Read typed rows from the named columns of a `table` artifact (one with no fixed schema, e.g.
/// `score_mc`'s `completions`): a missing column is an error naming the file and the column; other
/// columns are ignored.
pub fn read_table_columns<T: DeserializeOwned>(path: &Path, columns: &[&str]) -> Result<Vec<T>, ArtifactError> {
    let batch = read_batches(path)?;
    let mut idx = Vec::with_capacity(columns.len());
    for c in columns {
        let i = batch.schema().index_of(c).map_err(|_| ArtifactError::MissingColumn {
            path: path.to_path_buf(),
            column: c.to_string(),
            expected: "a column of the table".into(),
            schema: Schema::Table,
        })?;
        idx.push(i);
    }
    let projected = batch.project(&idx).map_err(|e| ArtifactError::Rows { path: path.to_path_buf(), schema: Schema::Table, message: e.to_string() })?;
    serde_arrow::from_record_batch(&projected).map_err(|e| ArtifactError::Rows { path: path.to_path_buf(), schema: Schema::Table, message: e.to_string() })
}

/// Read typed rows of `schema` from a Parquet artifact (extra columns are ignored).
pub fn read_rows<T: DeserializeOwned>(path: &Path, schema: Schema) -> Result<Vec<T>, ArtifactError> {
    let batch = validate_file(path, schema)?;
    let names: Vec<String> = schema.columns().iter().map(|f| f.name().clone()).collect();
    let idx: Vec<usize> = names.iter().map(|n| batch.schema().index_of(n).expect("validated column")).collect();
    let projected = batch
        .project(&idx)
        .map_err(|e| ArtifactError::Rows { path: path.to_path_buf(), schema, message: e.to_string() })?;
    serde_arrow::from_record_batch(&projected)
        .map_err(|e| ArtifactError::Rows { path: path.to_path_buf(), schema, message: e.to_string() })
}
