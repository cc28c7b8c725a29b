//! The JAX fixtures are JAX's numbers: where `python3` with jax runs, their script writes the
//! committed files again. The same jax version must write them to the byte; another version
//! (the GPU machine's jax is newer than the one that wrote them) may round differently (a
//! transcendental function's last bit, a reduction's order, which an element that cancels to
//! near zero magnifies), so there every number of an array must agree to 1e-5 of the array's
//! largest magnitude (the parity tests' tolerance) and everything else exactly.

use serde_json::Value as Json;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The fixture `name` in `dir` (written by `script`), parsed; panics naming the file and the
/// script to run when it is missing or malformed.
pub fn read(dir: &Path, script: &str, name: &str) -> Json {
    let path = dir.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run {script} {name})", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fixture tensor: its key path, shape and values.
pub struct Leaf {
    pub path: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// One fixture tensor (`{"path", "shape", "data"}`).
pub fn leaf(j: &Json) -> Leaf {
    let nums = |v: &Json| -> Vec<f64> {
        let list = v.as_array().expect("an array");
        list.iter().map(|x| x.as_f64().expect("a number")).collect()
    };
    Leaf {
        path: j["path"].as_str().expect("a path").to_string(),
        shape: nums(&j["shape"]).into_iter().map(|d| d as usize).collect(),
        data: nums(&j["data"]).into_iter().map(|v| v as f32).collect(),
    }
}

/// A list of fixture tensors.
pub fn leaves(j: &Json) -> Vec<Leaf> {
    j.as_array().expect("a list").iter().map(leaf).collect()
}

/// The leaf of `all` at JAX key path `path`; panics naming `what` when JAX has none.
pub fn find<'a>(all: &'a [Leaf], path: &str, what: &str) -> &'a Leaf {
    all.iter()
        .find(|l| l.path == path)
        .unwrap_or_else(|| panic!("{what}: JAX has no leaf at {path:?}"))
}

/// Runs `script` (relative to the package root, where cargo and the GPU bundle run tests) with `STAX_FIXTURES_OUT` set to a fresh
/// directory and checks that it writes exactly the files of `committed` and that each agrees
/// with the committed one (see the module docs). Prints a skip notice and returns where
/// `python3` cannot import jax and optax.
pub fn regenerated_fixtures_agree(script: &str, committed: &Path) {
    let probe = Command::new("python3")
        .args(["-c", "import jax, optax"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        let _ = writeln!(
            std::io::stderr(),
            "skipped: python3 with jax and optax is not available"
        );
        return;
    }
    let out = std::env::temp_dir().join(format!(
        "stax_fixtures_{}_{}",
        Path::new(script).file_stem().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let run = Command::new("python3")
        .arg(script)
        .env("STAX_FIXTURES_OUT", &out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(committed), names(&out), "{script} writes other files");
    let read = |p: &Path| -> (String, Json) {
        let text = std::fs::read_to_string(p).unwrap();
        let json = serde_json::from_str(&text).unwrap();
        (text, json)
    };
    for name in names(committed) {
        let (text_c, json_c) = read(&committed.join(&name));
        let (text_f, json_f) = read(&out.join(&name));
        if json_c["jax"] == json_f["jax"] {
            assert!(text_c == text_f, "{name} differs from what {script} writes");
        } else if let Err(at) = agree(&json_c, &json_f, "") {
            panic!(
                "{name}: jax {} wrote {at} apart from the committed (jax {})",
                json_f["jax"], json_c["jax"]
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// `a` and `b` (two fixtures) agree: each number to 1e-5 of the largest magnitude under its
/// top-level member (all of `grads`, all of `output`: a leaf that is mathematically zero, a
/// conv bias before a BatchNorm, holds rounding noise at the scale of its neighbours) plus
/// 1e-7, the `jax` version ignored, everything else equal. The error names the first place (a
/// JSON path) that does not.
fn agree(a: &Json, b: &Json, at: &str) -> Result<(), String> {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) if x.len() == y.len() => {
            x.iter()
                .try_for_each(|(k, v)| match (k.as_str(), y.get(k)) {
                    ("jax", Some(_)) => Ok(()),
                    (_, Some(w)) => agree_at_scale(v, w, &format!("{at}.{k}"), magnitude(v)),
                    (_, None) => Err(format!("{at}.{k}: missing")),
                })
        }
        _ => agree_at_scale(a, b, at, magnitude(a)),
    }
}

/// The largest magnitude of the numbers in `a`, at any depth.
fn magnitude(a: &Json) -> f64 {
    match a {
        Json::Number(x) => x.as_f64().unwrap().abs(),
        Json::Array(v) => v.iter().map(magnitude).fold(0.0, f64::max),
        Json::Object(m) => m.values().map(magnitude).fold(0.0, f64::max),
        _ => 0.0,
    }
}

fn agree_at_scale(a: &Json, b: &Json, at: &str, scale: f64) -> Result<(), String> {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            let ok = (x - y).abs() <= 1e-7 + 1e-5 * scale;
            ok.then_some(()).ok_or_else(|| format!("{at}: {x} vs {y}"))
        }
        (Json::Array(x), Json::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .try_for_each(|(i, (x, y))| agree_at_scale(x, y, &format!("{at}[{i}]"), scale)),
        (Json::Object(x), Json::Object(y)) if x.len() == y.len() => {
            x.iter().try_for_each(|(k, v)| match y.get(k) {
                Some(w) => agree_at_scale(v, w, &format!("{at}.{k}"), scale),
                None => Err(format!("{at}.{k}: missing")),
            })
        }
        _ => (a == b)
            .then_some(())
            .ok_or_else(|| format!("{at}: {a} vs {b}")),
    }
}
