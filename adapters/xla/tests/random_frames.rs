//! Random call-frame attributes for every stock handler (property test, with a fixed-seed
//! generator so every run tries the same frames): names (the ops' own, near misses, random
//! bytes, invalid UTF-8), attribute kinds (scalar, string, array, dictionary, an unknown kind)
//! and element types (every XLA type, supported or not), values (random bytes, NUL, invalid
//! UTF-8, empty arrays). A handler must return success or an error naming the op (never a
//! panic, which would abort this process across the `extern "C"` boundary); success is only
//! allowed when every attribute name belongs to the op; and the next valid call still works.
//! The fake `XLA_FFI_Api` and frames come from `tests/common`, shared with `tests/handlers.rs`.

// The bindgen constant names are used unqualified in `elem_size`.
#![allow(non_upper_case_globals)]

mod common;

use common::{call, fake_api, zeros, Buf, Handler, RawAttr};
use polyop_xla::sys;
use polyop_xla::xla_handlers;

/// Frames tried per op.
const FRAMES_PER_OP: usize = 3000;

/// xorshift64*: a fixed-seed generator (no dependency; every run tries the same frames).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const F32: sys::XLA_FFI_DataType = sys::XLA_FFI_DataType_XLA_FFI_DataType_F32;
const S64: sys::XLA_FFI_DataType = sys::XLA_FFI_DataType_XLA_FFI_DataType_S64;

/// Every element type code 0..=31 (the defined ones and some that are not), as (code, size).
fn elem_size(d: sys::XLA_FFI_DataType) -> usize {
    use sys::*;
    match d {
        XLA_FFI_DataType_XLA_FFI_DataType_PRED
        | XLA_FFI_DataType_XLA_FFI_DataType_S8
        | XLA_FFI_DataType_XLA_FFI_DataType_U8 => 1,
        XLA_FFI_DataType_XLA_FFI_DataType_S16
        | XLA_FFI_DataType_XLA_FFI_DataType_U16
        | XLA_FFI_DataType_XLA_FFI_DataType_F16
        | XLA_FFI_DataType_XLA_FFI_DataType_BF16 => 2,
        XLA_FFI_DataType_XLA_FFI_DataType_S32
        | XLA_FFI_DataType_XLA_FFI_DataType_U32
        | XLA_FFI_DataType_XLA_FFI_DataType_F32 => 4,
        _ => 8,
    }
}

fn random_attr(rng: &mut Rng, names: &[&str]) -> RawAttr {
    let name: Vec<u8> = match rng.below(6) {
        0..=2 => rng.pick(names).as_bytes().to_vec(),
        3 => rng
            .pick(&["axes", "Axis", "k ", "", "eps\0", "approximate\0x"])
            .as_bytes()
            .to_vec(),
        4 => vec![0xff, 0xfe, b'k'], // invalid UTF-8
        _ => {
            let n = rng.below(6);
            rng.bytes(n)
        }
    };
    let kind = match rng.below(10) {
        0..=4 => sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR,
        5 | 6 => sys::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING,
        7 | 8 => sys::XLA_FFI_AttrType_XLA_FFI_AttrType_ARRAY,
        _ => rng.pick(&[sys::XLA_FFI_AttrType_XLA_FFI_AttrType_DICTIONARY, 0, 77]),
    };
    let dtype = rng.below(32) as sys::XLA_FFI_DataType;
    let (elems, bytes) = match kind {
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING => {
            let s: Vec<u8> = match rng.below(5) {
                0 => b"none".to_vec(),
                1 => b"tanh".to_vec(),
                2 => b"tanh\0x".to_vec(),
                3 => vec![b'n', 0xc3], // truncated UTF-8
                _ => {
                    let n = rng.below(8);
                    rng.bytes(n)
                }
            };
            (0, s)
        }
        sys::XLA_FFI_AttrType_XLA_FFI_AttrType_ARRAY => {
            let n = rng.below(5);
            let mut b = rng.bytes(n * elem_size(dtype));
            if rng.below(2) == 0 {
                // small values, so some arrays are valid lists
                for x in b.iter_mut() {
                    *x %= 3;
                }
            }
            (n, b)
        }
        _ => {
            let mut b = rng.bytes(8);
            if rng.below(2) == 0 {
                b = (rng.below(5) as i64 - 1).to_ne_bytes().to_vec();
            }
            (1, b)
        }
    };
    RawAttr {
        name,
        kind,
        dtype,
        elems,
        bytes,
    }
}

/// An op's operands and results for a valid call with its default attributes (plus the
/// required ones in `base`).
struct Setup {
    op: &'static str,
    handler: Handler,
    args: Vec<(sys::XLA_FFI_DataType, Vec<i64>)>,
    rets: Vec<(sys::XLA_FFI_DataType, Vec<i64>)>,
    base: Vec<RawAttr>,
}

fn scalar_attr(name: &str, dtype: sys::XLA_FFI_DataType, bytes: Vec<u8>) -> RawAttr {
    RawAttr {
        name: name.as_bytes().to_vec(),
        kind: sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR,
        dtype,
        elems: 1,
        bytes,
    }
}

