//! An op is data: a schema, dtype rules, a shape function, a CPU kernel, an optional backward
//! (itself an op) and flags. Adapters translate [`OpDef`]s; they never know a particular op.

use std::cell::RefCell;

use crate::dim::{relate, Constraint, Dim, Relation};
use crate::parallel::ThreadPool;
use crate::schema::Schema;
use crate::sharding::{ShardCtx, ShardFn, ShardingRule};
use crate::tensor::{TensorMut, TensorRef};
use crate::{AttrValue, Attrs, DType, Error, Result};

/// dtype + shape, with possibly unknown dims. `shape == None` means unknown rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub dtype: DType,
    pub shape: Option<Vec<Dim>>,
}

impl TensorSpec {
    pub fn new(dtype: DType, shape: &[usize]) -> Self {
        TensorSpec {
            dtype,
            shape: Some(shape.iter().map(|&d| Dim::Known(d)).collect()),
        }
    }
    /// A spec of known rank; dims are [`Dim`]s, sizes, or `Option<usize>` (`None` unknown).
    pub fn with_dims<D: Into<Dim>>(dtype: DType, dims: impl IntoIterator<Item = D>) -> Self {
        TensorSpec {
            dtype,
            shape: Some(dims.into_iter().map(Into::into).collect()),
        }
    }
    pub fn unknown_rank(dtype: DType) -> Self {
        TensorSpec { dtype, shape: None }
    }
    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(Vec::len)
    }
    /// The shape when every dim is known.
    pub fn concrete(&self) -> Option<Vec<usize>> {
        self.shape.as_ref()?.iter().map(Dim::known).collect()
    }
}

/// Output shapes as an op's shape function returns them; `None` = unknown rank.
pub type ShapeOut = Option<Vec<Dim>>;

/// What a shape function sees. Only shapes: dtypes were already checked against the op's
/// dtype rules, and output dtypes follow from them.
pub struct InferCtx<'a> {
    pub op: &'a OpDef,
    /// One entry per tensor argument; `None` for an absent optional tensor.
    pub inputs: &'a [Option<TensorSpec>],
    pub attrs: &'a Attrs,
    /// Requirements over symbolic dims gathered by [`InferCtx::require_eq`] and friends.
    constraints: RefCell<Vec<Constraint>>,
}

impl InferCtx<'_> {
    /// The spec of tensor input `i` (required inputs are always present here).
    pub fn input(&self, i: usize) -> &TensorSpec {
        self.inputs[i]
            .as_ref()
            .expect("required input checked present")
    }
    pub fn input_opt(&self, i: usize) -> Option<&TensorSpec> {
        self.inputs.get(i).and_then(Option::as_ref)
    }
    /// Input `i`'s dims, or `None` when its rank is unknown.
    pub fn dims(&self, i: usize) -> Option<&[Dim]> {
        self.input(i).shape.as_deref()
    }
    fn relate(
        &self,
        relation: Relation,
        lhs: &Dim,
        rhs: &Dim,
        message: impl FnOnce() -> String,
    ) -> Result<()> {
        if let Some(c) = relate(relation, lhs, rhs, message)? {
            self.constraints.borrow_mut().push(c);
        }
        Ok(())
    }
    /// Require `lhs == rhs`: known sizes are compared now (`message` is the error when they
    /// differ); a requirement over symbols becomes a [`Constraint`] the framework checks.
    pub fn require_eq(&self, lhs: &Dim, rhs: &Dim, message: impl FnOnce() -> String) -> Result<()> {
        self.relate(Relation::Eq, lhs, rhs, message)
    }
    /// Require `lhs <= rhs` (topk's `k` within its axis), as [`InferCtx::require_eq`].
    pub fn require_le(&self, lhs: &Dim, rhs: &Dim, message: impl FnOnce() -> String) -> Result<()> {
        self.relate(Relation::Le, lhs, rhs, message)
    }
    /// Require shape `got` to be `want` (same rank, each dim equal; unknown ranks and dims match
    /// anything). A gradient's shape against its forward tensor's, for example.
    pub fn require_shape(
        &self,
        want: Option<&[Dim]>,
        got: Option<&[Dim]>,
        message: impl Fn() -> String,
    ) -> Result<()> {
        let (Some(w), Some(g)) = (want, got) else {
            return Ok(());
        };
        if w.len() != g.len() {
            return Err(Error::invalid(message()));
        }
        w.iter()
            .zip(g)
            .try_for_each(|(a, b)| self.require_eq(b, a, &message))
    }
}

/// Output specs and the requirements between symbolic input dims that hold for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inferred {
    pub outputs: Vec<TensorSpec>,
    pub constraints: Vec<Constraint>,
}

