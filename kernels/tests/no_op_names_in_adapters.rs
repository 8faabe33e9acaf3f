//! The design's rule: adapters are generic translators and never name a particular op. Every
//! stock op name (as a whole identifier or string, outside comments) is searched for in the
//! adapters' hand-written sources and build scripts.

use std::path::{Path, PathBuf};

/// This crate's directory, read when the test runs (cargo test sets it), not baked in at
/// compile time: CI shares one target directory between checkouts at different paths, and
/// cargo counts a test binary built in another checkout as fresh (it failed pointing into a
/// clone that had been deleted).
fn manifest_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test"))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("adapters dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            // Tests may name ops (they exercise the stock library); generated bindings do not.
            if !matches!(
                p.file_name().and_then(|n| n.to_str()),
                Some("tests" | "target")
            ) {
                sources(&p, out);
            }
        } else if matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("rs" | "cpp" | "h" | "sh")
        ) {
            out.push(p);
        }
    }
}

/// Whole-identifier occurrences of `word` in `line` (`_` and alphanumerics are identifier
/// characters, so `add` does not match `AddAttr` or `add_input`); a method call (`p.add(i)`,
/// pointer arithmetic) is not an op name.
fn has_word(line: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices(word).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + word.len()..].chars().next();
        !before.is_some_and(|c| ident(c) || c == '.') && !after.is_some_and(ident)
    })
}

#[test]
fn no_adapter_names_a_stock_op() {
    let root = manifest_dir().join("../adapters");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 20,
        "found only {} adapter sources",
        files.len()
    );
    let names: Vec<&str> = polyop_kernels::registry().ops().map(|o| o.name).collect();
    let mut hits = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let code = code.split(" # ").next().unwrap_or("");
            for name in &names {
                if has_word(code, name) {
                    hits.push(format!("{}:{}: `{name}` in {line:?}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(hits.is_empty(), "adapters name ops:\n{}", hits.join("\n"));
}

#[test]
fn the_check_finds_a_planted_name() {
    assert!(has_word("let t = \"topk\";", "topk"));
    assert!(has_word("registry.get(add)", "add"));
    assert!(!has_word("TF_OpDefinitionBuilderAddAttr(b, add_x)", "add"));
    assert!(!has_word("unsafe { *stack.add(i) }", "add"));
}
