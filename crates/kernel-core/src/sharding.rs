//! Sharding metadata: which dims of an op's tensors may be split across devices.
//!
//! An op describes, for the shapes and attributes of one call, a [`ShardingRule`] in the
//! einsum style that JAX's Shardy, torch DTensor and TensorFlow's strategies can each
//! translate: every dim of every tensor maps to a *factor*; tensors that share a factor are
//! split along it together. A factor is
//!
//! - [`Factor::Split`]: the op computes independently along it. Splitting every dim mapped to
//!   it into the same shards and running the op per shard gives, for each output that has the
//!   factor, that output's shards; an output that does *not* have the factor (a weight
//!   gradient summed over the batch) is the **sum** of the per-shard outputs (einsum's rule
//!   for an index missing from the result).
//! - [`Factor::Whole`]: the op needs the whole dim (softmax's axis, a convolution's window).
//!   A framework gathers it before the op.
//!
//! An op that declares no rule gets [`ShardingRule::replicated`]: every dim whole, so a
//! framework gathers its inputs (correct, never silently wrong). The rule is computed after
//! shape inference, from the same specs and attributes ([`OpDef::sharding_rule`]).

use crate::dim::Dim;
use crate::op::{OpDef, TensorSpec};
use crate::{Attrs, Result};

/// What a factor allows; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Factor {
    Split,
    Whole,
}

/// The factors of one call's tensors; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardingRule {
    /// Per factor id, its kind.
    pub factors: Vec<Factor>,
    /// Per tensor input, the factor of each dim; `None` for an absent optional input or an
    /// unknown rank.
    pub inputs: Vec<Option<Vec<usize>>>,
    /// Per output, the factor of each dim; `None` for an unknown rank.
    pub outputs: Vec<Option<Vec<usize>>>,
}

/// What a sharding function sees: the call's input specs, the inferred output specs and the
/// bound attributes.
pub struct ShardCtx<'a> {
    pub op: &'a OpDef,
    pub inputs: &'a [Option<TensorSpec>],
    pub outputs: &'a [TensorSpec],
    pub attrs: &'a Attrs,
}

impl ShardCtx<'_> {
    /// Rank of input `i` (`None` when absent or of unknown rank).
    pub fn input_rank(&self, i: usize) -> Option<usize> {
        self.inputs.get(i)?.as_ref()?.rank()
    }
}

/// An op's sharding function.
pub type ShardFn = fn(&ShardCtx) -> Result<ShardingRule>;

impl ShardingRule {
    /// A new factor of kind `f`; returns its id.
    pub fn factor(&mut self, f: Factor) -> usize {
        self.factors.push(f);
        self.factors.len() - 1
    }

    /// `n` new factors of kind `f`.
    pub fn factors(&mut self, f: Factor, n: usize) -> Vec<usize> {
        (0..n).map(|_| self.factor(f)).collect()
    }

    /// Every dim of every tensor its own whole factor: nothing may stay split.
    pub fn replicated(ctx: &ShardCtx) -> ShardingRule {
        let mut r = ShardingRule::default();
        r.inputs = ctx
            .inputs
            .iter()
            .map(|s| Some(r.factors(Factor::Whole, s.as_ref()?.rank()?)))
            .collect();
        r.outputs = ctx
            .outputs
            .iter()
            .map(|s| Some(r.factors(Factor::Whole, s.rank()?)))
            .collect();
        r
    }

    /// Elementwise with NumPy broadcasting: [`ShardingRule::broadcast_over`] the first
    /// output's shape. A [`ShardFn`] as it is (`.sharding(ShardingRule::broadcast)`).
    pub fn broadcast(ctx: &ShardCtx) -> Result<ShardingRule> {
        Ok(match ctx.outputs.first().and_then(|o| o.shape.as_deref()) {
            Some(full) => ShardingRule::broadcast_over(ctx, full),
            None => ShardingRule::replicated(ctx),
        })
    }

    /// One split factor per dim of the broadcast shape `full`; each input maps its dims,
    /// aligned from the right, to those factors, except a dim of size 1 that broadcasts
    /// against a larger one, which gets a whole factor of its own. Outputs of `full`'s rank
    /// take its factors; others are replicated (a backward op sets its own, see
    /// `add_backward`).
    pub fn broadcast_over(ctx: &ShardCtx, full: &[Dim]) -> ShardingRule {
        let mut r = ShardingRule::default();
        let split = r.factors(Factor::Split, full.len());
        let map = |r: &mut ShardingRule, dims: Option<&[Dim]>| -> Option<Vec<usize>> {
            let dims = dims?;
            let off = full.len().checked_sub(dims.len())?;
            let m = dims.iter().enumerate().map(|(j, d)| {
                if d.known() == Some(1) && full[off + j].known() != Some(1) {
                    r.factor(Factor::Whole)
                } else {
                    split[off + j]
                }
            });
            Some(m.collect())
        };
        r.inputs = ctx
            .inputs
            .iter()
            .map(|s| map(&mut r, s.as_ref().and_then(|s| s.shape.as_deref())))
            .collect();
        r.outputs = ctx
            .outputs
            .iter()
            .map(|o| match o.rank()? {
                n if n == full.len() => Some(split.clone()),
                n => Some(r.factors(Factor::Whole, n)),
            })
            .collect();
        r
    }