/// What a kernel sees: validated inputs, outputs allocated by the framework to the inferred
/// shapes (contiguous), attributes, and the host's thread pool.
pub struct KernelCtx<'a, 'b> {
    pub op: &'a OpDef,
    pub inputs: &'b [Option<TensorRef<'a>>],
    /// Pre-allocated outputs. Empty for ops with `data_dependent_shape`: those call
    /// [`KernelCtx::alloc_output`].
    pub outputs: &'b mut [TensorMut<'a>],
    pub attrs: &'a Attrs,
    pub pool: &'a dyn ThreadPool,
    allocator: Option<&'b mut dyn OutputAllocator<'a>>,
    /// Elementwise ops to apply to the output (see [`Epilogue`]), until the kernel takes them
    /// ([`KernelCtx::take_epilogue`]); the call path applies those left here afterwards.
    epilogue: Option<&'b [Epilogue<'a>]>,
    /// The kernel's own forms of constant inputs, made once for the call site
    /// ([`OpDef::prepack`], [`KernelCtx::prepacked`]).
    prepacked: &'a [(usize, Prepacked)],
}

/// A kernel's own form of one of its inputs (a convolution's weights in the order its inner
/// loop reads them), made once by the op's [`PrepackFn`] for an input a caller knows to be
/// constant (ONNX Runtime's constant initializers), kept with the call site and handed to
/// every call ([`KernelCtx::prepacked`]).
pub type Prepacked = Box<dyn std::any::Any + Send + Sync>;

/// An op's prepacking ([`OpBuilder::prepack`]): tensor input `input`'s constant value under the
/// call's attributes -> the kernel's form of it, or `None` when the kernel has none for it.
/// The kernel must check that a prepacked form fits the input it is called with (shape,
/// dtype, attributes) and compute from the input itself when not, so a result never depends on
/// whether the input was prepacked.
pub type PrepackFn = fn(input: usize, value: &TensorRef, attrs: &Attrs) -> Option<Prepacked>;

/// An elementwise op's in-place f32 form, declared by the op with [`OpBuilder::epilogue`]:
/// `relu` is `Unary`, `add` is `Binary` (`f(out, other, out_first)`: `out[i] = out[i] op
/// other[i]` when `out_first`, else `other[i] op out[i]`). A caller that runs an op and then
/// such ops on its only output may instead hand them to the op as an epilogue
/// ([`crate::call::run_with_epilogue`]): an op that declares [`OpFlags::applies_epilogue`]
/// applies them to each block of its f32 output as the block is finished, while it is in
/// cache, instead of more passes over memory. Each must give the bits of the op's own kernel,
/// so fusing never changes a result.
#[derive(Clone, Copy, Debug)]
pub enum EpilogueFn {
    Unary(fn(&mut [f32])),
    Binary(fn(&mut [f32], &[f32], bool)),
}

/// One step of an epilogue: an op's [`EpilogueFn`], with a binary op's other operand (the
/// output's shape, contiguous f32) and whether the output is the op's first operand.
#[derive(Clone, Copy, Debug)]
pub enum Epilogue<'t> {
    Unary(fn(&mut [f32])),
    Binary(fn(&mut [f32], &[f32], bool), &'t [f32], bool),
}

impl Epilogue<'_> {
    /// Apply the steps in order to `out`, the output's values from flat index `at` on.
    pub fn apply_all(steps: &[Epilogue], out: &mut [f32], at: usize) {
        for s in steps {
            match *s {
                Epilogue::Unary(f) => f(out),
                Epilogue::Binary(f, other, out_first) => {
                    f(out, &other[at..at + out.len()], out_first)
                }
            }
        }
    }
}

/// How a data-dependent op gets its outputs once it knows their shapes.
pub trait OutputAllocator<'a> {
    fn allocate(&mut self, index: usize, dtype: DType, shape: &[usize]) -> Result<TensorMut<'a>>;
    /// True when every output is new memory that no input can share (a fresh framework
    /// allocation), so the call path need not look for overlaps. The default is the safe
    /// answer: outputs may alias inputs (XLA's `input_output_aliases`, caller buffers).
    fn always_fresh(&self) -> bool {
        false
    }
    /// Whether large outputs of this allocator may be advised as transparent huge pages before
    /// the kernel writes them ([`crate::hugepages`]); `POLYOP_HUGE_PAGES` overrides it. Yes
    /// by default.
    fn huge_pages(&self) -> bool {
        true
    }
}

