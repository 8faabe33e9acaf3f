//! The standard ONNX operators an op implements, as data ([`OnnxOp`]), and the one generic
//! decision of whether a given ONNX node is exactly that op ([`OnnxOp::plan`]).
//!
//! An op declares, in its definition (`OpBuilder::onnx`), which ONNX op type of the default
//! domain it computes, for which schema versions (`since_version`s: ONNX Runtime matches
//! kernels to a node by the version of the op's schema the model's opset resolves to), how the
//! node's inputs and attributes map onto its schema, and the few layout differences ONNX has
//! (a tensor viewed as 2-D at an axis; a transposed output). An execution provider translates
//! this generically: it asks [`OnnxOp::plan`] about each node through the [`OnnxNode`] view of
//! its graph and claims the node only when the answer is a plan, i.e. when the dtypes,
//! attributes, opset and (declared) shapes fall inside the op's semantics. Anything else is
//! left to the framework's own implementation, with the reason.

use crate::dim::Dim;
use crate::op::{OpDef, TensorSpec};
use crate::schema::ArgType;
use crate::{AttrValue, Attrs, DType};

/// One ONNX node input.
#[derive(Debug, Clone)]
pub enum OnnxInput {
    /// The op's tensor input `i` (schema order).
    Tensor(usize),
    /// A one-element integer tensor that gives the op's int attribute of this name (ONNX
    /// `TopK`'s `K` input: polyop's `k` attribute): bound once when it is a constant
    /// initializer, else read at run time (and bound once per distinct value).
    IntAttr(&'static str),
}

/// How one ONNX attribute maps onto the schema.
#[derive(Debug, Clone)]
pub enum OnnxAttr {
    /// ONNX attribute `onnx` gives schema attribute `to`; `default` is ONNX's default when the
    /// node leaves it out (`None`: the schema's own default, declared equal to ONNX's).
    Map {
        onnx: &'static str,
        to: &'static str,
        default: Option<AttrValue>,
    },
    /// ONNX attribute `onnx` must be absent or equal to `value` (ONNX's default when absent
    /// must be `value` too): a node with any other value is not claimed.
    Require {
        onnx: &'static str,
        value: AttrValue,
    },
    /// Schema attribute `to` is fixed to `value` for this ONNX op.
    Set { to: &'static str, value: AttrValue },
}

/// How the ONNX op's tensors relate to the op's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnnxLayout {
    /// The same tensors.
    Same,
    /// Every tensor is viewed as 2-D `[prod(dims before axis), prod(dims from axis on)]`, the
    /// axis taken from ONNX int attribute `attr` (default `default`); outputs have input 0's
    /// shape (ONNX `Softmax` before opset 13).
    Flatten2D { attr: &'static str, default: i64 },
    /// Output `i` is the transpose of the op's 2-D output (ONNX `NonZero`'s `[rank, n]`).
    TransposeOutput(usize),
}

/// An op-specific rule on top of the declarative mapping: may add or replace schema attributes
/// (`given`) from the node (e.g. resolve `Conv`'s `auto_pad`), or refuse the node with a reason.
pub type OnnxCheckFn =
    fn(node: &dyn OnnxNode, given: &mut Vec<(&'static str, AttrValue)>) -> Result<(), String>;

/// A standard ONNX op that a polyop op implements (see the module docs).
#[derive(Debug, Clone)]
pub struct OnnxOp {
    pub op_type: &'static str,
    /// The ONNX schema versions (`since_version`) covered, each exactly.
    pub versions: &'static [u32],
    /// The node's inputs in ONNX order.
    pub inputs: Vec<OnnxInput>,
    /// Every attribute the ONNX op has in these versions (an attribute not listed here makes
    /// the mapping incomplete: [`OnnxOp::attr_names`] is checked against ONNX's schemas).
    pub attrs: Vec<OnnxAttr>,
    /// ONNX attributes that do not change the result (documented and accepted as is).
    pub ignored: Vec<&'static str>,
    pub layout: OnnxLayout,
    /// Restricts `T` further than the op's dtypes (`None`: every dtype of the op).
    pub dtypes: Option<&'static [DType]>,
    pub check: Option<OnnxCheckFn>,
}

impl OnnxOp {
    /// ONNX op type `op_type` of the default domain, schema versions `versions`, with the
    /// op's tensor inputs in schema order as its inputs and no attributes (add them).
    pub fn new(op_type: &'static str, versions: &'static [u32]) -> Self {
        OnnxOp {
            op_type,
            versions,
            inputs: Vec::new(),
            attrs: Vec::new(),
            ignored: Vec::new(),
            layout: OnnxLayout::Same,
            dtypes: None,
            check: None,
        }
    }
    /// The node's inputs (ONNX order); without this call the op's tensor inputs in order.
    pub fn inputs(mut self, inputs: impl IntoIterator<Item = OnnxInput>) -> Self {
        self.inputs = inputs.into_iter().collect();
        self
    }
    /// ONNX attribute `onnx` is schema attribute `to`, whose schema default is ONNX's too.
    pub fn attr(mut self, onnx: &'static str, to: &'static str) -> Self {
        self.attrs.push(OnnxAttr::Map {
            onnx,
            to,
            default: None,
        });
        self
    }
    /// ONNX attribute `onnx` is schema attribute `to`; ONNX's default is `default`.
    pub fn attr_default(
        mut self,
        onnx: &'static str,
        to: &'static str,
        default: AttrValue,
    ) -> Self {
        self.attrs.push(OnnxAttr::Map {
            onnx,
            to,
            default: Some(default),
        });
        self
    }
    /// ONNX attribute `onnx` must be absent or `value`.
    pub fn require(mut self, onnx: &'static str, value: AttrValue) -> Self {
        self.attrs.push(OnnxAttr::Require { onnx, value });
        self
    }
    /// Schema attribute `to` is `value` for this ONNX op.
    pub fn set(mut self, to: &'static str, value: AttrValue) -> Self {
        self.attrs.push(OnnxAttr::Set { to, value });
        self
    }
    /// ONNX attribute `onnx` is read by [`OnnxOp::check`] (or does not change the result).
    pub fn ignore(mut self, onnx: &'static str) -> Self {
        self.ignored.push(onnx);
        self
    }
    pub fn layout(mut self, layout: OnnxLayout) -> Self {
        self.layout = layout;
        self
    }
    pub fn dtypes(mut self, dtypes: &'static [DType]) -> Self {
        self.dtypes = Some(dtypes);
        self
    }
    pub fn check(mut self, f: OnnxCheckFn) -> Self {
        self.check = Some(f);
        self
    }

    /// Every ONNX attribute name the mapping knows (to compare with ONNX's schema).
    pub fn attr_names(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = self
            .attrs
            .iter()
            .filter_map(|a| match a {
                OnnxAttr::Map { onnx, .. } | OnnxAttr::Require { onnx, .. } => Some(*onnx),
                OnnxAttr::Set { .. } => None,
            })
            .collect();
        if let OnnxLayout::Flatten2D { attr, .. } = self.layout {
            v.push(attr);
        }
        v.extend(&self.ignored);
        v
    }

    /// The `versions` as inclusive ranges of `since_version`s, one per version.
    pub fn covers(&self, since_version: u32) -> bool {
        self.versions.contains(&since_version)
    }
}

/// What an execution provider tells about one ONNX node (from its graph, or from the kernel
/// info when the kernel is created).
pub trait OnnxNode {
    /// The `since_version` of the op schema the node resolves to.
    fn since_version(&self) -> u32;
    /// The node's input count (absent trailing optional inputs may or may not be counted).
    fn num_inputs(&self) -> usize;
    /// Input `i`: `None` when absent (an empty name), `Err(type name)` when its element type
    /// is one polyop has no dtype for; dims may be unknown or symbolic.
    fn input(&self, i: usize) -> Option<Result<TensorSpec, String>>;
    /// Attribute `name` read as `ty` (`None`: absent).
    fn attr(&self, name: &str, ty: &ArgType) -> Option<AttrValue>;
    /// The values of input `i` when it is a constant integer initializer.
    fn const_ints(&self, i: usize) -> Option<Vec<i64>>;
    /// Call `f` with input `i`'s value when it is a constant initializer (for
    /// [`OnnxPlan::prepack`]); the default knows of none.
    fn const_tensor(&self, _i: usize, _f: &mut dyn FnMut(&crate::TensorRef)) {}
}

/// How to run one claimed node: the op's attributes, which node input feeds each of the op's
/// tensor inputs, and the layout.
#[derive(Debug, Clone)]
pub struct OnnxPlan {
    pub attrs: Attrs,
    /// Per tensor input of the op (schema order): the node's input index (`None`: absent).
    pub inputs: Vec<Option<usize>>,
    /// `Some(axis)` (non-negative): tensors are viewed as 2-D at `axis`.
    pub flatten_axis: Option<usize>,
    /// Output transposed from the op's 2-D result.
    pub transpose_output: Option<usize>,
    /// Attributes read at run time from one-element integer inputs: (node input, attribute).
    pub runtime_ints: Vec<(usize, &'static str)>,
}

impl OnnxPlan {
    /// The op's prepacked forms ([`crate::op::PrepackFn`]) of the node's constant inputs, for
    /// the call site that runs the node ([`crate::CallSite::prepacked`]); none for an op
    /// without prepacking, a plan that views its tensors flattened, or one with attributes
    /// read at run time (its attributes here are placeholders).
    pub fn prepack(&self, op: &OpDef, node: &dyn OnnxNode) -> Vec<(usize, crate::op::Prepacked)> {
        let mut out = Vec::new();
        let Some(f) = op
            .prepack
            .filter(|_| self.flatten_axis.is_none() && self.runtime_ints.is_empty())
        else {
            return out;
        };
        for (i, j) in self.inputs.iter().enumerate() {
            if let Some(j) = *j {
                node.const_tensor(j, &mut |t| {
                    if let Some(p) = f(i, t, &self.attrs) {
                        out.push((i, p));
                    }
                });
            }
        }
        out
    }

    /// The attributes with the run-time values of [`OnnxPlan::runtime_ints`] (in that order),
    /// bound to `op`'s schema.
    pub fn attrs_with(&self, op: &OpDef, values: &[i64]) -> crate::Result<Attrs> {
        let given = self.attrs.iter().map(|(n, v)| {
            let rt = self.runtime_ints.iter().position(|(_, a)| *a == n);
            (
                n,
                rt.map_or_else(|| v.clone(), |i| AttrValue::Int(values[i])),
            )
        });
        op.bind_attrs(given.collect::<Vec<_>>())
    }
}

/// `[prod(dims[..axis]), prod(dims[axis..])]`, unknown when a factor is.
pub fn flatten_2d_dims(dims: &[Dim], axis: usize) -> [Dim; 2] {
    let prod = |ds: &[Dim]| -> Dim {
        ds.iter()
            .try_fold(1usize, |acc, d| d.known().and_then(|v| acc.checked_mul(v)))
            .map_or(Dim::Unknown, Dim::Known)
    };
    [prod(&dims[..axis]), prod(&dims[axis..])]
}

/// The schema type of attribute `name` of `op`.
fn schema_attr_ty<'a>(op: &'a OpDef, name: &str) -> Result<&'a ArgType, String> {
    op.schema
        .attr_args()
        .find(|a| a.name == name)
        .map(|a| &a.ty)
        .ok_or_else(|| format!("the ONNX mapping names unknown attribute `{name}`"))
}

/// An attribute value as ONNX holds it: ints (ONNX has no bool) and f32 floats.
fn onnx_ty(v: &AttrValue) -> ArgType {
    match v {
        AttrValue::Float(_) => ArgType::Float,
        AttrValue::Str(_) => ArgType::Str,
        AttrValue::IntList(_) => ArgType::IntList(None),
        AttrValue::FloatList(_) => ArgType::FloatList,
        _ => ArgType::Int,
    }
}

impl OnnxOp {
    /// Whether `node` is exactly `op` under this mapping: the plan to run it, or why not.
    pub fn plan(&self, op: &OpDef, node: &dyn OnnxNode) -> Result<OnnxPlan, String> {
        let v = node.since_version();
        if !self.covers(v) {
            return Err(format!(
                "{} version {v} is not one of the versions {:?} {} implements",
                self.op_type, self.versions, op.name
            ));
        }
        let default_inputs: Vec<OnnxInput>;
        let inputs = if self.inputs.is_empty() {
            default_inputs = (0..op.num_inputs()).map(OnnxInput::Tensor).collect();
            &default_inputs
        } else {
            &self.inputs
        };
        let n_in = node.num_inputs();
        if n_in > inputs.len() {
            return Err(format!(
                "{n_in} inputs, {} implements {} with at most {}",
                op.name,
                self.op_type,
                inputs.len()
            ));
        }
        let tensor_args: Vec<_> = op.schema.tensor_args().collect();
        let mut specs: Vec<Option<TensorSpec>> = vec![None; tensor_args.len()];
        let mut map: Vec<Option<usize>> = vec![None; tensor_args.len()];
        let mut given: Vec<(&'static str, AttrValue)> = Vec::new();
        let mut runtime_ints = Vec::new();
        for (j, inp) in inputs.iter().enumerate() {
            let got = if j < n_in { node.input(j) } else { None };
            match inp {
                OnnxInput::Tensor(i) => match got {
                    None => {
                        if tensor_args.get(*i).is_some_and(|a| a.ty == ArgType::Tensor) {
                            return Err(format!("input {j} is absent"));
                        }
                    }
                    Some(Err(t)) => return Err(format!("input {j} has element type {t}")),
                    Some(Ok(spec)) => {
                        if *i >= specs.len() {
                            return Err(format!("the ONNX mapping names tensor input {i}"));
                        }
                        specs[*i] = Some(spec);
                        map[*i] = Some(j);
                    }
                },
                OnnxInput::IntAttr(name) => match node.const_ints(j) {
                    Some(vals) => match vals[..] {
                        [k] => given.push((name, AttrValue::Int(k))),
                        _ => return Err(format!("input {j} does not hold one value")),
                    },
                    None => {
                        // read at run time: an int64 tensor of one element
                        let spec = match got {
                            Some(Ok(spec)) => spec,
                            _ => return Err(format!("input {j} is absent or not a tensor")),
                        };
                        if spec.dtype != DType::I64 {
                            return Err(format!("input {j} is {}, not int64", spec.dtype));
                        }
                        if spec
                            .concrete()
                            .is_some_and(|s| s.iter().product::<usize>() != 1)
                        {
                            return Err(format!("input {j} does not hold one value"));
                        }
                        // (validated with the value 0 here; the real one at run time)
                        given.push((name, AttrValue::Int(0)));
                        runtime_ints.push((j, *name));
                    }
                },
            }
        }
        for a in &self.attrs {
            match a {
                OnnxAttr::Map { onnx, to, default } => {
                    let ty = schema_attr_ty(op, to)?;
                    if let Some(val) = node.attr(onnx, ty).or_else(|| default.clone()) {
                        given.push((to, val));
                    }
                }
                OnnxAttr::Require { onnx, value } => {
                    if let Some(got) = node.attr(onnx, &onnx_ty(value)) {
                        if !got.same_as(value) {
                            return Err(format!(
                                "attribute {onnx} = {} (implemented: {})",
                                got.schema_literal(),
                                value.schema_literal()
                            ));
                        }
                    }
                }
                OnnxAttr::Set { to, value } => given.push((to, value.clone())),
            }
        }
        if let Some(check) = self.check {
            check(node, &mut given)?;
        }
        let t = op
            .check_inputs(
                &specs
                    .iter()
                    .map(|s| s.as_ref().map(|s| s.dtype))
                    .collect::<Vec<_>>(),
            )
            .map_err(|e| e.message)?;
        if let (Some(t), Some(allowed)) = (t, self.dtypes) {
            if !allowed.contains(&t) {
                return Err(format!("dtype {t} is not implemented for {}", self.op_type));
            }
        }
        let attrs = op.bind_attrs(given).map_err(|e| e.message)?;
        let mut flatten_axis = None;
        if let OnnxLayout::Flatten2D { attr, default } = self.layout {
            let axis = match node.attr(attr, &ArgType::Int) {
                Some(AttrValue::Int(a)) => a,
                None => default,
                Some(_) => return Err(format!("attribute {attr} is not an int")),
            };
            let rank = specs
                .first()
                .and_then(|s| s.as_ref())
                .and_then(TensorSpec::rank)
                .ok_or("the input's rank is unknown")?;
            let a = if axis < 0 { axis + rank as i64 } else { axis };
            if a < 0 || a >= rank as i64 {
                return Err(format!("{attr} = {axis} for rank {rank}"));
            }
            let a = a as usize;
            for s in specs.iter_mut().flatten() {
                let dims = s.shape.as_deref().ok_or("an input's rank is unknown")?;
                if dims.len() != rank {
                    return Err("inputs of different ranks".into());
                }
                s.shape = Some(flatten_2d_dims(dims, a).to_vec());
            }
            flatten_axis = Some(a);
        }
        let inferred = op.infer_symbolic(&specs, &attrs).map_err(|e| e.message)?;
        if !inferred.constraints.is_empty() {
            return Err(format!(
                "the declared shapes leave requirements unproven ({})",
                inferred
                    .constraints
                    .iter()
                    .map(|c| c.message.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let transpose_output = match self.layout {
            OnnxLayout::TransposeOutput(i) => {
                if op.output_types.get(i).is_none() {
                    return Err(format!("the ONNX mapping transposes output {i}"));
                }
                Some(i)
            }
            _ => None,
        };
        Ok(OnnxPlan {
            attrs,
            inputs: map,
            flatten_axis,
            transpose_output,
            runtime_ints,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{InferCtx, KernelCtx, ShapeOut};
    use crate::{Error, Result};

    fn same(ctx: &InferCtx) -> Result<Vec<ShapeOut>> {
        let rank = ctx.input(0).rank().unwrap_or(0) as i64;
        let axis = ctx.attrs.int("axis")?;
        if axis < -rank || axis >= rank {
            return Err(Error::invalid("axis out of range"));
        }
        Ok(vec![ctx.input(0).shape.clone()])
    }
    fn nop(_: &mut KernelCtx) -> Result<()> {
        Err(Error::internal("not run"))
    }

    struct Node {
        v: u32,
        inputs: Vec<Option<Result<TensorSpec, String>>>,
        attrs: Vec<(&'static str, AttrValue)>,
        consts: Vec<(usize, Vec<i64>)>,
    }
    impl OnnxNode for Node {
        fn since_version(&self) -> u32 {
            self.v
        }
        fn num_inputs(&self) -> usize {
            self.inputs.len()
        }
        fn input(&self, i: usize) -> Option<Result<TensorSpec, String>> {
            self.inputs.get(i).cloned().flatten()
        }
        fn attr(&self, name: &str, _ty: &ArgType) -> Option<AttrValue> {
            self.attrs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        }
        fn const_ints(&self, i: usize) -> Option<Vec<i64>> {
            self.consts
                .iter()
                .find(|(j, _)| *j == i)
                .map(|(_, v)| v.clone())
        }
    }

    fn op() -> OpDef {
        OpDef::builder("norm_like(Tensor x, int axis=-1, int k=1, float eps=0.5) -> Tensor")
            .infer(same)
            .cpu(nop)
            .build()
            .unwrap()
    }

    fn node(v: u32, dims: &[usize], attrs: Vec<(&'static str, AttrValue)>) -> Node {
        Node {
            v,
            inputs: vec![Some(Ok(TensorSpec::new(DType::F32, dims)))],
            attrs,
            consts: vec![],
        }
    }

    #[test]
    fn maps_attributes_with_onnx_defaults() {
        let m = OnnxOp::new("Thing", &[3, 7])
            .inputs([OnnxInput::Tensor(0), OnnxInput::IntAttr("k")])
            .attr_default("axis", "axis", AttrValue::Int(1))
            .attr_default("epsilon", "eps", AttrValue::Float(0.25))
            .require("mode", AttrValue::Int(1));
        let op = op();
        let mut n = node(7, &[2, 3], vec![]);
        n.inputs.push(Some(Ok(TensorSpec::new(DType::I64, &[1]))));
        n.consts.push((1, vec![2]));
        let p = m.plan(&op, &n).unwrap();
        assert_eq!(p.attrs.int("axis").unwrap(), 1);
        assert_eq!(p.attrs.int("k").unwrap(), 2);
        assert_eq!(p.attrs.float("eps").unwrap(), 0.25);
        assert_eq!(p.inputs, vec![Some(0)]);
        // a version not listed, a forbidden attribute value, a non-constant k: not claimed
        n.v = 5;
        assert!(m.plan(&op, &n).unwrap_err().contains("version 5"));
        n.v = 3;
        n.attrs.push(("mode", AttrValue::Int(0)));
        assert!(m.plan(&op, &n).unwrap_err().contains("mode"));
        n.attrs.pop();
        // k not a constant: read at run time
        n.consts.clear();
        let p = m.plan(&op, &n).unwrap();
        assert_eq!(p.runtime_ints, vec![(1, "k")]);
        assert_eq!(p.attrs_with(&op, &[5]).unwrap().int("k").unwrap(), 5);
        assert_eq!(p.attrs_with(&op, &[5]).unwrap().int("axis").unwrap(), 1);
        // ... but only from a one-element int64 tensor
        n.inputs[1] = Some(Ok(TensorSpec::new(DType::I64, &[2])));
        assert!(m.plan(&op, &n).unwrap_err().contains("one value"));
        n.inputs[1] = Some(Ok(TensorSpec::new(DType::I32, &[1])));
        assert!(m.plan(&op, &n).unwrap_err().contains("int64"));
    }

    #[test]
    fn refuses_what_the_op_refuses() {
        let m = OnnxOp::new("Thing", &[1]).attr("axis", "axis");
        let op = op();
        // axis out of range for the rank: the op's own validation says no
        let n = node(1, &[2, 3], vec![("axis", AttrValue::Int(5))]);
        assert!(m.plan(&op, &n).is_err());
        // an element type polyop lacks
        let mut n = node(1, &[2], vec![]);
        n.inputs[0] = Some(Err("uint8".into()));
        assert!(m.plan(&op, &n).unwrap_err().contains("uint8"));
        // a dtype excluded by the mapping
        let m = m.dtypes(&[DType::F64]);
        assert!(m.plan(&op, &node(1, &[2], vec![])).is_err());
    }

    #[test]
    fn flattens_at_the_axis() {
        let m = OnnxOp::new("Thing", &[1])
            .set("axis", AttrValue::Int(-1))
            .layout(OnnxLayout::Flatten2D {
                attr: "axis",
                default: 1,
            });
        let op = op();
        let p = m.plan(&op, &node(1, &[2, 3, 4], vec![])).unwrap();
        assert_eq!(p.flatten_axis, Some(1));
        let p = m
            .plan(
                &op,
                &node(1, &[2, 3, 4], vec![("axis", AttrValue::Int(-1))]),
            )
            .unwrap();
        assert_eq!(p.flatten_axis, Some(2));
        assert!(m
            .plan(&op, &node(1, &[2, 3], vec![("axis", AttrValue::Int(2))]))
            .is_err());
        assert_eq!(
            flatten_2d_dims(&[Dim::Known(2), Dim::Unknown, Dim::Known(4)], 2),
            [Dim::Unknown, Dim::Known(4)]
        );
    }
}
