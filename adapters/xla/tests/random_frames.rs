//! Random call-frame attributes for every stock handler (property test, with a fixed-seed
//! generator so every run tries the same frames): names (the ops' own, near misses, random
//! bytes, invalid UTF-8), attribute kinds (scalar, string, array, dictionary, an unknown kind)
//! and element types (every XLA type, supported or not), values (random bytes, NUL, invalid
//! UTF-8, empty arrays). A handler must return success or an error naming the op (never a
//! panic, which would abort this process across the `extern "C"` boundary); success is only
//! allowed when every attribute name belongs to the op; and the next valid call still works.
//! The fake `XLA_FFI_Api` and frame layout are those of `tests/handlers.rs`.

// The bindgen constant names are used unqualified in `elem_size`.
#![allow(non_upper_case_globals)]

use polyop_xla::sys;
use polyop_xla::xla_handlers;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

type Handler = unsafe extern "C" fn(*mut sys::XLA_FFI_CallFrame) -> *mut sys::XLA_FFI_Error;

/// Frames tried per op.
const FRAMES_PER_OP: usize = 3000;

struct FakeError(u32, String);

unsafe extern "C" fn fake_error_create(
    args: *mut sys::XLA_FFI_Error_Create_Args,
) -> *mut sys::XLA_FFI_Error {
    // SAFETY: the adapter calls `XLA_FFI_Error_Create` with a valid argument struct.
    let a = unsafe { &*args };
    // SAFETY: its `message` is a NUL-terminated string alive across the call.
    let msg = unsafe { CStr::from_ptr(a.message) }
        .to_string_lossy()
        .into_owned();
    Box::into_raw(Box::new(FakeError(a.errc, msg))) as *mut sys::XLA_FFI_Error
}

fn fake_api() -> sys::XLA_FFI_Api {
    // SAFETY: every field is an integer, a raw pointer or an Option<fn>; zero is valid.
    let mut api: sys::XLA_FFI_Api = unsafe { std::mem::zeroed() };
    api.struct_size = sys::XLA_FFI_Api_STRUCT_SIZE as usize;
    api.api_version = sys::XLA_FFI_Api_Version {
        struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE as usize,
        extension_start: null_mut(),
        major_version: polyop_xla::API_MAJOR,
        minor_version: polyop_xla::API_MINOR,
    };
    api.XLA_FFI_Error_Create = Some(fake_error_create);
    api
}

fn take_error(e: *mut sys::XLA_FFI_Error) -> Option<(u32, String)> {
    if e.is_null() {
        None
    } else {
        // SAFETY: every error here comes from `fake_error_create`, a leaked
        // `Box<FakeError>`, and each is taken once.
        let b = unsafe { Box::from_raw(e as *mut FakeError) };
        Some((b.0, b.1))
    }
}

/// A buffer of f32 or s64 zeros (owned) with its dims.
struct Buf {
    buf: sys::XLA_FFI_Buffer,
    dims: Vec<i64>,
    data: Vec<u64>,
}

fn buffer(dtype: sys::XLA_FFI_DataType, dims: &[i64]) -> Box<Buf> {
    let n: i64 = dims.iter().product();
    let mut b = Box::new(Buf {
        // SAFETY: every field of `XLA_FFI_Buffer` is an integer or a raw pointer; zero is valid.
        buf: unsafe { std::mem::zeroed() },
        dims: dims.to_vec(),
        data: vec![0; n.max(1) as usize], // 8 bytes per element: enough for f32 and s64
    });
    b.buf.struct_size = sys::XLA_FFI_Buffer_STRUCT_SIZE as usize;
    b.buf.dtype = dtype;
    b.buf.data = b.data.as_mut_ptr() as *mut c_void;
    b.buf.rank = dims.len() as i64;
    b.buf.dims = b.dims.as_mut_ptr();
    b
}

