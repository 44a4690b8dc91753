//! The compiled `dist/sluice.wasm`: one Engine, Module and Linker per test
//! binary, compiled on first use and shared by every test (each test then has
//! a `Store` of its own, so tests run in parallel).
//!
//! Fuel is on, so a guest that loops forever traps instead of hanging a test.
//!
//! Compiling the module with a debug build of Cranelift takes seconds, once
//! per test binary; so the compiled code is cached in `target/wasm-host/`,
//! keyed by a hash of the `.wasm`. Wasmtime refuses a cache entry from another
//! version or configuration, and then the module is compiled afresh.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use anyhow::Context;
use wasmtime::{Config, Engine, InstancePre, Linker, Module};

use super::imports;
use super::state::HostState;
use sluice_harness::paths::{dist, workspace_root};

pub(crate) struct Compiled {
    pub engine: Engine,
    pub pre: InstancePre<HostState>,
}

/// The compiled filter, or why it could not be compiled (the same message for
/// every test, so a missing `dist/` fails each test with the same hint).
/// `wasm` names another build of the filter than `dist/sluice.wasm`, for
/// measuring two builds side by side in one process.
pub(crate) fn compiled(wasm: Option<&Path>) -> anyhow::Result<&'static Compiled> {
    static COMPILED: OnceLock<Result<Compiled, String>> = OnceLock::new();
    static OTHERS: Mutex<Vec<(PathBuf, &'static Compiled)>> = Mutex::new(Vec::new());
    let Some(wasm) = wasm else {
        return COMPILED
            .get_or_init(|| dist("sluice.wasm").and_then(compile).map_err(|err| format!("{err:#}")))
            .as_ref()
            .map_err(|err| anyhow::anyhow!("{err}"));
    };
    let mut others = OTHERS.lock().map_err(|_| anyhow::anyhow!("module cache lock poisoned"))?;
    if let Some((_, compiled)) = others.iter().find(|(path, _)| path == wasm) {
        return Ok(compiled);
    }
    let compiled: &'static Compiled = Box::leak(Box::new(compile(wasm.to_path_buf())?));
    others.push((wasm.to_path_buf(), compiled));
    Ok(compiled)
}

fn compile(path: PathBuf) -> anyhow::Result<Compiled> {
    let mut config = Config::new();
    config.consume_fuel(true);
    let engine = Engine::new(&config)?;
    let wasm = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let module = cached(&engine, &wasm).with_context(|| format!("compiling {}", path.display()))?;
    let mut linker = Linker::new(&engine);
    imports::link(&mut linker)?;
    let pre = linker
        .instantiate_pre(&module)
        .map_err(anyhow::Error::from)
        .context("linking sluice.wasm's imports")?;
    Ok(Compiled { engine, pre })
}

/// The module compiled from `wasm`, from the cache when it holds it.
fn cached(engine: &Engine, wasm: &[u8]) -> anyhow::Result<Module> {
    let mut hasher = DefaultHasher::new();
    wasm.hash(&mut hasher);
    let dir = workspace_root().join("target").join("wasm-host");
    let file: PathBuf = dir.join(format!("sluice-{:016x}.cwasm", hasher.finish()));
    if file.is_file() {
        // SAFETY: the file was written by `Module::serialize` below, in our own
        // target dir; wasmtime checks its version and configuration.
        if let Ok(module) = unsafe { Module::deserialize_file(engine, &file) } {
            return Ok(module);
        }
    }
    let module = Module::new(engine, wasm)?;
    if let Ok(bytes) = module.serialize() {
        let tmp = dir.join(format!("{}.{}.tmp", std::process::id(), hasher.finish()));
        let stored = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&tmp, bytes));
        if stored.and_then(|()| std::fs::rename(&tmp, &file)).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(module)
}
