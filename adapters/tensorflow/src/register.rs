//! Registration: a kernel-core [`OpDef`] as a TensorFlow op definition (pure data), and the
//! op definitions, shape functions and CPU kernels registered with TF (per-slot trampolines).

use crate::error::report;
use crate::sys::*;
use kernel_core::ffi::{Added, SlotTable};
use kernel_core::{
    catch_panic, ArgType, AttrValue, DType, Error, OpDef, Registry, Result, TypeRule,
};
use std::ffi::CString;
use std::os::raw::c_void;

/// Upper bound on the number of ops one library can register. C callbacks carry no user data,
/// so each op slot gets its own monomorphised shape function and kernel constructor.
const SLOTS: usize = 256;
seq_macro::seq!(I in 0..256 {
    static SHAPE_FNS: [ShapeFn; SLOTS] = [#(shape_tramp::<I>,)*];
    static CREATE_FNS: [CreateFn; SLOTS] = [#(create_tramp::<I>,)*];
});

/// TF's name of a dtype in op-definition specs.
fn tf_type_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}

/// The TF op type of an op: `<prefix>` + CamelCase name (the stock library's prefix is
/// `Polyop`).
fn tf_op_type(prefix: &str, op: &OpDef) -> String {
    format!("{prefix}{}", op.camel_name)
}

/// The name of the number attr of optional tensor input `input` (a list of 0 or 1 tensors).
pub(crate) fn count_attr(input: &str) -> String {
    format!("N_{input}")
}

/// One op as TF sees it.
#[derive(Debug, Clone, PartialEq)]
struct TfOpSpec {
    op_type: String,
    attrs: Vec<String>,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

fn type_spec(rule: TypeRule) -> &'static str {
    match rule {
        TypeRule::T => "T",
        TypeRule::Fixed(d) => tf_type_name(d),
    }
}

/// A default in TF's attr syntax: numbers and lists as a schema writes them, bools in lower
/// case, strings escaped.
fn literal(v: &AttrValue) -> Option<String> {
    Some(match v {
        AttrValue::None => return None,
        AttrValue::Bool(b) => b.to_string(),
        AttrValue::Str(s) => format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
        other => other.schema_literal(),
    })
}

fn tf_attr_type(ty: &ArgType) -> &'static str {
    match ty {
        ArgType::Int => "int",
        ArgType::Float => "float",
        ArgType::Bool => "bool",
        ArgType::Str => "string",
        ArgType::IntList(_) => "list(int)",
        ArgType::FloatList => "list(float)",
        ArgType::Tensor | ArgType::OptionalTensor => unreachable!("tensor args are inputs"),
    }
}

