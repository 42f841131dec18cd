//! What the policy update needs beyond the model: one GRPO update over a batch ([`grpo`]), the
//! clipped policy-gradient loss with per-token credit ([`loss`]), a resumable AdamW ([`adamw`]),
//! the precision and checkpointing of the forward and backward ([`step`]) and the learning-rate
//! schedule.

pub mod adamw;
pub mod grpo;
pub mod loss;
pub mod step;

/// The learning-rate schedule and AdamW settings both trainers (`bootstrap_sft`, `update*`) take,
/// as their stage params name them.
pub struct OptimizerParams {
    pub lr: f64,
    pub min_lr_ratio: f64,
    pub weight_decay: f64,
    /// 0 = no clipping.
    pub grad_clip: f64,
    /// beta1, beta2, eps; `None` where the stage uses torch's defaults.
    pub adam: Option<(f64, f64, f64)>,
}

impl OptimizerParams {
    /// What would not train, naming the param: a learning rate that is not positive (gradient
    /// ascent, or nothing), a decay or clip below 0, a floor outside [0, 1], betas outside
    /// [0, 1). torch refuses some of these only inside the first step, behind a C++ backtrace.
    pub fn check(&self) -> std::result::Result<(), String> {
        let finite = |name: &str, v: f64| if v.is_finite() { Ok(v) } else { Err(format!("param {name} = {v} is not finite")) };
        if finite("lr", self.lr)? <= 0.0 {
            return Err(format!("param lr = {} must be positive", self.lr));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(format!("param min_lr_ratio = {} is outside [0, 1]", self.min_lr_ratio));
        }
        for (name, v) in [("weight_decay", self.weight_decay), ("grad_clip", self.grad_clip)] {
            if finite(name, v)? < 0.0 {
                return Err(format!("param {name} = {v} is negative"));
            }
        }
        if let Some((beta1, beta2, eps)) = self.adam {
            for (name, v) in [("adam_beta1", beta1), ("adam_beta2", beta2)] {
                if !(0.0..1.0).contains(&v) {
                    return Err(format!("param {name} = {v} is outside [0, 1)"));
                }
            }
            if finite("adam_eps", eps)? <= 0.0 {
                return Err(format!("param adam_eps = {eps} must be positive"));
            }
        }
        Ok(())
    }
}

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
