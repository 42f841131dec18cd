//! What the policy update needs beyond the model: one GRPO update over a batch ([`grpo`]), the
//! clipped policy-gradient loss with per-token credit ([`loss`]), a resumable AdamW ([`adamw`]),
//! the precision and checkpointing of the forward and backward ([`step`]) and the learning-rate
//! schedule.

pub mod adamw;
pub mod grpo;
pub mod loss;
pub mod step;

/// Learning rate at optimizer step `step` (0-based) of `steps`: linear warmup, then cosine from
/// `lr` to `lr * min_ratio`.
pub fn lr_at(step: usize, steps: usize, warmup: usize, lr: f64, min_ratio: f64) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let t = (step - warmup) as f64 / (steps - warmup).max(1) as f64;
    let cos = 0.5 * (1.0 + (std::f64::consts::PI * t.min(1.0)).cos());
    lr * (min_ratio + (1.0 - min_ratio) * cos)
}
