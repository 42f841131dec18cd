//! Parse a normalized answer string into an [`Answer`]: a number, interval, tuple or set.
//!
//! A small recursive-descent parser over LaTeX-ish tokens: integers (with thousands separators),
//! decimals, `\frac`, mixed numbers, `\sqrt[n]{}`, `\pi`, `\infty`, `+ - * / ^ × ÷ \cdot \times
//! \div`, implicit multiplication, `%`, parentheses/brackets (intervals and tuples) and `\{..\}`
//! sets. Arithmetic is exact over rationals where possible. Single-letter variables (`n`, `x`,
//! `\theta`) and the functions `sqrt`, `sin`, `cos`, `tan`, `ln`, `log`, `exp` (LaTeX or plain)
//! are read when an [`Env`] gives each variable a value ([`parse_answer_in`]); symbolic answers
//! are compared by evaluating both sides at a few points. Longer words are not variables (a
//! sentence does not parse). Knows nothing of responses or of the comparison policy; apply
//! [`crate::math::normalize::normalize`] first.

use std::collections::BTreeMap;

use super::normalize::closing_brace;
use super::number::{Kind, Num, Rational};
use thiserror::Error;

/// Values of the variables of a symbolic answer, by name (`n`, `theta`).
pub type Env = BTreeMap<String, f64>;

/// Function names read as functions, in LaTeX (`\sin`) or plain text (`sqrt(3)`).
const FUNCTIONS: &[&str] = &[
    "sqrt", "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "ln", "log",
    "exp", "pi",
];

/// Greek-letter commands read as variables, and the physics letters `\hbar` and `\ell`.
pub(crate) const GREEK: &[&str] = &[
    "hbar",
    "ell",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "theta",
    "lambda",
    "mu",
    "phi",
    "varphi",
    "omega",
    "sigma",
    "tau",
    "rho",
    "epsilon",
    "varepsilon",
    "psi",
    "eta",
    "xi",
    "zeta",
    "kappa",
    "nu",
    "chi",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Sigma",
    "Phi",
    "Psi",
    "Omega",
];

/// Accents on one letter, each read as a variable of its own (`\dot{x}_0` is not `x_0`).
const ACCENTS: &[&str] = &["dot", "ddot", "hat", "bar", "vec", "tilde"];

/// Commands whose braced argument is text, never letters to multiply (see [`letter_products`]).
const TEXT_COMMANDS: &[&str] = &["text", "textbf", "mathrm", "mathbf", "operatorname", "mbox"];

/// A parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Number(Num),
    /// `[a, b)` etc.; `(a, b)` with `a < b` is read as an open interval (as math-verify does).
    Interval {
        lo: Num,
        hi: Num,
        left_open: bool,
        right_open: bool,
    },
    /// Ordered: `(a, b, c)`, `[a, b, c]`, `(b, a)` with `b > a`.
    Tuple(Vec<Answer>),
    /// Unordered: `\{a, b\}` or a bare `a, b`.
    Set(Vec<Answer>),
    /// A relation that is no set of one unknown (`s^2 \le 8r^2`, `x + y > 3`, `\sin x > 0`) at
    /// one point of its variables: `diff` is the smaller side minus the larger one, so that it
    /// reads `diff < 0` (`strict`) or `diff \le 0`. Relations are equal where their differences
    /// are: `a \le b` is `b \ge a` and `a - b \le 0`, as math-verify compares them.
    Relation { diff: Num, strict: bool },
}

/// Why an answer string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("empty answer")]
    Empty,
    #[error("unexpected {found:?} at token {pos} in {input:?}")]
    Unexpected {
        input: String,
        pos: usize,
        found: String,
    },
    #[error("unsupported symbol {symbol:?} in {input:?}")]
    Symbol { input: String, symbol: String },
    #[error("expression nested too deeply in {input:?}")]
    TooDeep { input: String },
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(String),
    Cmd(String),
    Letter(char),
    /// A run of two or more letters that is not a function name (a word of a sentence).
    Word(String),
    /// A letter or Greek variable with a subscript (`x_0`, `E_{1}`, `\omega_{n}`), named
    /// `x_0`, `E_1`, `omega_n`.
    Var(String),
    Sym(char),
    /// `\{` and `\}`
    SetOpen,
    SetClose,
}

fn tokenize(s: &str) -> Vec<Tok> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            } else if i + 1 < chars.len() && chars[i] == '.' && matches!(chars[i + 1], '/' | '*' | ')') {
                // A float written as code writes it (`-1./3` in Minerva's answers): `1.` is 1.
                i += 1;
            }
            out.push(Tok::Num(chars[start..i].iter().collect()));
        } else if c == '\\' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i].is_ascii_alphabetic() {
                i += 1;
            }
            if i == start {
                match chars.get(i) {
                    Some('{') => out.push(Tok::SetOpen),
                    Some('}') => out.push(Tok::SetClose),
                    Some(&o) => out.push(Tok::Sym(o)),
                    None => {}
                }
                i += 1;
            } else {
                let mut name: String = chars[start..i].iter().collect();
                let accented = ACCENTS.contains(&name.as_str()).then(|| accent_argument(&chars, &mut i)).flatten();
                if let Some(base) = &accented {
                    name = format!("{base}{name}");
                }
                // Only a variable takes a subscript into its name (`\log_2` keeps its base).
                let variable = accented.is_some() || GREEK.contains(&name.as_str());
                match variable.then(|| subscript(&chars, &mut i)).flatten() {
                    Some(sub) => out.push(Tok::Var(format!("{name}_{sub}"))),
                    None if accented.is_some() => out.push(Tok::Var(name)),
                    None => out.push(Tok::Cmd(name)),
                }
            }
        } else if c.is_alphabetic() {
            let start = i;
            while i < chars.len() && chars[i].is_alphabetic() {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if FUNCTIONS.contains(&word.as_str()) {
                out.push(Tok::Cmd(word));
            } else if i - start == 1 {
                match subscript(&chars, &mut i) {
                    Some(sub) => out.push(Tok::Var(format!("{c}_{sub}"))),
                    None => out.push(Tok::Letter(c)),
                }
            } else {
                out.push(Tok::Word(word));
            }
        } else {
            out.push(Tok::Sym(c));
            i += 1;
        }
    }
    out
}

/// The one letter an accent sits on (`{x}`, ` x`, `{\omega}`) as a name (`x`, `omega`), moving
/// `i` past it; `None` (and `i` unmoved) for anything else (`\bar{AB}`).
fn accent_argument(chars: &[char], i: &mut usize) -> Option<String> {
    let mut j = *i;
    while chars.get(j).is_some_and(|c| c.is_whitespace()) {
        j += 1;
    }
    let braced = chars.get(j) == Some(&'{');
    if braced {
        j += 1;
    }
    let start = j;
    if chars.get(j) == Some(&'\\') {
        j += 1;
    }
    while chars.get(j).is_some_and(char::is_ascii_alphabetic) {
        j += 1;
    }
    let name: String = chars[start..j].iter().collect();
    let name = match name.strip_prefix('\\') {
        Some(g) if GREEK.contains(&g) => g.to_string(),
        None if name.len() == 1 => name,
        _ => return None,
    };
    if braced {
        if chars.get(j) != Some(&'}') {
            return None;
        }
        j += 1;
    }
    *i = j;
    Some(name)
}

