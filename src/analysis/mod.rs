//! The paper's analyses as functions over score rows, for the `analysis` and `credit_benchmark`
//! stages: σ's correlation with a reference method ([`correlation`]), MC completions lost to
//! truncation ([`truncation`]), the SD of MC values against k ([`mc_sd`]), the first wrong step of
//! a trace ([`first_wrong`], [`first_wrong_arith`]) and the statistics they share ([`stats`]).

pub mod correlation;
pub mod first_wrong;
pub mod first_wrong_arith;
pub mod locate;
pub mod mc_sd;
pub mod stats;
pub mod truncation;
