//! The generic handler driven through hand-built call frames and a fake `XLA_FFI_Api` (no
//! JAX needed): exports, metadata/version query, attributes, optional operands, errors.

mod common;

use common::{buffer, fake_api, take_error, Buf, Handler, RawAttr};
use polyop_xla::sys;
use polyop_xla::xla_handlers;
use std::ptr::null_mut;

/// `name=value` attributes for [`call`].
enum Attr {
    I64(i64),
    Str(String),
}

/// Call `handler` with the given operand/result buffers and attributes.
fn call(
    handler: Handler,
    api: &sys::XLA_FFI_Api,
    args: &mut [Box<Buf>],
    rets: &mut [Box<Buf>],
    attrs: &[(&str, Attr)],
) -> Option<(u32, String)> {
    let raw: Vec<RawAttr> = attrs
        .iter()
        .map(|(n, a)| match a {
            Attr::I64(i) => RawAttr::i64(n, *i),
            Attr::Str(s) => RawAttr::str(n, s),
        })
        .collect();
    common::call(handler, api, args, rets, &raw)
}

const F32: sys::XLA_FFI_DataType = sys::XLA_FFI_DataType_XLA_FFI_DataType_F32;
const S64: sys::XLA_FFI_DataType = sys::XLA_FFI_DataType_XLA_FFI_DataType_S64;

#[test]
fn every_registry_op_has_an_exported_handler() {
    let reg = polyop_kernels::registry();
    let mut seen = Vec::new();
    for o in reg.ops() {
        let h = xla_handlers::handler(o.name);
        if o.flags.inplace {
            assert!(h.is_none(), "in-place op {} must not be exported", o.name);
            continue;
        }
        let h = h.unwrap_or_else(|| panic!("op {} has no handler", o.name));
        // one function per op: XLA tells a handler nothing about which target it serves
        assert!(
            !seen.contains(&(h as usize)),
            "op {} shares a handler",
            o.name
        );
        seen.push(h as usize);
        // the C lookup gives the same function
        let name = std::ffi::CString::new(o.name).unwrap();
        // SAFETY: a valid NUL-terminated string.
        let c = unsafe { xla_handlers::lookup(name.as_ptr()) };
        assert_eq!(c.map(|f| f as usize), Some(h as usize), "{}", o.name);
    }
    assert!(xla_handlers::handler("no_such_op").is_none());
    // SAFETY: null is allowed.
    assert!(unsafe { xla_handlers::lookup(std::ptr::null()) }.is_none());
    assert_eq!(polyop_xla::exported_names(reg).len(), seen.len());
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
    let e = take_error(unsafe { xla_handlers::handler("topk").unwrap()(&mut frame) });
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
            xla_handlers::handler("negate").unwrap(),
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
        xla_handlers::handler("negate").unwrap(),
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
        xla_handlers::handler("negate").unwrap(),
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
        xla_handlers::handler("negate").unwrap(),
        &api,
        &mut [buffer(F32, &[3], x.as_mut_ptr() as _)],
        &mut [buffer(F32, &[3], y.as_mut_ptr() as _)],
        &[("alpha", Attr::I64(1))],
    )
    .unwrap();
    assert!(e.1.contains("unknown attribute `alpha`"), "{}", e.1);
    // Too many operands.
    let e = call(
        xla_handlers::handler("negate").unwrap(),
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
        xla_handlers::handler("negate").unwrap(),
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
        xla_handlers::handler("negate").unwrap(),
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
        xla_handlers::handler("topk").unwrap(),
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
        xla_handlers::handler("topk").unwrap(),
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
        xla_handlers::handler("nonzero").unwrap(),
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
                xla_handlers::handler("topk").unwrap(),
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
            xla_handlers::handler("topk").unwrap(),
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
            xla_handlers::handler("topk").unwrap(),
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
