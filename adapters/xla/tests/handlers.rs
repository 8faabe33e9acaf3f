//! The generic handler driven through hand-built call frames and a fake `XLA_FFI_Api` (no
//! JAX needed): exports, metadata/version query, attributes, optional operands, errors.

use polyop_xla::sys;
use polyop_xla::{xla_handlers, EXPORTED_OPS};
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

/// Fake errors: a boxed (code, message).
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

fn fake_api(major: i32, minor: i32) -> sys::XLA_FFI_Api {
    // SAFETY: every field is an integer, a raw pointer or an Option<fn>; zero is valid.
    let mut api: sys::XLA_FFI_Api = unsafe { std::mem::zeroed() };
    api.struct_size = sys::XLA_FFI_Api_STRUCT_SIZE as usize;
    api.api_version = sys::XLA_FFI_Api_Version {
        struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE as usize,
        extension_start: null_mut(),
        major_version: major,
        minor_version: minor,
    };
    api.XLA_FFI_Error_Create = Some(fake_error_create);
    api
}

fn take_error(e: *mut sys::XLA_FFI_Error) -> Option<(u32, String)> {
    if e.is_null() {
        None
    } else {
        // SAFETY: in these tests every error comes from `fake_error_create` (the only error
        // constructor of `fake_api`), a leaked `Box<FakeError>`, and each is taken once.
        let b = unsafe { Box::from_raw(e as *mut FakeError) };
        Some((b.0, b.1))
    }
}

struct Buf {
    buf: sys::XLA_FFI_Buffer,
    _dims: Vec<i64>,
}

fn buffer(dtype: sys::XLA_FFI_DataType, dims: &[i64], data: *mut c_void) -> Box<Buf> {
    let mut b = Box::new(Buf {
        // SAFETY: every field of `XLA_FFI_Buffer` is an integer or a raw pointer; zero is valid.
        buf: unsafe { std::mem::zeroed() },
        _dims: dims.to_vec(),
    });
    b.buf.struct_size = sys::XLA_FFI_Buffer_STRUCT_SIZE as usize;
    b.buf.dtype = dtype;
    b.buf.data = data;
    b.buf.rank = dims.len() as i64;
    b.buf.dims = b._dims.as_mut_ptr();
    b
}

enum Attr {
    I64(i64),
    Str(String),
}

