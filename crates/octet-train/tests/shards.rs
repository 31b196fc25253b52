//! Sharded safetensors as transformers writes them: a model saved past its
//! shard limit comes back equal from its shards and index, a small one stays
//! one file, and a broken index or shard set is an error naming the file.

use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::DType;
use octet_train::checkpoint::{self, shards};
use std::path::{Path, PathBuf};

fn tiny() -> LlamaConfig {
    let mut cfg = LlamaConfig::preset("tiny").expect("the tiny preset");
    cfg.vocab_size = 64;
    cfg
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("octet-shards-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

/// How many shard files `dir` holds.
fn shard_count(dir: &Path) -> usize {
    files(dir)
        .iter()
        .filter(|f| f.starts_with("model-"))
        .count()
}

/// A model saved with a shard limit below its size: several shards of at
/// most the limit (bar a tensor larger than it) named as transformers names
/// them, an index mapping every tensor to its shard with the total size, and
/// weights that load back bit for bit.
#[test]
fn a_model_past_the_shard_limit_is_written_as_shards_that_load_back_equal() {
    let dir = tmpdir("write");
    let model = Llama::new_random(&tiny(), DType::F32, None, 7).expect("a model");
    let limit = 20_000;
    checkpoint::save_model_sharded(&dir, &model, limit).expect("save in shards");
    let names = files(&dir);
    let shard_files: Vec<&String> = names.iter().filter(|n| n.starts_with("model-")).collect();
    let n = shard_files.len();
    assert!(n >= 3, "{names:?}");
    for (i, f) in shard_files.iter().enumerate() {
        assert_eq!(**f, shards::shard_name(i + 1, n));
    }
    assert!(
        !names.contains(&"model.safetensors".to_string()),
        "{names:?}"
    );
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(shards::INDEX_FILE)).expect("the index"),
    )
    .expect("JSON");
    let params = model.params();
    let total: usize = params.iter().map(|(_, t)| t.bytes()).sum();
    assert_eq!(index["metadata"]["total_size"], total);
    let map = index["weight_map"].as_object().expect("a weight_map");
    assert_eq!(map.len(), params.len());
    for (name, t) in &params {
        assert!(map[name].is_string(), "{name}");
        let shard = dir.join(map[name].as_str().expect("a name"));
        // Each shard's data is at most the limit, unless one tensor is larger.
        let bytes = std::fs::metadata(&shard).expect("the shard").len() as usize;
        assert!(bytes < limit + 4096 || t.bytes() > limit, "{name}: {bytes}");
    }
    let back = checkpoint::load_weights(&dir, DType::F32).expect("load the shards");
    assert_eq!(back.len(), params.len());
    for (name, t) in &params {
        assert_eq!(back[name].to_f32_vec(), t.to_f32_vec(), "{name}");
    }
    assert!(checkpoint::has_weights(&dir));
    assert_eq!(
        checkpoint::resolve_checkpoint_dir(&dir).expect("itself"),
        dir
    );
    // Saved again under the default limit: one file, the shards gone.
    checkpoint::save_model(&dir, &model).expect("save whole");
    assert_eq!(files(&dir), ["config.json", "model.safetensors"]);
    let again = checkpoint::load_weights(&dir, DType::F32).expect("load");
    for (name, t) in &params {
        assert_eq!(again[name].to_f32_vec(), t.to_f32_vec(), "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model folder written by a training run in shards is a checkpoint the
/// trainer's `latest` may name, and a model `--init` can start from.
#[test]
fn a_sharded_checkpoint_is_found_by_latest_and_loads_as_a_model() {
    let parent = tmpdir("latest");
    let model = Llama::new_random(&tiny(), DType::F32, None, 3).expect("a model");
    let ck = checkpoint::save_checkpoint_with(&parent, "step_000002", |tmp| {
        checkpoint::save_model_sharded(tmp, &model, 30_000)
    })
    .expect("save");
    assert!(!ck.join("model.safetensors").exists());
    assert_eq!(
        checkpoint::latest_checkpoint(&parent).expect("latest"),
        Some(ck.clone())
    );
    let cfg = checkpoint::load_config(&ck).expect("config");
    let w = checkpoint::load_weights(&ck, DType::F32).expect("weights");
    Llama::from_weights(&cfg, w, None).expect("a model from shards");
    let _ = std::fs::remove_dir_all(&parent);
}

/// Broken shard sets are errors naming the file: a shard the index lists
/// that is absent (the shard and the index), a tensor in two shards, an
/// index that is not JSON, a shard path that leaves the folder.
#[test]
fn broken_shard_sets_are_errors_naming_the_file() {
    let dir = tmpdir("errors");
    let model = Llama::new_random(&tiny(), DType::F32, None, 5).expect("a model");
    checkpoint::save_model_sharded(&dir, &model, 20_000).expect("save in shards");
    let index_path = dir.join(shards::INDEX_FILE);
    let index = std::fs::read_to_string(&index_path).expect("the index");
    let load = || {
        checkpoint::load_weights(&dir, DType::F32)
            .expect_err("should fail")
            .to_string()
    };
    let n = shard_count(&dir);
    // A missing shard.
    let second = dir.join(shards::shard_name(2, n));
    let kept = std::fs::read(&second).expect("the second shard");
    std::fs::remove_file(&second).expect("remove it");
    let e = load();
    let second_name = second.file_name().expect("a name").to_string_lossy();
    assert!(
        e.contains(second_name.as_ref()) && e.contains(shards::INDEX_FILE),
        "{e}"
    );
    std::fs::write(&second, &kept).expect("put it back");
    // A tensor in two shards: the first shard copied over the second.
    let first = dir.join(shards::shard_name(1, n));
    std::fs::copy(&first, &second).expect("copy");
    let e = load();
    assert!(e.contains("two shards"), "{e}");
    std::fs::write(&second, &kept).expect("put it back");
    checkpoint::load_weights(&dir, DType::F32).expect("whole again");
    // An index that is not JSON.
    std::fs::write(&index_path, "{\"weight_map\": ").expect("write");
    let e = load();
    assert!(e.contains(shards::INDEX_FILE) && e.contains("JSON"), "{e}");
    // A shard named by a path out of the folder.
    let outside = index.replacen(
        &format!("\"{}\"", shards::shard_name(1, n)),
        "\"../model-00001-of-00001.safetensors\"",
        1,
    );
    std::fs::write(&index_path, outside).expect("write");
    let e = load();
    assert!(
        e.contains(shards::INDEX_FILE) && e.contains("not a path"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A failed sharded write leaves no shard of its own behind, and the
/// folder's previous weights as they were.
#[cfg(unix)]
#[test]
fn a_failed_sharded_write_leaves_the_previous_weights() {
    let dir = tmpdir("failed");
    let model = Llama::new_random(&tiny(), DType::F32, None, 9).expect("a model");
    checkpoint::save_model(&dir, &model).expect("save whole");
    // A directory where the third shard goes: its rename fails.
    let probe = tmpdir("probe");
    checkpoint::save_model_sharded(&probe, &model, 20_000).expect("probe");
    let n = shard_count(&probe);
    let _ = std::fs::remove_dir_all(&probe);
    let blocker = dir.join(shards::shard_name(3, n));
    std::fs::create_dir(&blocker).expect("block the third shard");
    std::fs::write(blocker.join("x"), "x").expect("make it non-empty");
    let e = checkpoint::save_model_sharded(&dir, &model, 20_000).expect_err("blocked");
    assert!(e.to_string().contains(&shards::shard_name(3, n)), "{e}");
    std::fs::remove_dir_all(&blocker).expect("unblock");
    assert_eq!(files(&dir), ["config.json", "model.safetensors"]);
    checkpoint::load_weights(&dir, DType::F32).expect("the previous weights");
    let _ = std::fs::remove_dir_all(&dir);
}
