//! The shape model: a dim is a known size, an unknown size, or a symbolic expression over
//! named sizes (a batch `b`, a sequence `s`), and shape functions are written once against it.
//!
//! Frameworks that trace with symbolic sizes (torch `SymInt`s, JAX shape polymorphism, ONNX
//! `dim_param`s) pass each symbolic input dim as a [`Dim::Sym`] named by the framework; the
//! op's shape function builds output dims with [`Dim::add`], [`Dim::floor_div`], ... and
//! [`broadcast_dims`], and states what must hold between inputs (rms_norm's weight equals the
//! last dim of x) through [`InferCtx::require_eq`](crate::InferCtx::require_eq) and
//! [`InferCtx::require_le`](crate::InferCtx::require_le). Known sizes are decided at once
//! (a contradiction is an error); a requirement over symbols comes back as a [`Constraint`]
//! the framework checks or guards on, never as a specialization to a constant.
//!
//! Expressions are kept small by folding constants (`(s + 2 - 3) // 1 + 1` is `s`), so
//! frameworks see the expression a person would write. See docs/shapes.md.

use std::fmt;
use std::sync::Arc;

use crate::{Error, Result};

/// One dimension of a shape.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Dim {
    Known(usize),
    /// Not known and not named (TF graph mode `None` dims, ONNX dims without a `dim_param`).
    Unknown,
    /// An expression with at least one symbol (never a bare constant: that is `Known`).
    Sym(Arc<Expr>),
}

/// Binary operators of [`Expr`], the ones the stock ops need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    /// Floor division (sizes are non-negative, so this is truncating division too).
    FloorDiv,
    Max,
    /// NumPy broadcasting of two sizes: equal, or one of them is 1 and the result the other.
    /// Frameworks evaluate it with their own broadcasting rule (which guards as it needs).
    Broadcast,
}

impl BinOp {
    /// The operator's name in the wire form (`("add", a, b)`) the Python glue evaluates.
    pub fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::FloorDiv => "floordiv",
            BinOp::Max => "max",
            BinOp::Broadcast => "broadcast",
        }
    }
    pub fn from_name(name: &str) -> Option<BinOp> {
        Some(match name {
            "add" => BinOp::Add,
            "sub" => BinOp::Sub,
            "mul" => BinOp::Mul,
            "floordiv" => BinOp::FloorDiv,
            "max" => BinOp::Max,
            "broadcast" => BinOp::Broadcast,
            _ => return None,
        })
    }
}

/// A symbolic size expression.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    Sym(String),
    Const(i64),
    Bin(BinOp, Box<Expr>, Box<Expr>),
}

fn overflow(what: &str) -> Error {
    Error::invalid(format!("size arithmetic overflows: {what}"))
}

impl Dim {
    /// A named symbolic size.
    pub fn sym(name: impl Into<String>) -> Dim {
        Dim::Sym(Arc::new(Expr::Sym(name.into())))
    }
    pub fn known(&self) -> Option<usize> {
        match self {
            Dim::Known(n) => Some(*n),
            _ => None,
        }
    }
    pub fn is_unknown(&self) -> bool {
        matches!(self, Dim::Unknown)
    }
    /// The dim as an expression (`None` when unknown); a size beyond `i64` is an error.
    pub fn expr(&self) -> Result<Option<Expr>> {
        Ok(match self {
            Dim::Known(n) => Some(Expr::Const(
                i64::try_from(*n).map_err(|_| overflow(&format!("size {n}")))?,
            )),
            Dim::Unknown => None,
            Dim::Sym(e) => Some((**e).clone()),
        })
    }
    /// A dim from an expression: a constant becomes `Known` (a negative one is an error).
    pub fn from_expr(e: Expr) -> Result<Dim> {
        match e {
            Expr::Const(c) => usize::try_from(c)
                .map(Dim::Known)
                .map_err(|_| Error::invalid(format!("a size cannot be negative, got {c}"))),
            e => Ok(Dim::Sym(Arc::new(e))),
        }
    }

