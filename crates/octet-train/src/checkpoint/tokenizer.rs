//! The tokenizer files a checkpoint, merge or export carries from the run's
//! Hugging Face tokenizer, and where a written folder's tokenizer is found.

use super::*;

/// [`copy_tokenizer_files`] of a run's tokenizer (`None`: nothing to copy)
/// into the checkpoint being written at `tmp`.
pub fn copy_run_tokenizer(tokenizer: Option<&Path>, tmp: &Path) -> Result<()> {
    if let Some(t) = tokenizer {
        copy_tokenizer_files(t, tmp)?;
    }
    Ok(())
}

/// The files of a model folder that describe its tokenizer, as transformers'
/// `AutoTokenizer` and octet's [`crate::hf_tokenizer`] read them. Each is
/// small (a vocabulary, merges, a SentencePiece model or settings), so every
/// folder octet writes from a run on such a tokenizer carries them unchanged
/// ([`copy_tokenizer_files`]); weight files are never among them.
pub const TOKENIZER_FILES: [&str; 13] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
];

/// Copy the tokenizer files ([`TOKENIZER_FILES`]) of `tokenizer` into the
/// folder `to`, byte for byte. `tokenizer` is a model folder, or a
/// `tokenizer.json` file: that file arrives as `to/tokenizer.json` (whatever
/// its name) and the other files come from its folder, as
/// [`crate::hf_tokenizer`] reads them. Files the folder lacks are left out;
/// one that is there but cannot be read is an error naming it. Returns the
/// names copied.
pub fn copy_tokenizer_files(tokenizer: &Path, to: &Path) -> Result<Vec<&'static str>> {
    let (dir, json) = if tokenizer.is_dir() {
        (tokenizer.to_path_buf(), tokenizer.join("tokenizer.json"))
    } else {
        let dir = match tokenizer.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        (dir, tokenizer.to_path_buf())
    };
    let mut copied = Vec::new();
    for name in TOKENIZER_FILES {
        let from = match name {
            "tokenizer.json" => json.clone(),
            _ => dir.join(name),
        };
        match std::fs::copy(&from, to.join(name)) {
            Ok(_) => copied.push(name),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !from.exists() => {}
            Err(e) => {
                return Err(Error::Checkpoint(format!(
                    "copying the tokenizer file {} into {}: {e}",
                    from.display(),
                    to.display()
                )))
            }
        }
    }
    Ok(copied)
}

/// The tokenizer files the model folder or checkpoint `dir` goes with, for
/// a folder written from it ([`copy_tokenizer_files`] takes the path):
/// `dir`'s own where it holds a `tokenizer.json` or records no run (a
/// model folder), else those of the Hugging Face tokenizer its run recorded
/// (the `tokenizer` of [`read_trainer_settings`], where that is still
/// there; a checkpoint written before checkpoints carried them). `None` for
/// a run on the `byte` or `gpt2` tokenizer.
pub fn tokenizer_source(dir: &Path) -> Result<Option<PathBuf>> {
    if dir.join("tokenizer.json").is_file() {
        return Ok(Some(dir.to_path_buf()));
    }
    Ok(match recorded_tokenizer(dir)? {
        Some(recorded) => recorded,
        None => Some(dir.to_path_buf()),
    })
}

/// [`tokenizer_source`] of a model merged from `base` and the LoRA adapter
/// `adapter`: the adapter's where it holds a `tokenizer.json` or records the
/// run that trained it (on whichever tokenizer that run took), else the
/// base's (an adapter from elsewhere).
pub fn merged_tokenizer_source(base: &Path, adapter: &Path) -> Result<Option<PathBuf>> {
    if adapter.join("tokenizer.json").is_file() {
        return Ok(Some(adapter.to_path_buf()));
    }
    match recorded_tokenizer(adapter)? {
        Some(recorded) => Ok(recorded),
        None => tokenizer_source(base),
    }
}

/// The tokenizer the run that saved the checkpoint `dir` trained with:
/// `None` where `dir` records no run, `Some(None)` for `byte`, `gpt2` or
/// a tokenizer no longer there, else its `tokenizer.json`.
pub fn recorded_tokenizer(dir: &Path) -> Result<Option<Option<PathBuf>>> {
    if !dir.join("optimizer.safetensors").is_file() {
        return Ok(None);
    }
    let Some(text) = read_trainer_settings(dir)? else {
        return Ok(None);
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Ok(None);
    };
    let Some(name) = v["tokenizer"].as_str() else {
        return Ok(None);
    };
    Ok(Some(match name {
        "byte" | "gpt2" => None,
        path => crate::hf_tokenizer::tokenizer_json(Path::new(path)),
    }))
}
