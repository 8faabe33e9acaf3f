//! Shape inference when attribute values are unknown (TensorFlow's C shape functions see
//! input shapes and type attributes only).

use crate::op::TypeRule;
use crate::schema::{Arg, ArgType};
use crate::{AttrValue, Attrs, DType, Error, OpDef, Result, TensorSpec};

/// Most attribute combinations tried per inference.
const MAX_PROBES: usize = 1024;

/// Candidate values of one attribute; `None` when it cannot be probed (no default, not int,
/// float or bool).
fn probe_values(arg: &Arg) -> Option<Vec<AttrValue>> {
    let mut v: Vec<AttrValue> = Vec::new();
    // the default as binding sees it (`int[2] stride=1` is `[1, 1]`)
    let default = arg.default_value();
    if let Some(d) = &default {
        if *d != AttrValue::None {
            v.push(d.clone());
        }
    }
    let extra: Vec<AttrValue> = match (&arg.ty, &default) {
        (ArgType::Int, _) => [0, 1, 2, 3, -1, -2].map(AttrValue::Int).to_vec(),
        (ArgType::Float, _) => [1.0, 0.5, 2.0].map(AttrValue::Float).to_vec(),
        (ArgType::Bool, _) => [true, false].map(AttrValue::Bool).to_vec(),
        // A fixed-length list changes a shape through its values only.
        (ArgType::IntList(Some(n)), _) => [1, 2, 3, 4]
            .map(|k| AttrValue::IntList(vec![k; *n]))
            .to_vec(),
        // A list can change a shape through its values (pads) or its length: vary both, so a
        // dim that depends on it is not taken for static (which TF would then trust).
        (ArgType::IntList(None), Some(AttrValue::IntList(d))) => [1, 2, 3]
            .iter()
            .map(|k| AttrValue::IntList(d.iter().map(|v| v + k).collect()))
            .chain([
                AttrValue::IntList(vec![1; d.len() + 1]),
                AttrValue::IntList(vec![2; d.len().max(1)]),
            ])
            .collect(),
        (ArgType::IntList(None), _) => vec![
            AttrValue::IntList(vec![1]),
            AttrValue::IntList(vec![1, 2]),
            AttrValue::IntList(vec![2, 3, 4, 5]),
        ],
        (ArgType::FloatList, Some(AttrValue::FloatList(d))) => [0.5, 2.0]
            .iter()
            .map(|k| AttrValue::FloatList(d.iter().map(|v| v * k + k).collect()))
            .chain([AttrValue::FloatList(vec![1.0; d.len() + 1])])
            .collect(),
        (ArgType::FloatList, _) => vec![
            AttrValue::FloatList(vec![1.0]),
            AttrValue::FloatList(vec![0.5, 2.0]),
        ],
        // Strings are probed with their default only: an op whose output shape depends on a
        // string attribute gets the default's shape in TF graph mode (docs/tensorflow.md).
        _ => Vec::new(),
    };
    for e in extra {
        if !v.contains(&e) {
            v.push(e);
        }
    }
    (!v.is_empty()).then_some(v)
}

/// Every probe attribute set for `op` (the cartesian product), or `None` if some attribute
/// cannot be probed or there would be too many.
fn probe_attr_sets(op: &OpDef) -> Option<Vec<Attrs>> {
    let args: Vec<_> = op.schema.attr_args().collect();
    let values: Vec<Vec<AttrValue>> = args
        .iter()
        .map(|a| probe_values(a))
        .collect::<Option<_>>()?;
    let total: usize = values.iter().map(Vec::len).product();
    if total > MAX_PROBES {
        return None;
    }
    let mut out = Vec::with_capacity(total);
    for mut idx in 0..total {
        let mut given = Vec::with_capacity(args.len());
        for (a, vals) in args.iter().zip(&values) {
            given.push((a.name.as_str(), vals[idx % vals.len()].clone()));
            idx /= vals.len();
        }
        if let Ok(attrs) = op.bind_attrs(given) {
            out.push(attrs);
        }
    }
    Some(out)
}

impl OpDef {
    /// Shape inference when the attribute values are not known (TF's C shape API cannot read
    /// them): the op's inference over probe values of its attributes (defaults and a few
    /// small values), keeping what every successful probe agrees on. A dim no attribute can
    /// change stays static, one they change (topk's `k` axis, conv2d's spatial dims) becomes
    /// unknown; ops whose attributes cannot be probed get outputs of unknown rank. An error
    /// only when the inputs are invalid whatever the attributes (every probe fails alike).
    pub fn infer_unknown_attrs(&self, inputs: &[Option<TensorSpec>]) -> Result<Vec<TensorSpec>> {
        // dtypes and arity do not depend on attributes: check them first, for a precise error.
        let dtypes: Vec<Option<DType>> =
            inputs.iter().map(|s| s.as_ref().map(|s| s.dtype)).collect();
        let t = self.check_inputs(&dtypes)?;
        let unknown = || -> Result<Vec<TensorSpec>> {
            self.output_types
                .iter()
                .map(|r| match r {
                    TypeRule::Fixed(d) => Ok(TensorSpec::unknown_rank(*d)),
                    TypeRule::T => t
                        .map(TensorSpec::unknown_rank)
                        .ok_or_else(|| Error::internal("no input binds T").in_op(self)),
                })
                .collect()
        };
        let Some(probes) = probe_attr_sets(self) else {
            return unknown();
        };
        let mut merged: Option<Vec<TensorSpec>> = None;
        let mut first_err: Option<Error> = None;
        let mut errors_agree = true;
        for attrs in &probes {
            match self.infer(inputs, attrs) {
                Ok(specs) => {
                    merged = Some(match merged {
                        None => specs,
                        Some(m) => m.into_iter().zip(specs).map(|(a, b)| merge(a, b)).collect(),
                    })
                }
                Err(e) => match &first_err {
                    None => first_err = Some(e),
                    Some(f) => errors_agree &= f.message == e.message,
                },
            }
        }
        match (merged, first_err) {
            (Some(m), _) => Ok(m),
            (None, Some(e)) if errors_agree => Err(e),
            _ => unknown(),
        }
    }
}

fn merge(a: TensorSpec, b: TensorSpec) -> TensorSpec {
    let shape = match (a.shape, b.shape) {
        (Some(x), Some(y)) if x.len() == y.len() => Some(
            x.into_iter()
                .zip(y)
                .map(|(p, q)| if p == q { p } else { crate::Dim::Unknown })
                .collect(),
        ),
        _ => None,
    };
    TensorSpec {
        dtype: a.dtype,
        shape,
    }
}