/// Whether `name` is a valid TF input/output name (`[a-z][a-z0-9_]*`).
fn valid_io_name(name: &str) -> bool {
    let mut c = name.chars();
    matches!(c.next(), Some('a'..='z'))
        && c.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The TF op definition of `op`, op type `<prefix><CamelName>`: a type attr `T` over its
/// dtypes (when some tensor has type T), one typed attr per schema attribute (with its
/// default), one input per tensor argument (`Tensor?` as a list `N_name * T` of 0 or 1
/// tensors) and one output per return.
fn tf_op_spec(prefix: &str, op: &OpDef) -> Result<TfOpSpec> {
    let err = |m: String| Error::invalid(m).in_op(op);
    let mut attrs = Vec::new();
    let uses_t = op
        .input_types
        .iter()
        .chain(&op.output_types)
        .any(|r| *r == TypeRule::T);
    if uses_t {
        if op.schema.attr_args().any(|a| a.name == "T") {
            return Err(err(
                "an attribute named `T` clashes with TF's type attr".into()
            ));
        }
        let types: Vec<&str> = op.dtypes.iter().map(|&d| tf_type_name(d)).collect();
        attrs.push(format!("T: {{{}}}", types.join(", ")));
    }
    for a in op.schema.attr_args() {
        let mut s = format!("{}: {}", a.name, tf_attr_type(&a.ty));
        if let Some(d) = a.default_value().as_ref().and_then(literal) {
            s.push_str(" = ");
            s.push_str(&d);
        }
        attrs.push(s);
    }
    let mut inputs = Vec::new();
    for (a, rule) in op.schema.tensor_args().zip(&op.input_types) {
        if !valid_io_name(&a.name) {
            return Err(err(format!(
                "input name `{}` is not a valid TF name",
                a.name
            )));
        }
        if a.ty == ArgType::OptionalTensor {
            let n = count_attr(&a.name);
            if op.schema.attr_args().any(|x| x.name == n) {
                return Err(err(format!(
                    "attribute `{n}` clashes with TF's list length attr"
                )));
            }
            attrs.push(format!("{n}: int >= 0 = 0"));
            inputs.push(format!("{}: {n} * {}", a.name, type_spec(*rule)));
        } else {
            inputs.push(format!("{}: {}", a.name, type_spec(*rule)));
        }
    }
    let mut outputs = Vec::new();
    for (i, rule) in op.output_types.iter().enumerate() {
        let name = op.schema.output_name(i);
        if !valid_io_name(&name) {
            return Err(err(format!("output name `{name}` is not a valid TF name")));
        }
        outputs.push(format!("{name}: {}", type_spec(*rule)));
    }
    Ok(TfOpSpec {
        op_type: tf_op_type(prefix, op),
        attrs,
        inputs,
        outputs,
    })
}

/// Ops registered so far; a slot index is a position in this table.
pub(crate) static OPS: SlotTable<OpDef> = SlotTable::new();

unsafe extern "C" fn shape_tramp<const I: usize>(
    ctx: *mut TF_ShapeInferenceContext,
    status: *mut TF_Status,
) {
    let r = match OPS.get(I) {
        // SAFETY: `ctx` and `status` are the arguments TF passed to this shape function.
        Some(op) => catch_panic(op, || unsafe { crate::shape::shape_fn(op, ctx, status) }),
        None => Err(Error::internal("shape function slot without an op")),
    };
    if let Err(e) = r {
        // SAFETY: `status` is the live status TF passed to this shape function.
        unsafe { report(status, &e) };
    }
}

unsafe extern "C" fn create_tramp<const I: usize>(
    ctx: *mut TF_OpKernelConstruction,
) -> *mut c_void {
    // SAFETY: TF calls the create function with the context of a running construction.
    unsafe { crate::call::create(I, ctx) }
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in op specs")
}

/// Register one op with TF: op definition + shape function + CPU kernel.
///
/// # Safety
/// TensorFlow's framework library is loaded (it is linked), and `slot` is `op`'s slot in
/// `OPS`, below `SLOTS`.
unsafe fn register_op(prefix: &str, op: &'static OpDef, slot: usize) -> Result<(), String> {
    let spec = tf_op_spec(prefix, op).map_err(|e| e.to_string())?;
    let name = cstr(&spec.op_type);
    // SAFETY: `name` is NUL-terminated (TF copies it); the builder is owned here until
    // `TF_RegisterOpDefinition` below.
    let b = unsafe { TF_NewOpDefinitionBuilder(name.as_ptr()) };
    for a in &spec.attrs {
        // SAFETY: `b` is the live builder; the temporary C string lives through the call and
        // TF copies it (so for the two loops below).
        unsafe { TF_OpDefinitionBuilderAddAttr(b, cstr(a).as_ptr()) };
    }
    for i in &spec.inputs {
        // SAFETY: as above.
        unsafe { TF_OpDefinitionBuilderAddInput(b, cstr(i).as_ptr()) };
    }
    for o in &spec.outputs {
        // SAFETY: as above.
        unsafe { TF_OpDefinitionBuilderAddOutput(b, cstr(o).as_ptr()) };
    }
    // SAFETY: `b` is the live builder; `SHAPE_FNS[slot]` reads slot `slot` of `OPS`, which
    // holds `op` (this function's contract), so TF's later calls run `op`'s shape function.
    unsafe { TF_OpDefinitionBuilderSetShapeInferenceFunction(b, Some(SHAPE_FNS[slot])) };
    let st = Status::new();
    // Takes ownership of (and deletes) the builder.
    // SAFETY: `b` is live and not used after this call; `st` is a live status.
    unsafe { TF_RegisterOpDefinition(b, st.0) };
    if !st.ok() {
        return Err(format!("op definition {:?}: {}", spec, st.message()));
    }
    let cpu = cstr("CPU");
    // SAFETY: NUL-terminated names (TF copies them); `CREATE_FNS[slot]` creates kernels for
    // slot `slot`, `op`'s; the callbacks are this crate's `extern "C"` functions, which catch
    // panics.
    let kb = unsafe {
        TF_NewKernelBuilder(
            name.as_ptr(),
            cpu.as_ptr(),
            Some(CREATE_FNS[slot]),
            Some(crate::call::compute_tramp),
            Some(crate::call::delete_tramp),
        )
    };
    let kname = cstr(&format!("{}Cpu", spec.op_type));
    let st = Status::new();
    // Takes ownership of the kernel builder.
    // SAFETY: `kname` is NUL-terminated; `kb` is the live builder, not used after this call;
    // `st` is a live status.
    unsafe { TF_RegisterKernelBuilder(kname.as_ptr(), kb, st.0) };
    if !st.ok() {
        return Err(format!("kernel for {}: {}", spec.op_type, st.message()));
    }
    Ok(())
}

/// Register every op of `registry` with TensorFlow as op type `<prefix><CamelName>` (the
/// stock library uses `Polyop`), skipping in-place ops (TF has no in-place semantics; the
/// out-of-place op is there). TF's generated Python wrappers are the op types in snake case
/// (`MyAddOne` -> `my_add_one`). Errors are reported per op and do not stop the others.
/// Returns the op types registered.
pub fn register_with_prefix(prefix: &str, registry: &'static Registry) -> Vec<String> {
    let mut done = Vec::new();
    for op in registry.ops().filter(|o| !o.flags.inplace) {
        let slot = match OPS.add(op, SLOTS) {
            Added::New(slot) => slot,
            Added::Already(_) => continue,
            Added::Full => {
                polyop_export::record_load_error(format!(
                    "polyop-tensorflow: more than {SLOTS} ops; `{}` not registered",
                    op.name
                ));
                continue;
            }
        };
        // SAFETY: called with TF loaded (this library links libtensorflow_framework).
        match unsafe { register_op(prefix, op, slot) } {
            Ok(()) => done.push(tf_op_type(prefix, op)),
            Err(e) => polyop_export::record_load_error(format!(
                "polyop-tensorflow: failed to register `{}`: {e}",
                op.name
            )),
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_core::{InferCtx, KernelCtx, ShapeOut};

    fn infer(_: &InferCtx) -> Result<Vec<ShapeOut>> {
        Ok(vec![None, None])
    }
    fn cpu(_: &mut KernelCtx) -> Result<()> {
        Ok(())
    }

    #[test]
    fn translates_attrs_optional_inputs_and_outputs() {
        let op = OpDef::builder(
            "thing(Tensor x, int k, Tensor? weight=None, float eps=1e-6, bool largest=True, \
             str approximate=\"none\") -> (Tensor values, Tensor indices)",
        )
        .dtypes(DType::NUMERIC)
        .fixed("indices", DType::I64)
        .infer(infer)
        .cpu(cpu)
        .build()
        .unwrap();
        let s = tf_op_spec("Polyop", &op).unwrap();
        assert_eq!(s.op_type, "PolyopThing");
        assert_eq!(
            s.attrs,
            vec![
                "T: {half, bfloat16, float, double, int32, int64}",
                "k: int",
                "eps: float = 1e-6",
                "largest: bool = true",
                "approximate: string = \"none\"",
                "N_weight: int >= 0 = 0",
            ]
        );
        assert_eq!(s.inputs, vec!["x: T", "weight: N_weight * T"]);
        assert_eq!(s.outputs, vec!["values: T", "indices: int64"]);
    }
}