/// The subscript at `chars[*i]` (`_0`, `_{10}`, `_{\odot}`, `_{\text {red}}`) as a name part
/// (`0`, `10`, `odot`, `red`), moving `i` past it; `None` (and `i` unmoved) without one.
fn subscript(chars: &[char], i: &mut usize) -> Option<String> {
    if chars.get(*i) != Some(&'_') {
        return None;
    }
    let (body, end) = match chars.get(*i + 1)? {
        '{' => {
            let close = *i + 1 + closing_brace(chars[*i + 1..].iter().copied().enumerate())?;
            (chars[*i + 2..close].iter().collect::<String>(), close + 1)
        }
        c if c.is_ascii_alphanumeric() => (c.to_string(), *i + 2),
        _ => return None,
    };
    let name: String = body
        .replace("\\text", "")
        .replace("\\mathrm", "")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    if name.is_empty() {
        return None;
    }
    *i = end;
    Some(name)
}

const MAX_DEPTH: usize = 64;

struct Parser<'a> {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
    input: &'a str,
    /// Variable values; `None` reads a variable as an error (a purely numeric answer).
    env: Option<&'a Env>,
}

/// An intermediate node: a number or a bracketed group that may become an interval or tuple.
enum Node {
    Num(Num),
    Group(Answer),
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn unexpected(&self) -> ParseError {
        ParseError::Unexpected {
            input: self.input.to_string(),
            pos: self.pos,
            found: self
                .peek()
                .map_or_else(|| "end".to_string(), |t| format!("{t:?}")),
        }
    }

