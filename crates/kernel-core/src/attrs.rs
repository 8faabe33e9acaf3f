//! Attribute values (the non-tensor arguments of an op) and their binding against a schema.

use crate::schema::{ArgType, Schema};
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    None,
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    IntList(Vec<i64>),
    FloatList(Vec<f64>),
}

impl AttrValue {
    pub fn type_name(&self) -> &'static str {
        match self {
            AttrValue::None => "None",
            AttrValue::Int(_) => "int",
            AttrValue::Float(_) => "float",
            AttrValue::Bool(_) => "bool",
            AttrValue::Str(_) => "str",
            AttrValue::IntList(_) => "int[]",
            AttrValue::FloatList(_) => "float[]",
        }
    }
    /// Equality with floats compared bit for bit (see [`Attrs::same_as`]).
    pub fn same_as(&self, other: &AttrValue) -> bool {
        match (self, other) {
            (AttrValue::Float(a), AttrValue::Float(b)) => a.to_bits() == b.to_bits(),
            (AttrValue::FloatList(a), AttrValue::FloatList(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (a, b) => a == b,
        }
    }
    /// How the value is written in a schema default.
    pub fn schema_literal(&self) -> String {
        match self {
            AttrValue::None => "None".into(),
            AttrValue::Int(i) => i.to_string(),
            AttrValue::Float(f) => {
                let s = format!("{f:?}");
                s
            }
            AttrValue::Bool(b) => if *b { "True" } else { "False" }.into(),
            AttrValue::Str(s) => format!("\"{s}\""),
            AttrValue::IntList(v) => {
                format!(
                    "[{}]",
                    v.iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            AttrValue::FloatList(v) => {
                format!(
                    "[{}]",
                    v.iter()
                        .map(|x| format!("{x:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        }
    }
}

/// Widen a float attribute that a framework stores as float32 (ONNX and TensorFlow always; XLA
/// when the caller passes a float32) to the f64 the user most likely wrote: the shortest decimal
/// that round-trips the f32 (`1e-6f32` becomes `1e-6`, not `9.99999997e-7`). Every adapter
/// widens the same way, so `eps=1e-6` gives bitwise-identical results in every framework.
pub fn widen_f32_attr(v: f32) -> f64 {
    format!("{v}").parse::<f64>().unwrap_or(v as f64)
}

/// Bound attributes: every attribute of the schema, in schema order, with defaults filled in
/// and values coerced to the declared type.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attrs {
    values: Vec<(String, AttrValue)>,
}

impl Attrs {
    /// Bind `given` (name, value) pairs to `schema`'s attribute arguments. Coercions are the
    /// ones frameworks need: an int for a float, 0/1 ints for a bool (ONNX has no bool), a
    /// single int for an `int[N]` (repeated N times) or an `int[]` (one element). Unknown
    /// names, missing required attributes and wrong types are errors naming the attribute.
    pub fn bind<'a>(
        schema: &Schema,
        given: impl IntoIterator<Item = (&'a str, AttrValue)>,
    ) -> Result<Attrs> {
        let mut given: Vec<(&str, AttrValue)> = given.into_iter().collect();
        let mut values = Vec::new();
        for arg in schema.attr_args() {
            let pos = given.iter().position(|(n, _)| *n == arg.name);
            let v = match pos {
                Some(p) => given.remove(p).1,
                None => match &arg.default {
                    Some(d) => d.clone(),
                    None => {
                        return Err(Error::invalid(format!(
                            "missing required attribute `{}` ({})",
                            arg.name,
                            arg.ty.schema_name()
                        )))
                    }
                },
            };
            let v = coerce(&arg.name, &arg.ty, v)?;
            values.push((arg.name.clone(), v));
        }
        if let Some((name, _)) = given.first() {
            let known: Vec<&str> = schema.attr_args().map(|a| a.name.as_str()).collect();
            return Err(Error::invalid(format!(
                "unknown attribute `{name}` (this op takes: {})",
                if known.is_empty() {
                    "no attributes".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        Ok(Attrs { values })
    }

    /// Equal names and values, floats compared bit for bit (so `-0.0` and `0.0` differ and a
    /// NaN equals itself): the equality under which cached results may be reused.
    pub fn same_as(&self, other: &Attrs) -> bool {
        self.values.len() == other.values.len()
            && self
                .values
                .iter()
                .zip(&other.values)
                .all(|((n, a), (m, b))| n == m && a.same_as(b))
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, &AttrValue)> {
        self.values.iter().map(|(n, v)| (n.as_str(), v))
    }
    pub fn get(&self, name: &str) -> Result<&AttrValue> {
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| Error::internal(format!("op has no attribute `{name}`")))
    }
    /// An `int` attribute, already bound (default filled in) and type-checked.
    pub fn int(&self, name: &str) -> Result<i64> {
        match self.get(name)? {
            AttrValue::Int(i) => Ok(*i),
            v => Err(Error::internal(format!(
                "attribute `{name}` is {}, not int",
                v.type_name()
            ))),
        }
    }
    /// A `float` attribute as f64 (float32 values from ONNX and XLA widened exactly).
    pub fn float(&self, name: &str) -> Result<f64> {
        match self.get(name)? {
            AttrValue::Float(f) => Ok(*f),
            v => Err(Error::internal(format!(
                "attribute `{name}` is {}, not float",
                v.type_name()
            ))),
        }
    }
    /// A `bool` attribute (an ONNX INT 0/1 arrives as a bool).
    pub fn bool(&self, name: &str) -> Result<bool> {
        match self.get(name)? {
            AttrValue::Bool(b) => Ok(*b),
            v => Err(Error::internal(format!(
                "attribute `{name}` is {}, not bool",
                v.type_name()
            ))),
        }
    }
    /// A `str` attribute.
    pub fn str(&self, name: &str) -> Result<&str> {
        match self.get(name)? {
            AttrValue::Str(s) => Ok(s),
            v => Err(Error::internal(format!(
                "attribute `{name}` is {}, not str",
                v.type_name()
            ))),
        }
    }
    /// An `int[]` attribute (torch `int[]`, TF `list(int)`, ONNX INTS, XLA int64 array).
    pub fn int_list(&self, name: &str) -> Result<&[i64]> {
        match self.get(name)? {
            AttrValue::IntList(l) => Ok(l),
            v => Err(Error::internal(format!(
                "attribute `{name}` is {}, not int[]",
                v.type_name()
            ))),
        }
    }
    /// A `float[]` attribute (values widened to f64 as for `float`).
    pub fn float_list(&self, name: &str) -> Result<&[f64]> {
        match self.get(name)? {
            AttrValue::FloatList(l) => Ok(l),
            v => Err(Error::internal(format!(
                "attribute `{name}` is {}, not float[]",
                v.type_name()
            ))),
        }
    }
}

/// `v` as an attribute of type `ty` (see [`Attrs::bind`]); `name` for the error.
pub(crate) fn coerce(name: &str, ty: &ArgType, v: AttrValue) -> Result<AttrValue> {
    let bad = |v: &AttrValue| {
        Err(Error::invalid(format!(
            "attribute `{name}` must be {}, got {}",
            ty.schema_type(),
            v.type_name()
        )))
    };
    match (ty, v) {
        (ArgType::Int, v @ AttrValue::Int(_)) => Ok(v),
        (ArgType::Float, v @ AttrValue::Float(_)) => Ok(v),
        (ArgType::Float, AttrValue::Int(i)) => Ok(AttrValue::Float(i as f64)),
        (ArgType::Bool, v @ AttrValue::Bool(_)) => Ok(v),
        (ArgType::Bool, AttrValue::Int(i)) if i == 0 || i == 1 => Ok(AttrValue::Bool(i == 1)),
        (ArgType::Str, v @ AttrValue::Str(_)) => Ok(v),
        (ArgType::IntList(Some(n)), AttrValue::IntList(l)) if l.len() != *n => {
            Err(Error::invalid(format!(
                "attribute `{name}` must be int[{n}] (a single int or {n} ints), got {} ints {l:?}",
                l.len()
            )))
        }
        (ArgType::IntList(_), v @ AttrValue::IntList(_)) => Ok(v),
        // a single int: repeated to the fixed length, or a one-element `int[]`
        (ArgType::IntList(n), AttrValue::Int(i)) => Ok(AttrValue::IntList(vec![i; n.unwrap_or(1)])),
        (ArgType::FloatList, v @ AttrValue::FloatList(_)) => Ok(v),
        (ArgType::FloatList, AttrValue::IntList(l)) => Ok(AttrValue::FloatList(
            l.into_iter().map(|i| i as f64).collect(),
        )),
        (_, v) => bad(&v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topk() -> Schema {
        Schema::parse("topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)")
            .unwrap()
    }

    #[test]
    fn fills_defaults_and_coerces() {
        let a = Attrs::bind(
            &topk(),
            [("k", AttrValue::Int(2)), ("largest", AttrValue::Int(0))],
        )
        .unwrap();
        assert_eq!(a.int("k").unwrap(), 2);
        assert_eq!(a.int("axis").unwrap(), -1);
        assert!(!a.bool("largest").unwrap());
        let s = Schema::parse("scale(Tensor x, float alpha) -> Tensor").unwrap();
        let a = Attrs::bind(&s, [("alpha", AttrValue::Int(3))]).unwrap();
        assert_eq!(a.float("alpha").unwrap(), 3.0);
    }

    #[test]
    fn int_lists_take_a_single_int() {
        let s = Schema::parse(
            "conv(Tensor x, int[2] stride=1, int[] padding=0, int[3] k=[1, 2, 3]) -> Tensor",
        )
        .unwrap();
        let a = Attrs::bind(&s, []).unwrap();
        assert_eq!(a.int_list("stride").unwrap(), &[1, 1]);
        assert_eq!(a.int_list("padding").unwrap(), &[0]);
        assert_eq!(a.int_list("k").unwrap(), &[1, 2, 3]);
        let a = Attrs::bind(
            &s,
            [
                ("stride", AttrValue::Int(2)),
                ("padding", AttrValue::Int(3)),
                ("k", AttrValue::Int(4)),
            ],
        )
        .unwrap();
        assert_eq!(a.int_list("stride").unwrap(), &[2, 2]);
        assert_eq!(a.int_list("padding").unwrap(), &[3]);
        assert_eq!(a.int_list("k").unwrap(), &[4, 4, 4]);
        let a = Attrs::bind(
            &s,
            [
                ("stride", AttrValue::IntList(vec![2, 1])),
                ("padding", AttrValue::IntList(vec![1, 2, 3, 4])),
            ],
        )
        .unwrap();
        assert_eq!(a.int_list("stride").unwrap(), &[2, 1]);
        assert_eq!(a.int_list("padding").unwrap(), &[1, 2, 3, 4]);
        let e = Attrs::bind(&s, [("stride", AttrValue::IntList(vec![1, 2, 3]))]).unwrap_err();
        assert!(
            e.message
                .contains("`stride` must be int[2] (a single int or 2 ints), got 3 ints"),
            "{e}"
        );
        let e = Attrs::bind(&s, [("stride", AttrValue::IntList(vec![]))]).unwrap_err();
        assert!(e.message.contains("got 0 ints"), "{e}");
        let e = Attrs::bind(&s, [("stride", AttrValue::Float(1.0))]).unwrap_err();
        assert!(
            e.message.contains("`stride` must be int[2], got float"),
            "{e}"
        );
    }

    #[test]
    fn same_as_compares_floats_bitwise() {
        let s = Schema::parse("scale(Tensor x, float alpha, float[] w=[]) -> Tensor").unwrap();
        let b = |a: f64, w: Vec<f64>| {
            Attrs::bind(
                &s,
                [
                    ("alpha", AttrValue::Float(a)),
                    ("w", AttrValue::FloatList(w)),
                ],
            )
            .unwrap()
        };
        assert!(b(1.5, vec![2.0]).same_as(&b(1.5, vec![2.0])));
        assert!(!b(0.0, vec![]).same_as(&b(-0.0, vec![])));
        assert!(!b(1.0, vec![0.0]).same_as(&b(1.0, vec![-0.0])));
        assert!(b(f64::NAN, vec![]).same_as(&b(f64::NAN, vec![])));
        assert!(!b(1.0, vec![]).same_as(&b(2.0, vec![])));
    }

    #[test]
    fn float32_attributes_widen_to_the_decimal_written() {
        assert_eq!(widen_f32_attr(1e-6f64 as f32), 1e-6);
        assert_eq!(widen_f32_attr(0.1), 0.1);
        assert_eq!(widen_f32_attr(1.5), 1.5);
        assert_eq!(widen_f32_attr(1.7f64 as f32), 1.7);
        assert_eq!(widen_f32_attr(f32::INFINITY), f64::INFINITY);
        assert!(widen_f32_attr(f32::NAN).is_nan());
        assert_ne!(
            1e-6f64 as f32 as f64, 1e-6,
            "a plain cast would not round-trip"
        );
    }

    #[test]
    fn rejects_bad_attributes() {
        let e = Attrs::bind(&topk(), []).unwrap_err();
        assert!(e.message.contains("missing required attribute `k`"), "{e}");
        let e = Attrs::bind(
            &topk(),
            [("k", AttrValue::Int(1)), ("kk", AttrValue::Int(1))],
        )
        .unwrap_err();
        assert!(e.message.contains("unknown attribute `kk`"), "{e}");
        let e = Attrs::bind(&topk(), [("k", AttrValue::Float(1.5))]).unwrap_err();
        assert!(e.message.contains("`k` must be int, got float"), "{e}");
        let e = Attrs::bind(
            &topk(),
            [("k", AttrValue::Int(1)), ("largest", AttrValue::Int(2))],
        )
        .unwrap_err();
        assert!(e.message.contains("`largest` must be bool"), "{e}");
    }
}
