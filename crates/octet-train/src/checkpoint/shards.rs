//! A model folder's weights in one safetensors file or in shards, as
//! transformers reads and writes them.
//!
//! | layout  | files                                                          |
//! |---------|----------------------------------------------------------------|
//! | single  | `model.safetensors`                                            |
//! | sharded | `model-00001-of-0000n.safetensors` ... and                     |
//! |         | `model.safetensors.index.json`: `{"metadata": {"total_size":   |
//! |         | bytes}, "weight_map": {tensor: shard file}}`                   |
//!
//! Reading takes `model.safetensors` where it is there (transformers' order),
//! else the index and every shard it names. Writing makes shards only where
//! the tensors exceed one shard's limit ([`MAX_SHARD_BYTES`], transformers'
//! default `max_shard_size="5GB"`), one file otherwise. Each file is written
//! atomically; the files of the other layout are removed afterwards, so a
//! reader never takes a stale single file over new shards.

use super::{read_header, read_tensors_fp8, write_atomic, write_tensors, FileTensors, Lazy};
use crate::{Error, Result};
use safetensors::View;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The most bytes of tensor data one shard holds: 5 GB (5 * 10^9), the
/// `max_shard_size` transformers' `save_pretrained` writes by default.
/// A tensor larger than this gets a shard of its own.
pub const MAX_SHARD_BYTES: usize = 5_000_000_000;

/// The weights of an unsharded model folder.
pub const SINGLE_FILE: &str = "model.safetensors";

/// The index of a sharded model folder.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Whether `dir` holds model weights in either layout (the files exist; what
/// reads them reports what is wrong inside).
pub fn has_weights(dir: &Path) -> bool {
    dir.join(SINGLE_FILE).is_file() || dir.join(INDEX_FILE).is_file()
}

/// A parsed index: the shard files in order of first mention, and which
/// shard each tensor is in.
struct Index {
    path: PathBuf,
    shards: Vec<String>,
    weight_map: HashMap<String, String>,
}

/// Read and check `dir/model.safetensors.index.json`: JSON with a
/// `weight_map` of tensor names to shard file names in `dir` (plain names,
/// no directories), each of which exists.
fn read_index(dir: &Path) -> Result<Index> {
    let path = dir.join(INDEX_FILE);
    let bad = |m: String| Error::Checkpoint(format!("{}: {m}", path.display()));
    let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no \"weight_map\" object of tensor names to shard files".into()))?;
    let mut shards: Vec<String> = Vec::new();
    let mut weight_map = HashMap::with_capacity(map.len());
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            bad(format!(
                "weight_map[{tensor:?}] = {file}: expected a shard file name"
            ))
        })?;
        let plain = Path::new(file).file_name().is_some_and(|n| n == file);
        if !plain || file == ".." {
            return Err(bad(format!(
                "weight_map[{tensor:?}] = {file:?}: a shard is a file name in the model folder, not a path"
            )));
        }
        if !shards.iter().any(|s| s == file) {
            shards.push(file.to_string());
        }
        weight_map.insert(tensor.clone(), file.to_string());
    }
    if shards.is_empty() {
        return Err(bad("the weight_map names no tensors".into()));
    }
    for s in &shards {
        if !dir.join(s).is_file() {
            return Err(Error::Checkpoint(format!(
                "shard {s} listed in {} is missing from {}",
                path.display(),
                dir.display()
            )));
        }
    }
    Ok(Index {
        path,
        shards,
        weight_map,
    })
}

/// Every tensor of a model folder's weights (single file or shards), and the
/// path its errors name (`model.safetensors` or the index). Sharded: a
/// tensor in two shards, or one the index puts in a shard that does not
/// hold it, is an error naming the files.
pub(super) fn read_model_tensors(dir: &Path) -> Result<(FileTensors, PathBuf)> {
    let single = dir.join(SINGLE_FILE);
    if single.is_file() || !dir.join(INDEX_FILE).is_file() {
        // Without either file, the single file's read names what is missing.
        return Ok((read_tensors_fp8(&single)?, single));
    }
    let index = read_index(dir)?;
    let (mut dense, mut fp8, mut meta) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut home: HashMap<String, &str> = HashMap::new();
    for shard in &index.shards {
        let (d, f, m) = read_tensors_fp8(&dir.join(shard))?;
        let names: Vec<String> = d.keys().chain(f.keys()).cloned().collect();
        for name in names {
            if let Some(first) = home.insert(name.clone(), shard) {
                return Err(Error::Checkpoint(format!(
                    "tensor {name} is in two shards, {first} and {shard} (index {})",
                    index.path.display()
                )));
            }
        }
        dense.extend(d);
        fp8.extend(f);
        meta.extend(m);
    }
    let mut listed: Vec<(&String, &String)> = index.weight_map.iter().collect();
    listed.sort();
    for (tensor, shard) in listed {
        if home.get(tensor).copied() != Some(shard.as_str()) {
            return Err(Error::Checkpoint(format!(
                "{}: tensor {tensor} is listed in shard {shard}, which does not hold it",
                index.path.display()
            )));
        }
    }
    Ok(((dense, fp8, meta), index.path))
}

