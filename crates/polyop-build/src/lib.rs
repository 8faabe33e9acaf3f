//! Build-script helpers shared by the adapters that link a framework's wheel (torch,
//! TensorFlow): where the framework's pip package lives.
//!
//! A package directory comes from `$<ENV_DIR>` when set (e.g. `POLYOP_TORCH_DIR`), else from
//! asking a Python interpreter, the first of: `$POLYOP_PYTHON`; `$VIRTUAL_ENV/bin/python` (an
//! activated virtual environment); `.venv/bin/python` in the crate's directory or the nearest
//! ancestor that has one (the workspace's venv); `python3` on `PATH`. The build says which one
//! it used (a `cargo:warning`) and, when none has the package, what it tried. Each lookup
//! prints the `cargo:rerun-if-env-changed` lines it depends on.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A Python interpreter to ask, and how it was found.
#[derive(Debug, Clone)]
pub struct Python {
    pub path: PathBuf,
    /// Where it came from, for messages (`POLYOP_PYTHON`, `VIRTUAL_ENV=...`, ...).
    pub source: String,
}

/// Every candidate interpreter, in the order they are tried.
pub fn pythons() -> Vec<Python> {
    println!("cargo:rerun-if-env-changed=POLYOP_PYTHON");
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("POLYOP_PYTHON") {
        out.push(Python {
            path: PathBuf::from(p),
            source: "POLYOP_PYTHON".into(),
        });
    }
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        let p = Path::new(&v).join("bin/python");
        out.push(Python {
            source: format!("VIRTUAL_ENV={}", Path::new(&v).display()),
            path: p,
        });
    }
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        if let Some(venv) = Path::new(&dir)
            .ancestors()
            .map(|d| d.join(".venv"))
            .find(|v| v.join("bin/python").exists())
            // the venv directory resolved (not its python, a link to the base interpreter):
            // where `.venv` is a link to a venv kept elsewhere (CI's build cache), the path,
            // the package directories found through it and the `rerun-if-changed` lines are
            // the same from every checkout, so a checkout elsewhere does not rerun this build
            .map(|v| std::fs::canonicalize(&v).unwrap_or(v).join("bin/python"))
        {
            out.push(Python {
                source: format!(
                    "{}",
                    venv.parent()
                        .and_then(Path::parent)
                        .unwrap_or(&venv)
                        .display()
                ),
                path: venv,
            });
        }
    }
    out.push(Python {
        path: PathBuf::from("python3"),
        source: "python3 on PATH".into(),
    });
    out
}

fn find_in(py: &Python, module: &str) -> Result<PathBuf, String> {
    let code = format!(
        "import importlib.util as u; s = u.find_spec('{module}'); \
         print(s.submodule_search_locations[0] if s else '')"
    );
    let out = Command::new(&py.path)
        .args(["-c", &code])
        .output()
        .map_err(|e| format!("{} ({}): cannot run it ({e})", py.path.display(), py.source))?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || dir.is_empty() {
        return Err(format!(
            "{} ({}): no `{module}` package{}",
            py.path.display(),
            py.source,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(PathBuf::from(dir))
}

/// The directory of Python package `module` (without importing it: `find_spec` only locates
/// it, which for TensorFlow saves seconds), or `$env_dir` when set: from the first candidate
/// interpreter (see [`pythons`]) that has it, announced with a `cargo:warning` naming the
/// interpreter and how it was found. `Err` lists every interpreter tried and why each failed.
pub fn package_dir(module: &str, env_dir: &str) -> Result<PathBuf, String> {
    println!("cargo:rerun-if-env-changed={env_dir}");
    if let Some(d) = std::env::var_os(env_dir) {
        return Ok(PathBuf::from(d));
    }
    let mut tried = Vec::new();
    for py in pythons() {
        match find_in(&py, module) {
            Ok(dir) => {
                if py.path.exists() {
                    println!("cargo:rerun-if-changed={}", py.path.display());
                }
                println!(
                    "cargo:warning=using `{module}` at {} (from {}, found through {})",
                    dir.display(),
                    py.path.display(),
                    py.source
                );
                return Ok(dir);
            }
            Err(e) => tried.push(e),
        }
    }
    Err(format!(
        "cannot find the `{module}` package; tried: {}. Install it into one of those, set \
         POLYOP_PYTHON to a Python that has it, or set {env_dir} to its package directory",
        tried.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_in_order_and_a_missing_package_lists_them() {
        // the one test in this crate, so no other thread reads the environment meanwhile
        std::env::set_var("POLYOP_PYTHON", "/nonexistent/python");
        std::env::set_var("VIRTUAL_ENV", "/nonexistent/venv");
        let c = pythons();
        assert_eq!(c[0].source, "POLYOP_PYTHON");
        assert_eq!(c[1].path, Path::new("/nonexistent/venv/bin/python"));
        assert_eq!(c.last().unwrap().source, "python3 on PATH");
        // a checkout whose `.venv` is a link to a venv kept elsewhere (CI's build cache): the
        // candidate is the venv's resolved path, the same from any checkout linking to it
        let tmp = std::env::temp_dir().join(format!("polyop-build-test-{}", std::process::id()));
        let kept = tmp.join("cache/venv-key");
        std::fs::create_dir_all(kept.join("bin")).unwrap();
        std::fs::write(kept.join("bin/python"), "").unwrap();
        let checkouts = [tmp.join("checkout-a"), tmp.join("checkout-b")];
        let manifest = std::env::var_os("CARGO_MANIFEST_DIR");
        for checkout in &checkouts {
            std::fs::create_dir_all(checkout.join("crate")).unwrap();
            std::os::unix::fs::symlink(&kept, checkout.join(".venv")).unwrap();
            std::env::set_var("CARGO_MANIFEST_DIR", checkout.join("crate"));
            let c = pythons();
            assert_eq!(
                c[2].path,
                std::fs::canonicalize(&kept).unwrap().join("bin/python"),
                "{checkout:?}"
            );
        }
        match manifest {
            Some(m) => std::env::set_var("CARGO_MANIFEST_DIR", m),
            None => std::env::remove_var("CARGO_MANIFEST_DIR"),
        }
        std::fs::remove_dir_all(&tmp).unwrap();
        std::env::remove_var("POLYOP_NO_SUCH_DIR");
        let e = package_dir("polyop_no_such_package", "POLYOP_NO_SUCH_DIR").unwrap_err();
        assert!(
            e.contains("/nonexistent/python (POLYOP_PYTHON): cannot run it"),
            "{e}"
        );
        assert!(e.contains("VIRTUAL_ENV=/nonexistent/venv"), "{e}");
        assert!(
            e.contains("(python3 on PATH): no `polyop_no_such_package` package"),
            "{e}"
        );
        assert!(e.contains("set POLYOP_NO_SUCH_DIR"), "{e}");
        std::env::set_var("POLYOP_NO_SUCH_DIR", "/given");
        assert_eq!(
            package_dir("x", "POLYOP_NO_SUCH_DIR").unwrap(),
            Path::new("/given")
        );
    }
}