impl<'a, 'b> KernelCtx<'a, 'b> {
    pub fn new(
        op: &'a OpDef,
        inputs: &'b [Option<TensorRef<'a>>],
        outputs: &'b mut [TensorMut<'a>],
        attrs: &'a Attrs,
        pool: &'a dyn ThreadPool,
    ) -> Self {
        KernelCtx {
            op,
            inputs,
            outputs,
            attrs,
            pool,
            allocator: None,
            epilogue: None,
            prepacked: &[],
        }
    }
    /// Hand the kernel the prepacked forms of its constant inputs (see [`Prepacked`]).
    pub fn with_prepacked(mut self, prepacked: &'a [(usize, Prepacked)]) -> Self {
        self.prepacked = prepacked;
        self
    }
    /// The prepacked form of tensor input `input`, if the caller has one of type `P` (which
    /// the kernel must still check against the input: [`PrepackFn`]).
    pub fn prepacked<P: 'static>(&self, input: usize) -> Option<&'a P> {
        self.prepacked
            .iter()
            .find(|(i, _)| *i == input)
            .and_then(|(_, p)| p.downcast_ref::<P>())
    }
    /// Ask the kernel to apply `epilogue` to its output (see [`Epilogue`]).
    pub fn with_epilogue(mut self, epilogue: Option<&'b [Epilogue<'a>]>) -> Self {
        self.epilogue = epilogue;
        self
    }
    /// The epilogue to apply, for a kernel that applies it itself as it writes its f32 output
    /// ([`Epilogue::apply_all`]); one not taken is applied by the call path over the whole
    /// output after the kernel.
    pub fn take_epilogue(&mut self) -> Option<&'b [Epilogue<'a>]> {
        self.epilogue.take()
    }
    /// For data-dependent ops: outputs come from `allocator`.
    pub fn with_allocator(mut self, allocator: &'b mut dyn OutputAllocator<'a>) -> Self {
        self.allocator = Some(allocator);
        self
    }
    pub fn input(&self, i: usize) -> &TensorRef<'a> {
        self.inputs[i]
            .as_ref()
            .expect("required input checked present")
    }
    pub fn input_opt(&self, i: usize) -> Option<&TensorRef<'a>> {
        self.inputs.get(i).and_then(Option::as_ref)
    }
    /// Allocate output `index` with `shape` (data-dependent ops only).
    pub fn alloc_output(&mut self, index: usize, shape: &[usize]) -> Result<TensorMut<'a>> {
        let dtype = self.op.output_dtype(index, self.inputs)?;
        match self.allocator.as_mut() {
            Some(a) => a.allocate(index, dtype, shape),
            None => Err(Error::internal("this call site offers no output allocator")),
        }
    }
}

pub type InferFn = fn(&InferCtx) -> Result<Vec<ShapeOut>>;
pub type KernelFn = fn(&mut KernelCtx) -> Result<()>;

/// Where one input of a backward op comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BwdInput {
    /// The incoming gradient of forward output `i`.
    Grad(usize),
    /// Forward tensor input `i`.
    Input(usize),
    /// Forward output `i`.
    Output(usize),
}

/// How to compute gradients: run op `op` on `inputs`; its output `j` is the gradient of forward
/// tensor input `outputs[j]`. Attributes of the backward op are taken by name from the forward
/// call's attributes.
#[derive(Debug, Clone, Copy)]
pub struct Backward {
    pub op: &'static str,
    pub inputs: &'static [BwdInput],
    pub outputs: &'static [usize],
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpFlags {
    /// Writes its result into input 0 and returns it (`relu_`). Only frameworks with in-place
    /// semantics (torch) expose such ops; the others skip them.
    pub inplace: bool,
    /// Output shapes depend on the data (`nonzero`): the kernel allocates through
    /// [`KernelCtx::alloc_output`], and static-shape frameworks refuse the op at trace time.
    pub data_dependent_shape: bool,
    /// A backward op: exposed so gradients can call it, not part of the user-facing list.
    pub backward_only: bool,
    /// Its f32 kernel applies an epilogue its caller hands it ([`KernelCtx::take_epilogue`])
    /// block by block: worth fusing with a following op that has an [`OpDef::epilogue`].
    pub applies_epilogue: bool,
}

/// Which dtype each tensor argument / return has: the type variable `T` or a fixed dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeRule {
    T,
    Fixed(DType),
}