    /// Every tensor (inputs and outputs) of rank `rank` shares one factor per dim, position by
    /// position: split, except the dims in `whole` (softmax's axis, topk's). Tensors of
    /// another rank get whole factors.
    pub fn aligned(ctx: &ShardCtx, rank: usize, whole: &[usize]) -> ShardingRule {
        let mut r = ShardingRule::default();
        let shared: Vec<usize> = (0..rank)
            .map(|d| {
                r.factor(if whole.contains(&d) {
                    Factor::Whole
                } else {
                    Factor::Split
                })
            })
            .collect();
        let map = |r: &mut ShardingRule, n: Option<usize>| match n {
            Some(n) if n == rank => Some(shared.clone()),
            Some(n) => Some(r.factors(Factor::Whole, n)),
            None => None,
        };
        r.inputs = (0..ctx.inputs.len())
            .map(|i| map(&mut r, ctx.input_rank(i)))
            .collect();
        r.outputs = ctx.outputs.iter().map(|o| map(&mut r, o.rank())).collect();
        r
    }

    /// Every tensor of the first input's rank shares its factors ([`ShardingRule::aligned`]);
    /// the dims the op's axis attributes ([`OpDef::axis_attrs`]) select are whole: softmax,
    /// topk and their backward ops. A [`ShardFn`] as it is.
    pub fn whole_axes(ctx: &ShardCtx) -> Result<ShardingRule> {
        let Some(rank) = ctx.input_rank(0) else {
            return Ok(ShardingRule::replicated(ctx));
        };
        let mut whole = Vec::new();
        for a in &ctx.op.axis_attrs {
            whole.push(crate::normalize_axis(ctx.attrs.int(a)?, rank)?);
        }
        Ok(ShardingRule::aligned(ctx, rank, &whole))
    }

    /// Whether factor `f` may be split.
    pub fn is_split(&self, f: usize) -> bool {
        self.factors.get(f) == Some(&Factor::Split)
    }

    /// Checks the rule against the call: one entry per tensor, one factor per dim, every
    /// factor id defined.
    pub fn check(&self, ctx: &ShardCtx) -> Result<()> {
        let bad = |m: String| Err(crate::Error::internal(format!("sharding rule: {m}")));
        if self.inputs.len() != ctx.inputs.len() || self.outputs.len() != ctx.outputs.len() {
            return bad(format!(
                "{} inputs and {} outputs, the call has {} and {}",
                self.inputs.len(),
                self.outputs.len(),
                ctx.inputs.len(),
                ctx.outputs.len()
            ));
        }
        let ranks = ctx
            .inputs
            .iter()
            .map(|s| s.as_ref().and_then(TensorSpec::rank))
            .chain(ctx.outputs.iter().map(TensorSpec::rank));
        for (i, (m, rank)) in self
            .inputs
            .iter()
            .chain(&self.outputs)
            .zip(ranks)
            .enumerate()
        {
            let Some(m) = m else { continue };
            if Some(m.len()) != rank {
                return bad(format!(
                    "tensor {i} maps {} dims, its rank is {rank:?}",
                    m.len()
                ));
            }
            if let Some(f) = m.iter().find(|&&f| f >= self.factors.len()) {
                return bad(format!("tensor {i} uses undefined factor {f}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, InferCtx, KernelCtx, ShapeOut};

    fn infer(_: &InferCtx) -> Result<Vec<ShapeOut>> {
        Ok(vec![None])
    }
    fn cpu(_: &mut KernelCtx) -> Result<()> {
        Ok(())
    }

    fn op() -> OpDef {
        OpDef::builder("f(Tensor x, Tensor? y=None) -> Tensor")
            .infer(infer)
            .cpu(cpu)
            .build()
            .unwrap()
    }

    fn spec(d: &[usize]) -> TensorSpec {
        TensorSpec::new(DType::F32, d)
    }

    #[test]
    fn broadcast_gives_size_one_dims_their_own_whole_factor() {
        let op = op();
        let attrs = Attrs::default();
        let inputs = [Some(spec(&[4, 1, 3])), Some(spec(&[5, 3]))];
        let outputs = [spec(&[4, 5, 3])];
        let ctx = ShardCtx {
            op: &op,
            inputs: &inputs,
            outputs: &outputs,
            attrs: &attrs,
        };
        let r = ShardingRule::broadcast(&ctx).unwrap();
        r.check(&ctx).unwrap();
        assert_eq!(r.outputs, vec![Some(vec![0, 1, 2])]);
        assert_eq!(r.inputs, vec![Some(vec![0, 3, 2]), Some(vec![1, 2])]);
        assert_eq!(
            r.factors,
            vec![Factor::Split, Factor::Split, Factor::Split, Factor::Whole]
        );
    }

    #[test]
    fn aligned_and_replicated() {
        let op = op();
        let attrs = Attrs::default();
        let inputs = [Some(spec(&[2, 8])), None];
        let outputs = [spec(&[2, 8])];
        let ctx = ShardCtx {
            op: &op,
            inputs: &inputs,
            outputs: &outputs,
            attrs: &attrs,
        };
        let r = ShardingRule::aligned(&ctx, 2, &[1]);
        r.check(&ctx).unwrap();
        assert_eq!(r.inputs, vec![Some(vec![0, 1]), None]);
        assert_eq!(r.outputs, vec![Some(vec![0, 1])]);
        assert!(r.is_split(0) && !r.is_split(1));
        let r = ShardingRule::replicated(&ctx);
        r.check(&ctx).unwrap();
        assert!(r.factors.iter().all(|f| *f == Factor::Whole));
        assert_eq!(r.factors.len(), 4);
        // a rule that maps the wrong number of dims is refused
        let mut bad = r.clone();
        bad.outputs[0] = Some(vec![0]);
        assert!(bad.check(&ctx).is_err());
    }
}