/// The safetensors headers of a model folder's weights merged into one JSON
/// object (tensor name to `dtype`, `shape`, `data_offsets`; no
/// `__metadata__`); `None` where the folder holds no weights.
pub(super) fn read_model_header(dir: &Path) -> Result<Option<serde_json::Value>> {
    let single = dir.join(SINGLE_FILE);
    let files: Vec<PathBuf> = if single.is_file() {
        vec![single]
    } else if dir.join(INDEX_FILE).is_file() {
        let index = read_index(dir)?;
        index.shards.iter().map(|s| dir.join(s)).collect()
    } else {
        return Ok(None);
    };
    let mut all = serde_json::Map::new();
    for f in files {
        if let serde_json::Value::Object(m) = read_header(&f)? {
            all.extend(m.into_iter().filter(|(k, _)| k != "__metadata__"));
        }
    }
    Ok(Some(serde_json::Value::Object(all)))
}

/// The name transformers gives shard `i` (from 1) of `n`.
pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{i:05}-of-{n:05}.safetensors")
}

/// Split tensor sizes (bytes, in order) into consecutive shards of at most
/// `max_bytes` each, greedily as transformers does: a tensor that does not
/// fit the current shard starts the next; one larger than `max_bytes` has a
/// shard of its own. Returns each shard's number of tensors.
fn plan_shards(sizes: &[usize], max_bytes: usize) -> Vec<usize> {
    let mut counts = Vec::new();
    let (mut n, mut bytes) = (0usize, 0usize);
    for &s in sizes {
        if n > 0 && bytes.saturating_add(s) > max_bytes {
            counts.push(n);
            (n, bytes) = (0, 0);
        }
        n += 1;
        bytes = bytes.saturating_add(s);
    }
    if n > 0 || counts.is_empty() {
        counts.push(n);
    }
    counts
}

/// Write `tensors` as a model folder's weights in `dir`: `model.safetensors`
/// where they fit `max_shard_bytes` (octet writes with [`MAX_SHARD_BYTES`]),
/// else shards with their index. Each file is atomic; a failure removes the
/// shards this call wrote. The other layout's files in `dir` go after a
/// success.
pub(super) fn write_model_tensors(
    dir: &Path,
    tensors: Vec<(String, Lazy<'_>)>,
    max_shard_bytes: usize,
) -> Result<()> {
    let sizes: Vec<usize> = tensors.iter().map(|(_, t)| t.data_len()).collect();
    let plan = plan_shards(&sizes, max_shard_bytes.max(1));
    if plan.len() == 1 {
        write_tensors(&dir.join(SINGLE_FILE), tensors, None)?;
        remove_other_layout(dir, &[SINGLE_FILE.to_string()]);
        return Ok(());
    }
    let n = plan.len();
    let total: usize = sizes.iter().sum();
    let mut weight_map = BTreeMap::new();
    let mut written: Vec<String> = Vec::with_capacity(n + 1);
    let mut rest = tensors.into_iter();
    let mut result = Ok(());
    for (i, &count) in plan.iter().enumerate() {
        let name = shard_name(i + 1, n);
        let part: Vec<(String, Lazy)> = rest.by_ref().take(count).collect();
        for (t, _) in &part {
            weight_map.insert(t.clone(), name.clone());
        }
        result = write_tensors(&dir.join(&name), part, None);
        if result.is_err() {
            break;
        }
        written.push(name);
    }
    if result.is_ok() {
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        result = serde_json::to_string_pretty(&index)
            .map_err(|e| Error::Checkpoint(e.to_string()))
            .and_then(|text| write_atomic(&dir.join(INDEX_FILE), (text + "\n").as_bytes()));
    }
    if let Err(e) = result {
        for f in &written {
            let _ = std::fs::remove_file(dir.join(f));
        }
        return Err(e);
    }
    written.push(INDEX_FILE.to_string());
    remove_other_layout(dir, &written);
    Ok(())
}

/// Remove the weight files of either layout in `dir` that `keep` does not
/// name (best effort: a file that cannot be removed stays).
fn remove_other_layout(dir: &Path, keep: &[String]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !keep.contains(&name) && is_weight_file(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// `model.safetensors`, the index, or a shard name `model-NNNNN-of-NNNNN.safetensors`.
fn is_weight_file(name: &str) -> bool {
    if name == SINGLE_FILE || name == INDEX_FILE {
        return true;
    }
    let Some(mid) = name
        .strip_prefix("model-")
        .and_then(|r| r.strip_suffix(".safetensors"))
    else {
        return false;
    };
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    mid.split_once("-of-")
        .is_some_and(|(a, b)| digits(a) && digits(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_planned_greedily_and_a_large_tensor_stands_alone() {
        assert_eq!(plan_shards(&[4, 4, 4], 100), [3]);
        assert_eq!(plan_shards(&[4, 4, 4], 8), [2, 1]);
        assert_eq!(plan_shards(&[4, 20, 4, 4], 8), [1, 1, 2]);
        assert_eq!(plan_shards(&[], 8), [0]);
        assert_eq!(shard_name(2, 3), "model-00002-of-00003.safetensors");
        assert!(is_weight_file("model-00002-of-00003.safetensors"));
        assert!(!is_weight_file("model-2-of-3.safetensors"));
        assert!(!is_weight_file("adapter_model.safetensors"));
    }
}
