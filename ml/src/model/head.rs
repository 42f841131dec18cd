//! The LM head over many positions, in pieces: log-probabilities of given tokens without the
//! logits of every position at once.
//!
//! Why: training and scoring need `log p(token)` at thousands of positions, and the logits behind
//! one position weigh the whole vocabulary (151,936 floats for Qwen). A piece's logits, their
//! float32 copy, the log-softmax and, under autograd, their gradients all exist at once, so the
//! size of a piece sets the memory (and on the CPU the speed: the caching allocator of
//! [`crate::cpu_cache`] keeps at most 512 MiB of freed blocks, and blocks of 1 GiB were handed back
//! to the system and faulted in page by page for every piece: an update of a Qwen-vocabulary
//! model spent most of its time in page faults, bench/cpu_alloc.sh).

use tch::{Device, Kind, Tensor};

use super::decoder::DecoderLm;
use super::error::{ModelError, Result};

/// Logits the head computes at once on `device`: `RREDCOT_HEAD_LOGITS` where the worker set it
/// ([`set_logits_at_once`]), else CPU 2^24 (64 MiB in float32, so a piece's blocks fit the CPU
/// cache and the next piece reuses them) and CUDA 2^28 (1 GiB in float32: few pieces, each of
/// which reads the whole head matrix, 467 MB in bf16 for Qwen's 1.5B shape).
pub fn logits_at_once(device: Device) -> i64 {
    #[cfg(test)]
    if let Some(n) = TEST_LOGITS_AT_ONCE.get() {
        return n;
    }
    if let Some(&n) = CHOSEN.get() {
        return n;
    }
    if device == Device::Cpu {
        1 << 24
    } else {
        1 << 28
    }
}

/// The process's `RREDCOT_HEAD_LOGITS`, set once at the worker's start.
static CHOSEN: std::sync::OnceLock<i64> = std::sync::OnceLock::new();

/// `RREDCOT_HEAD_LOGITS` (a positive number of logits; unset: the device's default): less
/// memory for a stage's head, or fewer pieces. It changes no log-probability; a training
/// step's head gradient sums its pieces in another order (the last bits of the update's
/// weights, as a thread count does).
pub fn logits_at_once_from_env() -> std::result::Result<Option<i64>, String> {
    match std::env::var("RREDCOT_HEAD_LOGITS") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<i64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("RREDCOT_HEAD_LOGITS={v:?}: expected a positive number of logits (e.g. 16777216)")),
        },
    }
}

/// Makes `n` every device's [`logits_at_once`] for this process (the first call wins).
pub fn set_logits_at_once(n: i64) {
    let _ = CHOSEN.set(n);
}

#[cfg(test)]
thread_local! {
    /// A test's [`logits_at_once`] (a tiny model's vocabulary fits one piece otherwise).
    pub(crate) static TEST_LOGITS_AT_ONCE: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
}

/// How many of `n` items, each of `per_item` logits, make a piece of at most `logits` logits
/// (at least one item).
pub fn items_per_piece(logits: i64, per_item: i64) -> i64 {
    (logits / per_item.max(1)).max(1)
}

/// `(start, len)` of the pieces of `n` items, at most `per_piece` each, as few pieces as that
/// allows and of sizes within one of each other. Even sizes, not a small remainder last: a CPU
/// product of up to 32 rows takes another kernel ([`super::cpu_matmul`]) whose sums round
/// differently, while MKL's rows come out the same whatever their number, so even pieces of
/// more than 32 rows give the bits of the head at once.
pub fn pieces(n: i64, per_piece: i64) -> Vec<(i64, i64)> {
    if n <= 0 {
        return vec![];
    }
    let count = (n + per_piece.max(1) - 1) / per_piece.max(1);
    let (base, extra) = (n / count, n % count);
    let mut start = 0;
    (0..count)
        .map(|i| {
            let len = base + i64::from(i < extra);
            start += len;
            (start - len, len)
        })
        .collect()
}

/// The pieces of `n` rows `[n, D]` for `model`'s head (each row `V` logits).
pub fn row_pieces(model: &DecoderLm, n: i64) -> Vec<(i64, i64)> {
    pieces(n, items_per_piece(logits_at_once(model.device()), model.cfg.vocab_size))
}