fn setups() -> Vec<Setup> {
    let f = |dims: &[i64]| (F32, dims.to_vec());
    vec![
        Setup {
            op: "negate",
            handler: xla_handlers::handler("negate").unwrap(),
            args: vec![f(&[3])],
            rets: vec![f(&[3])],
            base: vec![],
        },
        Setup {
            op: "relu",
            handler: xla_handlers::handler("relu").unwrap(),
            args: vec![f(&[3])],
            rets: vec![f(&[3])],
            base: vec![],
        },
        Setup {
            op: "add",
            handler: xla_handlers::handler("add").unwrap(),
            args: vec![f(&[2, 3]), f(&[3])],
            rets: vec![f(&[2, 3])],
            base: vec![],
        },
        Setup {
            op: "scale",
            handler: xla_handlers::handler("scale").unwrap(),
            args: vec![f(&[3])],
            rets: vec![f(&[3])],
            base: vec![scalar_attr(
                "alpha",
                sys::XLA_FFI_DataType_XLA_FFI_DataType_F64,
                2.0f64.to_ne_bytes().to_vec(),
            )],
        },
        Setup {
            op: "gelu",
            handler: xla_handlers::handler("gelu").unwrap(),
            args: vec![f(&[3])],
            rets: vec![f(&[3])],
            base: vec![],
        },
        Setup {
            op: "softmax",
            handler: xla_handlers::handler("softmax").unwrap(),
            args: vec![f(&[2, 3])],
            rets: vec![f(&[2, 3])],
            base: vec![],
        },
        Setup {
            op: "rms_norm",
            handler: xla_handlers::handler("rms_norm").unwrap(),
            args: vec![f(&[2, 3])],
            rets: vec![f(&[2, 3])],
            base: vec![],
        },
        Setup {
            op: "topk",
            handler: xla_handlers::handler("topk").unwrap(),
            args: vec![f(&[1, 4])],
            rets: vec![f(&[1, 2]), (S64, vec![1, 2])],
            base: vec![scalar_attr("k", S64, 2i64.to_ne_bytes().to_vec())],
        },
        Setup {
            op: "conv2d",
            handler: xla_handlers::handler("conv2d").unwrap(),
            args: vec![f(&[1, 1, 3, 3]), f(&[1, 1, 2, 2])],
            rets: vec![f(&[1, 1, 2, 2])],
            base: vec![],
        },
    ]
}

fn run(s: &Setup, api: &sys::XLA_FFI_Api, attrs: &[RawAttr]) -> Option<(u32, String)> {
    let mut args: Vec<Box<Buf>> = s.args.iter().map(|(d, dims)| zeros(*d, dims)).collect();
    let mut rets: Vec<Box<Buf>> = s.rets.iter().map(|(d, dims)| zeros(*d, dims)).collect();
    call(s.handler, api, &mut args, &mut rets, attrs)
}

#[test]
fn random_attributes_give_errors_naming_the_op_never_a_panic() {
    let api = fake_api(polyop_xla::API_MAJOR, polyop_xla::API_MINOR);
    let reg = polyop_kernels::registry();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut refused) = (0usize, 0usize);
    for s in setups() {
        let op = reg.lookup(s.op).unwrap();
        let known: Vec<&str> = op.schema.attr_args().map(|a| a.name.as_str()).collect();
        let mut names = known.clone();
        names.extend(op.schema.tensor_args().map(|a| a.name.as_str()));
        if names.is_empty() {
            names.push("x");
        }
        // the valid call works before anything random
        let e = run(&s, &api, &s.base);
        assert!(e.is_none(), "{}: the valid call fails: {e:?}", s.op);
        for _ in 0..FRAMES_PER_OP {
            let mut attrs = if rng.below(2) == 0 {
                s.base.clone()
            } else {
                vec![]
            };
            for _ in 0..rng.below(4) {
                attrs.push(random_attr(&mut rng, &names));
            }
            match run(&s, &api, &attrs) {
                None => {
                    accepted += 1;
                    for a in &attrs {
                        assert!(
                            known.iter().any(|k| k.as_bytes() == a.name.as_slice()),
                            "{}: accepted an unknown attribute {:?} in {attrs:?}",
                            s.op,
                            String::from_utf8_lossy(&a.name)
                        );
                    }
                }
                Some((code, msg)) => {
                    refused += 1;
                    assert!(
                        msg.starts_with(&format!("polyop.{}:", s.op)),
                        "{}: error (code {code}) does not name the op: {msg} (attrs {attrs:?})",
                        s.op
                    );
                    assert_ne!(code, sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_OK);
                }
            }
            // and the next valid call still works
            let e = run(&s, &api, &s.base);
            assert!(
                e.is_none(),
                "{}: the valid call after {attrs:?} fails: {e:?}",
                s.op
            );
        }
    }
    eprintln!("random frames: {accepted} accepted, {refused} refused");
    // the generator reaches both outcomes (a negative control on its own strength)
    assert!(
        accepted > 0 && refused > 0,
        "accepted {accepted}, refused {refused}"
    );
}