pub struct OpDef {
    pub name: &'static str,
    pub schema: Schema,
    pub doc: &'static str,
    /// The dtypes type variable `T` may take.
    pub dtypes: &'static [DType],
    /// Per tensor input, in schema order.
    pub input_types: Vec<TypeRule>,
    /// Per output.
    pub output_types: Vec<TypeRule>,
    pub infer_fn: InferFn,
    pub cpu: KernelFn,
    pub backward: Option<Backward>,
    pub flags: OpFlags,
    /// CamelCase op type (ONNX op_type, TF op type after the prefix). Defaults to the
    /// mechanical conversion of `name` (`rms_norm` -> `RmsNorm`).
    pub camel_name: String,
    /// ONNX's conventional spelling when it differs from `camel_name` (`TopK`, `NonZero`).
    pub onnx_name: Option<&'static str>,
    /// Int attributes that name an axis of the first tensor input (Python style, negative
    /// from the end): what batching rules (JAX vmap) must keep pointing at the same axis.
    pub axis_attrs: Vec<&'static str>,
    /// The namespace of the registry the op is registered in (see [`Registry::named`]):
    /// errors name the op `<namespace>.<name>`.
    pub namespace: &'static str,
    /// Which dims may stay split across devices ([`crate::sharding`]); `None`: none.
    pub sharding: Option<ShardFn>,
    /// The standard ONNX ops it implements exactly ([`crate::onnx`]), for execution providers.
    pub onnx: Vec<crate::onnx::OnnxOp>,
    /// Its in-place f32 form, for fusing into the op that produces its input ([`EpilogueFn`]);
    /// only for an op with one (`Unary`) or two (`Binary`) tensor inputs and no attributes.
    pub epilogue: Option<EpilogueFn>,
    /// Its kernel's own form of a constant input ([`PrepackFn`]).
    pub prepack: Option<PrepackFn>,
}

impl std::fmt::Debug for OpDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpDef({})", self.schema)
    }
}

/// `rms_norm` -> `RmsNorm`, `relu_` -> `Relu_`.
pub fn camel_case(name: &str) -> String {
    let trailing = name.len() - name.trim_end_matches('_').len();
    let mut out: String = name
        .trim_end_matches('_')
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect();
    out.push_str(&"_".repeat(trailing));
    out
}

/// Builds an [`OpDef`] from a schema string.
pub struct OpBuilder {
    schema: &'static str,
    doc: &'static str,
    dtypes: &'static [DType],
    fixed: Vec<(&'static str, DType)>,
    infer: Option<InferFn>,
    cpu: Option<KernelFn>,
    backward: Option<Backward>,
    flags: OpFlags,
    onnx_name: Option<&'static str>,
    axis_attrs: Vec<&'static str>,
    sharding: Option<ShardFn>,
    onnx: Vec<crate::onnx::OnnxOp>,
    epilogue: Option<EpilogueFn>,
    prepack: Option<PrepackFn>,
}

impl OpDef {
    /// The error for tensor argument `input` given in a dtype the op does not take, `dtype`
    /// named as the framework names it (it may be one polyop has no `DType` for).
    pub fn unsupported_dtype(&self, input: &str, dtype: &str) -> Error {
        let supported: Vec<&str> = self.dtypes.iter().map(|d| d.name()).collect();
        Error::invalid(format!(
            "unsupported dtype {dtype} for input `{input}` (supported: {})",
            supported.join(", ")
        ))
        .in_op(self)
    }

    pub fn builder(schema: &'static str) -> OpBuilder {
        OpBuilder {
            schema,
            doc: "",
            dtypes: DType::FLOAT,
            fixed: Vec::new(),
            infer: None,
            cpu: None,
            backward: None,
            flags: OpFlags::default(),
            onnx_name: None,
            axis_attrs: Vec::new(),
            sharding: None,
            onnx: Vec::new(),
            epilogue: None,
            prepack: None,
        }
    }

    pub fn num_inputs(&self) -> usize {
        self.input_types.len()
    }
    pub fn num_outputs(&self) -> usize {
        self.output_types.len()
    }
    pub fn onnx_op_type(&self) -> &str {
        self.onnx_name.unwrap_or(&self.camel_name)
    }

    /// The type `T` is bound to by these inputs (the first present T-typed input).
    fn bound_t(&self, dtypes: impl Iterator<Item = Option<DType>>) -> Option<DType> {
        self.input_types
            .iter()
            .zip(dtypes)
            .find_map(|(r, d)| if *r == TypeRule::T { d } else { None })
    }

    /// Output `i`'s dtype given the inputs.
    pub fn output_dtype(&self, i: usize, inputs: &[Option<TensorRef>]) -> Result<DType> {
        match self.output_types.get(i) {
            Some(TypeRule::Fixed(d)) => Ok(*d),
            Some(TypeRule::T) => self
                .bound_t(inputs.iter().map(|t| t.as_ref().map(|t| t.dtype)))
                .ok_or_else(|| Error::internal("no input binds T")),
            None => Err(Error::internal(format!("no output {i}"))),
        }
    }

