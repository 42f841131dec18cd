//! AdamW (decoupled weight decay, as `torch.optim.AdamW`) whose state can be saved and restored,
//! so each unrolled training step can run in its own process and a resumed run continues with the
//! exact moments. (tch's built-in optimizers cannot export their state.)
//!
//! State directory: `moments.safetensors` (`m.<param>`, `v.<param>`) and `adamw.json`
//! (hyper-parameters and the step count).
//!
//! Device discipline: the moments live on the parameters' device (restored ones are moved there
//! on load) and are float32 whatever the parameter dtype, so a bfloat16 model keeps exact moments.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

pub struct AdamW {
    pub cfg: AdamWConfig,
    /// Optimizer steps taken so far (bias correction).
    pub t: i64,
    m: BTreeMap<String, Tensor>,
    v: BTreeMap<String, Tensor>,
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    cfg: AdamWConfig,
    t: i64,
}

const MOMENTS: &str = "moments.safetensors";
const STATE: &str = "adamw.json";

impl AdamW {
    pub fn new(cfg: AdamWConfig) -> AdamW {
        AdamW { cfg, t: 0, m: BTreeMap::new(), v: BTreeMap::new() }
    }

    /// Restores the state saved in `dir` onto `device` (the parameters' device), or starts fresh
    /// when `dir` holds none (the first step).
    pub fn load_or_new(dir: &Path, cfg: AdamWConfig, device: Device) -> Result<AdamW> {
        let state = dir.join(STATE);
        if !state.exists() {
            return Ok(AdamW::new(cfg));
        }
        let s: StateFile = serde_json::from_slice(&std::fs::read(&state).with_context(|| state.display().to_string())?)
            .with_context(|| format!("{}: not an optimizer state", state.display()))?;
        let mut opt = AdamW::new(cfg);
        opt.t = s.t;
        let moments = dir.join(MOMENTS);
        // Mapped, each moment copied out onto `device` in turn: tch's read_safetensors read the
        // whole file into memory and then made every tensor on the host (twice the state's size,
        // 8 bytes per parameter each time), and left them on the CPU (the step-2 crash on CUDA).
        let bytes = crate::model::weights::map_file(&moments)?;
        let st = safetensors::SafeTensors::deserialize(&bytes).with_context(|| format!("{}: not a safetensors file", moments.display()))?;
        let restored = st.tensors().into_iter().map(|(name, view)| {
            let t = crate::model::weights::host_tensor(&moments, &name, &view)?;
            anyhow::Ok((name, t.to_device(device).to_kind(Kind::Float)))
        });
        for r in restored {
            let (name, t) = r?;
            if let Some(p) = name.strip_prefix("m.") {
                opt.m.insert(p.to_string(), t);
            } else if let Some(p) = name.strip_prefix("v.") {
                opt.v.insert(p.to_string(), t);
            }
        }
        Ok(opt)
    }

    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let named: Vec<(String, Tensor)> = self
            .m
            .iter()
            .map(|(k, t)| (format!("m.{k}"), t.shallow_clone()))
            .chain(self.v.iter().map(|(k, t)| (format!("v.{k}"), t.shallow_clone())))
            .collect();
        Tensor::write_safetensors(&named, dir.join(MOMENTS))?;
        let state = StateFile { cfg: self.cfg, t: self.t };
        std::fs::write(dir.join(STATE), serde_json::to_string_pretty(&state)?)?;
        Ok(())
    }

    /// One update of every parameter that has a gradient, at learning rate `lr`.
    pub fn step(&mut self, params: &[(String, Tensor)], lr: f64) -> Result<()> {
        self.t += 1;
        let c = self.cfg;
        let bc1 = 1.0 - c.beta1.powi(self.t as i32);
        let bc2 = 1.0 - c.beta2.powi(self.t as i32);
        tch::no_grad(|| -> Result<()> {
            for (name, p) in params {
                let g = p.grad();
                if !g.defined() {
                    continue;
                }
                let fresh = || Tensor::zeros(p.size(), (Kind::Float, p.device()));
                let m = self.m.entry(name.clone()).or_insert_with(fresh);
                let v = self.v.entry(name.clone()).or_insert_with(fresh);
                if m.size() != p.size() {
                    bail!("optimizer state for `{name}` has shape {:?}, the parameter {:?} (another model?)", m.size(), p.size());
                }
                if m.device() != p.device() || v.device() != p.device() {
                    bail!(
                        "optimizer state for `{name}` is on {:?}, the parameter on {:?}",
                        m.device(),
                        p.device()
                    );
                }
                let g = g.to_kind(Kind::Float);
                let mut p = p.shallow_clone();
                let _ = p.g_mul_scalar_(1.0 - lr * c.weight_decay);
                let _ = m.g_mul_scalar_(c.beta1).g_add_(&(&g * (1.0 - c.beta1)));
                let _ = v.g_mul_scalar_(c.beta2).g_add_(&(&g * &g * (1.0 - c.beta2)));
                let denom = (&*v / bc2).sqrt() + c.eps;
                let _ = p.g_sub_(&((&*m / bc1) / denom * lr).to_kind(p.kind()));
            }
            Ok(())
        })
    }
}

