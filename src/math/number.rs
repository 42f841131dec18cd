//! Scalar numbers of the math verifier: exact `i128` rationals with an `f64` shadow.
//!
//! Owns arithmetic only (checked, overflow falls back to floating point); knows nothing of LaTeX,
//! answer extraction or comparison policy.

use std::cmp::Ordering;

/// An exact rational `num/den` in lowest terms with `den > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rational {
    num: i128,
    den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Rational {
    /// `num/den` reduced; `None` when `den == 0` or on overflow.
    pub fn new(num: i128, den: i128) -> Option<Self> {
        if den == 0 || num == i128::MIN || den == i128::MIN {
            return None;
        }
        let g = gcd(num, den).max(1);
        let (mut n, mut d) = (num / g, den / g);
        if d < 0 {
            n = -n;
            d = -d;
        }
        Some(Self { num: n, den: d })
    }

    pub fn int(n: i128) -> Self {
        Self { num: n, den: 1 }
    }

    pub fn numer(&self) -> i128 {
        self.num
    }

    pub fn denom(&self) -> i128 {
        self.den
    }

    pub fn is_integer(&self) -> bool {
        self.den == 1
    }

    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    pub fn checked_add(self, o: Self) -> Option<Self> {
        let n = self
            .num
            .checked_mul(o.den)?
            .checked_add(o.num.checked_mul(self.den)?)?;
        Self::new(n, self.den.checked_mul(o.den)?)
    }

    pub fn negated(self) -> Self {
        Self {
            num: -self.num,
            den: self.den,
        }
    }

    pub fn checked_sub(self, o: Self) -> Option<Self> {
        self.checked_add(o.negated())
    }

    pub fn checked_mul(self, o: Self) -> Option<Self> {
        Self::new(self.num.checked_mul(o.num)?, self.den.checked_mul(o.den)?)
    }

    pub fn checked_div(self, o: Self) -> Option<Self> {
        Self::new(self.num.checked_mul(o.den)?, self.den.checked_mul(o.num)?)
    }

    /// Integer power, `None` on overflow, division by zero or |exp| > 512.
    pub fn powi(self, exp: i128) -> Option<Self> {
        if exp.abs() > 512 {
            return None;
        }
        let mut acc = Self::int(1);
        for _ in 0..exp.abs() {
            acc = acc.checked_mul(self)?;
        }
        if exp < 0 {
            Self::int(1).checked_div(acc)
        } else {
            Some(acc)
        }
    }

    /// Exact `n`-th root when numerator and denominator are perfect powers.
    pub fn root(self, n: u32) -> Option<Self> {
        if n == 0 || (self.num < 0 && n.is_multiple_of(2)) {
            return None;
        }
        let r = |x: i128| -> Option<i128> {
            let neg = x < 0;
            let a = x.unsigned_abs();
            let guess = (a as f64).powf(1.0 / n as f64).round() as u128;
            for c in guess.saturating_sub(1)..=guess + 1 {
                if c.checked_pow(n) == Some(a) {
                    let c = i128::try_from(c).ok()?;
                    return Some(if neg { -c } else { c });
                }
            }
            None
        };
        Self::new(r(self.num)?, r(self.den)?)
    }

    /// Round half away from zero to `digits` decimal places, as a scaled integer.
    pub fn round_scaled(self, digits: u32) -> Option<i128> {
        let scale = 10i128.checked_pow(digits)?;
        let n = self.num.checked_mul(scale)?;
        let q = n.div_euclid(self.den);
        let r = n.rem_euclid(self.den);
        // q <= n/den < q+1; round half away from zero.
        let twice = r.checked_mul(2)?;
        Some(match twice.cmp(&self.den) {
            Ordering::Greater => q + 1,
            Ordering::Less => q,
            Ordering::Equal => {
                if n >= 0 {
                    q + 1
                } else {
                    q
                }
            }
        })
    }

    /// Parse a plain decimal literal such as `-12.50` exactly.
    pub fn from_decimal(s: &str) -> Option<Self> {
        let (neg, body) = match s.strip_prefix('-') {
            Some(b) => (true, b),
            None => (false, s),
        };
        let (ip, fp) = body.split_once('.').unwrap_or((body, ""));
        if ip.is_empty() && fp.is_empty() {
            return None;
        }
        if !ip.bytes().all(|b| b.is_ascii_digit()) || !fp.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = format!("{ip}{fp}");
        let digits = digits.trim_start_matches('0');
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        let den = 10i128.checked_pow(u32::try_from(fp.len()).ok()?)?;
        Self::new(if neg { -mantissa } else { mantissa }, den)
    }
}

/// How a number was written, which decides the comparison rule (math-verify semantics):
/// a bare float literal is compared after rounding, two bare integers ignore a percent sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bare integer literal (or `\frac` of integers that reduces to one).
    Integer,
    /// A bare `\frac{a}{b}` of integer literals.
    Fraction,
    /// A bare decimal literal such as `3.75`.
    Float,
    /// Anything computed: sums, products, roots, `\pi`, powers.
    Expr,
}

/// A real number: exact when possible, always with an `f64` approximation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num {
    pub exact: Option<Rational>,
    pub approx: f64,
    pub kind: Kind,
    /// Written with a trailing `%`; `exact`/`approx` hold the value *before* dividing by 100.
    pub percent: bool,
}

impl Num {
    pub fn rational(r: Rational, kind: Kind) -> Self {
        Self {
            exact: Some(r),
            approx: r.to_f64(),
            kind,
            percent: false,
        }
    }