    /// Check arity, presence and dtypes of the inputs; returns the dtype bound to `T`.
    pub fn check_inputs(&self, dtypes: &[Option<DType>]) -> Result<Option<DType>> {
        let args: Vec<_> = self.schema.tensor_args().collect();
        if dtypes.len() != args.len() {
            return Err(Error::invalid(format!(
                "expected {} tensor input(s) ({}), got {}",
                args.len(),
                args.iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                dtypes.len()
            ))
            .in_op(self));
        }
        let t = self.bound_t(dtypes.iter().copied());
        for ((arg, rule), d) in args.iter().zip(&self.input_types).zip(dtypes) {
            let Some(d) = d else {
                if arg.ty == crate::schema::ArgType::Tensor {
                    return Err(
                        Error::invalid(format!("input `{}` is required", arg.name)).in_op(self)
                    );
                }
                continue;
            };
            match rule {
                TypeRule::Fixed(f) if d != f => {
                    return Err(Error::invalid(format!(
                        "input `{}` must be {f}, got {d}",
                        arg.name
                    ))
                    .in_op(self))
                }
                TypeRule::T if !self.dtypes.contains(d) => {
                    return Err(self.unsupported_dtype(&arg.name, d.name()))
                }
                TypeRule::T if Some(*d) != t => {
                    return Err(Error::invalid(format!(
                        "dtype mismatch: input `{}` is {d} but earlier inputs are {}",
                        arg.name,
                        t.expect("T bound by an earlier input")
                    ))
                    .in_op(self))
                }
                _ => {}
            }
        }
        Ok(t)
    }

    /// Shape inference over specs whose dims may be unknown. Validates dtypes, arity and
    /// attributes, then calls the op's shape function.
    pub fn infer(&self, inputs: &[Option<TensorSpec>], attrs: &Attrs) -> Result<Vec<TensorSpec>> {
        self.infer_symbolic(inputs, attrs).map(|r| r.outputs)
    }

    /// Shape inference over specs whose dims may be unknown or symbolic: the output specs and
    /// the [`Constraint`]s between symbolic dims the op requires (none when every dim is
    /// known: those are decided, and a contradiction is an error).
    pub fn infer_symbolic(&self, inputs: &[Option<TensorSpec>], attrs: &Attrs) -> Result<Inferred> {
        let dtypes: Vec<Option<DType>> =
            inputs.iter().map(|s| s.as_ref().map(|s| s.dtype)).collect();
        let t = self.check_inputs(&dtypes)?;
        // Element counts and byte sizes of every fully known shape, inputs and outputs, are
        // overflow-checked here, once for every op and every surface: a caller's input spec
        // or a shape function's output too large to address is an error, never a wrapped
        // count. A shape with unknown dims is checked once it is concrete.
        let check_size = |spec: &TensorSpec, what: &dyn Fn() -> String| -> Result<()> {
            match spec.concrete() {
                Some(shape) => crate::tensor::checked_byte_size(&shape, spec.dtype.size())
                    .map(|_| ())
                    .map_err(|e| Error::invalid(format!("{} {}", what(), e.message)).in_op(self)),
                None => Ok(()),
            }
        };
        for (arg, spec) in self.schema.tensor_args().zip(inputs) {
            if let Some(spec) = spec {
                check_size(spec, &|| format!("input `{}`:", arg.name))?;
            }
        }
        let ctx = InferCtx {
            op: self,
            inputs,
            attrs,
            constraints: RefCell::default(),
        };
        let shapes = (self.infer_fn)(&ctx).map_err(|e| e.in_op(self))?;
        let constraints = ctx.constraints.into_inner();
        if shapes.len() != self.num_outputs() {
            return Err(Error::internal(format!(
                "shape function returned {} outputs, schema has {}",
                shapes.len(),
                self.num_outputs()
            ))
            .in_op(self));
        }
        shapes
            .into_iter()
            .zip(&self.output_types)
            .enumerate()
            .map(|(i, (shape, rule))| {
                let dtype = match rule {
                    TypeRule::Fixed(d) => *d,
                    TypeRule::T => {
                        t.ok_or_else(|| Error::internal("no input binds T").in_op(self))?
                    }
                };
                let spec = TensorSpec { dtype, shape };
                check_size(&spec, &|| {
                    format!("output `{}`:", self.schema.output_name(i))
                })?;
                Ok(spec)
            })
            .collect::<Result<_>>()
            .map(|outputs| Inferred {
                outputs,
                constraints,
            })
    }