/// Global L2 norm of the gradients; the first parameter whose gradient is not finite is an error.
pub fn grad_norm(params: &[(String, Tensor)]) -> std::result::Result<f64, String> {
    let mut sq = 0.0;
    for (name, p) in params {
        let g = p.grad();
        if !g.defined() {
            continue;
        }
        let n = g.norm().double_value(&[]);
        if !n.is_finite() {
            return Err(name.clone());
        }
        sq += n * n;
    }
    Ok(sq.sqrt())
}

/// Scales all gradients so their global norm is at most `max_norm` (as `clip_grad_norm_`).
pub fn clip_grads(params: &[(String, Tensor)], norm: f64, max_norm: f64) {
    if max_norm <= 0.0 || norm <= max_norm {
        return;
    }
    let scale = max_norm / (norm + 1e-6);
    tch::no_grad(|| {
        for (_, p) in params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.g_mul_scalar_(scale);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Device};

    fn cfg() -> AdamWConfig {
        AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }

    /// A toy quadratic: our AdamW, saved and restored mid-way, follows torch's nn::AdamW (tch)
    /// step for step.
    #[test]
    fn matches_torch_adamw_across_a_save_and_restore() {
        let target = Tensor::from_slice(&[1.0f32, -2.0, 3.0]);
        let run_ours = |steps: usize, dir: &Path| {
            let mut p = Tensor::zeros([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
            let params = vec![("w".to_string(), p.shallow_clone())];
            let mut opt = AdamW::new(cfg());
            for s in 0..steps {
                if s == steps / 2 {
                    opt.save(dir).unwrap();
                    opt = AdamW::load_or_new(dir, cfg(), Device::Cpu).unwrap();
                }
                p.zero_grad();
                (&p - &target).square().sum(Kind::Float).backward();
                opt.step(&params, 0.1).unwrap();
            }
            p.detach()
        };
        let dir = tempfile::tempdir().unwrap();
        let ours = run_ours(20, dir.path());
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let p = vs.root().zeros("w", &[3]);
        use tch::nn::OptimizerConfig;
        let mut opt = tch::nn::AdamW { beta1: 0.9, beta2: 0.999, wd: 0.01, eps: 1e-8, amsgrad: false }.build(&vs, 0.1).unwrap();
        for _ in 0..20 {
            opt.zero_grad();
            (&p - &target).square().sum(Kind::Float).backward();
            opt.step();
        }
        let diff = (ours - p.detach()).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "AdamW differs from torch by {diff}");
    }

    /// Moments are float32 on the parameter's device, also for a bfloat16 parameter and after
    /// a restore (on CUDA the restored moments were left on the CPU: issue 17's step-2 crash;
    /// `tests/gpu.rs` runs this on a GPU).
    #[test]
    fn restored_moments_are_f32_on_the_given_device() {
        let dir = tempfile::tempdir().unwrap();
        let p = Tensor::ones([4], (Kind::BFloat16, Device::Cpu)).set_requires_grad(true);
        let params = vec![("w".to_string(), p.shallow_clone())];
        let mut opt = AdamW::new(cfg());
        (&p * 3.0).sum(Kind::Float).backward();
        opt.step(&params, 0.1).unwrap();
        assert_eq!(opt.m["w"].kind(), Kind::Float);
        assert_eq!(p.kind(), Kind::BFloat16);
        assert!(p.double_value(&[0]) < 1.0, "the parameter moved");
        opt.save(dir.path()).unwrap();
        let back = AdamW::load_or_new(dir.path(), cfg(), Device::Cpu).unwrap();
        assert_eq!(back.t, 1);
        for t in [&back.m["w"], &back.v["w"]] {
            assert_eq!((t.kind(), t.device()), (Kind::Float, Device::Cpu));
        }
        assert!(back.v["w"].equal(&opt.v["w"]));
    }

    #[test]
    fn a_non_finite_gradient_is_named() {
        let p = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        (&p * f64::NAN).sum(Kind::Float).backward();
        assert_eq!(grad_norm(&[("layer.0.w".into(), p)]), Err("layer.0.w".to_string()));
    }
}
