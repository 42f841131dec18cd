//! rredcot-ml: everything that links libtorch.
//!
//! - [`model`]: tch decoder LMs (Qwen2, Qwen3, Llama), weights, tokenizer, generation, scoring
//! - [`traces`]: a trace as the policy sees it (prompt ids, rollout/segment joins, y* targets)
//! - [`sampling`]: sampling completions for the stages that sample (prompts, per-row seeds,
//!   batching, the context clamp, the answer after the chain of thought), through the model core
//!   or an OpenAI-compatible engine ([`sampling::http`])
//! - [`train`]: the policy-gradient loss with per-token credit, resumable AdamW, LR schedule
//! - [`stages`]: builtin stages that need the model; [`stages::FULL_RUNTIME`] is what
//!   `rredcot-worker` runs (the engine binary `rredcot` hands those instances to it)
//! - [`serve`]: `rredcot serve`, an OpenAI-compatible chat completions server over the model core
//! - [`aten_kernels`]: which CPU kernels ATen runs (in every ML stage's run record)

pub mod aten_kernels;
pub mod cpu_cache;
pub mod model;
pub mod sampling;
pub mod serve;
pub mod stages;
pub mod traces;
pub mod train;

#[cfg(test)]
mod device_discipline;