    fn eat_sym(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Sym(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn eat_cmd(&mut self, name: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Cmd(c)) if c == name) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_sym(&mut self, c: char) -> Result<(), ParseError> {
        if self.eat_sym(c) {
            Ok(())
        } else {
            Err(self.unexpected())
        }
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ParseError::TooDeep {
                input: self.input.to_string(),
            });
        }
        Ok(())
    }

    /// Comma-separated items until one of `closers` (not consumed).
    fn list(&mut self) -> Result<Vec<Answer>, ParseError> {
        let mut items = vec![self.item()?];
        // A union of intervals is the set of its parts (`(-\infty, 0] \cup [4, \infty)`).
        while self.eat_sym(',') || self.eat_sym(';') || self.eat_cmd("cup") {
            items.push(self.item()?);
        }
        Ok(items)
    }

    fn item(&mut self) -> Result<Answer, ParseError> {
        match self.expr()? {
            Node::Num(n) => Ok(Answer::Number(n)),
            Node::Group(a) => Ok(a),
        }
    }

    fn num(&mut self) -> Result<Num, ParseError> {
        let node = self.expr()?;
        self.number(node)
    }

    /// A node that must be a number (a group is unexpected where it stands).
    fn number(&self, node: Node) -> Result<Num, ParseError> {
        match node {
            Node::Num(n) => Ok(n),
            Node::Group(_) => Err(self.unexpected()),
        }
    }

    fn expr(&mut self) -> Result<Node, ParseError> {
        self.enter()?;
        let mut acc = self.term()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Sym(c @ ('+' | '-'))) => *c,
                Some(Tok::Cmd(c)) if c == "pm" || c == "mp" => {
                    return Err(ParseError::Symbol {
                        input: self.input.to_string(),
                        symbol: c.clone(),
                    })
                }
                _ => break,
            };
            self.pos += 1;
            let rhs = self.term()?;
            acc = Node::Num(match (acc, rhs) {
                (Node::Num(a), Node::Num(b)) if op == '+' => a + b,
                (Node::Num(a), Node::Num(b)) => a - b,
                _ => return Err(self.unexpected()),
            });
        }
        self.depth -= 1;
        Ok(acc)
    }

    fn term(&mut self) -> Result<Node, ParseError> {
        let mut acc = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Sym(c @ ('*' | '/' | '×' | '÷' | '·'))) => *c,
                // A ratio `7:32` is the quotient (math-verify: 7/32); only one `:` is read.
                Some(Tok::Sym(':')) => '/',
                Some(Tok::Cmd(c)) if c == "cdot" || c == "times" => '*',
                Some(Tok::Cmd(c)) if c == "div" => '/',
                Some(t) if starts_primary(t) => '@',
                _ => break,
            };
            if op != '@' {
                self.pos += 1;
            }
            let rhs = self.unary()?;
            acc = Node::Num(match (acc, rhs) {
                (Node::Num(a), Node::Num(b)) if op == '/' || op == '÷' => a / b,
                (Node::Num(a), Node::Num(b)) => a * b,
                _ => return Err(self.unexpected()),
            });
        }
        Ok(acc)
    }

    fn unary(&mut self) -> Result<Node, ParseError> {
        if self.eat_sym('-') {
            self.enter()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Node::Num(-self.number(inner)?));
        }
        if self.eat_sym('+') {
            self.enter()?;
            let r = self.unary();
            self.depth -= 1;
            return r;
        }
        self.power()
    }

    fn power(&mut self) -> Result<Node, ParseError> {
        let base = self.postfix()?;
        if self.eat_sym('^') {
            let Node::Num(b) = base else {
                return Err(self.unexpected());
            };
            self.enter()?;
            let e = match self.peek() {
                Some(Tok::Sym('{')) => self.braced()?,
                Some(Tok::Sym('-')) => {
                    self.pos += 1;
                    -self.postfix_num()?
                }
                _ => self.postfix_num()?,
            };
            self.depth -= 1;
            return Ok(Node::Num(b.pow(e)));
        }
        Ok(base)
    }

    fn postfix_num(&mut self) -> Result<Num, ParseError> {
        let node = self.postfix()?;
        self.number(node)
    }

    /// A primary with a trailing `%` or `!`.
    fn postfix(&mut self) -> Result<Node, ParseError> {
        let mut p = self.primary()?;
        while self.peek() == Some(&Tok::Sym('!')) && self.toks.get(self.pos + 1) != Some(&Tok::Sym('=')) {
            let Node::Num(n) = p else {
                return Err(self.unexpected());
            };
            p = Node::Num(self.factorial(n)?);
            self.pos += 1;
        }
        if self.peek() == Some(&Tok::Sym('%')) {
            self.pos += 1;
            let Node::Num(mut n) = p else {
                return Err(self.unexpected());
            };
            if n.percent {
                n = n.resolved();
            }
            n.percent = true;
            return Ok(Node::Num(n));
        }
        Ok(p)
    }

    /// `n!`, exact: an integer from 0 to 33 (34! overflows `i128`). A larger one is an error, not
    /// an infinity that `\frac{1}{2004!}` would turn into a zero equal to `0`.
    fn factorial(&self, n: Num) -> Result<Num, ParseError> {
        match n.resolved().exact {
            Some(r) if r.is_integer() && (0..=33).contains(&r.numer()) => {
                let f = (1..=r.numer()).product::<i128>();
                Ok(Num::rational(Rational::int(f), Kind::Integer))
            }
            _ => Err(ParseError::Symbol {
                input: self.input.to_string(),
                symbol: "!".to_string(),
            }),
        }
    }

    fn braced(&mut self) -> Result<Num, ParseError> {
        self.expect_sym('{')?;
        let n = self.num()?;
        self.expect_sym('}')?;
        Ok(n)
    }

    fn primary(&mut self) -> Result<Node, ParseError> {
        self.enter()?;
        let r = self.primary_inner();
        self.depth -= 1;
        r
    }

    fn primary_inner(&mut self) -> Result<Node, ParseError> {
        let Some(tok) = self.peek().cloned() else {
            return Err(self.unexpected());
        };
        self.pos += 1;
        match tok {
            Tok::Num(s) => {
                let r = Rational::from_decimal(&s);
                let kind = if s.contains('.') {
                    Kind::Float
                } else {
                    Kind::Integer
                };
                let n = match r {
                    Some(r) => Num::rational(r, kind),
                    None => Num {
                        kind,
                        ..Num::approx(s.parse::<f64>().unwrap_or(f64::NAN))
                    },
                };
                // Mixed number: `2\frac{1}{3}` = 2 + 1/3.
                if kind == Kind::Integer && matches!(self.peek(), Some(Tok::Cmd(c)) if c == "frac")
                {
                    let save = self.pos;
                    self.pos += 1;
                    if let Ok((a, b)) = self.frac_args() {
                        if a.kind == Kind::Integer && b.kind == Kind::Integer {
                            return Ok(Node::Num(n + a / b));
                        }
                    }
                    self.pos = save;
                }
                Ok(Node::Num(n))
            }
            Tok::Cmd(c) => match c.as_str() {
                "frac" => {
                    let (a, b) = self.frac_args()?;
                    let bare = matches!(a.kind, Kind::Integer) && matches!(b.kind, Kind::Integer);
                    let mut q = a / b;
                    if bare {
                        q.kind = match q.exact {
                            Some(r) if r.is_integer() => Kind::Integer,
                            Some(_) => Kind::Fraction,
                            None => Kind::Expr,
                        };
                    }
                    Ok(Node::Num(q))
                }
                "sqrt" => {
                    let index = if self.eat_sym('[') {
                        let n = self.num()?;
                        self.expect_sym(']')?;
                        n
                    } else {
                        Num::rational(Rational::int(2), Kind::Integer)
                    };
                    // TeX reads one token: `\sqrt10` is `\sqrt{1}0`.
                    let x = match self.peek() {
                        Some(Tok::Sym('{')) | Some(Tok::Num(_)) => self.frac_arg()?,
                        _ => self.postfix_num()?,
                    };
                    Ok(Node::Num(x.root(index)))
                }
                "pi" => Ok(Node::Num(Num::approx(std::f64::consts::PI))),
                "infty" => Ok(Node::Num(Num::approx(f64::INFINITY))),
                "sin" | "cos" | "tan" | "sec" | "csc" | "cot" | "arcsin" | "arccos" | "arctan"
                | "ln" | "log" | "exp" => {
                    // `\sin^2 x` is (sin x)^2; `\sin^{-1} x` is arcsin x.
                    let power = if self.eat_sym('^') { Some(self.frac_arg()?.resolved().approx) } else { None };
                    let (name, power) = match (c.as_str(), power) {
                        ("sin" | "cos" | "tan", Some(-1.0)) => (format!("arc{c}"), None),
                        _ => (c.clone(), power),
                    };
                    let x = match self.peek() {
                        Some(Tok::Sym('{')) => self.braced()?,
                        _ => self.power_num()?,
                    }
                    .resolved()
                    .approx;
                    let y = match name.as_str() {
                        "sin" => x.sin(),
                        "cos" => x.cos(),
                        "tan" => x.tan(),
                        "sec" => 1.0 / x.cos(),
                        "csc" => 1.0 / x.sin(),
                        "cot" => x.cos() / x.sin(),
                        "arcsin" => x.asin(),
                        "arccos" => x.acos(),
                        "arctan" => x.atan(),
                        "exp" => x.exp(),
                        _ => x.ln(),
                    };
                    Ok(Node::Num(Num::approx(power.map_or(y, |p| y.powf(p)))))
                }
                name if GREEK.contains(&name) => self.variable(name),
                _ => Err(ParseError::Symbol {
                    input: self.input.to_string(),
                    symbol: format!("\\{c}"),
                }),
            },
            // `{1, 2, 3}` (braces without `\`) is a set, as math-verify reads it.
            Tok::Sym('{') => {
                let mut items = self.list()?;
                self.expect_sym('}')?;
                Ok(match items.len() {
                    1 => match items.pop() {
                        Some(Answer::Number(n)) => Node::Num(n),
                        Some(other) => Node::Group(other),
                        None => Node::Group(Answer::Set(Vec::new())),
                    },
                    _ => Node::Group(Answer::Set(items)),
                })
            }
            Tok::Sym(open @ ('(' | '[')) => {
                let items = self.list()?;
                let close = match self.peek() {
                    Some(Tok::Sym(c @ (')' | ']'))) => *c,
                    _ => return Err(self.unexpected()),
                };
                self.pos += 1;
                Ok(bracket(open, close, items))
            }
            Tok::SetOpen => {
                let items = self.list()?;
                if self.peek() != Some(&Tok::SetClose) {
                    return Err(self.unexpected());
                }
                self.pos += 1;
                Ok(Node::Group(Answer::Set(items)))
            }
            Tok::Letter('e') if self.env.is_some() => {
                Ok(Node::Num(Num::approx(std::f64::consts::E)))
            }
            Tok::Letter(c) => self.variable(&c.to_string()),
            Tok::Var(name) => self.variable(&name),
            Tok::Word(w) => Err(ParseError::Symbol {
                input: self.input.to_string(),
                symbol: w,
            }),
            _ => {
                self.pos -= 1;
                Err(self.unexpected())
            }
        }
    }

    /// A variable's value from the environment (an error without one).
    fn variable(&mut self, name: &str) -> Result<Node, ParseError> {
        match self.env.and_then(|e| e.get(name)) {
            Some(v) => Ok(Node::Num(Num::approx(*v))),
            None => Err(ParseError::Symbol {
                input: self.input.to_string(),
                symbol: name.to_string(),
            }),
        }
    }

    /// A function argument: a primary with its power (`\sin x^2` is `\sin(x^2)`).
    fn power_num(&mut self) -> Result<Num, ParseError> {
        let node = self.power()?;
        self.number(node)
    }

    fn frac_args(&mut self) -> Result<(Num, Num), ParseError> {
        let a = self.frac_arg()?;
        let b = self.frac_arg()?;
        Ok((a, b))
    }

    /// `{expr}`, a single digit (`\frac12`, `\sqrt2`) or a single constant or variable
    /// (`\frac \pi4`, `\frac x2`): TeX reads one token.
    fn frac_arg(&mut self) -> Result<Num, ParseError> {
        if self.peek() == Some(&Tok::Sym('{')) {
            return self.braced();
        }
        match self.peek().cloned() {
            Some(t) if one_token_value(&t) => {
                let node = self.primary_inner()?;
                self.number(node)
            }
            Some(Tok::Num(s)) => {
                let first = &s[..1];
                let rest = &s[1..];
                if rest.is_empty() {
                    self.pos += 1;
                } else {
                    self.toks[self.pos] = Tok::Num(rest.to_string());
                }
                let d = Rational::from_decimal(first).unwrap_or(Rational::int(0));
                Ok(Num::rational(d, Kind::Integer))
            }
            _ => Err(self.unexpected()),
        }
    }
}

