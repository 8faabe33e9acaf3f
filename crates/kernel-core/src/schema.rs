//! PyTorch-style op schemas: `topk(Tensor x, int k, int axis=-1, bool largest=True) ->
//! (Tensor values, Tensor indices)`. Parsed once at registration; every adapter derives its
//! framework's signature from the parsed form.

use crate::{AttrValue, Error, Result};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// The alias set name (`a` in `Tensor(a!)`).
    pub set: String,
    /// `!`: the op writes through this alias.
    pub write: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ArgType {
    Tensor,
    /// `Tensor?`: may be absent (None).
    OptionalTensor,
    Int,
    Float,
    Bool,
    Str,
    IntList,
    FloatList,
}

impl ArgType {
    pub fn is_tensor(&self) -> bool {
        matches!(self, ArgType::Tensor | ArgType::OptionalTensor)
    }
    /// The name as written in a schema.
    pub fn schema_name(&self) -> &'static str {
        match self {
            ArgType::Tensor => "Tensor",
            ArgType::OptionalTensor => "Tensor?",
            ArgType::Int => "int",
            ArgType::Float => "float",
            ArgType::Bool => "bool",
            ArgType::Str => "str",
            ArgType::IntList => "int[]",
            ArgType::FloatList => "float[]",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    pub name: String,
    pub ty: ArgType,
    pub default: Option<AttrValue>,
    pub alias: Option<Alias>,
    /// Declared after a `*`.
    pub kwarg_only: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Return {
    pub name: Option<String>,
    pub alias: Option<Alias>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    pub name: String,
    pub args: Vec<Arg>,
    pub returns: Vec<Return>,
    /// Whether the returns were written as a parenthesised tuple.
    pub tuple_return: bool,
}

impl Schema {
    pub fn parse(text: &str) -> Result<Schema> {
        Parser { s: text, pos: 0 }.schema()
    }

    /// Tensor arguments (`Tensor`, `Tensor?`, `Tensor(a!)`) in order: the op's inputs.
    pub fn tensor_args(&self) -> impl Iterator<Item = &Arg> {
        self.args.iter().filter(|a| a.ty.is_tensor())
    }
    /// Non-tensor arguments in order: the op's attributes.
    pub fn attr_args(&self) -> impl Iterator<Item = &Arg> {
        self.args.iter().filter(|a| !a.ty.is_tensor())
    }
    pub fn num_inputs(&self) -> usize {
        self.tensor_args().count()
    }
    pub fn num_outputs(&self) -> usize {
        self.returns.len()
    }
    /// The name of output `i`: its declared name, else `out` / `out{i}`.
    pub fn output_name(&self, i: usize) -> String {
        match &self.returns[i].name {
            Some(n) => n.clone(),
            None if self.returns.len() == 1 => "out".to_string(),
            None => format!("out{i}"),
        }
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.name)?;
        let mut kw_written = false;
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if a.kwarg_only && !kw_written {
                f.write_str("*, ")?;
                kw_written = true;
            }
            match (&a.ty, &a.alias) {
                (ArgType::Tensor, Some(al)) => {
                    write!(f, "Tensor({}{})", al.set, if al.write { "!" } else { "" })?
                }
                // `Tensor(a!)?`: the parser keeps an optional tensor's alias, so Display must too
                // or a round trip loses it.
                (ArgType::OptionalTensor, Some(al)) => {
                    write!(f, "Tensor({}{})?", al.set, if al.write { "!" } else { "" })?
                }
                (ty, _) => f.write_str(ty.schema_name())?,
            }
            write!(f, " {}", a.name)?;
            if let Some(d) = &a.default {
                write!(f, "={}", d.schema_literal())?;
            }
        }
        f.write_str(") -> ")?;
        let ret = |r: &Return| {
            let mut s = match &r.alias {
                Some(al) => format!("Tensor({}{})", al.set, if al.write { "!" } else { "" }),
                None => "Tensor".to_string(),
            };
            if let Some(n) = &r.name {
                s.push(' ');
                s.push_str(n);
            }
            s
        };
        if self.tuple_return || self.returns.len() != 1 {
            let parts: Vec<String> = self.returns.iter().map(ret).collect();
            write!(f, "({})", parts.join(", "))
        } else {
            f.write_str(&ret(&self.returns[0]))
        }
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> Error {
        let caret = " ".repeat(self.pos) + "^";
        Error::invalid(format!(
            "schema parse error at column {}: {what}\n  {}\n  {caret}",
            self.pos + 1,
            self.s
        ))
    }
    fn rest(&self) -> &str {
        &self.s[self.pos..]
    }
    fn skip_ws(&mut self) {
        while self.rest().starts_with([' ', '\t', '\n']) {
            self.pos += 1;
        }
    }
    fn eat(&mut self, tok: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, tok: &str) -> Result<()> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(self.err(&format!("expected `{tok}`")))
        }
    }
    fn ident(&mut self) -> Result<String> {
        self.skip_ws();
        let r = self.rest();
        let len = r
            .char_indices()
            .take_while(|&(i, c)| {
                c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())
            })
            .count();
        if len == 0 {
            return Err(self.err("expected an identifier"));
        }
        let id = r[..len].to_string();
        self.pos += len;
        Ok(id)
    }

    fn schema(&mut self) -> Result<Schema> {
        let name = self.ident()?;
        self.expect("(")?;
        let mut args: Vec<Arg> = Vec::new();
        let mut kwarg_only = false;
        if !self.eat(")") {
            loop {
                if self.eat("*") {
                    kwarg_only = true;
                } else {
                    let arg = self.arg(kwarg_only)?;
                    if args.iter().any(|a| a.name == arg.name) {
                        return Err(self.err(&format!("duplicate argument name `{}`", arg.name)));
                    }
                    if arg.default.is_none()
                        && arg.ty != ArgType::OptionalTensor
                        && args.iter().any(|a| a.default.is_some() && !a.kwarg_only)
                        && !kwarg_only
                    {
                        return Err(
                            self.err("an argument without a default follows one with a default")
                        );
                    }
                    args.push(arg);
                }
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        self.expect("->")?;
        let (returns, tuple_return) = self.returns()?;
        self.skip_ws();
        if self.pos != self.s.len() {
            return Err(self.err("unexpected text after the returns"));
        }
        Ok(Schema {
            name,
            args,
            returns,
            tuple_return,
        })
    }

    fn alias(&mut self) -> Result<Option<Alias>> {
        if !self.rest().starts_with('(') {
            return Ok(None);
        }
        self.pos += 1;
        let set = self.ident()?;
        let write = self.eat("!");
        self.expect(")")?;
        Ok(Some(Alias { set, write }))
    }

    fn arg(&mut self, kwarg_only: bool) -> Result<Arg> {
        self.skip_ws();
        let start = self.pos;
        let tyname = self.ident()?;
        let (ty, alias) = match tyname.as_str() {
            "Tensor" => {
                let alias = self.alias()?;
                if self.rest().starts_with('?') {
                    self.pos += 1;
                    (ArgType::OptionalTensor, alias)
                } else {
                    (ArgType::Tensor, alias)
                }
            }
            "int" | "float" if self.rest().starts_with("[]") => {
                self.pos += 2;
                (
                    if tyname == "int" {
                        ArgType::IntList
                    } else {
                        ArgType::FloatList
                    },
                    None,
                )
            }
            "int" => (ArgType::Int, None),
            "float" => (ArgType::Float, None),
            "bool" => (ArgType::Bool, None),
            "str" => (ArgType::Str, None),
            other => {
                self.pos = start;
                return Err(self.err(&format!(
                    "unknown type `{other}` (expected Tensor, Tensor?, int, float, bool, str, int[] or float[])"
                )));
            }
        };
        let name = self.ident()?;
        let default = if self.eat("=") {
            Some(self.default(&ty)?)
        } else {
            None
        };
        Ok(Arg {
            name,
            ty,
            default,
            alias,
            kwarg_only,
        })
    }

    fn default(&mut self, ty: &ArgType) -> Result<AttrValue> {
        self.skip_ws();
        let start = self.pos;
        let r = self.rest();
        let v = if let Some(q) = r.chars().next().filter(|c| *c == '"' || *c == '\'') {
            let end = r[1..]
                .find(q)
                .ok_or_else(|| self.err("unterminated string"))?;
            let s = r[1..1 + end].to_string();
            self.pos += end + 2;
            AttrValue::Str(s)
        } else if r.starts_with('[') {
            let end = r.find(']').ok_or_else(|| self.err("unterminated list"))?;
            let body = &r[1..end];
            let items: Vec<&str> = body
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            let v = if *ty == ArgType::FloatList {
                let f: std::result::Result<Vec<f64>, _> = items.iter().map(|s| s.parse()).collect();
                AttrValue::FloatList(f.map_err(|_| self.err("bad float list"))?)
            } else {
                let i: std::result::Result<Vec<i64>, _> = items.iter().map(|s| s.parse()).collect();
                AttrValue::IntList(i.map_err(|_| self.err("bad int list"))?)
            };
            self.pos += end + 1;
            v
        } else {
            let len = r
                .find(|c: char| c == ',' || c == ')' || c.is_whitespace())
                .unwrap_or(r.len());
            let tok = &r[..len];
            let v = match tok {
                "True" => AttrValue::Bool(true),
                "False" => AttrValue::Bool(false),
                "None" => AttrValue::None,
                _ => {
                    if let Ok(i) = tok.parse::<i64>() {
                        AttrValue::Int(i)
                    } else if let Ok(f) = tok.parse::<f64>() {
                        AttrValue::Float(f)
                    } else {
                        return Err(self.err(&format!("cannot parse default value `{tok}`")));
                    }
                }
            };
            self.pos += len;
            v
        };
        let ok = matches!(
            (ty, &v),
            (ArgType::OptionalTensor, AttrValue::None)
                | (ArgType::Int, AttrValue::Int(_))
                | (ArgType::Float, AttrValue::Float(_) | AttrValue::Int(_))
                | (ArgType::Bool, AttrValue::Bool(_))
                | (ArgType::Str, AttrValue::Str(_))
                | (ArgType::IntList, AttrValue::IntList(_))
                | (ArgType::FloatList, AttrValue::FloatList(_))
        );
        if !ok {
            self.pos = start;
            return Err(self.err(&format!("default does not match type {}", ty.schema_name())));
        }
        Ok(match (ty, v) {
            (ArgType::Float, AttrValue::Int(i)) => AttrValue::Float(i as f64),
            (_, v) => v,
        })
    }

    fn ret(&mut self) -> Result<Return> {
        self.skip_ws();
        let start = self.pos;
        let t = self.ident()?;
        if t != "Tensor" {
            self.pos = start;
            return Err(self.err("ops return Tensors only"));
        }
        let alias = self.alias()?;
        self.skip_ws();
        let name = if self
            .rest()
            .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        {
            Some(self.ident()?)
        } else {
            None
        };
        Ok(Return { name, alias })
    }

    fn returns(&mut self) -> Result<(Vec<Return>, bool)> {
        if self.eat("(") {
            let mut rets = Vec::new();
            if self.eat(")") {
                return Ok((rets, true));
            }
            loop {
                rets.push(self.ret()?);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
            Ok((rets, true))
        } else {
            Ok((vec![self.ret()?], false))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_stock_form() {
        let s = Schema::parse(
            "topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)",
        )
        .unwrap();
        assert_eq!(s.name, "topk");
        assert_eq!(s.num_inputs(), 1);
        assert_eq!(s.attr_args().count(), 3);
        assert_eq!(s.args[2].default, Some(AttrValue::Int(-1)));
        assert_eq!(s.args[3].default, Some(AttrValue::Bool(true)));
        assert_eq!(s.returns.len(), 2);
        assert_eq!(s.returns[1].name.as_deref(), Some("indices"));

        let s = Schema::parse("rms_norm(Tensor x, Tensor? weight=None, float eps=1e-6) -> Tensor")
            .unwrap();
        assert_eq!(s.args[1].ty, ArgType::OptionalTensor);
        assert_eq!(s.args[2].default, Some(AttrValue::Float(1e-6)));

        let s = Schema::parse("relu_(Tensor(a!) x) -> Tensor(a!)").unwrap();
        assert_eq!(
            s.args[0].alias,
            Some(Alias {
                set: "a".into(),
                write: true
            })
        );
        assert_eq!(
            s.returns[0].alias,
            Some(Alias {
                set: "a".into(),
                write: true
            })
        );

        let s = Schema::parse("gelu(Tensor x, str approximate=\"none\") -> Tensor").unwrap();
        assert_eq!(s.args[1].default, Some(AttrValue::Str("none".into())));

        let s = Schema::parse("f(Tensor x, int[] dims=[1, -2], *, float a=2) -> Tensor").unwrap();
        assert_eq!(s.args[1].default, Some(AttrValue::IntList(vec![1, -2])));
        assert!(s.args[2].kwarg_only);
        assert_eq!(s.args[2].default, Some(AttrValue::Float(2.0)));
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)",
            "rms_norm(Tensor x, Tensor? weight=None, float eps=1e-06) -> Tensor",
            "relu_(Tensor(a!) x) -> Tensor(a!)",
            "f(Tensor(a!) x, Tensor(b)? y=None) -> Tensor(a!)",
            "gelu(Tensor x, str approximate=\"none\") -> Tensor",
        ] {
            let s = Schema::parse(text).unwrap();
            let again = Schema::parse(&s.to_string()).unwrap();
            assert_eq!(s, again, "{text}");
        }
    }

    #[test]
    fn errors_point_at_the_bad_character() {
        let e = Schema::parse("topk(Tensor x, integer k) -> Tensor").unwrap_err();
        assert!(e.message.contains("column 16"), "{}", e.message);
        assert!(
            e.message.contains("unknown type `integer`"),
            "{}",
            e.message
        );
        let e = Schema::parse("f(Tensor x) Tensor").unwrap_err();
        assert!(e.message.contains("expected `->`"), "{}", e.message);
        let e = Schema::parse("f(Tensor x, int k=1.5) -> Tensor").unwrap_err();
        assert!(
            e.message.contains("default does not match type int"),
            "{}",
            e.message
        );
        let e = Schema::parse("f(Tensor x, int x) -> Tensor").unwrap_err();
        assert!(e.message.contains("duplicate"), "{}", e.message);
        let e = Schema::parse("f(Tensor x) -> Tensor out)").unwrap_err();
        assert!(e.message.contains("unexpected text"), "{}", e.message);
        let e = Schema::parse("f(Tensor x, str s=\"abc) -> Tensor").unwrap_err();
        assert!(e.message.contains("unterminated string"), "{}", e.message);
        let e = Schema::parse("f(Tensor x) -> int").unwrap_err();
        assert!(e.message.contains("Tensors only"), "{}", e.message);
    }
}