    /// The sharding rule of a call whose inputs are `inputs` and whose outputs (from shape
    /// inference) are `outputs`: the op's own, or every dim whole when it declares none or
    /// when any rank is unknown. Checked against the call's ranks.
    pub fn sharding_rule(
        &self,
        inputs: &[Option<TensorSpec>],
        outputs: &[TensorSpec],
        attrs: &Attrs,
    ) -> Result<ShardingRule> {
        let ctx = ShardCtx {
            op: self,
            inputs,
            outputs,
            attrs,
        };
        let rule = match self.sharding {
            Some(f) if !self.flags.data_dependent_shape => f(&ctx).map_err(|e| e.in_op(self))?,
            _ => ShardingRule::replicated(&ctx),
        };
        rule.check(&ctx).map_err(|e| e.in_op(self))?;
        Ok(rule)
    }

    /// Shape inference for concrete inputs. For ops without data-dependent shapes every
    /// returned shape is fully known.
    pub fn infer_concrete(
        &self,
        inputs: &[Option<TensorRef>],
        attrs: &Attrs,
    ) -> Result<Vec<TensorSpec>> {
        let specs: Vec<Option<TensorSpec>> = inputs
            .iter()
            .map(|t| t.as_ref().map(|t| t.spec()))
            .collect();
        self.infer(&specs, attrs)
    }

    /// Bind attributes given by name to this op's schema (defaults, coercions, errors).
    pub fn bind_attrs<'a>(
        &self,
        given: impl IntoIterator<Item = (&'a str, AttrValue)>,
    ) -> Result<Attrs> {
        Attrs::bind(&self.schema, given).map_err(|e| e.in_op(self))
    }

    /// Run the kernel: inputs validated by [`OpDef::infer_concrete`] first, outputs allocated to
    /// its shapes. Panics are caught and returned as errors.
    pub fn compute(&self, ctx: &mut KernelCtx) -> Result<()> {
        crate::catch_panic(self, || (self.cpu)(ctx))
    }
}

/// A concrete output of [`OpDef::infer_concrete_cached`]: dtype and, when inference fixes
/// it (every op without `data_dependent_shape`), the shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutSpec {
    pub dtype: DType,
    pub shape: Option<Vec<usize>>,
}

/// How many (input specs, attributes) combinations an [`InferCache`] remembers.
pub const INFER_CACHE_ENTRIES: usize = 8;

/// Remembers the results of the last few successful concrete shape inferences of one op, so a
/// call with the same input dtypes/shapes and attributes as a recent one skips validation and
/// the shape function (both pure functions of exactly those). Part of every
/// [`CallSite`](crate::call::CallSite). Errors are never cached.
pub struct InferCache {
    entries: crate::call::Bounded<CacheEntry>,
}

impl Default for InferCache {
    fn default() -> Self {
        Self::new()
    }
}

struct CacheEntry {
    /// Per input: `usize::MAX` (absent) or dtype code, rank, dims.
    key: Vec<usize>,
    attrs: Attrs,
    out: std::sync::Arc<[OutSpec]>,
}

const ABSENT: usize = usize::MAX;

fn key_matches(key: &[usize], inputs: &[Option<TensorRef>]) -> bool {
    let mut k = key.iter();
    for t in inputs {
        match t {
            None => {
                if k.next() != Some(&ABSENT) {
                    return false;
                }
            }
            Some(t) => {
                if k.next() != Some(&(t.dtype as usize)) || k.next() != Some(&t.shape.len()) {
                    return false;
                }
                if !t.shape.iter().all(|d| k.next() == Some(d)) {
                    return false;
                }
            }
        }
    }
    k.next().is_none()
}

fn make_key(inputs: &[Option<TensorRef>]) -> Vec<usize> {
    let mut key = Vec::with_capacity(inputs.len() * 4);
    for t in inputs {
        match t {
            None => key.push(ABSENT),
            Some(t) => {
                key.push(t.dtype as usize);
                key.push(t.shape.len());
                key.extend_from_slice(&t.shape);
            }
        }
    }
    key
}

impl InferCache {
    pub const fn new() -> Self {
        InferCache {
            entries: crate::call::Bounded::new(INFER_CACHE_ENTRIES),
        }
    }
    /// A cache that remembers nothing (for one-off calls).
    pub const fn disabled() -> Self {
        InferCache {
            entries: crate::call::Bounded::new(0),
        }
    }
}

impl std::fmt::Debug for InferCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InferCache")
    }
}