/// A token that is a value by itself: a letter variable, `\pi`, a Greek variable.
fn one_token_value(t: &Tok) -> bool {
    match t {
        Tok::Letter(_) | Tok::Var(_) => true,
        Tok::Cmd(c) => c == "pi" || GREEK.contains(&c.as_str()),
        _ => false,
    }
}

fn starts_primary(t: &Tok) -> bool {
    match t {
        Tok::Num(_) | Tok::SetOpen => true,
        // `\lambda^5 \left[e^{x}-1\right]`: a bracket multiplies as a parenthesis does.
        Tok::Sym(c) => matches!(c, '(' | '{' | '['),
        Tok::Cmd(c) => {
            matches!(c.as_str(), "frac" | "sqrt" | "pi" | "infty")
                || FUNCTIONS.contains(&c.as_str())
                || GREEK.contains(&c.as_str())
        }
        Tok::Letter(_) | Tok::Word(_) | Tok::Var(_) => true,
        Tok::SetClose => false,
    }
}

fn bracket(open: char, close: char, mut items: Vec<Answer>) -> Node {
    // `(x)` and `\left[x\right]^{5/2}` group; one item in mixed brackets is no interval either.
    if items.len() == 1 && ((open == '(' && close == ')') || (open == '[' && close == ']')) {
        return match items.pop() {
            Some(Answer::Number(n)) => Node::Num(n),
            Some(other) => Node::Group(other),
            None => Node::Group(Answer::Tuple(Vec::new())),
        };
    }
    if let [Answer::Number(lo), Answer::Number(hi)] = items.as_slice() {
        let ordered = lo.resolved().approx < hi.resolved().approx;
        if open != close || ordered {
            // `(a, b)` is an open interval only when a < b; `[a, b]` likewise a closed one.
            if ordered || open != '(' || close != ')' {
                return Node::Group(interval(*lo, *hi, open == '(', close == ')'));
            }
        }
    }
    Node::Group(Answer::Tuple(items))
}

/// The interval from `lo` to `hi`; an infinite end is always open (sympy: `[-oo, 1]` is
/// `(-oo, 1]`).
fn interval(lo: Num, hi: Num, lo_open: bool, hi_open: bool) -> Answer {
    Answer::Interval {
        left_open: lo_open || lo.approx.is_infinite(),
        right_open: hi_open || hi.approx.is_infinite(),
        lo,
        hi,
    }
}

/// Whole-string thousands-separated number such as `1,234,567.5`.
fn thousands(s: &str) -> Option<String> {
    let t = s.trim();
    let (sign, body) = match t.strip_prefix('-') {
        Some(b) => ("-", b),
        None => ("", t),
    };
    let (ip, fp) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    let groups: Vec<&str> = ip.split(',').collect();
    if groups.len() < 2
        || groups[0].is_empty()
        || groups[0].len() > 3
        || groups[1..].iter().any(|g| g.len() != 3)
        || !groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    if let Some(f) = fp {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    }
    let mut out = format!("{sign}{}", groups.concat());
    if let Some(f) = fp {
        out.push('.');
        out.push_str(f);
    }
    Some(out)
}

/// `3qr`, `\frac{hc}{\lambda}`, `SRMC = LRMC` with each letter of a run of letters apart, to be
/// read as a product of variables (`3q r`, `\frac{h c}{\lambda}`), as math-verify reads them.
/// Only a run glued to a digit or standing next to an operator or bracket is split; `None` when
/// no run was, or when a run stands among words (`MR=SRMC, or marginal revenue ...`: a sentence).
/// Kept whole: commands (`\frac`) and their text arguments (`\text{cm}`), subscripts (`P_{ab}`),
/// ordinals after a digit (`5th`), `and`/`or`, and any run holding a function name (`sinh`, `pir`),
/// which would read as something else.
pub fn letter_products(normalized: &str) -> Option<String> {
    let b = normalized.as_bytes();
    let operator = |c: u8| b"=+-*/^(){}[]<>|\\_".contains(&c);
    let mut out: Vec<u8> = Vec::with_capacity(b.len() + 8);
    let mut changed = false;
    let mut i = 0;
    // Copies b[i..] through the `}` that closes the `{` at b[i] (or to the end).
    let through_group = |i: usize, out: &mut Vec<u8>| -> usize {
        let j = closing_brace(normalized[i..].char_indices()).map_or(b.len(), |k| i + k + 1);
        out.extend_from_slice(&b[i..j]);
        j
    };
    while i < b.len() {
        let c = b[i];
        if c == b'\\' {
            let start = i + 1;
            let mut j = start;
            while j < b.len() && b[j].is_ascii_alphabetic() {
                j += 1;
            }
            let end = j.max(start + 1).min(b.len());
            out.extend_from_slice(&b[i..end]);
            let command = &normalized[start..j];
            i = end;
            if TEXT_COMMANDS.contains(&command) && b.get(i) == Some(&b'{') {
                i = through_group(i, &mut out);
            }
        } else if c == b'_' {
            out.push(c);
            i += 1;
            if b.get(i) == Some(&b'{') {
                i = through_group(i, &mut out);
            } else if b.get(i).is_some_and(u8::is_ascii_alphanumeric) {
                out.push(b[i]);
                i += 1;
            }
        } else if c.is_ascii_alphabetic() {
            let mut j = i;
            while j < b.len() && b[j].is_ascii_alphabetic() {
                j += 1;
            }
            let run = &normalized[i..j];
            let before = b[..i].iter().rposition(|c| !c.is_ascii_whitespace()).map(|k| (b[k], k + 1 < i));
            let after = b[j..].iter().find(|c| !c.is_ascii_whitespace()).copied();
            let kept = run.len() == 1
                || ["and", "or"].contains(&run)
                || FUNCTIONS.iter().any(|f| run.contains(f))
                || (before.is_some_and(|(c, spaced)| c.is_ascii_digit() && !spaced) && ["st", "nd", "rd", "th"].contains(&run));
            let glued = before.is_some_and(|(c, spaced)| operator(c) || (c.is_ascii_digit() && !spaced))
                || after.is_some_and(|c| operator(c) || (c.is_ascii_digit() && j < b.len() && b[j] == c));
            if kept {
                out.extend_from_slice(run.as_bytes());
            } else if glued {
                for (k, letter) in run.bytes().enumerate() {
                    if k > 0 {
                        out.push(b' ');
                    }
                    out.push(letter);
                }
                changed = true;
            } else {
                return None;
            }
            i = j;
        } else {
            out.push(c);
            i += 1;
        }
    }
    changed.then(|| String::from_utf8(out).ok()).flatten()
}