    fn binary(&self, op: BinOp, other: &Dim) -> Result<Dim> {
        let (Some(a), Some(b)) = (self.expr()?, other.expr()?) else {
            return Ok(Dim::Unknown);
        };
        Dim::from_expr(simplify(op, a, b)?)
    }
    pub fn add(&self, other: &Dim) -> Result<Dim> {
        self.binary(BinOp::Add, other)
    }
    /// `self - other`; a known negative result is an error.
    pub fn sub(&self, other: &Dim) -> Result<Dim> {
        self.binary(BinOp::Sub, other)
    }
    pub fn mul(&self, other: &Dim) -> Result<Dim> {
        self.binary(BinOp::Mul, other)
    }
    /// `self // other`; division by a known zero is an error.
    pub fn floor_div(&self, other: &Dim) -> Result<Dim> {
        self.binary(BinOp::FloorDiv, other)
    }
    pub fn max(&self, other: &Dim) -> Result<Dim> {
        self.binary(BinOp::Max, other)
    }
}

/// `None` is an unknown size.
impl From<Option<usize>> for Dim {
    fn from(n: Option<usize>) -> Dim {
        n.map_or(Dim::Unknown, Dim::Known)
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Known(n)
    }
}

/// Build `op(a, b)` with constants folded and identities applied. Constants of a sum are
/// kept on the right (`s + 3`), a product's on the left (`2*s`).
fn simplify(op: BinOp, a: Expr, b: Expr) -> Result<Expr> {
    use BinOp::*;
    use Expr::Const;
    let bin = |op, a, b| Expr::Bin(op, Box::new(a), Box::new(b));
    Ok(match (op, a, b) {
        (Add, Const(x), Const(y)) => Const(
            x.checked_add(y)
                .ok_or_else(|| overflow(&format!("{x} + {y}")))?,
        ),
        (Sub, Const(x), Const(y)) => Const(
            x.checked_sub(y)
                .ok_or_else(|| overflow(&format!("{x} - {y}")))?,
        ),
        (Mul, Const(x), Const(y)) => Const(
            x.checked_mul(y)
                .ok_or_else(|| overflow(&format!("{x} * {y}")))?,
        ),
        (FloorDiv, _, Const(0)) => return Err(Error::invalid("division of a size by zero")),
        (FloorDiv, Const(x), Const(y)) => Const(x.div_euclid(y)),
        (Max, Const(x), Const(y)) => Const(x.max(y)),
        (Broadcast, Const(x), Const(y)) => {
            if x == y || y == 1 {
                Const(x)
            } else if x == 1 {
                Const(y)
            } else {
                return Err(Error::invalid(format!(
                    "sizes {x} and {y} do not broadcast"
                )));
            }
        }
        // identities
        (Add, e, Const(0)) | (Add, Const(0), e) | (Sub, e, Const(0)) => e,
        (Mul, e, Const(1)) | (Mul, Const(1), e) | (FloorDiv, e, Const(1)) => e,
        (Mul, _, Const(0)) | (Mul, Const(0), _) => Const(0),
        (Sub, a, b) if a == b => Const(0),
        (Max | Broadcast, a, b) if a == b => a,
        (Broadcast, e, Const(1)) | (Broadcast, Const(1), e) => e,
        (Max, e, Const(0)) | (Max, Const(0), e) => e,
        // constants of sums to the right, folded: (e + x) + y = e + (x + y)
        (Add, Const(c), e) => simplify(Add, e, Const(c))?,
        (Sub, e, Const(c)) => simplify(
            Add,
            e,
            Const(c.checked_neg().ok_or_else(|| overflow("negation"))?),
        )?,
        (Add, Expr::Bin(Add, e, x), Const(y)) if matches!(*x, Const(_)) => {
            let Const(x) = *x else { unreachable!() };
            simplify(Add, *e, simplify(Add, Const(x), Const(y))?)?
        }
        // constants of products to the left
        (Mul, e, Const(c)) => bin(Mul, Const(c), e),
        (op, a, b) => bin(op, a, b),
    })
}

