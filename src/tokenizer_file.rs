//! Loading a tokenizer for the stages that read text as tokens without the model (segment,
//! filter, locate_errors, report, credit_benchmark): a `tokenizer.json`, or a checkpoint directory
//! holding one.

use std::path::Path;

use anyhow::anyhow;
use tokenizers::Tokenizer;

/// Load a `tokenizer.json` (a file, or a directory holding one).
pub fn load(path: &Path) -> anyhow::Result<Tokenizer> {
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    if file
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        anyhow::bail!(
            "{}: a GGUF file keeps its tokenizer in metadata only the model stages read; give this input a directory with the model's tokenizer.json (e.g. an `eval`/`rollout` output checkpoint or the original Hugging Face repo)",
            file.display()
        );
    }
    Tokenizer::from_file(&file)
        .map_err(|e| anyhow!("{}: not a loadable tokenizer: {e}", file.display()))
}
