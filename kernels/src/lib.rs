//! The stock kernel library: SPEC.md section 3, one module per op family.

use kernel_core::{Registry, Result};
use std::sync::OnceLock;

pub(crate) mod common;
pub mod conv;
pub mod elementwise;
pub mod nonzero;
pub mod norm;
pub mod softmax;
pub mod topk;
pub mod vmath;

/// Calls `$m!` with the names of every stock op that a framework without in-place semantics
/// exposes (forward and backward). For adapters that need one symbol per op at compile time
/// (XLA's handlers), so that no adapter lists op names; a test checks it against
/// [`registry`].
#[macro_export]
macro_rules! with_out_of_place_op_names {
    ($($m:ident)::+ { $($args:tt)* }) => {
        $($m)::+! { $($args)*
            negate,
            add, add_backward,
            scale,
            relu, relu_backward,
            add_relu, add_relu_backward,
            gelu, gelu_backward,
            softmax, softmax_backward,
            rms_norm, rms_norm_backward,
            topk, topk_backward,
            conv2d, conv2d_backward,
            nonzero,
        }
    };
}

/// Every stock op (forward and backward), validated.
pub fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| build().expect("stock registry is valid"))
}

fn build() -> Result<Registry> {
    let mut r = Registry::new();
    elementwise::register(&mut r)?;
    softmax::register(&mut r)?;
    norm::register(&mut r)?;
    topk::register(&mut r)?;
    conv::register(&mut r)?;
    nonzero::register(&mut r)?;
    r.validate()?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    macro_rules! names {
        ($($n:ident),* $(,)?) => {
            &[$(stringify!($n)),*]
        };
    }

    #[test]
    fn op_name_list_matches_the_registry() {
        let listed: &[&str] = with_out_of_place_op_names!(names {});
        let want: Vec<&str> = super::registry()
            .ops()
            .filter(|o| !o.flags.inplace)
            .map(|o| o.name)
            .collect();
        assert_eq!(listed, &want[..]);
    }
}