/// Call `handler` with the given operand/result buffers and attributes.
fn call(
    handler: unsafe extern "C" fn(*mut sys::XLA_FFI_CallFrame) -> *mut sys::XLA_FFI_Error,
    api: &sys::XLA_FFI_Api,
    args: &mut [Box<Buf>],
    rets: &mut [Box<Buf>],
    attrs: &[(&str, Attr)],
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
    // Attribute storage.
    let mut names: Vec<sys::XLA_FFI_ByteSpan> = attrs
        .iter()
        .map(|(n, _)| sys::XLA_FFI_ByteSpan {
            ptr: n.as_ptr() as *const _,
            len: n.len(),
        })
        .collect();
    let mut name_ptrs: Vec<*mut sys::XLA_FFI_ByteSpan> =
        names.iter_mut().map(|n| n as *mut _).collect();
    let mut ints: Vec<i64> = attrs
        .iter()
        .map(|(_, a)| if let Attr::I64(i) = a { *i } else { 0 })
        .collect();
    let mut scalars: Vec<sys::XLA_FFI_Scalar> = ints
        .iter_mut()
        .map(|i| sys::XLA_FFI_Scalar {
            dtype: sys::XLA_FFI_DataType_XLA_FFI_DataType_S64,
            value: i as *mut i64 as *mut c_void,
        })
        .collect();
    let mut spans: Vec<sys::XLA_FFI_ByteSpan> = attrs
        .iter()
        .map(|(_, a)| match a {
            Attr::Str(s) => sys::XLA_FFI_ByteSpan {
                ptr: s.as_ptr() as *const _,
                len: s.len(),
            },
            _ => sys::XLA_FFI_ByteSpan {
                ptr: std::ptr::null(),
                len: 0,
            },
        })
        .collect();
    let mut attr_types = Vec::new();
    let mut attr_ptrs: Vec<*mut c_void> = Vec::new();
    for (i, (_, a)) in attrs.iter().enumerate() {
        match a {
            Attr::I64(_) => {
                attr_types.push(sys::XLA_FFI_AttrType_XLA_FFI_AttrType_SCALAR);
                attr_ptrs.push(&mut scalars[i] as *mut _ as *mut c_void);
            }
            Attr::Str(_) => {
                attr_types.push(sys::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING);
                attr_ptrs.push(&mut spans[i] as *mut _ as *mut c_void);
            }
        }
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
    // SAFETY: `frame` is a complete call frame: every array holds `size` entries, each entry
    // points to a value of the declared type, and all of it (buffers, dims, attribute
    // storage, `api`) outlives the call.
    take_error(unsafe { handler(&mut frame) })
}

const F32: sys::XLA_FFI_DataType = sys::XLA_FFI_DataType_XLA_FFI_DataType_F32;
const S64: sys::XLA_FFI_DataType = sys::XLA_FFI_DataType_XLA_FFI_DataType_S64;

#[test]
fn every_registry_op_has_an_exported_handler() {
    let reg = polyop_kernels::registry();
    let missing: Vec<&str> = reg
        .ops()
        .filter(|o| !o.flags.inplace)
        .map(|o| o.name)
        .filter(|n| !EXPORTED_OPS.contains(n))
        .collect();
    assert!(missing.is_empty(), "ops without a polyop_<name> symbol (add them to export_xla_handlers! in adapters/xla/src/lib.rs): {missing:?}");
    for o in reg.ops().filter(|o| o.flags.inplace) {
        assert!(
            !EXPORTED_OPS.contains(&o.name),
            "in-place op {} must not be exported",
            o.name
        );
    }
}

#[test]
fn metadata_query_reports_api_version_and_traits() {
    let api = fake_api(polyop_xla::API_MAJOR, polyop_xla::API_MINOR);
    // SAFETY: every field is an integer, a raw pointer or a struct of those; zero is valid.
    let mut md: sys::XLA_FFI_Metadata = unsafe { std::mem::zeroed() };
    md.struct_size = sys::XLA_FFI_Metadata_STRUCT_SIZE as usize;
    md.traits = 0xdead;
    let mut ext = sys::XLA_FFI_Metadata_Extension {
        extension_base: sys::XLA_FFI_Extension_Base {
            struct_size: sys::XLA_FFI_Metadata_Extension_STRUCT_SIZE as usize,
            type_: sys::XLA_FFI_Extension_Type_XLA_FFI_Extension_Metadata,
            next: null_mut(),
        },
        metadata: &mut md,
    };
    // SAFETY: as for `md` (null arrays with size 0).
    let mut frame: sys::XLA_FFI_CallFrame = unsafe { std::mem::zeroed() };
    frame.struct_size = sys::XLA_FFI_CallFrame_STRUCT_SIZE as usize;
    frame.api = &api;
    frame.extension_start = &mut ext.extension_base;
    // SAFETY: a metadata-query frame: the extension chain (`ext`, `md`) and `api` outlive the
    // call, and the handler reads nothing else of a metadata query.
    let e = take_error(unsafe { xla_handlers::topk(&mut frame) });
    assert!(e.is_none(), "{e:?}");
    assert_eq!(md.api_version.major_version, sys::XLA_FFI_API_MAJOR as i32);
    assert_eq!(md.api_version.minor_version, sys::XLA_FFI_API_MINOR as i32);
    assert_eq!(md.traits, 0);
}

#[test]
fn api_version_mismatch_fails_clearly() {
    let mut x = [1.0f32, -2.0];
    let mut y = [0.0f32; 2];
    for (maj, min) in [(1, 0), (0, 0)] {
        let api = fake_api(maj, min);
        let e = call(
            xla_handlers::negate,
            &api,
            &mut [buffer(F32, &[2], x.as_mut_ptr() as _)],
            &mut [buffer(F32, &[2], y.as_mut_ptr() as _)],
            &[],
        )
        .expect("version skew must be an error");
        assert!(
            e.1.contains("polyop.negate") && e.1.contains("API version mismatch"),
            "{}",
            e.1
        );
        assert_eq!(
            e.0,
            sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_UNIMPLEMENTED
        );
    }
    assert_eq!(y, [0.0, 0.0], "no output written on error");
}

#[test]
fn negate_and_errors_and_next_call_works() {
    let api = fake_api(polyop_xla::API_MAJOR, polyop_xla::API_MINOR);
    let mut x = [1.0f32, -2.0, 3.0];
    let mut y = [0.0f32; 3];
    let e = call(
        xla_handlers::negate,
        &api,
        &mut [buffer(F32, &[3], x.as_mut_ptr() as _)],
        &mut [buffer(F32, &[3], y.as_mut_ptr() as _)],
        &[],
    );
    assert!(e.is_none(), "{e:?}");
    assert_eq!(y, [-1.0, 2.0, -3.0]);
    // Wrong result shape declared by the caller.
    let mut y2 = [0.0f32; 2];
    let e = call(
        xla_handlers::negate,
        &api,
        &mut [buffer(F32, &[3], x.as_mut_ptr() as _)],
        &mut [buffer(F32, &[2], y2.as_mut_ptr() as _)],
        &[],
    )
    .unwrap();
    assert_eq!(
        e.0,
        sys::XLA_FFI_Error_Code_XLA_FFI_Error_Code_INVALID_ARGUMENT
    );
    assert!(
        e.1.starts_with("polyop.negate: result `out` was declared as float32[2]"),
        "{}",
        e.1
    );
    // Unknown attribute.
    let e = call(
        xla_handlers::negate,
        &api,
        &mut [buffer(F32, &[3], x.as_mut_ptr() as _)],
        &mut [buffer(F32, &[3], y.as_mut_ptr() as _)],
        &[("alpha", Attr::I64(1))],
    )
    .unwrap();
    assert!(e.1.contains("unknown attribute `alpha`"), "{}", e.1);
    // Too many operands.
    let e = call(
        xla_handlers::negate,
        &api,
        &mut [
            buffer(F32, &[3], x.as_mut_ptr() as _),
            buffer(F32, &[3], x.as_mut_ptr() as _),
        ],
        &mut [buffer(F32, &[3], y.as_mut_ptr() as _)],
        &[],
    )
    .unwrap();
    assert!(
        e.1.contains("polyop.negate: expected at most 1 tensor operand"),
        "{}",
        e.1
    );
    // Missing required operand.
    let e = call(
        xla_handlers::negate,
        &api,
        &mut [],
        &mut [buffer(F32, &[3], y.as_mut_ptr() as _)],
        &[],
    )
    .unwrap();
    assert!(
        e.1.contains("polyop.negate:") && e.1.contains("x"),
        "{}",
        e.1
    );
    // And the next call works.
    let mut y3 = [0.0f32; 3];
    assert!(call(
        xla_handlers::negate,
        &api,
        &mut [buffer(F32, &[3], x.as_mut_ptr() as _)],
        &mut [buffer(F32, &[3], y3.as_mut_ptr() as _)],
        &[]
    )
    .is_none());
    assert_eq!(y3, [-1.0, 2.0, -3.0]);
}

#[test]
fn topk_with_int_and_string_attrs() {
    // topk is a stock op: a registry without it is a failure, not a reason to skip
    let reg = polyop_kernels::registry();
    assert!(reg.get("topk").is_some(), "topk is not registered");
    let api = fake_api(polyop_xla::API_MAJOR, polyop_xla::API_MINOR);
    let mut x = [1.0f32, 3.0, 3.0, 2.0];
    let mut v = [0.0f32; 2];
    let mut i = [0i64; 2];
    let e = call(
        xla_handlers::topk,
        &api,
        &mut [buffer(F32, &[1, 4], x.as_mut_ptr() as _)],
        &mut [
            buffer(F32, &[1, 2], v.as_mut_ptr() as _),
            buffer(S64, &[1, 2], i.as_mut_ptr() as _),
        ],
        &[("k", Attr::I64(2))],
    );
    assert!(e.is_none(), "{e:?}");
    assert_eq!((v, i), ([3.0, 3.0], [1, 2]));
    let e = call(
        xla_handlers::topk,
        &api,
        &mut [buffer(F32, &[1, 4], x.as_mut_ptr() as _)],
        &mut [
            buffer(F32, &[1, 2], v.as_mut_ptr() as _),
            buffer(S64, &[1, 2], i.as_mut_ptr() as _),
        ],
        &[("k", Attr::Str("two".into()))],
    )
    .unwrap();
    assert!(
        e.1.contains("polyop.topk") && e.1.contains("`k` must be int"),
        "{}",
        e.1
    );
}

#[test]
fn nonzero_refused_cleanly() {
    let api = fake_api(polyop_xla::API_MAJOR, polyop_xla::API_MINOR);
    let mut x = [1.0f32, 0.0];
    let mut y = [0i64; 2];
    let e = call(
        xla_handlers::nonzero,
        &api,
        &mut [buffer(F32, &[2], x.as_mut_ptr() as _)],
        &mut [buffer(S64, &[1, 1], y.as_mut_ptr() as _)],
        &[],
    )
    .unwrap();
    assert!(e.1.starts_with("polyop.nonzero:"), "{}", e.1);
}

/// Exported handlers remember bound attributes and inferred shapes per call site: calls that
/// alternate attribute values, attribute sets and shapes must each see their own.
#[test]
fn cached_call_sites_keep_attributes_and_shapes_apart() {
    let api = fake_api(polyop_xla::API_MAJOR, polyop_xla::API_MINOR);
    let mut x = [3.0f32, 1.0, 2.0, 5.0, 4.0, 0.0];
    for round in 0..3 {
        // `largest` arrives as an int 0/1 here; binding coerces it to bool.
        for (k, largest, shape) in [(1i64, 1i64, [6i64]), (2, 1, [6]), (2, 0, [6]), (1, 0, [6])] {
            let mut v = [0.0f32; 2];
            let mut i = [0i64; 2];
            let e = call(
                xla_handlers::topk,
                &api,
                &mut [buffer(F32, &shape, x.as_mut_ptr() as _)],
                &mut [
                    buffer(F32, &[k], v.as_mut_ptr() as _),
                    buffer(S64, &[k], i.as_mut_ptr() as _),
                ],
                &[("k", Attr::I64(k)), ("largest", Attr::I64(largest))],
            );
            assert!(e.is_none(), "round {round} k={k} largest={largest}: {e:?}");
            let want: &[f32] = match (k, largest) {
                (1, 1) => &[5.0],
                (2, 1) => &[5.0, 4.0],
                (2, 0) => &[0.0, 1.0],
                _ => &[0.0],
            };
            assert_eq!(
                &v[..k as usize],
                want,
                "round {round} k={k} largest={largest}"
            );
        }
        // Same attributes, a different input shape: result shape follows the input.
        let mut v = [0.0f32; 2];
        let mut i = [0i64; 2];
        let e = call(
            xla_handlers::topk,
            &api,
            &mut [buffer(F32, &[2, 3], x.as_mut_ptr() as _)],
            &mut [
                buffer(F32, &[2, 1], v.as_mut_ptr() as _),
                buffer(S64, &[2, 1], i.as_mut_ptr() as _),
            ],
            &[("k", Attr::I64(1)), ("largest", Attr::I64(1))],
        );
        assert!(e.is_none(), "{e:?}");
        assert_eq!(v, [3.0, 5.0]);
        // A bad attribute value is reported every time (errors are not cached).
        let e = call(
            xla_handlers::topk,
            &api,
            &mut [buffer(F32, &[6], x.as_mut_ptr() as _)],
            &mut [
                buffer(F32, &[1], v.as_mut_ptr() as _),
                buffer(S64, &[1], i.as_mut_ptr() as _),
            ],
            &[("k", Attr::I64(1)), ("largest", Attr::I64(7))],
        )
        .unwrap();
        assert!(e.1.contains("`largest` must be bool"), "{}", e.1);
    }
}