/// The pieces of the `l` positions of a `[b, l, D]` batch for `model`'s head (each position
/// `b × V` logits).
pub fn position_pieces(model: &DecoderLm, b: i64, l: i64) -> Vec<(i64, i64)> {
    pieces(l, items_per_piece(logits_at_once(model.device()), b * model.cfg.vocab_size))
}

/// The pieces' results joined along `dim`; `empty` where there was no piece.
fn join(mut parts: Vec<Tensor>, dim: i64, empty: impl FnOnce() -> Tensor) -> Tensor {
    match parts.len() {
        0 => empty(),
        1 => parts.pop().expect("one part"),
        _ => Tensor::cat(&parts, dim),
    }
}

/// `log_softmax(logits / temperature)` at `targets` (`logits: [.., V]`, `targets: [.., K]`
/// int64): float32 `[.., K]`.
pub fn logprobs_at(logits: &Tensor, targets: &Tensor, temperature: f64) -> Tensor {
    let logits = logits.to_kind(Kind::Float);
    // x / 1 is x: no pass over the logits where the temperature is 1.
    let scaled = if temperature == 1.0 { logits } else { logits / temperature };
    scaled.log_softmax(-1, Kind::Float).gather(-1, targets, false)
}

/// [`logprobs_at`] of `model`'s head over `hidden: [N, D]` at `targets: [N, K]` (temperature
/// 1), the head run on at most [`logits_at_once`] logits at a time: float32 `[N, K]`. Fails with
/// [`ModelError::NonFinite`] naming `row` if any logit is not finite (checked once for all
/// pieces: one read from the device).
pub fn head_logprobs(model: &DecoderLm, hidden: &Tensor, targets: &Tensor, row: usize) -> Result<Tensor> {
    let (n, _) = hidden
        .size2()
        .map_err(|e| ModelError::Request(format!("hidden states must be [rows, width]: {e}")))?;
    let mut finite: Option<Tensor> = None;
    let mut parts = Vec::new();
    for (s, len) in row_pieces(model, n) {
        let logits = model.logits(&hidden.narrow(0, s, len));
        let ok = super::error::all_finite(&logits);
        finite = Some(match finite {
            None => ok,
            Some(f) => f.logical_and(&ok),
        });
        parts.push(logprobs_at(&logits, &targets.narrow(0, s, len), 1.0));
    }
    if let Some(f) = finite {
        if f.int64_value(&[]) == 0 {
            return Err(ModelError::NonFinite { row, step: 0 });
        }
    }
    Ok(join(parts, 0, || Tensor::zeros([0, targets.size()[1]], (Kind::Float, hidden.device()))))
}

/// Log-probabilities `[B, L]` of `targets: [B, L]` given the final hidden states
/// `hidden: [B, L, D]` (logits / `temperature`), the head run on [`position_pieces`]. With
/// autograd each piece keeps only its log-softmax for the backward.
pub fn position_logprobs(model: &DecoderLm, hidden: &Tensor, targets: &Tensor, temperature: f64) -> Tensor {
    let (b, l) = (hidden.size()[0], hidden.size()[1]);
    let parts = position_pieces(model, b, l)
        .into_iter()
        .map(|(s, n)| position_piece(model, hidden, targets, temperature, s, n))
        .collect();
    join(parts, 1, || Tensor::zeros([b, 0], (Kind::Float, hidden.device())))
}

