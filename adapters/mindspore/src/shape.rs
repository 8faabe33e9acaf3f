//! MindSpore's shape and type inference (`polyop_<name>InferShape` / `InferType`) from
//! kernel-core's: what graph mode with dynamic dims asks for, and where bad input is reported,
//! before any kernel runs (a kernel failure leaves a compiled graph broken). MindSpore gives
//! InferShape the input shapes (-1: unknown dim, [-2]: unknown rank) and InferType the input
//! dtypes, never both, so each validates what it sees: InferType runs inference over inputs
//! of unknown rank, InferShape over inputs of the type variable's first dtype.

use crate::attrs::{decode, Extra};
use crate::error::entry;
use crate::sys::AotExtra;
use crate::tensor::{dims, type_name, MS_TYPES};
use kernel_core::{
    ArgType, AttrSource, AttrValue, Dim, Error, OpDef, Result, TensorSpec, TypeRule,
};

/// The prim attribute `polyop.mindspore` sets to the number of tensors given: InferShape
/// receives no count, and trailing optional inputs may be absent (default: all present).
const NUM_INPUTS: &str = "polyop_num_inputs";

fn refuse_data_dependent(op: &OpDef) -> Result<()> {
    if op.flags.data_dependent_shape {
        return Err(Error::unsupported(
            "the output shape depends on the input values, which a MindSpore graph cannot \
             express; call it in PyNative mode (polyop.mindspore), outside mindspore.jit",
        ));
    }
    Ok(())
}

/// The input dtype InferShape assumes: the fixed one, or the first the type variable takes.
fn placeholder(op: &OpDef, rule: &TypeRule) -> kernel_core::DType {
    match rule {
        TypeRule::Fixed(d) => *d,
        TypeRule::T => op.dtypes[0],
    }
}

/// Output shapes, flat (`rank, dims...` per output; `1, -2` for an unknown rank).
///
/// # Safety
/// `ndims`/`shapes` are MindSpore's arrays of the call's input shapes, `extra` its AotExtra.
pub(crate) unsafe fn infer_shape(
    slot: usize,
    ndims: *const i32,
    shapes: usize,
    extra: *mut AotExtra,
) -> Result<Vec<i64>, String> {
    entry(slot, |op| {
        refuse_data_dependent(op)?;
        let attrs = decode(op, extra)?;
        let all = op.num_inputs();
        let given = match Extra(extra).get(NUM_INPUTS, &ArgType::Int)? {
            Some(AttrValue::Int(n)) => (n.max(0) as usize).min(all),
            _ => all,
        };
        let mut specs = Vec::with_capacity(op.num_inputs());
        for (i, rule) in op.input_types.iter().enumerate() {
            if i >= given {
                specs.push(None);
                continue;
            }
            // SAFETY: MindSpore passes one shape per input given (this function's contract).
            let d = unsafe { dims(ndims, shapes as *const *const i64, i) };
            let dtype = placeholder(op, rule);
            specs.push(Some(if d == [-2] {
                TensorSpec::unknown_rank(dtype)
            } else {
                TensorSpec::with_dims(dtype, d.iter().map(|&x| usize::try_from(x).ok()))
            }));
        }
        let mut flat = Vec::new();
        for s in op.infer(&specs, &attrs)? {
            match s.shape {
                None => flat.extend([1, -2]),
                Some(dims) => {
                    flat.push(dims.len() as i64);
                    flat.extend(dims.iter().map(|d| match d {
                        Dim::Known(n) => *n as i64,
                        _ => -1,
                    }));
                }
            }
        }
        Ok(flat)
    })
}

/// Output `TypeId`s from the input ones.
///
/// # Safety
/// `extra` is MindSpore's AotExtra for the call.
pub(crate) unsafe fn infer_type(
    slot: usize,
    types: &[i32],
    extra: *mut AotExtra,
) -> Result<Vec<i32>, String> {
    entry(slot, |op| {
        refuse_data_dependent(op)?;
        let attrs = decode(op, extra)?;
        if types.len() > op.num_inputs() {
            return Err(Error::invalid(format!(
                "expected at most {} tensor input(s), got {}",
                op.num_inputs(),
                types.len()
            )));
        }
        let mut specs = Vec::with_capacity(op.num_inputs());
        for (i, arg) in op.schema.tensor_args().enumerate() {
            specs.push(match types.get(i) {
                None => None,
                Some(&t) => {
                    Some(TensorSpec::unknown_rank(MS_TYPES.dtype(t).ok_or_else(
                        || op.unsupported_dtype(&arg.name, &type_name(t)),
                    )?))
                }
            });
        }
        Ok(op
            .infer(&specs, &attrs)?
            .iter()
            .map(|s| MS_TYPES.code(s.dtype))
            .collect())
    })
}
