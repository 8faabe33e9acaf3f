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
    /// `int[]` (`None`) or `int[N]` (`Some(N)`, a fixed length N >= 1). A single int is
    /// accepted for either: repeated N times for `int[N]` (as torch's `int[2]` does), a
    /// one-element list for `int[]`.
    IntList(Option<usize>),
    FloatList,
}

impl ArgType {
    pub fn is_tensor(&self) -> bool {
        matches!(self, ArgType::Tensor | ArgType::OptionalTensor)
    }
    /// The type's kind as written in a schema, without a list's fixed length (`int[]` for
    /// `int[2]` too): what the adapters and the Python glue dispatch on.
    pub fn schema_name(&self) -> &'static str {
        match self {
            ArgType::Tensor => "Tensor",
            ArgType::OptionalTensor => "Tensor?",
            ArgType::Int => "int",
            ArgType::Float => "float",
            ArgType::Bool => "bool",
            ArgType::Str => "str",
            ArgType::IntList(_) => "int[]",
            ArgType::FloatList => "float[]",
        }
    }
    /// The type exactly as written in a schema (`int[2]`).
    pub fn schema_type(&self) -> String {
        match self {
            ArgType::IntList(Some(n)) => format!("int[{n}]"),
            ty => ty.schema_name().to_string(),
        }
    }
    /// The fixed length of an `int[N]` list.
    pub fn fixed_len(&self) -> Option<usize> {
        match self {
            ArgType::IntList(n) => *n,
            _ => None,
        }
    }
}

impl Arg {
    /// The default as binding uses it: coerced to the argument's type (`int[2] stride=1`
    /// gives `[1, 1]`, `int[] padding=0` gives `[0]`). `None` for a required argument.
    pub fn default_value(&self) -> Option<AttrValue> {
        let d = self.default.clone()?;
        Some(crate::attrs::coerce(&self.name, &self.ty, d.clone()).unwrap_or(d))
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
                (ty, _) => f.write_str(&ty.schema_type())?,
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
            "float" if self.rest().starts_with("[]") => {
                self.pos += 2;
                (ArgType::FloatList, None)
            }
            "int" if self.rest().starts_with('[') => (ArgType::IntList(self.list_len()?), None),
            "int" => (ArgType::Int, None),
            "float" => (ArgType::Float, None),
            "bool" => (ArgType::Bool, None),
            "str" => (ArgType::Str, None),
            other => {
                self.pos = start;
                return Err(self.err(&format!(
                    "unknown type `{other}` (expected Tensor, Tensor?, int, float, bool, str, int[], int[N] or float[])"
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

    /// `[]` (`None`) or `[N]` with N >= 1, after a list's element type.
    fn list_len(&mut self) -> Result<Option<usize>> {
        self.pos += 1; // `[`
        let r = self.rest();
        let digits = r.chars().take_while(char::is_ascii_digit).count();
        let n = if digits == 0 {
            None
        } else {
            match r[..digits].parse::<usize>() {
                Ok(n) if n >= 1 => Some(n),
                _ => return Err(self.err("a fixed list length must be an integer >= 1")),
            }
        };
        self.pos += digits;
        if !self.rest().starts_with(']') {
            return Err(self.err("expected `]` closing the list type"));
        }
        self.pos += 1;
        Ok(n)
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
                | (
                    ArgType::IntList(_),
                    AttrValue::IntList(_) | AttrValue::Int(_)
                )
                | (ArgType::FloatList, AttrValue::FloatList(_))
        );
        if !ok {
            self.pos = start;
            return Err(self.err(&format!("default does not match type {}", ty.schema_type())));
        }
        if let (Some(n), AttrValue::IntList(l)) = (ty.fixed_len(), &v) {
            if l.len() != n {
                self.pos = start;
                return Err(self.err(&format!(
                    "default has {} values, type {} takes {n} (or a single int)",
                    l.len(),
                    ty.schema_type()
                )));
            }
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
            "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[] padding=0, int[2] dilation=[1, 2], int groups=1) -> Tensor",
        ] {
            let s = Schema::parse(text).unwrap();
            let again = Schema::parse(&s.to_string()).unwrap();
            assert_eq!(s, again, "{text}");
        }
    }

    #[test]
    fn fixed_length_int_lists() {
        let s = Schema::parse(
            "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[] padding=0, int[2] dilation=[1, 2], int groups=1) -> Tensor",
        )
        .unwrap();
        let ty = |i: usize| s.args[i].ty.clone();
        assert_eq!(ty(3), ArgType::IntList(Some(2)));
        assert_eq!(ty(4), ArgType::IntList(None));
        assert_eq!(ty(5), ArgType::IntList(Some(2)));
        // defaults are kept as written (Display reproduces the schema) ...
        assert_eq!(s.args[3].default, Some(AttrValue::Int(1)));
        assert_eq!(s.args[4].default, Some(AttrValue::Int(0)));
        assert!(s.to_string().contains("int[2] stride=1, int[] padding=0"));
        // ... and coerced to the type where used: repeated to N, or a one-element int[]
        assert_eq!(
            s.args[3].default_value(),
            Some(AttrValue::IntList(vec![1, 1]))
        );
        assert_eq!(s.args[4].default_value(), Some(AttrValue::IntList(vec![0])));
        assert_eq!(
            s.args[5].default_value(),
            Some(AttrValue::IntList(vec![1, 2]))
        );
        assert_eq!(ty(3).schema_name(), "int[]", "the kind, for the adapters");
        assert_eq!(ty(3).schema_type(), "int[2]");
        assert_eq!(ty(3).fixed_len(), Some(2));
        assert_eq!(ty(4).fixed_len(), None);

        let bad = |text: &str, want: &str| {
            let e = Schema::parse(text).unwrap_err();
            assert!(e.message.contains(want), "{text}: {}", e.message);
        };
        bad(
            "f(Tensor x, int[0] s=1) -> Tensor",
            "length must be an integer >= 1",
        );
        bad("f(Tensor x, int[2 s=1) -> Tensor", "expected `]`");
        bad("f(Tensor x, int[x] s=1) -> Tensor", "expected `]`");
        bad(
            "f(Tensor x, int[2] s=[1, 2, 3]) -> Tensor",
            "default has 3 values, type int[2] takes 2",
        );
        bad(
            "f(Tensor x, int[2] s=1.5) -> Tensor",
            "default does not match type int[2]",
        );
        bad(
            "f(Tensor x, float[2] s=1) -> Tensor",
            "expected an identifier",
        );
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
