//! Build-script helpers shared by the adapters that link a framework's wheel (torch,
//! TensorFlow): where the framework's pip package lives.
//!
//! A package directory comes from `$<ENV_DIR>` when set (e.g. `POLYOP_TORCH_DIR`), else from
//! asking a Python interpreter: `$POLYOP_PYTHON`, else `<workspace>/.venv/bin/python`. Each
//! lookup prints the `cargo:rerun-if-env-changed` lines it depends on.

use std::path::PathBuf;
use std::process::Command;

/// The Python interpreter to ask, if one exists.
pub fn python() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=POLYOP_PYTHON");
    if let Some(p) = std::env::var_os("POLYOP_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let p = manifest.join("../../.venv/bin/python");
    p.exists().then_some(p)
}

/// The directory of Python package `module` (without importing it: `find_spec` only locates
/// it, which for TensorFlow saves seconds), or `$env_dir` when set. `Err` says why not.
pub fn package_dir(module: &str, env_dir: &str) -> Result<PathBuf, String> {
    println!("cargo:rerun-if-env-changed={env_dir}");
    if let Some(d) = std::env::var_os(env_dir) {
        return Ok(PathBuf::from(d));
    }
    let py = python().ok_or_else(|| {
        format!(
            "no Python to locate `{module}`: create the project venv (.venv), set POLYOP_PYTHON \
             to a Python with it installed, or set {env_dir} to its package directory"
        )
    })?;
    println!("cargo:rerun-if-changed={}", py.display());
    let code = format!(
        "import importlib.util as u; s = u.find_spec('{module}'); \
         print(s.submodule_search_locations[0] if s else '')"
    );
    let out = Command::new(&py)
        .args(["-c", &code])
        .output()
        .map_err(|e| format!("cannot run `{}` ({e})", py.display()))?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || dir.is_empty() {
        return Err(format!(
            "`{}` cannot find the `{module}` package (set POLYOP_PYTHON to a Python that has \
             it, or {env_dir} to its package directory){}",
            py.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(PathBuf::from(dir))
}