/// One attribute as a frame holds it: kind (`XLA_FFI_AttrType`), element type, and the bytes
/// of the value (one scalar, the array elements, or the string).
#[derive(Debug, Clone)]
struct RawAttr {
    name: Vec<u8>,
    kind: sys::XLA_FFI_AttrType,
    dtype: sys::XLA_FFI_DataType,
    elems: usize,
    bytes: Vec<u8>,
}

/// Call `handler` with operands, results and attributes.
fn call(
    handler: Handler,
    api: &sys::XLA_FFI_Api,
    args: &mut [Box<Buf>],
    rets: &mut [Box<Buf>],
    attrs: &[RawAttr],
) -> Option<(u32, String)> {
    let mut arg_types = vec![sys::XLA_FFI_ArgType_XLA_FFI_ArgType_BUFFER; args.len()];
    let mut arg_ptrs: Vec<*mut c_void> = args
        .iter_mut()
        .map(|b| &mut b.buf as *mut _ as *mut c_void)
        .collect();
    let mut ret_types = vec![sys::XLA_FFI_RetType_XLA_FFI_RetType_BUFFER; rets.len()];
    let mut ret_ptrs: Vec<*mut c_void> = rets
        .iter_mut()
        .map(|b| &mut b.buf as *mut _ as *mut c_void)
        .collect();
    // Value storage: 8-byte aligned, at least 16 bytes, so a scalar of any declared type reads
    // inside it.
    let mut storage: Vec<Vec<u64>> = attrs
        .iter()
        .map(|a| {
            let mut v = vec![0u64; a.bytes.len().div_ceil(8).max(2)];
            // SAFETY: `v` has at least `a.bytes.len()` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    a.bytes.as_ptr(),
                    v.as_mut_ptr() as *mut u8,
                    a.bytes.len(),
                )
            };
            v
        })
        .collect();
    let mut names: Vec<sys::XLA_FFI_ByteSpan> = attrs
        .iter()
        .map(|a| sys::XLA_FFI_ByteSpan {
            ptr: a.name.as_ptr() as *const _,
            len: a.name.len(),
        })
        .collect();
    let mut name_ptrs: Vec<*mut sys::XLA_FFI_ByteSpan> =
        names.iter_mut().map(|n| n as *mut _).collect();
    let mut scalars: Vec<sys::XLA_FFI_Scalar> = Vec::new();
    let mut spans: Vec<sys::XLA_FFI_ByteSpan> = Vec::new();
    let mut arrays: Vec<sys::XLA_FFI_Array> = Vec::new();
    for (a, s) in attrs.iter().zip(storage.iter_mut()) {
        let p = s.as_mut_ptr() as *mut c_void;
        scalars.push(sys::XLA_FFI_Scalar {
            dtype: a.dtype,
            value: p,
        });
        spans.push(sys::XLA_FFI_ByteSpan {
            ptr: p as *const _,
            len: a.bytes.len(),
        });
        arrays.push(sys::XLA_FFI_Array {
            dtype: a.dtype,
            size: a.elems,
            data: p,
        });
    }
    let mut attr_types: Vec<sys::XLA_FFI_AttrType> = attrs.iter().map(|a| a.kind).collect();
    let mut attr_ptrs: Vec<*mut c_void> = Vec::new();
    for (i, a) in attrs.iter().enumerate() {
        attr_ptrs.push(match a.kind {
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR => {
                &mut scalars[i] as *mut _ as *mut c_void
            }
            sys::XLA_FFI_AttrType_XLA_FFI_AttrType_ARRAY => &mut arrays[i] as *mut _ as *mut c_void,
            // strings, and the kinds the adapter must refuse without reading (a dictionary,
            // an unknown kind): a byte span, so even a wrong read stays in bounds
            _ => &mut spans[i] as *mut _ as *mut c_void,
        });
    }
    let mut frame = sys::XLA_FFI_CallFrame {
        struct_size: sys::XLA_FFI_CallFrame_STRUCT_SIZE as usize,
        extension_start: null_mut(),
        api,
        ctx: null_mut(),
        stage: sys::XLA_FFI_ExecutionStage_XLA_FFI_ExecutionStage_EXECUTE,
        args: sys::XLA_FFI_Args {
            struct_size: sys::XLA_FFI_Args_STRUCT_SIZE as usize,
            extension_start: null_mut(),
            size: args.len() as i64,
            types: arg_types.as_mut_ptr(),
            args: arg_ptrs.as_mut_ptr(),
        },
        rets: sys::XLA_FFI_Rets {
            struct_size: sys::XLA_FFI_Rets_STRUCT_SIZE as usize,
            extension_start: null_mut(),
            size: rets.len() as i64,
            types: ret_types.as_mut_ptr(),
            rets: ret_ptrs.as_mut_ptr(),
        },
        attrs: sys::XLA_FFI_Attrs {
            struct_size: sys::XLA_FFI_Attrs_STRUCT_SIZE as usize,
            extension_start: null_mut(),
            size: attrs.len() as i64,
            types: attr_types.as_mut_ptr(),
            names: name_ptrs.as_mut_ptr(),
            attrs: attr_ptrs.as_mut_ptr(),
        },
        future: null_mut(),
    };
    // SAFETY: `frame` is complete: every array holds `size` entries, each entry points to a
    // value of the declared kind whose data (scalar storage of >= 16 bytes, `elems` elements
    // of at most 8 bytes for arrays, `len` bytes for spans) is alive for the call.
    take_error(unsafe { handler(&mut frame) })
}

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
            handler: xla_handlers::negate,
            args: vec![f(&[3])],
            rets: vec![f(&[3])],
            base: vec![],
        },
        Setup {
            op: "relu",
            handler: xla_handlers::relu,
            args: vec![f(&[3])],
            rets: vec![f(&[3])],
            base: vec![],
        },
        Setup {
            op: "add",
            handler: xla_handlers::add,
            args: vec![f(&[2, 3]), f(&[3])],
            rets: vec![f(&[2, 3])],
            base: vec![],
        },
        Setup {
            op: "scale",
            handler: xla_handlers::scale,
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
            handler: xla_handlers::gelu,
            args: vec![f(&[3])],
            rets: vec![f(&[3])],
            base: vec![],
        },
        Setup {
            op: "softmax",
            handler: xla_handlers::softmax,
            args: vec![f(&[2, 3])],
            rets: vec![f(&[2, 3])],
            base: vec![],
        },
        Setup {
            op: "rms_norm",
            handler: xla_handlers::rms_norm,
            args: vec![f(&[2, 3])],
            rets: vec![f(&[2, 3])],
            base: vec![],
        },
        Setup {
            op: "topk",
            handler: xla_handlers::topk,
            args: vec![f(&[1, 4])],
            rets: vec![f(&[1, 2]), (S64, vec![1, 2])],
            base: vec![scalar_attr("k", S64, 2i64.to_ne_bytes().to_vec())],
        },
        Setup {
            op: "conv2d",
            handler: xla_handlers::conv2d,
            args: vec![f(&[1, 1, 3, 3]), f(&[1, 1, 2, 2])],
            rets: vec![f(&[1, 1, 2, 2])],
            base: vec![],
        },
    ]
}

fn run(s: &Setup, api: &sys::XLA_FFI_Api, attrs: &[RawAttr]) -> Option<(u32, String)> {
    let mut args: Vec<Box<Buf>> = s.args.iter().map(|(d, dims)| buffer(*d, dims)).collect();
    let mut rets: Vec<Box<Buf>> = s.rets.iter().map(|(d, dims)| buffer(*d, dims)).collect();
    call(s.handler, api, &mut args, &mut rets, attrs)
}

#[test]
fn random_attributes_give_errors_naming_the_op_never_a_panic() {
    let api = fake_api();
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