impl OpDef {
    /// [`OpDef::infer_concrete`] through `cache`: the same result (as [`OutSpec`]s) and the
    /// same errors, without re-running validation and the shape function when these input
    /// dtypes/shapes and attributes were inferred successfully before.
    pub fn infer_concrete_cached(
        &self,
        cache: &InferCache,
        inputs: &[Option<TensorRef>],
        attrs: &Attrs,
    ) -> Result<std::sync::Arc<[OutSpec]>> {
        let hit = cache.entries.find_map(|e| {
            (key_matches(&e.key, inputs) && e.attrs.same_as(attrs)).then(|| e.out.clone())
        });
        if let Some(out) = hit {
            return Ok(out);
        }
        let out: std::sync::Arc<[OutSpec]> = self
            .infer_concrete(inputs, attrs)?
            .into_iter()
            .map(|s| OutSpec {
                dtype: s.dtype,
                shape: s.concrete(),
            })
            .collect();
        cache.entries.insert_with(|| CacheEntry {
            key: make_key(inputs),
            attrs: attrs.clone(),
            out: out.clone(),
        });
        Ok(out)
    }
}

impl OpBuilder {
    pub fn doc(mut self, doc: &'static str) -> Self {
        self.doc = doc;
        self
    }
    /// The dtypes the type variable `T` may take (default: float).
    pub fn dtypes(mut self, dtypes: &'static [DType]) -> Self {
        self.dtypes = dtypes;
        self
    }
    /// Tensor argument or return `name` always has dtype `dtype` (an unnamed single return is
    /// `out`, unnamed returns of a tuple `out0`, `out1`, ...).
    pub fn fixed(mut self, name: &'static str, dtype: DType) -> Self {
        self.fixed.push((name, dtype));
        self
    }
    pub fn infer(mut self, f: InferFn) -> Self {
        self.infer = Some(f);
        self
    }
    pub fn cpu(mut self, f: KernelFn) -> Self {
        self.cpu = Some(f);
        self
    }
    pub fn backward(
        mut self,
        op: &'static str,
        inputs: &'static [BwdInput],
        outputs: &'static [usize],
    ) -> Self {
        self.backward = Some(Backward {
            op,
            inputs,
            outputs,
        });
        self
    }
    pub fn inplace(mut self) -> Self {
        self.flags.inplace = true;
        self
    }
    pub fn data_dependent_shape(mut self) -> Self {
        self.flags.data_dependent_shape = true;
        self
    }
    /// The op's in-place f32 form ([`EpilogueFn`]): only for an op with one (`Unary`) or two
    /// (`Binary`) tensor inputs and no attributes (checked by `build`).
    pub fn epilogue(mut self, f: EpilogueFn) -> Self {
        self.epilogue = Some(f);
        self
    }
    /// Its kernel's own form of constant inputs ([`PrepackFn`]).
    pub fn prepack(mut self, f: PrepackFn) -> Self {
        self.prepack = Some(f);
        self
    }
    /// Its kernel applies a caller's epilogue to its f32 output ([`OpFlags::applies_epilogue`]).
    pub fn applies_epilogue(mut self) -> Self {
        self.flags.applies_epilogue = true;
        self
    }
    pub fn backward_only(mut self) -> Self {
        self.flags.backward_only = true;
        self
    }
    pub fn onnx_name(mut self, name: &'static str) -> Self {
        self.onnx_name = Some(name);
        self
    }
    /// Int attribute `name` selects an axis of the first tensor input.
    pub fn axis_attr(mut self, name: &'static str) -> Self {
        self.axis_attrs.push(name);
        self
    }
    /// The op's sharding rule ([`crate::sharding`]); without one every dim stays whole.
    pub fn sharding(mut self, f: ShardFn) -> Self {
        self.sharding = Some(f);
        self
    }
    /// A standard ONNX op this op implements exactly ([`crate::onnx::OnnxOp`]); may be given
    /// several times (one ONNX op type per call, or one per range of schema versions whose
    /// mapping differs).
    pub fn onnx(mut self, m: crate::onnx::OnnxOp) -> Self {
        self.onnx.push(m);
        self
    }

