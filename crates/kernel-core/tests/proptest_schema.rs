//! Property tests (proptest) of the schema parser and attribute binding: random strings and
//! mutated valid schemas never panic (an `Err` is the answer to bad text); every schema that
//! parses prints (Display) to text that parses back to the same schema; generated valid
//! schemas parse; `Attrs::bind` with random names and values returns a value or an error,
//! never panics, and what it accepts has the schema's names in order, with known types.

use kernel_core::*;
use proptest::prelude::*;
use proptest::test_runner::Config;

fn cfg() -> Config {
    Config {
        cases: 2000,
        failure_persistence: None,
        // Fixed seed: CI runs the same cases every time (docs/testing.md, "Property tests").
        rng_seed: proptest::test_runner::RngSeed::Fixed(6049338),
        ..Config::default()
    }
}

const TYPES: &[&str] = &[
    "Tensor",
    "Tensor?",
    "Tensor(a!)",
    "Tensor(b)",
    "int",
    "float",
    "bool",
    "str",
    "int[]",
    "int[2]",
    "float[]",
];

fn ident() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,6}"
}

/// A default literal for an attribute type, as a schema writes it.
fn default_for(ty: &'static str) -> BoxedStrategy<Option<String>> {
    let lit: BoxedStrategy<String> = match ty {
        "int" => any::<i32>().prop_map(|i| i.to_string()).boxed(),
        "float" => prop_oneof![
            (-1e6f64..1e6).prop_map(|f| format!("{f:?}")),
            Just("1e-6".to_string()),
            Just("-0.0".to_string()),
        ]
        .boxed(),
        "bool" => prop_oneof![Just("True".to_string()), Just("False".to_string())].boxed(),
        "str" => "[a-z ]{0,5}".prop_map(|s| format!("\"{s}\"")).boxed(),
        "int[]" => prop_oneof![
            prop::collection::vec(-5i64..5, 0..4).prop_map(|v| format!("{v:?}")),
            (-5i64..5).prop_map(|i| i.to_string()),
        ]
        .boxed(),
        // a single int (repeated) or exactly two
        "int[2]" => prop_oneof![
            prop::collection::vec(-5i64..5, 2..=2).prop_map(|v| format!("{v:?}")),
            (-5i64..5).prop_map(|i| i.to_string()),
        ]
        .boxed(),
        "float[]" => prop::collection::vec(-5i32..5, 0..4)
            .prop_map(|v| {
                let f: Vec<f64> = v.into_iter().map(|i| i as f64 / 2.0).collect();
                format!("{f:?}")
            })
            .boxed(),
        "Tensor?" => Just("None".to_string()).boxed(),
        _ => return Just(None).boxed(),
    };
    prop::option::of(lit).boxed()
}

/// A valid schema as text: tensors, then attributes; defaults only at the end.
fn valid_schema() -> impl Strategy<Value = String> {
    (
        ident(),
        prop::collection::vec(
            (prop::sample::select(TYPES), ident())
                .prop_flat_map(|(t, n)| default_for(t).prop_map(move |d| (t, n.clone(), d))),
            0..6,
        ),
        prop::collection::vec(prop::option::of(ident()), 1..4),
        any::<bool>(),
        0usize..7,
    )
        .prop_map(|(name, args, rets, tuple, kw_at)| {
            let mut seen = std::collections::HashSet::new();
            let mut parts = Vec::new();
            let mut defaulted = false;
            for (i, (t, n, d)) in args.into_iter().enumerate() {
                if !seen.insert(n.clone()) {
                    continue;
                }
                let d = if defaulted && d.is_none() {
                    // keep "no argument without a default after one with a default"
                    default_for_fixed(t)
                } else {
                    d
                };
                let Some(d) = d.or(if defaulted { None } else { Some(String::new()) }) else {
                    continue;
                };
                if i == kw_at {
                    parts.push("*".to_string());
                }
                if d.is_empty() {
                    parts.push(format!("{t} {n}"));
                } else {
                    defaulted = true;
                    parts.push(format!("{t} {n}={d}"));
                }
            }
            let rets: Vec<String> = rets
                .into_iter()
                .map(|r| match r {
                    Some(n) => format!("Tensor {n}"),
                    None => "Tensor".to_string(),
                })
                .collect();
            let ret = if tuple || rets.len() > 1 {
                format!("({})", rets.join(", "))
            } else {
                rets[0].clone()
            };
            format!("{name}({}) -> {ret}", parts.join(", "))
        })
}

fn default_for_fixed(ty: &str) -> Option<String> {
    Some(
        match ty {
            "int" => "0",
            "float" => "1.5",
            "bool" => "True",
            "str" => "\"x\"",
            "int[]" => "[1, 2]",
            "int[2]" => "3",
            "float[]" => "[0.5]",
            "Tensor?" => "None",
            _ => return None,
        }
        .to_string(),
    )
}