/// One piece of [`position_logprobs`]: positions `s..s + n`, `[B, n]`.
/// In float32 the temperature divides the hidden states, not the logits: the head is linear
/// without a bias, so `head(h / T) = head(h) / T` up to rounding (~1e-7), and `[B, n, D]` is a
/// few hundredth of `[B, n, V]` (the division over the logits and its backward took a sixth of a
/// CPU update's time with Qwen's vocabulary). In bfloat16 `h / T` would be rounded to 8 bits
/// before the product, so there the float32 logits are divided as before.
pub fn position_piece(model: &DecoderLm, hidden: &Tensor, targets: &Tensor, temperature: f64, s: i64, n: i64) -> Tensor {
    let h = hidden.narrow(1, s, n);
    let targets = targets.narrow(1, s, n).unsqueeze(-1);
    let lp = if temperature != 1.0 && h.kind() == Kind::Float {
        logprobs_at(&model.logits(&(h / temperature)), &targets, 1.0)
    } else {
        logprobs_at(&model.logits(&h), &targets, temperature)
    };
    lp.squeeze_dim(-1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::score::tests::tiny_model;
    use crate::model::Arch;

    #[test]
    fn pieces_cover_every_item_once_in_order() {
        assert_eq!(pieces(10, 4), [(0, 4), (4, 3), (7, 3)]);
        assert_eq!(pieces(12, 4), [(0, 4), (4, 4), (8, 4)]);
        assert_eq!(pieces(3, 5), [(0, 3)]);
        assert_eq!(pieces(5, 1), [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]);
        assert_eq!(pieces(221, 110), [(0, 74), (74, 74), (148, 73)]);
        assert!(pieces(0, 5).is_empty());
        assert_eq!(items_per_piece(100, 30), 3);
        assert_eq!(items_per_piece(10, 30), 1, "a piece holds at least one item");
        assert_eq!(logits_at_once(Device::Cpu), 1 << 24);
    }

    /// The head in pieces gives the log-probabilities of the whole head at once, in every
    /// precision, whatever the piece size (one position, a few, all).
    #[test]
    fn the_head_in_pieces_equals_the_head_at_once() {
        let mut m = tiny_model(Arch::Qwen2, 3);
        for kind in [Kind::Float, Kind::BFloat16] {
            m.set_kind(kind);
            let (b, l, v) = (3i64, 7i64, m.cfg.vocab_size);
            let hidden = Tensor::randn([b, l, m.cfg.hidden_size], (kind, Device::Cpu));
            let targets = Tensor::randint(v, [b, l], (Kind::Int64, Device::Cpu));
            for t in [1.0, 0.7] {
                let whole = (m.logits(&hidden).to_kind(Kind::Float) / t).log_softmax(-1, Kind::Float);
                let want = whole.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1);
                for logits in [1, 2 * b * v, 3 * b * v, 1 << 30] {
                    TEST_LOGITS_AT_ONCE.set(Some(logits));
                    let got = position_logprobs(&m, &hidden, &targets, t);
                    TEST_LOGITS_AT_ONCE.set(None);
                    assert_eq!(got.size(), [b, l]);
                    let diff = (&got - &want).abs().max().double_value(&[]);
                    assert!(diff < 1e-5, "{kind:?} T={t} piece of {logits} logits: {diff}");
                }
            }
            // Rows [N, D] with two targets each, in pieces of 1, 2 and all rows.
            let flat = hidden.view([b * l, -1]);
            let two = Tensor::randint(v, [b * l, 2], (Kind::Int64, Device::Cpu));
            let want = m.logits(&flat).to_kind(Kind::Float).log_softmax(-1, Kind::Float).gather(-1, &two, false);
            for logits in [1, 2 * v, 1 << 30] {
                TEST_LOGITS_AT_ONCE.set(Some(logits));
                let got = head_logprobs(&m, &flat, &two, 0).unwrap();
                TEST_LOGITS_AT_ONCE.set(None);
                assert_eq!(got.size(), [b * l, 2]);
                let diff = (&got - &want).abs().max().double_value(&[]);
                assert!(diff < 1e-5, "{kind:?} rows in pieces of {logits} logits: {diff}");
            }
        }
    }

    /// A non-finite logit in any piece fails the whole call, naming the caller's row.
    #[test]
    fn a_non_finite_logit_in_any_piece_names_the_row() {
        let m = tiny_model(Arch::Qwen2, 4);
        let v = m.cfg.vocab_size;
        // Pieces of 4 rows.
        let rows = 11;
        let hidden = Tensor::randn([rows, m.cfg.hidden_size], (Kind::Float, Device::Cpu));
        let targets = Tensor::zeros([rows, 1], (Kind::Int64, Device::Cpu));
        TEST_LOGITS_AT_ONCE.set(Some(4 * v));
        assert_eq!(row_pieces(&m, rows).len(), 3);
        assert!(head_logprobs(&m, &hidden, &targets, 9).is_ok());
        for bad_row in [0, 5, rows - 1] {
            for bad in [f64::NAN, f64::INFINITY] {
                let h = hidden.copy();
                let _ = h.get(bad_row).fill_(bad);
                assert!(
                    matches!(head_logprobs(&m, &h, &targets, 9), Err(ModelError::NonFinite { row: 9, step: 0 })),
                    "{bad} hidden state at row {bad_row} of {rows}"
                );
            }
        }
        TEST_LOGITS_AT_ONCE.set(None);
    }
}