impl Expr {
    /// Binding strength for printing with the fewest parentheses.
    fn prec(&self) -> u8 {
        match self {
            Expr::Bin(BinOp::Add | BinOp::Sub, ..) => 1,
            Expr::Bin(BinOp::Mul | BinOp::FloorDiv, ..) => 2,
            Expr::Const(c) if *c < 0 => 1,
            _ => 3,
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let paren = |f: &mut fmt::Formatter<'_>, e: &Expr, min: u8| {
            if e.prec() < min {
                write!(f, "({e})")
            } else {
                write!(f, "{e}")
            }
        };
        match self {
            Expr::Sym(s) => f.write_str(s),
            Expr::Const(c) => write!(f, "{c}"),
            Expr::Bin(op @ (BinOp::Max | BinOp::Broadcast), a, b) => {
                write!(f, "{}({a}, {b})", op.name())
            }
            Expr::Bin(BinOp::Add, a, b) => {
                paren(f, a, 1)?;
                match **b {
                    Expr::Const(c) if c < 0 => write!(f, " - {}", c.unsigned_abs()),
                    _ => {
                        f.write_str(" + ")?;
                        paren(f, b, 2)
                    }
                }
            }
            Expr::Bin(op, a, b) => {
                let (sym, lmin, rmin) = match op {
                    BinOp::Sub => (" - ", 1, 2),
                    BinOp::Mul => ("*", 2, 3),
                    _ => (" // ", 2, 3),
                };
                paren(f, a, lmin)?;
                f.write_str(sym)?;
                paren(f, b, rmin)
            }
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Unknown => f.write_str("?"),
            Dim::Sym(e) => write!(f, "{e}"),
        }
    }
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `[2, s, ?]`: a shape as error messages show it.
pub fn fmt_dims(d: &[Dim]) -> String {
    let parts: Vec<String> = d.iter().map(Dim::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// How two dims must relate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Relation {
    Eq,
    Le,
}

impl Relation {
    pub fn name(self) -> &'static str {
        match self {
            Relation::Eq => "eq",
            Relation::Le => "le",
        }
    }
}

/// A requirement between symbolic dims that shape inference could not decide: the framework
/// checks it (torch `torch._check`, a guard) or leaves it to the kernel's check at run time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Constraint {
    pub relation: Relation,
    pub lhs: Dim,
    pub rhs: Dim,
    /// The error the op gives when it does not hold.
    pub message: String,
}

/// Decide `lhs relation rhs` where possible: a known contradiction is an error with
/// `message`; a requirement over symbols is returned as a [`Constraint`]; an unknown dim
/// satisfies anything.
pub fn relate(
    relation: Relation,
    lhs: &Dim,
    rhs: &Dim,
    message: impl FnOnce() -> String,
) -> Result<Option<Constraint>> {
    let holds = match (relation, lhs, rhs) {
        (_, Dim::Unknown, _) | (_, _, Dim::Unknown) => true,
        (Relation::Eq, Dim::Known(a), Dim::Known(b)) => a == b,
        (Relation::Le, Dim::Known(a), Dim::Known(b)) => a <= b,
        (_, a, b) if a == b => true,
        (Relation::Le, Dim::Known(0), _) => true,
        _ => {
            return Ok(Some(Constraint {
                relation,
                lhs: lhs.clone(),
                rhs: rhs.clone(),
                message: message(),
            }))
        }
    };
    if holds {
        Ok(None)
    } else {
        Err(Error::invalid(message()))
    }
}

