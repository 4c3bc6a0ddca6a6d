//! Durations in a case: milliseconds as an integer, or a small expression of numbers and the
//! case's variables joined by `+`, `-` and `*` (`"window + 2500"`, `"4 * window"`). Shipped-default
//! cases name their windows once in `[vars]` and scale them in `[scaled]`, so one set of steps
//! states its bounds for both forms.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

/// A duration as written in a case file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Duration {
    Ms(u64),
    Expr(String),
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Duration::Ms(ms) => write!(f, "{ms} ms"),
            Duration::Expr(e) => write!(f, "{e}"),
        }
    }
}

/// The case's variables, in ms.
pub type Vars = BTreeMap<String, u64>;

/// Longest expression accepted, in characters: a bound is a line, not a program.
const MAX_EXPR_CHARS: usize = 200;

impl Duration {
    /// The value in ms under `vars`.
    pub fn eval(&self, vars: &Vars) -> Result<u64, String> {
        match self {
            Duration::Ms(ms) => Ok(*ms),
            Duration::Expr(e) => eval(e, vars),
        }
    }
    /// Every variable the expression names (for checking them when the case is loaded).
    pub fn names(&self) -> Vec<String> {
        match self {
            Duration::Ms(_) => Vec::new(),
            Duration::Expr(e) => tokens(e)
                .into_iter()
                .filter_map(|t| match t {
                    Token::Name(n) => Some(n),
                    _ => None,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Num(u64),
    Name(String),
    Op(char),
    Bad(char),
}

fn tokens(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_ascii_digit() {
            let mut n: u64 = 0;
            while let Some(&d) = chars.peek() {
                let Some(v) = d.to_digit(10) else { break };
                n = n.saturating_mul(10).saturating_add(u64::from(v));
                chars.next();
            }
            out.push(Token::Num(n));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut s = String::new();
            while let Some(&d) = chars.peek() {
                if d.is_ascii_alphanumeric() || d == '_' {
                    s.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(Token::Name(s));
        } else if matches!(c, '+' | '-' | '*') {
            out.push(Token::Op(c));
            chars.next();
        } else {
            out.push(Token::Bad(c));
            chars.next();
        }
    }
    out
}

/// Evaluates `text` (`term (('+'|'-') term)*`, `term = factor ('*' factor)*`).
pub fn eval(text: &str, vars: &Vars) -> Result<u64, String> {
    if text.len() > MAX_EXPR_CHARS {
        return Err(format!(
            "duration expression longer than {MAX_EXPR_CHARS} characters"
        ));
    }
    let toks = tokens(text);
    if let Some(Token::Bad(c)) = toks.iter().find(|t| matches!(t, Token::Bad(_))) {
        return Err(format!(
            "{text:?}: unexpected {c:?} (a duration is ms, variables and + - *)"
        ));
    }
    let mut pos = 0;
    let value = sum(&toks, &mut pos, vars, text)?;
    if pos != toks.len() {
        return Err(format!("{text:?}: unexpected text after position {pos}"));
    }
    u64::try_from(value).map_err(|_| format!("{text:?} is negative ({value} ms)"))
}

fn sum(toks: &[Token], pos: &mut usize, vars: &Vars, text: &str) -> Result<i128, String> {
    let mut acc = product(toks, pos, vars, text)?;
    while let Some(Token::Op(op @ ('+' | '-'))) = toks.get(*pos) {
        *pos += 1;
        let rhs = product(toks, pos, vars, text)?;
        acc = if *op == '+' { acc + rhs } else { acc - rhs };
    }
    Ok(acc)
}

fn product(toks: &[Token], pos: &mut usize, vars: &Vars, text: &str) -> Result<i128, String> {
    let mut acc = factor(toks, pos, vars, text)?;
    while let Some(Token::Op('*')) = toks.get(*pos) {
        *pos += 1;
        acc = acc.saturating_mul(factor(toks, pos, vars, text)?);
    }
    Ok(acc)
}

fn factor(toks: &[Token], pos: &mut usize, vars: &Vars, text: &str) -> Result<i128, String> {
    let t = toks
        .get(*pos)
        .ok_or_else(|| format!("{text:?}: a number or variable is missing at its end"))?;
    *pos += 1;
    match t {
        Token::Num(n) => Ok(i128::from(*n)),
        Token::Name(n) => vars
            .get(n)
            .map(|v| i128::from(*v))
            .ok_or_else(|| format!("{text:?}: no variable {n:?} in [vars]")),
        other => Err(format!(
            "{text:?}: expected a number or variable, found {other:?}"
        )),
    }
}

/// Replaces every `${name}` in `text` with the variable's value (for `[env]` values).
pub fn substitute(text: &str, vars: &Vars) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("{text:?}: `${{` without its `}}`"))?;
        let name = &after[..end];
        let value = vars
            .get(name)
            .ok_or_else(|| format!("{text:?}: no variable {name:?} in [vars]"))?;
        out.push_str(&value.to_string());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        [("window".to_string(), 1500), ("ttl".to_string(), 30_000)]
            .into_iter()
            .collect()
    }

    /// Mutation seen failing: `product` folding `*` with `+` (`4 * window + 500` = 2004).
    #[test]
    fn precedence_is_products_before_sums() {
        assert_eq!(eval("4 * window + 500", &vars()), Ok(6500));
        assert_eq!(eval("window + 2 * 1000", &vars()), Ok(3500));
        assert_eq!(eval("ttl - window - 500", &vars()), Ok(28_000));
        assert_eq!(Duration::Ms(7).eval(&vars()), Ok(7));
    }

    /// Mutation seen failing: an unknown name read as 0 (the bound silently becomes 500).
    #[test]
    fn unknown_names_bad_characters_and_negative_results_are_refused() {
        assert!(eval("windw + 500", &vars())
            .unwrap_err()
            .contains("no variable \"windw\""));
        assert!(eval("window / 2", &vars())
            .unwrap_err()
            .contains("unexpected '/'"));
        assert!(eval("500 - window", &vars())
            .unwrap_err()
            .contains("negative"));
        assert!(eval("window +", &vars()).unwrap_err().contains("missing"));
        assert!(eval("window 500", &vars())
            .unwrap_err()
            .contains("unexpected text"));
    }

    #[test]
    fn env_values_substitute_variables() {
        assert_eq!(substitute("${window}", &vars()).as_deref(), Ok("1500"));
        assert_eq!(
            substitute("a${ttl}b${window}", &vars()).as_deref(),
            Ok("a30000b1500")
        );
        assert!(substitute("${nope}", &vars()).is_err());
        assert!(substitute("${window", &vars()).is_err());
    }
}