    pub fn approx(x: f64) -> Self {
        Self {
            exact: None,
            approx: x,
            kind: Kind::Expr,
            percent: false,
        }
    }

    /// The value with a percent sign applied (x% = x/100), as an expression.
    pub fn resolved(self) -> Self {
        if !self.percent {
            return self;
        }
        let hundred = Rational::int(100);
        let exact = self.exact.and_then(|r| r.checked_div(hundred));
        Self {
            exact,
            approx: self.approx / 100.0,
            kind: Kind::Expr,
            percent: false,
        }
    }

    fn combine(
        a: Self,
        b: Self,
        exact: impl Fn(Rational, Rational) -> Option<Rational>,
        approx: impl Fn(f64, f64) -> f64,
    ) -> Self {
        let (a, b) = (a.resolved(), b.resolved());
        match (a.exact, b.exact) {
            (Some(x), Some(y)) => match exact(x, y) {
                Some(r) => Self::rational(r, Kind::Expr),
                None => Self::approx(approx(a.approx, b.approx)),
            },
            _ => Self::approx(approx(a.approx, b.approx)),
        }
    }
}

impl std::ops::Add for Num {
    type Output = Num;

    fn add(self, o: Self) -> Self {
        Self::combine(self, o, Rational::checked_add, |x, y| x + y)
    }
}

impl std::ops::Sub for Num {
    type Output = Num;

    fn sub(self, o: Self) -> Self {
        Self::combine(self, o, Rational::checked_sub, |x, y| x - y)
    }
}

impl std::ops::Mul for Num {
    type Output = Num;

    fn mul(self, o: Self) -> Self {
        Self::combine(self, o, Rational::checked_mul, |x, y| x * y)
    }
}

impl std::ops::Div for Num {
    type Output = Num;

    fn div(self, o: Self) -> Self {
        Self::combine(self, o, Rational::checked_div, |x, y| x / y)
    }
}

/// Negation keeps a bare literal bare (sympy folds `-5` into `Integer(-5)`).
impl std::ops::Neg for Num {
    type Output = Num;

    fn neg(self) -> Self {
        Self {
            exact: self.exact.map(Rational::negated),
            approx: -self.approx,
            ..self
        }
    }
}

impl Num {
    pub fn pow(self, e: Self) -> Self {
        let (b, e) = (self.resolved(), e.resolved());
        if let (Some(x), Some(y)) = (b.exact, e.exact) {
            if y.is_integer() {
                if let Some(r) = x.powi(y.numer()) {
                    return Self::rational(r, Kind::Expr);
                }
            } else if let Ok(q) = u32::try_from(y.denom()) {
                if let Some(r) = x.root(q).and_then(|r| r.powi(y.numer())) {
                    return Self::rational(r, Kind::Expr);
                }
            }
        }
        Self::approx(b.approx.powf(e.approx))
    }

    /// `n`-th root (`\sqrt[n]{x}`), exact for perfect powers.
    pub fn root(self, n: Self) -> Self {
        let (x, n) = (self.resolved(), n.resolved());
        if let (Some(r), Some(k)) = (x.exact, n.exact) {
            if k.is_integer() {
                if let Ok(k) = u32::try_from(k.numer()) {
                    if let Some(v) = r.root(k) {
                        return Self::rational(v, Kind::Expr);
                    }
                }
            }
        }
        if n.approx == 2.0 {
            Self::approx(x.approx.sqrt())
        } else {
            Self::approx(x.approx.powf(1.0 / n.approx))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rational_arithmetic_is_exact_and_reduced() {
        let a = Rational::new(2, 4).unwrap();
        assert_eq!((a.numer(), a.denom()), (1, 2));
        let s = a.checked_add(Rational::new(1, 3).unwrap()).unwrap();
        assert_eq!((s.numer(), s.denom()), (5, 6));
        assert!(Rational::new(1, 0).is_none());
        assert!(Rational::int(i128::MAX)
            .checked_mul(Rational::int(2))
            .is_none());
    }

    #[test]
    fn decimal_literals_are_exact() {
        let r = Rational::from_decimal("-12.50").unwrap();
        assert_eq!((r.numer(), r.denom()), (-25, 2));
        assert_eq!(Rational::from_decimal(".5").unwrap().denom(), 2);
        assert!(Rational::from_decimal("1.2.3").is_none());
    }

    #[test]
    fn roots_and_powers() {
        assert_eq!(Rational::new(9, 4).unwrap().root(2), Rational::new(3, 2));
        assert_eq!(Rational::int(2).root(2), None);
        assert_eq!(Rational::int(2).powi(10), Some(Rational::int(1024)));
        assert_eq!(Rational::int(2).powi(-1), Rational::new(1, 2));
        let s = Num::rational(Rational::int(18), Kind::Integer)
            .root(Num::rational(Rational::int(2), Kind::Integer));
        assert!((s.approx - 18f64.sqrt()).abs() < 1e-12 && s.exact.is_none());
    }

    #[test]
    fn rounding_half_away_from_zero() {
        let r = Rational::from_decimal("3.7500001").unwrap();
        assert_eq!(r.round_scaled(6), Some(3_750_000));
        assert_eq!(Rational::new(1, 3).unwrap().round_scaled(6), Some(333_333));
        assert_eq!(
            Rational::from_decimal("-0.0000005")
                .unwrap()
                .round_scaled(6),
            Some(-1)
        );
    }

    #[test]
    fn percent_resolves_to_hundredths() {
        let mut n = Num::rational(Rational::int(25), Kind::Integer);
        n.percent = true;
        assert_eq!(n.resolved().exact, Rational::new(1, 4));
    }
}