/// NumPy broadcasting of two shapes (`None` = unknown rank). Known sizes that do not broadcast
/// are an error; symbolic sizes give a `broadcast(a, b)` expression unless one is 1 or both
/// are the same; an unknown size with a known size other than 1 gives that size.
pub fn broadcast_dims(a: Option<&[Dim]>, b: Option<&[Dim]>) -> Result<Option<Vec<Dim>>> {
    let (Some(a), Some(b)) = (a, b) else {
        return Ok(None);
    };
    let rank = a.len().max(b.len());
    let get = |s: &'_ [Dim], i: usize| -> Dim {
        if i + s.len() >= rank {
            s[i + s.len() - rank].clone()
        } else {
            Dim::Known(1)
        }
    };
    (0..rank)
        .map(|i| {
            let (da, db) = (get(a, i), get(b, i));
            Ok(match (&da, &db) {
                (Dim::Known(x), Dim::Known(y)) if x != y && *x != 1 && *y != 1 => {
                    return Err(Error::invalid(format!(
                        "shapes {} and {} cannot be broadcast together (dim {x} vs {y})",
                        fmt_dims(a),
                        fmt_dims(b)
                    )))
                }
                (Dim::Known(1), d) | (d, Dim::Known(1)) => d.clone(),
                (Dim::Unknown, Dim::Known(n)) | (Dim::Known(n), Dim::Unknown) => Dim::Known(*n),
                (Dim::Unknown, _) | (_, Dim::Unknown) => Dim::Unknown,
                _ => da.binary(BinOp::Broadcast, &db)?,
            })
        })
        .collect::<Result<_>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: &str) -> Dim {
        Dim::sym(n)
    }
    fn k(n: usize) -> Dim {
        Dim::Known(n)
    }

    #[test]
    fn conv_output_size_folds_to_the_input_symbol() {
        // (H + 2*1 - 3) // 1 + 1 == H
        let h = s("H");
        let out = h
            .add(&k(2))
            .unwrap()
            .sub(&k(3))
            .unwrap()
            .floor_div(&k(1))
            .unwrap()
            .add(&k(1))
            .unwrap();
        assert_eq!(out, h);
        // stride 2: (H + 2 - 3) // 2 + 1
        let out = h
            .add(&k(2))
            .unwrap()
            .sub(&k(3))
            .unwrap()
            .floor_div(&k(2))
            .unwrap()
            .add(&k(1))
            .unwrap();
        assert_eq!(out.to_string(), "(H - 1) // 2 + 1");
        assert_eq!(k(7).sub(&k(3)).unwrap().floor_div(&k(2)).unwrap(), k(2));
    }

    #[test]
    fn arithmetic_errors_and_unknowns() {
        assert!(k(3).sub(&k(4)).is_err(), "negative size");
        assert!(k(usize::MAX).add(&k(1)).is_err(), "overflow");
        assert!(k(i64::MAX as usize).add(&k(1)).is_err(), "overflow");
        assert_eq!(k(5).add(&k(1)).unwrap(), k(6));
        assert!(s("a").floor_div(&k(0)).is_err(), "division by zero");
        assert_eq!(Dim::Unknown.add(&k(1)).unwrap(), Dim::Unknown);
        assert_eq!(k(2).mul(&s("b")).unwrap().to_string(), "2*b");
        assert_eq!(s("b").mul(&k(0)).unwrap(), k(0));
        assert_eq!(s("a").max(&s("a")).unwrap(), s("a"));
        assert_eq!(s("a").max(&s("b")).unwrap().to_string(), "max(a, b)");
        assert_eq!(s("a").sub(&s("a")).unwrap(), k(0));
        let e = s("a").add(&s("b")).unwrap().mul(&k(3)).unwrap();
        assert_eq!(e.to_string(), "3*(a + b)");
    }

    #[test]
    fn broadcasting_with_symbols() {
        let b = |x: &[Dim], y: &[Dim]| broadcast_dims(Some(x), Some(y));
        assert_eq!(
            b(&[s("n"), k(1)], &[k(4)]).unwrap().unwrap(),
            vec![s("n"), k(4)]
        );
        assert_eq!(b(&[s("n")], &[s("n")]).unwrap().unwrap(), vec![s("n")]);
        assert_eq!(
            b(&[s("n")], &[s("m")]).unwrap().unwrap()[0].to_string(),
            "broadcast(n, m)"
        );
        assert_eq!(
            b(&[s("n")], &[k(4)]).unwrap().unwrap()[0].to_string(),
            "broadcast(n, 4)"
        );
        assert_eq!(b(&[Dim::Unknown], &[k(4)]).unwrap().unwrap(), vec![k(4)]);
        assert_eq!(
            b(&[Dim::Unknown], &[k(1)]).unwrap().unwrap(),
            vec![Dim::Unknown]
        );
        assert_eq!(
            b(&[Dim::Unknown], &[s("n")]).unwrap().unwrap(),
            vec![Dim::Unknown]
        );
        let e = b(&[k(3)], &[k(4)]).unwrap_err();
        assert!(e.message.contains("cannot be broadcast"), "{}", e.message);
        assert_eq!(broadcast_dims(None, Some(&[k(1)])).unwrap(), None);
    }

    #[test]
    fn relations_decide_what_they_can() {
        let msg = || "bad".to_string();
        assert!(relate(Relation::Eq, &k(3), &k(3), msg).unwrap().is_none());
        assert!(relate(Relation::Eq, &k(3), &k(4), msg).is_err());
        assert!(relate(Relation::Le, &k(5), &k(4), msg).is_err());
        assert!(relate(Relation::Eq, &s("n"), &s("n"), msg)
            .unwrap()
            .is_none());
        assert!(relate(Relation::Eq, &Dim::Unknown, &k(4), msg)
            .unwrap()
            .is_none());
        assert!(relate(Relation::Le, &k(0), &s("n"), msg).unwrap().is_none());
        let c = relate(Relation::Le, &k(3), &s("n"), msg).unwrap().unwrap();
        assert_eq!((c.relation, c.lhs, c.rhs), (Relation::Le, k(3), s("n")));
    }
}