    pub fn build(self) -> Result<OpDef> {
        let schema = Schema::parse(self.schema)?;
        let leaked: &'static str = Box::leak(schema.name.clone().into_boxed_str());
        let rule = |name: Option<&str>| match name
            .and_then(|n| self.fixed.iter().find(|(f, _)| *f == n))
        {
            Some((_, d)) => TypeRule::Fixed(*d),
            None => TypeRule::T,
        };
        let input_types: Vec<TypeRule> =
            schema.tensor_args().map(|a| rule(Some(&a.name))).collect();
        // Unnamed returns are addressed as `out` (single) or `out{i}`, like Schema::output_name.
        let output_types: Vec<TypeRule> = (0..schema.returns.len())
            .map(|i| rule(Some(&schema.output_name(i))))
            .collect();
        for (f, _) in &self.fixed {
            let known = schema.tensor_args().any(|a| a.name == *f)
                || (0..schema.returns.len()).any(|i| schema.output_name(i) == *f);
            if !known {
                return Err(
                    Error::invalid(format!("fixed dtype for unknown tensor `{f}`")).in_op(leaked),
                );
            }
        }
        for a in &self.axis_attrs {
            if !schema
                .attr_args()
                .any(|x| x.name == *a && x.ty == crate::schema::ArgType::Int)
            {
                return Err(Error::invalid(format!(
                    "axis attribute `{a}` is not an int attribute"
                ))
                .in_op(leaked));
            }
        }
        let operands = match self.epilogue {
            Some(EpilogueFn::Unary(_)) => Some(1),
            Some(EpilogueFn::Binary(_)) => Some(2),
            None => None,
        };
        if operands.is_some_and(|n| {
            schema.tensor_args().count() != n
                || schema.attr_args().count() != 0
                || schema.returns.len() != 1
        }) {
            return Err(Error::invalid(
                "an epilogue needs one tensor input (two for a binary one), one output and no \
                 attributes",
            )
            .in_op(leaked));
        }
        if !input_types.contains(&TypeRule::T) && output_types.contains(&TypeRule::T) {
            return Err(Error::invalid("an output has type T but no input binds T").in_op(leaked));
        }
        Ok(OpDef {
            name: leaked,
            camel_name: camel_case(&schema.name),
            schema,
            doc: self.doc,
            dtypes: self.dtypes,
            input_types,
            output_types,
            infer_fn: self
                .infer
                .ok_or_else(|| Error::invalid("no shape function").in_op(leaked))?,
            cpu: self
                .cpu
                .ok_or_else(|| Error::invalid("no cpu kernel").in_op(leaked))?,
            backward: self.backward,
            flags: self.flags,
            onnx_name: self.onnx_name,
            axis_attrs: self.axis_attrs,
            namespace: DEFAULT_NAMESPACE,
            sharding: self.sharding,
            onnx: self.onnx,
            epilogue: self.epilogue,
            prepack: self.prepack,
        })
    }
}

/// The namespace of [`Registry::new`]: the stock ops' `polyop`.
pub const DEFAULT_NAMESPACE: &str = "polyop";

/// A set of ops, looked up by name. Adapters are generic over a `&'static Registry`.
#[derive(Debug)]
pub struct Registry {
    ops: Vec<OpDef>,
    namespace: &'static str,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::named(DEFAULT_NAMESPACE)
    }
}

impl Registry {
    /// A registry in namespace `polyop` (the stock ops'); see [`Registry::named`].
    pub fn new() -> Self {
        Self::default()
    }
    /// A registry whose ops' errors read `<namespace>.<op>: ...` in every framework
    /// (`Registry::named("my_ops")`: `my_ops.my_op: attribute ...`).
    pub fn named(namespace: &'static str) -> Self {
        Registry {
            ops: Vec::new(),
            namespace,
        }
    }
    /// The namespace errors name this registry's ops with.
    pub fn namespace(&self) -> &'static str {
        self.namespace
    }
    /// Add an op; names must be unique.
    pub fn register(&mut self, mut op: OpDef) -> Result<()> {
        op.namespace = self.namespace;
        if self.get(op.name).is_some() {
            return Err(Error::invalid("an op of this name is already registered").in_op(&op));
        }
        self.ops.push(op);
        Ok(())
    }
    pub fn get(&self, name: &str) -> Option<&OpDef> {
        self.ops.iter().find(|o| o.name == name)
    }
    pub fn lookup(&self, name: &str) -> Result<&OpDef> {
        self.get(name).ok_or_else(|| {
            Error::invalid(format!(
                "unknown op `{name}` (known: {})",
                self.ops
                    .iter()
                    .map(|o| o.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }
    pub fn ops(&self) -> impl Iterator<Item = &OpDef> {
        self.ops.iter()
    }
    /// Check that every backward refers to a registered op with matching arity.
    pub fn validate(&self) -> Result<()> {
        for op in &self.ops {
            if let Some(b) = &op.backward {
                let bop = self.lookup(b.op).map_err(|e| e.in_op(op))?;
                if bop.num_inputs() != b.inputs.len() || bop.num_outputs() != b.outputs.len() {
                    return Err(Error::invalid(format!(
                        "backward op `{}` arity does not match the backward spec",
                        b.op
                    ))
                    .in_op(op));
                }
                for (name, _) in bop.schema.attr_args().map(|a| (a.name.as_str(), ())) {
                    if !op.schema.attr_args().any(|a| a.name == name) {
                        return Err(Error::invalid(format!(
                            "backward op `{}` needs attribute `{name}` the forward op lacks",
                            b.op
                        ))
                        .in_op(op));
                    }
                }
            }
        }
        Ok(())
    }
}