/// Parse a normalized numeric answer (a variable is an error). A top-level `lhs = rhs` keeps only
/// the last right-hand side; a top-level comma list without brackets is a set.
pub fn parse_answer(normalized: &str) -> Result<Answer, ParseError> {
    parse_with(normalized, None)
}

/// Parse a normalized answer whose variables take the values in `env`.
pub fn parse_answer_in(normalized: &str, env: &Env) -> Result<Answer, ParseError> {
    parse_with(normalized, Some(env))
}

/// The variables of a normalized answer (single letters and Greek-letter commands, `e` aside),
/// in the right-hand sides that [`parse_answer`] reads.
pub fn variables(normalized: &str) -> Vec<String> {
    variables_of(&[normalized])
}

/// The variables of several normalized answers together, each once, in order of appearance.
pub fn variables_of(answers: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in answers.iter().flat_map(|a| equation_rhs_parts(a.trim())) {
        for t in tokenize(&part) {
            let name = match t {
                Tok::Letter(c) if c != 'e' => c.to_string(),
                Tok::Var(name) => name,
                Tok::Cmd(c) if GREEK.contains(&c.as_str()) => c,
                _ => continue,
            };
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

fn parse_with(normalized: &str, env: Option<&Env>) -> Result<Answer, ParseError> {
    let s = normalized.trim();
    if s.is_empty() {
        return Err(ParseError::Empty);
    }
    let owned;
    let s = match thousands(s) {
        Some(t) => {
            owned = t;
            owned.as_str()
        }
        None => s,
    };
    if let Some(r) = inequality_set(s, env) {
        return r;
    }
    if let Some(r) = semicolon_groups(s, env) {
        return r;
    }
    let parts = equation_rhs_parts(s);
    let s = parts.join(",");
    let s = s.as_str();
    if let Some(r) = plus_minus(s, env) {
        return r;
    }
    // `a:b:c` is no single number (math-verify reads it as (a/b)/c).
    if s.matches(':').count() > 1 {
        return Err(ParseError::Symbol {
            input: s.to_string(),
            symbol: ":".to_string(),
        });
    }
    let mut p = Parser {
        toks: tokenize(s),
        pos: 0,
        depth: 0,
        input: s,
        env,
    };
    if p.toks.is_empty() {
        return Err(ParseError::Empty);
    }
    let mut items = p.list()?;
    if p.pos != p.toks.len() {
        return Err(p.unexpected());
    }
    Ok(if items.len() == 1 {
        items.pop().unwrap_or(Answer::Set(Vec::new()))
    } else {
        Answer::Set(items)
    })
}

/// Where `s` has a `\pm` / `\mp` command (not `\pmatrix`, `\pmb`) or `±` / `∓`: byte range and
/// whether the upper sign comes first (`\pm`: +, then -).
fn plus_minus_signs(s: &str) -> Vec<(std::ops::Range<usize>, bool)> {
    let mut out = Vec::new();
    for (i, c) in s.char_indices() {
        match c {
            '±' | '∓' => out.push((i..i + c.len_utf8(), c == '±')),
            '\\' => {
                let name: String = s[i + 1..].chars().take_while(char::is_ascii_alphabetic).collect();
                if name == "pm" || name == "mp" {
                    out.push((i..i + 3, name == "pm"));
                }
            }
            _ => {}
        }
    }
    out
}

/// An answer with `±` in its items: each such item is its two values, the answer the set of all
/// values (`\pm 2` = {2, -2}, `1 \pm \sqrt{19}` = {1+√19, 1-√19}, as math-verify reads them).
/// `None` when there is no `±`; an item with two of them is not read.
fn plus_minus(s: &str, env: Option<&Env>) -> Option<Result<Answer, ParseError>> {
    if plus_minus_signs(s).is_empty() {
        return None;
    }
    let mut values = Vec::new();
    for item in split_top(s, ',') {
        let signs = plus_minus_signs(item);
        let variants: Vec<String> = match signs.as_slice() {
            [] => vec![item.to_string()],
            [(at, pm)] => {
                let (first, second) = if *pm { ("+", "-") } else { ("-", "+") };
                [first, second].iter().map(|sign| format!("{}{sign}{}", &item[..at.start], &item[at.end..])).collect()
            }
            _ => {
                return Some(Err(ParseError::Symbol {
                    input: s.to_string(),
                    symbol: "\\pm".to_string(),
                }))
            }
        };
        for v in variants {
            match parse_with(&v, env) {
                Ok(Answer::Set(items)) => values.extend(items),
                Ok(a) => values.push(a),
                Err(e) => return Some(Err(e)),
            }
        }
    }
    Some(Ok(Answer::Set(values)))
}

/// Split `s` at `sep` outside brackets and braces.
fn split_top(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            c if c == sep && depth == 0 => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Solutions separated by `;`, each a comma list (`p=5,q=2;p=7,q=2`): the set of the tuples
/// (math-verify reads `1, 2; 3, 4` as {(1, 2), (3, 4)}). `None` when no part has a comma.
fn semicolon_groups(s: &str, env: Option<&Env>) -> Option<Result<Answer, ParseError>> {
    let groups = split_top(s, ';');
    if groups.len() < 2 || !groups.iter().any(|g| split_top(g, ',').len() > 1) {
        return None;
    }
    let read = |g: &str| -> Result<Answer, ParseError> {
        Ok(match parse_with(g, env)? {
            Answer::Set(items) => Answer::Tuple(items),
            other => other,
        })
    };
    Some(
        groups
            .into_iter()
            .map(read)
            .collect::<Result<Vec<_>, _>>()
            .map(Answer::Set),
    )
}

/// Relation operators of an inequality: (text, less-than side, strict).
const RELATIONS: &[(&str, bool, bool)] = &[
    ("\\leqslant", true, false),
    ("\\geqslant", false, false),
    ("\\leq", true, false),
    ("\\geq", false, false),
    ("\\le", true, false),
    ("\\ge", false, false),
    ("\\lt", true, true),
    ("\\gt", false, true),
    ("<=", true, false),
    (">=", false, false),
    ("≤", true, false),
    ("≥", false, false),
    ("<", true, true),
    (">", false, true),
];

/// An inequality in one unknown is the set it describes, as math-verify compares it with a set
/// (sympy's `as_set`): `-793 < a < 10` is the interval (-793, 10), `x \ge 2` is [2, ∞),
/// `0 < f(x) < 1` is (0, 1), `1 \le |z| \le 3/2` is [-3/2, -1] ∪ [1, 3/2]. The bounds must be
/// numbers and the other side one unknown ([`is_unknown`]); `None` when `s` has no top-level `<`,
/// `>`, `\le`, `\ge`.
fn inequality_set(s: &str, env: Option<&Env>) -> Option<Result<Answer, ParseError>> {
    let mut parts = Vec::new();
    let mut rels = Vec::new();
    let (mut depth, mut start, mut i) = (0i32, 0, 0);
    let b = s.as_bytes();
    while i < s.len() {
        match b[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        let rel = (depth == 0)
            .then(|| {
                RELATIONS.iter().find(|(op, _, _)| {
                    s[i..].starts_with(op)
                        && !(op.starts_with('\\')
                            && s[i + op.len()..].starts_with(|c: char| c.is_ascii_alphabetic()))
                })
            })
            .flatten();
        match rel {
            Some(&(op, less, strict)) => {
                parts.push(&s[start..i]);
                rels.push((less, strict));
                i += op.len();
                start = i;
            }
            None => i += s[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
    if rels.is_empty() {
        return None;
    }
    parts.push(&s[start..]);
    let number = |t: &str| match parse_with(t, env) {
        Ok(Answer::Number(n)) => Some(n),
        _ => None,
    };
    let free = |t: &str| is_unknown(t);
    let inf = Num::approx(f64::INFINITY);
    let err = || ParseError::Symbol {
        input: s.to_string(),
        symbol: "inequality".to_string(),
    };
    // Relations, where the variables take the values of `env`: an inequality in two or more
    // variables (`x > y` is `y < x`, not a ray of x), or one that is no polynomial of its unknown.
    let relations = || -> Result<Answer, ParseError> {
        env.ok_or_else(err)?;
        let mut out = Vec::with_capacity(rels.len());
        for (w, &(less, strict)) in parts.windows(2).zip(&rels) {
            let (a, b) = (number(w[0]).ok_or_else(err)?, number(w[1]).ok_or_else(err)?);
            out.push(Answer::Relation {
                diff: if less { a - b } else { b - a },
                strict,
            });
        }
        // A chain holds all its relations, in any order (`a < x < b` is `b > x > a`).
        Ok(if out.len() == 1 { out.remove(0) } else { Answer::Set(out) })
    };
    if inequality_variables(&parts) > 1 {
        return Some(relations());
    }
    // (lo, hi, lo open, hi open) of the unknown side, and that side.
    let (lo, hi, lo_open, hi_open, unknown) = match (parts.as_slice(), rels.as_slice()) {
        ([a, m, c], [(l1, s1), (l2, s2)]) if l1 == l2 && free(m) => {
            let (lo, hi, lo_open, hi_open) = if *l1 { (a, c, s1, s2) } else { (c, a, s2, s1) };
            match (number(lo), number(hi)) {
                (Some(lo), Some(hi)) => (lo, hi, *lo_open, *hi_open, *m),
                _ => return Some(Err(err())),
            }
        }
        ([a, c], [(less, strict)]) => match (free(a), number(c), number(a), free(c)) {
            (true, Some(c), _, _) if *less => (-inf, c, true, *strict, *a),
            (true, Some(c), _, _) => (c, inf, *strict, true, *a),
            (_, _, Some(a), true) if *less => (a, inf, *strict, true, *c),
            (_, _, Some(a), true) => (-inf, a, true, *strict, *c),
            // `b^2 + 2b - 15 \le 0`, `3x + 2 > 2x + 5`: polynomials of one unknown.
            _ => return Some(polynomial_inequality(a, c, *less, *strict).map_or_else(relations, Ok)),
        },
        _ => return Some(Err(err())),
    };
    let u = unknown.trim();
    let abs =
        u.len() > 2 && u.starts_with('|') && u.ends_with('|') && !u[1..u.len() - 1].contains('|');
    if !abs || lo.resolved().approx <= 0.0 {
        return Some(Ok(if abs {
            // |v| < hi: (-hi, hi)
            interval(-hi, hi, hi_open, hi_open)
        } else {
            interval(lo, hi, lo_open, hi_open)
        }));
    }
    // lo <= |v| <= hi with lo > 0: two intervals.
    Some(Ok(Answer::Set(vec![
        interval(-hi, -lo, hi_open, lo_open),
        interval(lo, hi, lo_open, hi_open),
    ])))
}

/// The set where `lhs < rhs` (`less`; else `lhs > rhs`; `strict` or with equality) holds, for
/// sides whose difference is a polynomial of degree 1 or 2 in one unknown: `b^2 + 2b - 15 \le 0`
/// is `[-5, 3]`, `x^2 > 4` is `(-\infty, -2) \cup (2, \infty)`. The coefficients come from values
/// at three points, checked at two more; a difference of degree 3 to 8 goes to
/// [`higher_degree_inequality`] (anything else, `\sin x > 0`, is `None`). Roots that are fractions
/// of denominator up to 100 are exact.
fn polynomial_inequality(lhs: &str, rhs: &str, less: bool, strict: bool) -> Option<Answer> {
    let vars = variables_of(&[lhs, rhs]);
    let [v] = vars.as_slice() else { return None };
    let side = |t: &str, env: &Env| match parse_with(t, Some(env)) {
        Ok(Answer::Number(n)) => Some(n.resolved().approx),
        _ => None,
    };
    let f = |x: f64| -> Option<f64> {
        let env: Env = [(v.clone(), x)].into_iter().collect();
        Some(side(lhs, &env)? - side(rhs, &env)?).filter(|y| y.is_finite())
    };
    let (f0, f1, fm1) = (f(0.0)?, f(1.0)?, f(-1.0)?);
    let (a, b, c) = ((f1 + fm1) / 2.0 - f0, (f1 - fm1) / 2.0, f0);
    let fits = |x: f64| f(x).is_some_and(|y| (y - (a * x * x + b * x + c)).abs() <= 1e-9 * (1.0 + y.abs()));
    if !fits(2.0) || !fits(-3.5) {
        return higher_degree_inequality(&f, less, strict);
    }
    let inf = f64::INFINITY;
    let span = |lo: f64, hi: f64, lo_open: bool, hi_open: bool| interval(root_end(lo), root_end(hi), lo_open, hi_open);
    let tiny = 1e-12 * (1.0 + b.abs() + c.abs());
    if a.abs() <= tiny {
        // b v + c < 0 (or > 0): one ray; no unknown left (b = 0) is no inequality in it.
        if b.abs() <= tiny {
            return None;
        }
        let r = -c / b;
        return Some(if less == (b > 0.0) { span(-inf, r, true, strict) } else { span(r, inf, strict, true) });
    }
    // Where a v^2 + b v + c is negative (below = true) or positive, between or outside its roots.
    let below = less == (a > 0.0);
    let d = b * b - 4.0 * a * c;
    if d < -tiny {
        // Never zero: the sign of a everywhere.
        return if below { None } else { Some(span(-inf, inf, true, true)) };
    }
    let (r1, r2) = {
        let q = d.max(0.0).sqrt();
        let (x, y) = ((-b - q) / (2.0 * a), (-b + q) / (2.0 * a));
        (x.min(y), x.max(y))
    };
    Some(if below {
        span(r1, r2, strict, strict)
    } else {
        Answer::Set(vec![span(-inf, r1, true, strict), span(r2, inf, strict, true)])
    })
}

/// An end of a solution set: exact when it is a fraction of denominator up to 100, an infinity, or
/// else approximate.
fn root_end(r: f64) -> Num {
    if r.is_infinite() {
        return Num::approx(r);
    }
    (1..=100i128)
        .find_map(|d| {
            let n = (r * d as f64).round();
            ((r * d as f64 - n).abs() < 1e-9 * d as f64).then(|| Rational::new(n as i128, d)).flatten()
        })
        .map_or(Num::approx(r), |q| Num::rational(q, if q.is_integer() { Kind::Integer } else { Kind::Fraction }))
}

/// [`polynomial_inequality`] for a difference `f` of degree 3 to [`MAX_DEGREE`] (`x^3 < 8` is
/// `(-\infty, 2)`): its coefficients from values at `MAX_DEGREE + 1` points, checked at two more;
/// its real roots ([`real_roots`]) cut the line, and the pieces where `f` has the asked sign are
/// joined through the roots when equality counts (`(x-1)^2(x+2) \le 0` is
/// `(-\infty, -2] \cup \{1\}`).
fn higher_degree_inequality(f: &dyn Fn(f64) -> Option<f64>, less: bool, strict: bool) -> Option<Answer> {
    // Points in [-2, 2], where a Vandermonde system of this size is still well conditioned.
    const XS: [f64; MAX_DEGREE + 1] = [0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1.5, -1.5];
    const N: usize = MAX_DEGREE + 1;
    // Solve the Vandermonde system for c0 + c1 x + … + c8 x^8 (Gaussian elimination, pivoting).
    let mut m: Vec<[f64; N + 1]> = Vec::with_capacity(N);
    for &x in &XS {
        let mut row = [0.0; N + 1];
        for (k, r) in row[..N].iter_mut().enumerate() {
            *r = x.powi(k as i32);
        }
        row[N] = f(x)?;
        m.push(row);
    }
    for col in 0..N {
        let pivot = (col..N).max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))?;
        m.swap(col, pivot);
        let pivot_row = m[col];
        for (_, r) in m.iter_mut().enumerate().filter(|(row, _)| *row != col) {
            let k = r[col] / pivot_row[col];
            for (x, p) in r[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= k * p;
            }
        }
    }
    let mut c: Vec<f64> = (0..N).map(|i| m[i][N] / m[i][i]).collect();
    let fits = |x: f64| f(x).is_some_and(|y| (y - horner(&c, x)).abs() <= 1e-9 * (1.0 + y.abs()));
    if !fits(3.0) || !fits(-3.5) {
        return None;
    }
    let scale = c.iter().fold(0.0f64, |m, a| m.max(a.abs()));
    while c.len() > 1 && c.last().is_some_and(|a| a.abs() <= 1e-12 * scale) {
        c.pop();
    }
    if c.len() < 4 {
        return None;
    }
    let roots = real_roots(&c);
    // The atoms of the line in order: the open piece before each root, the root, the last piece.
    let inf = f64::INFINITY;
    let wanted = |x: f64| if less { horner(&c, x) < 0.0 } else { horner(&c, x) > 0.0 };
    let mut atoms: Vec<(f64, f64, bool)> = Vec::new(); // (lo, hi, included); lo == hi for a root
    for (i, &r) in roots.iter().enumerate() {
        let lo = if i == 0 { -inf } else { roots[i - 1] };
        let probe = if i == 0 { r - 1.0 } else { (lo + r) / 2.0 };
        atoms.push((lo, r, wanted(probe)));
        atoms.push((r, r, !strict));
    }
    let last = roots.last().copied().unwrap_or(-inf);
    atoms.push((last, inf, wanted(if last.is_infinite() { 0.0 } else { last + 1.0 })));
    // Runs of included atoms: a run opens at a root it holds (closed) or after one (open).
    let mut pieces = Vec::new();
    let mut run: Option<(f64, bool)> = None;
    for (k, &(lo, hi, included)) in atoms.iter().enumerate() {
        let is_root = k % 2 == 1 && k + 1 < atoms.len();
        if included && run.is_none() {
            run = Some((lo, !is_root));
        }
        let next_included = atoms.get(k + 1).is_some_and(|a| a.2);
        if let Some((start, start_open)) = run.filter(|_| included && !next_included) {
            // A root alone (`(x-1)^2 \le 0` at 1) is a point of the set.
            pieces.push(if start == hi { Answer::Number(root_end(hi)) } else { interval(root_end(start), root_end(hi), start_open, !is_root) });
            run = None;
        }
    }
    match pieces.len() {
        0 => None,
        1 => pieces.pop(),
        _ => Some(Answer::Set(pieces)),
    }
}

/// The highest degree of a polynomial inequality that is solved for its unknown.
const MAX_DEGREE: usize = 8;

/// The value of `c[0] + c[1] x + … + c[n] x^n` at `x` (Horner's rule).
fn horner(c: &[f64], x: f64) -> f64 {
    c.iter().rev().fold(0.0, |acc, &a| acc * x + a)
}

/// The real roots of `c[0] + c[1] x + … + c[n] x^n` (`c[n]` nonzero), ascending, once each: the
/// critical points (the derivative's roots) cut the line into monotone pieces, each crossing zero
/// at most once (found by bisection); a critical point where the value is zero is a root that
/// touches zero without crossing.
fn real_roots(c: &[f64]) -> Vec<f64> {
    let n = c.len() - 1;
    match n {
        0 => return vec![],
        1 => return vec![-c[0] / c[1]],
        _ => {}
    }
    let eval = |x: f64| horner(c, x);
    let derivative: Vec<f64> = (1..=n).map(|k| k as f64 * c[k]).collect();
    let critical = real_roots(&derivative);
    // Every root lies within Cauchy's bound.
    let bound = 1.0 + c[..n].iter().map(|a| (a / c[n]).abs()).fold(0.0, f64::max);
    let scale = c.iter().fold(0.0f64, |m, a| m.max(a.abs()));
    let zero = |x: f64| eval(x).abs() <= 1e-9 * scale * (1.0 + x.abs()).powi(n as i32);
    let mut edges = vec![-bound];
    edges.extend(critical.iter().copied().filter(|x| x.abs() < bound));
    edges.push(bound);
    let mut roots: Vec<f64> = critical.iter().copied().filter(|&x| zero(x)).collect();
    for w in edges.windows(2) {
        let (mut lo, mut hi) = (w[0], w[1]);
        let (flo, fhi) = (eval(lo), eval(hi));
        if zero(lo) || zero(hi) || flo.signum() == fhi.signum() {
            continue;
        }
        for _ in 0..200 {
            let mid = (lo + hi) / 2.0;
            if eval(mid).signum() == flo.signum() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        roots.push((lo + hi) / 2.0);
    }
    roots.sort_by(f64::total_cmp);
    roots.dedup_by(|a, b| (*a - *b).abs() <= 1e-9 * (1.0 + b.abs()));
    roots
}

/// Whether `normalized` is an inequality (a top-level `<`, `>`, `\le`, `\ge`; see
/// [`inequality_set`]).
pub fn is_inequality(normalized: &str) -> bool {
    inequality_set(normalized.trim(), None).is_some()
}

/// How many variables the sides of an inequality name, an unknown that is a function's value
/// (`f(x)`, `f(2)`) counting as its argument's.
fn inequality_variables(parts: &[&str]) -> usize {
    let mut names: Vec<String> = Vec::new();
    for part in parts {
        let t = part.trim();
        let argument = t
            .find('(')
            .filter(|_| is_unknown(t) && t.ends_with(')'))
            .map(|i| &t[i + 1..t.len() - 1]);
        for v in variables(argument.unwrap_or(t)) {
            if !names.contains(&v) {
                names.push(v);
            }
        }
    }
    names.len()
}

/// One unknown: a variable (`a`, `x_{1}`, `\theta`), a function of one (`f(x)`), or the absolute
/// value of one (`|z|`). An expression (`b^2 + 2b - 15 \le 0`) describes another set than its
/// bounds say, so it is not read.
fn is_unknown(t: &str) -> bool {
    let t = t.trim();
    let t = t
        .strip_prefix('|')
        .and_then(|x| x.strip_suffix('|'))
        .map_or(t, str::trim);
    let name = match t.find('(') {
        Some(i) if t.ends_with(')') => t[..i].trim(),
        _ => t,
    };
    let name = name.split('_').next().unwrap_or("");
    let greek = name.strip_prefix('\\').is_some_and(|g| GREEK.contains(&g));
    greek || (name.len() == 1 && name.bytes().all(|c| c.is_ascii_alphabetic()))
}

/// Split `s` at top-level commas (outside brackets and braces); when every part is an equation
/// (`f(x) = 0, f(x) = 1`, from "f(x)=0 or f(x)=1"), keep each right-hand side; otherwise the
/// whole text as one part, through [`last_equation_rhs`].
fn equation_rhs_parts(s: &str) -> Vec<String> {
    let parts = split_top(s, ',');
    let is_eq = |p: &str| last_equation_rhs(p).len() < p.len();
    // `a = 4, -8, -10` and `(x, y) = (5, 8), (8, 5)`: one equation whose right-hand side is the
    // whole list (math-verify: Eq(a, {4, -8, -10})).
    if parts.len() > 1 && is_eq(parts[0]) && !parts[1..].iter().any(|p| is_eq(p)) {
        let mut out = vec![last_equation_rhs(parts[0]).trim().to_string()];
        out.extend(parts[1..].iter().map(|p| p.trim().to_string()));
        return out;
    }
    if parts.len() > 1 && parts.iter().all(|p| is_eq(p)) {
        parts
            .into_iter()
            .map(|p| last_equation_rhs(p).trim().to_string())
            .collect()
    } else {
        vec![last_equation_rhs(s).to_string()]
    }
}

/// `x = 5` -> `5`; `a = b = 7` -> `7`. Leaves `\le`/`\ge`/`!=` alone.
fn last_equation_rhs(s: &str) -> &str {
    // `x=1, y=2` is a system, not a chain; `(a, b) = (2, 12)` is one equation of tuples.
    let mut depth = 0i32;
    for c in s.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' | ';' if depth == 0 => return s,
            _ => {}
        }
    }
    let bytes = s.as_bytes();
    let mut cut = None;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'=' {
            let prev = if i > 0 { bytes[i - 1] } else { b' ' };
            if !matches!(prev, b'<' | b'>' | b'!' | b'\\') {
                cut = Some(i + 1);
            }
        }
    }
    match cut {
        Some(i) if !s[i..].trim().is_empty() => &s[i..],
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(s: &str) -> Num {
        match parse_answer(s) {
            Ok(Answer::Number(n)) => n,
            other => panic!("{s:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn integers_decimals_and_thousands() {
        assert_eq!(num("42").exact, Some(Rational::int(42)));
        assert_eq!(num("1,234,567").exact, Some(Rational::int(1_234_567)));
        assert_eq!(num("-3.75").kind, Kind::Float);
        assert_eq!(num("-3.75").exact, Rational::new(-15, 4));
    }

    #[test]
    fn fractions_mixed_and_expressions() {
        assert_eq!(num("\\frac{3}{6}").exact, Rational::new(1, 2));
        assert_eq!(num("\\frac{3}{6}").kind, Kind::Fraction);
        assert_eq!(num("\\frac12").exact, Rational::new(1, 2));
        assert_eq!(num("2\\frac{1}{3}").exact, Rational::new(7, 3));
        assert_eq!(num("2^{10}").exact, Some(Rational::int(1024)));
        assert_eq!(num("(3+4)\\times 5").exact, Some(Rational::int(35)));
        assert_eq!(num("3+4\\cdot 5").exact, Some(Rational::int(23)));
        assert_eq!(num("7/2").exact, Rational::new(7, 2));
        assert_eq!(num("x = 5").exact, Some(Rational::int(5)));
    }

    #[test]
    fn roots_pi_percent() {
        assert!((num("3\\sqrt{2}").approx - 3.0 * 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(num("\\sqrt{16}").exact, Some(Rational::int(4)));
        assert_eq!(num("\\sqrt4").exact, Some(Rational::int(2)));
        assert_eq!(num("\\sqrt49").exact, Some(Rational::int(18)));
        assert!((num("\\frac{2\\pi}{3}").approx - 2.0 * std::f64::consts::PI / 3.0).abs() < 1e-12);
        let p = num("25%");
        assert!(p.percent && p.exact == Some(Rational::int(25)));
    }

    #[test]
    fn intervals_tuples_sets() {
        assert!(matches!(
            parse_answer("[1, 5)"),
            Ok(Answer::Interval {
                left_open: false,
                right_open: true,
                ..
            })
        ));
        assert!(matches!(
            parse_answer("(1, 5)"),
            Ok(Answer::Interval {
                left_open: true,
                ..
            })
        ));
        assert!(matches!(parse_answer("(5, 1)"), Ok(Answer::Tuple(v)) if v.len() == 2));
        assert!(matches!(parse_answer("(1, 2, 3)"), Ok(Answer::Tuple(v)) if v.len() == 3));
        assert!(matches!(parse_answer("\\{3, 1\\}"), Ok(Answer::Set(v)) if v.len() == 2));
        assert!(matches!(parse_answer("3, 1"), Ok(Answer::Set(v)) if v.len() == 2));
        assert!(matches!(
            parse_answer("(-\\infty, 3]"),
            Ok(Answer::Interval { .. })
        ));
    }

    #[test]
    fn errors_are_reported_not_panicked() {
        assert_eq!(parse_answer("  "), Err(ParseError::Empty));
        assert!(matches!(
            parse_answer("x+1"),
            Err(ParseError::Symbol { .. })
        ));
        assert!(parse_answer("((((1").is_err());
        assert!(matches!(
            parse_answer(&"(".repeat(500)),
            Err(ParseError::TooDeep { .. })
        ));
    }
}
