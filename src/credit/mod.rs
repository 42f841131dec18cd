//! Credit assignment that needs no model: how a trace is cut into segments, how value curves
//! become the redistribution σ, and each token's credit for the loss ([`builder`]). The
//! model-side parts (rollouts, scoring with the policy) are the `rollout` and `score_sigma`
//! stages in `rredcot-ml`.

pub mod builder;
pub mod progress;
pub mod segmentation;
pub mod sigma;
pub mod thinking;
pub mod weights;
