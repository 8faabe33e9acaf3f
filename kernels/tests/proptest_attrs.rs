//! Property tests (proptest) of attribute binding and decoding for every stock op: random
//! names and values through `OpDef::bind_attrs` (how torch, XLA and Python bind keyword
//! lists) and random typed values through `OpDef::decode_attrs` with a random `AttrSource`
//! (how TensorFlow and ONNX Runtime read node attributes) return a value or an error that
//! names the op, never a panic; what is accepted is complete and well-typed, and an unknown
//! name or a value of a type binding cannot coerce is refused.

use kernel_core::*;
use proptest::prelude::*;
use proptest::test_runner::Config;

fn cfg() -> Config {
    Config {
        cases: 3000,
        failure_persistence: None,
        // Fixed seed: CI runs the same cases every time (docs/testing.md, "Property tests").
        rng_seed: proptest::test_runner::RngSeed::Fixed(686053),
        ..Config::default()
    }
}

fn attr_value() -> impl Strategy<Value = AttrValue> {
    prop_oneof![
        Just(AttrValue::None),
        any::<i64>().prop_map(AttrValue::Int),
        prop_oneof![-4i64..4, Just(i64::MIN), Just(i64::MAX)].prop_map(AttrValue::Int),
        any::<f64>().prop_map(AttrValue::Float),
        any::<bool>().prop_map(AttrValue::Bool),
        prop_oneof![
            Just("none".to_string()),
            Just("tanh".to_string()),
            Just("none\0".to_string()),
            "\\PC{0,8}",
        ]
        .prop_map(AttrValue::Str),
        prop::collection::vec(prop_oneof![-3i64..4, any::<i64>()], 0..5)
            .prop_map(AttrValue::IntList),
        prop::collection::vec(any::<f64>(), 0..5).prop_map(AttrValue::FloatList),
    ]
}

fn op_names() -> Vec<&'static str> {
    polyop_kernels::registry().ops().map(|o| o.name).collect()
}

/// Names: every attribute and input name of the stock ops, near misses, random text.
fn attr_name() -> impl Strategy<Value = String> {
    let mut known: Vec<String> = polyop_kernels::registry()
        .ops()
        .flat_map(|o| o.schema.args.iter().map(|a| a.name.clone()))
        .collect();
    known.extend(["axes", "Axis", "epsilon", "k ", "", "approximate\0"].map(String::from));
    prop_oneof![prop::sample::select(known), "\\PC{0,6}"]
}

fn type_ok(ty: &ArgType, v: &AttrValue) -> bool {
    matches!(
        (ty, v),
        (ArgType::Int, AttrValue::Int(_))
            | (ArgType::Float, AttrValue::Float(_))
            | (ArgType::Bool, AttrValue::Bool(_))
            | (ArgType::Str, AttrValue::Str(_))
            | (ArgType::IntList(_), AttrValue::IntList(_))
            | (ArgType::FloatList, AttrValue::FloatList(_))
            | (_, AttrValue::None)
    )
}

fn named(op: &str, e: &Error) -> bool {
    e.to_string().contains(&format!("polyop.{op}"))
}

/// Checks of an accepted binding: every schema attribute present, in order, well-typed.
fn check_bound(op: &OpDef, attrs: &Attrs) -> Result<(), TestCaseError> {
    let names: Vec<&str> = attrs.iter().map(|(n, _)| n).collect();
    let want: Vec<&str> = op.schema.attr_args().map(|a| a.name.as_str()).collect();
    prop_assert_eq!(names, want);
    for (a, (_, v)) in op.schema.attr_args().zip(attrs.iter()) {
        prop_assert!(
            type_ok(&a.ty, v),
            "{}: `{}` bound to {:?}",
            op.name,
            a.name,
            v
        );
    }
    Ok(())
}

/// An attribute source answering from a list (first match), or failing for one name.
struct Source {
    values: Vec<(String, AttrValue)>,
    fail_on: Option<String>,
}

impl AttrSource for Source {
    fn get(&mut self, name: &str, _ty: &ArgType) -> Result<Option<AttrValue>> {
        if self.fail_on.as_deref() == Some(name) {
            return Err(Error::invalid(format!(
                "attribute `{name}` could not be read"
            )));
        }
        Ok(self
            .values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone()))
    }
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn bind_attrs_never_panics(
        op in prop::sample::select(op_names()),
        given in prop::collection::vec((attr_name(), attr_value()), 0..5),
    ) {
        let op = polyop_kernels::registry().lookup(op).unwrap();
        let pairs: Vec<(&str, AttrValue)> = given.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        let r = std::panic::catch_unwind(|| op.bind_attrs(pairs));
        prop_assert!(r.is_ok(), "{}: bind_attrs panicked on {:?}", op.name, given);
        match r.unwrap() {
            Ok(attrs) => {
                check_bound(op, &attrs)?;
                for (n, _) in &given {
                    prop_assert!(
                        op.schema.attr_args().any(|a| &a.name == n),
                        "{}: unknown attribute `{}` accepted", op.name, n
                    );
                }
            }
            Err(e) => prop_assert!(named(op.name, &e), "error does not name the op: {}", e),
        }
    }

    #[test]
    fn decode_attrs_never_panics(
        op in prop::sample::select(op_names()),
        values in prop::collection::vec((attr_name(), attr_value()), 0..6),
        fail in prop::option::of(attr_name()),
    ) {
        let op = polyop_kernels::registry().lookup(op).unwrap();
        let mut src = Source { values: values.clone(), fail_on: fail.clone() };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op.decode_attrs(&mut src)));
        prop_assert!(r.is_ok(), "{}: decode_attrs panicked on {:?}", op.name, values);
        match r.unwrap() {
            Ok(attrs) => {
                check_bound(op, &attrs)?;
                if let Some(f) = &fail {
                    prop_assert!(
                        !op.schema.attr_args().any(|a| &a.name == f),
                        "{}: a failing read of `{}` was ignored", op.name, f
                    );
                }
            }
            Err(e) => prop_assert!(named(op.name, &e), "error does not name the op: {}", e),
        }
    }

    /// A value of the declared type (or a documented coercion) in range is accepted by
    /// binding: the random tests above are not passing by refusing everything.
    #[test]
    fn well_typed_values_bind(k in 0i64..8, axis in -3i64..3, largest in any::<bool>(), eps in 0.0f64..1.0) {
        let reg = polyop_kernels::registry();
        let topk = reg.lookup("topk").unwrap();
        let a = topk.bind_attrs([("k", AttrValue::Int(k)), ("axis", AttrValue::Int(axis)), ("largest", AttrValue::Bool(largest))]);
        prop_assert!(a.is_ok(), "{:?}", a);
        let rms = reg.lookup("rms_norm").unwrap();
        let a = rms.bind_attrs([("eps", AttrValue::Float(eps))]);
        prop_assert!(a.is_ok(), "{:?}", a);
        // an int where a float is declared is a documented coercion
        let a = rms.bind_attrs([("eps", AttrValue::Int(0))]);
        prop_assert!(a.is_ok(), "{:?}", a);
        // an unknown name is refused, naming it
        let e = topk.bind_attrs([("k", AttrValue::Int(k)), ("axes", AttrValue::Int(axis))]).unwrap_err();
        prop_assert!(e.to_string().contains("unknown attribute `axes`"), "{}", e);
    }
}