/// The round-trip property of a schema that parsed.
fn assert_round_trip(s: &Schema) {
    let text = s.to_string();
    let again = Schema::parse(&text).unwrap_or_else(|e| {
        panic!("Display output `{text}` of a parsed schema does not parse: {e}")
    });
    assert_eq!(&again, s, "`{text}` parses to a different schema");
    assert_eq!(again.to_string(), text, "Display is not stable");
}

/// Mutations of a text: delete, duplicate, insert or replace a piece.
fn mutate(text: String) -> impl Strategy<Value = String> {
    let n = text.chars().count().max(1);
    let pieces = prop::sample::select(vec![
        "(", ")", ",", "->", "=", "*", "!", "?", "[", "]", "\"", "'", " ", "Tensor", "int", "None",
        "True", "1e400", "-", "[1,", "\u{e9}", "\0", "Tensor(", "int[2]", ")->",
    ]);
    (0..n, 0..n, pieces, 0u8..4).prop_map(move |(i, j, piece, op)| {
        let chars: Vec<char> = text.chars().collect();
        let (a, b) = (i.min(j), i.max(j).min(chars.len()));
        let head: String = chars[..a].iter().collect();
        let mid: String = chars[a..b].iter().collect();
        let tail: String = chars[b..].iter().collect();
        match op {
            0 => format!("{head}{tail}"),
            1 => format!("{head}{mid}{mid}{tail}"),
            2 => format!("{head}{piece}{mid}{tail}"),
            _ => format!("{head}{piece}{tail}"),
        }
    })
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn random_text_never_panics(text in "\\PC{0,60}") {
        if let Ok(s) = Schema::parse(&text) {
            assert_round_trip(&s);
        }
    }

    #[test]
    fn schema_alphabet_text_never_panics(text in "[a-z_()\\[\\],?!*=>\\- \"'.0-9TensorintfloatboolstrNone]{0,60}") {
        if let Ok(s) = Schema::parse(&text) {
            assert_round_trip(&s);
        }
    }

    #[test]
    fn valid_schemas_parse_and_round_trip(text in valid_schema()) {
        let s = Schema::parse(&text).unwrap_or_else(|e| panic!("`{text}` does not parse: {e}"));
        assert_round_trip(&s);
    }

    #[test]
    fn mutated_schemas_never_panic(text in valid_schema().prop_flat_map(mutate)) {
        match Schema::parse(&text) {
            Ok(s) => assert_round_trip(&s),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Attrs::bind

fn attr_value() -> impl Strategy<Value = AttrValue> {
    prop_oneof![
        Just(AttrValue::None),
        any::<i64>().prop_map(AttrValue::Int),
        prop_oneof![-3i64..3, Just(i64::MIN), Just(i64::MAX)].prop_map(AttrValue::Int),
        any::<f64>().prop_map(AttrValue::Float),
        any::<bool>().prop_map(AttrValue::Bool),
        "\\PC{0,8}".prop_map(AttrValue::Str),
        prop::collection::vec(any::<i64>(), 0..5).prop_map(AttrValue::IntList),
        prop::collection::vec(any::<f64>(), 0..5).prop_map(AttrValue::FloatList),
    ]
}

const BIND_SCHEMAS: &[&str] = &[
    "topk(Tensor x, int k, int axis=-1, bool largest=True) -> (Tensor values, Tensor indices)",
    "gelu(Tensor x, str approximate=\"none\") -> Tensor",
    "rms_norm(Tensor x, Tensor? weight=None, float eps=1e-6) -> Tensor",
    "conv(Tensor x, Tensor w, int[] stride=[1, 1], float[] scales=[0.5], int groups=1) -> Tensor",
    "scale(Tensor x, float alpha) -> Tensor",
    "negate(Tensor x) -> Tensor",
];

fn known_type(ty: &ArgType, v: &AttrValue) -> bool {
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

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn bind_random_names_and_values_never_panics(
        which in 0..BIND_SCHEMAS.len(),
        given in prop::collection::vec(
            (prop_oneof![
                prop::sample::select(vec!["k", "axis", "largest", "approximate", "eps", "alpha",
                                          "stride", "scales", "groups", "x", "weight"])
                    .prop_map(str::to_string),
                "\\PC{0,6}",
            ], attr_value()),
            0..6,
        ),
    ) {
        let schema = Schema::parse(BIND_SCHEMAS[which]).unwrap();
        let pairs: Vec<(&str, AttrValue)> =
            given.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        match Attrs::bind(&schema, pairs) {
            Ok(attrs) => {
                // every schema attribute, in order, each a value of a type binding produces
                let names: Vec<&str> = attrs.iter().map(|(n, _)| n).collect();
                let want: Vec<&str> = schema.attr_args().map(|a| a.name.as_str()).collect();
                prop_assert_eq!(names, want);
                for (a, (_, v)) in schema.attr_args().zip(attrs.iter()) {
                    prop_assert!(known_type(&a.ty, v), "{} bound to {:?}", a.name, v);
                }
                // every given name is a schema attribute
                for (n, _) in &given {
                    prop_assert!(schema.attr_args().any(|a| &a.name == n), "unknown `{}` accepted", n);
                }
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("attribute") || msg.contains('`'), "vague error: {}", msg);
            }
        }
    }
}
