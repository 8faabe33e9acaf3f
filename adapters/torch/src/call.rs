//! The generic boxed kernel: attributes and tensors off the StableIValue stack, then
//! kernel-core's one call path with torch's allocator and pool. One function serves every op
//! and both dispatch keys (CPU computes; Meta only allocates outputs of the inferred shapes,
//! for FakeTensor / torch.compile / opcheck), then in-place results are written back.

use crate::attrs::decode;
use crate::pool::TorchPool;
use crate::sys::{self, StableIValue};
use crate::tensor::{check, codes, info, Info, TorchOutputs};
use kernel_core::{CallSites, Error, Few, OpDef, Phase, Result, TensorRef};

/// Per registered op: which outputs alias an input (`Tensor(a!)` returns), and its call sites
/// (attributes bound once per distinct attribute set, each with its inference cache).
pub(crate) struct OpState {
    pub op: &'static OpDef,
    alias_of: Vec<Option<usize>>,
    sites: CallSites,
}

impl OpState {
    pub(crate) fn new(op: &'static OpDef) -> Self {
        let alias_of = op
            .schema
            .returns
            .iter()
            .map(|r| {
                r.alias.as_ref().and_then(|al| {
                    op.schema
                        .tensor_args()
                        .position(|a| a.alias.as_ref().is_some_and(|b| b.set == al.set))
                })
            })
            .collect();
        OpState {
            op,
            alias_of,
            sites: CallSites::new(),
        }
    }
}

/// Run `op` on a boxed stack. On success the first `num_outputs` stack entries hold owning
/// output handles; on error nothing was written and every input has been released.
///
/// # Safety
/// `stack` is torch's boxed stack for `st.op`, of `max(num_args, num_outputs)` entries, the
/// arguments owned by the callee.
pub(crate) unsafe fn call(
    st: &OpState,
    stack: *mut StableIValue,
    num_args: u64,
    num_outputs: u64,
) -> Result<()> {
    let op = st.op;
    if num_args as usize != op.schema.args.len() || num_outputs as usize != op.num_outputs() {
        // Cannot happen for a schema we registered; refuse rather than guess the stack.
        return Err(Error::internal(format!(
            "stack has {num_args} args / {num_outputs} outputs, schema `{}` disagrees",
            op.schema
        )));
    }
    // SAFETY: this function's contract; `num_args` was just checked against the schema.
    let (inputs, given) = unsafe { decode(op, stack)? };
    let site = st.sites.get_or_bind(
        |key| {
            given.iter().for_each(|(_, v)| v.write_key(key));
            true
        },
        || op.bind_attrs(given.iter().map(|(n, v)| (*n, v.clone()))),
    )?;

    let mut device: Option<(i32, i32, &str)> = None;
    let mut refs: Few<Option<TensorRef<'_>>> = Few::with_capacity(inputs.len());
    for (t, arg) in inputs.iter().zip(op.schema.tensor_args()) {
        let Some(t) = t else {
            refs.push(None);
            continue;
        };
        let Info {
            device_type,
            device_index,
            view,
        } = info(op, &arg.name, t)?;
        match device {
            None => device = Some((device_type, device_index, &arg.name)),
            Some((t, _, first)) if t != device_type => {
                return Err(Error::invalid(format!(
                    "inputs `{first}` and `{}` are on different devices",
                    arg.name
                )));
            }
            _ => {}
        }
        refs.push(Some(view));
    }
    let Some((dev_type, dev_index, _)) = device else {
        return Err(Error::invalid("no tensor input"));
    };
    let is_meta = dev_type == codes().meta;
    let mut outs = TorchOutputs {
        device: (dev_type, dev_index),
        outputs: Few::with_capacity(op.num_outputs()),
    };
    let phase = if is_meta {
        Phase::ShapesOnly
    } else {
        Phase::Compute
    };
    kernel_core::call::run(op, &refs, &site, &mut outs, &TorchPool, phase).map_err(|e| {
        if is_meta && op.flags.data_dependent_shape {
            Error::unsupported(format!(
                "{} (torch.compile, FakeTensor): run it eagerly, or load the ops with \
                 `polyop.torch.load()`, which registers a fake kernel giving it an unbacked \
                 symbolic size",
                e.message
            ))
        } else {
            e
        }
    })?;
    drop(refs);
    // In-place results: the kernel wrote out of place; copy into the aliased input (only now,
    // so a failed kernel leaves the input untouched) and return that input (on meta, just
    // return the input).
    let mut outputs = outs.outputs;
    for (t, alias) in outputs.iter_mut().zip(&st.alias_of) {
        let Some(i) = alias else { continue };
        let dst = inputs
            .get(*i)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::internal(format!("aliased input {i} is absent")))?;
        if !is_meta {
            // SAFETY: both handles are valid; same shape and dtype by inference.
            check(unsafe { sys::aoti_torch_copy_(dst.0, t.0, 0) }, "copy_")?;
        }
        *t = dst.share()?;
    }
    for (j, t) in outputs.into_iter().enumerate() {
        // SAFETY: the stack has max(num_args, num_outputs) entries; inputs were consumed.
        unsafe { *stack.add(j) = t.into_raw() as usize as StableIValue };
    }
    drop(inputs);
    Ok(())
}
