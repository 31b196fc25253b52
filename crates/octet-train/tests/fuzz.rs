//! Property tests of the file readers: whatever bytes a checkpoint, config or
//! token file holds, reading it returns `Ok` or an `Err`, never a panic.
//!
//! Each reader gets arbitrary bytes and mutations (bytes flipped, inserted,
//! deleted, a long number spliced in, the file cut short) of the small valid
//! files under `tests/fuzz-corpus/<reader>/`. The default case counts keep
//! each property under a minute on two cores; `PROPTEST_CASES=N` runs N
//! cases of each instead (see `docs/reliability.md`).

use octet_train::checkpoint;
use octet_train::data::Dataset;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

/// `PROPTEST_CASES` where given (a longer run), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(default: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases(default),
        ..ProptestConfig::default()
    }
}

/// The committed inputs of `reader` (`tests/fuzz-corpus/<reader>/*`), sorted by name.
fn corpus(reader: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz-corpus")
        .join(reader);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no corpus files", dir.display());
    files
        .iter()
        .map(|f| std::fs::read(f).expect("corpus file"))
        .collect()
}

/// One edit of a corpus file; positions are taken modulo its length.
#[derive(Clone, Debug)]
enum Edit {
    Set(usize, u8),
    Insert(usize, u8),
    Delete(usize, usize),
    Truncate(usize),
    /// A number past every limit, where a digit or value may be.
    Splice(usize, &'static str),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<usize>(), 1usize..32).prop_map(|(i, n)| Edit::Delete(i, n)),
        any::<usize>().prop_map(Edit::Truncate),
        (
            any::<usize>(),
            prop::sample::select(vec![
                "99999999999999999999",
                "-1",
                "1e308",
                "NaN",
                "18446744073709551615",
                "4294967296",
                "null",
                "[]",
                "{}",
                "\"\"",
            ])
        )
            .prop_map(|(i, s)| Edit::Splice(i, s)),
    ]
}

fn apply(mut b: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let at = |i: usize, n: usize| if n == 0 { 0 } else { i % n };
        match *e {
            Edit::Set(i, v) if !b.is_empty() => {
                let i = at(i, b.len());
                b[i] = v;
            }
            Edit::Set(..) => {}
            Edit::Insert(i, v) => {
                let i = at(i, b.len() + 1);
                b.insert(i, v);
            }
            Edit::Delete(i, n) => {
                let i = at(i, b.len());
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Edit::Truncate(i) => b.truncate(at(i, b.len() + 1)),
            Edit::Splice(i, s) => {
                let i = at(i, b.len() + 1);
                b.splice(i..i, s.bytes());
            }
        }
    }
    b
}

/// Arbitrary bytes (a quarter of the cases) or a mutated corpus file of `reader`.
fn inputs(reader: &str) -> impl Strategy<Value = Vec<u8>> {
    let files = corpus(reader);
    let n = files.len();
    let mutated = (0..n, prop::collection::vec(edit(), 0..6))
        .prop_map(move |(i, edits)| apply(files[i].clone(), &edits));
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..512),
        3 => mutated,
    ]
}

/// A fresh directory for one property's files (`octet-fuzz-<tag>-<pid>`).
fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("octet-fuzz-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("fuzz dir");
    d
}

proptest! {
    #![proptest_config(config(3_000))]

    /// The safetensors reader (tensors, FP8 codes, metadata) and the header
    /// reader behind the checkpoint's scaling record.
    #[test]
    fn any_safetensors_bytes_read_as_tensors_or_an_error(bytes in inputs("safetensors")) {
        let d = dir("safetensors");
        let p = d.join("model.safetensors");
        std::fs::write(&p, &bytes).unwrap();
        let _ = checkpoint::read_tensors(&p);
        let _ = checkpoint::stored_fp8_scaling(&d);
        let _ = checkpoint::load_weights(&d, octet_tensor::DType::F32);
    }
}

proptest! {
    #![proptest_config(config(2_000))]

    /// A checkpoint's Hugging Face `config.json`.
    #[test]
    fn any_config_json_bytes_read_as_a_config_or_an_error(bytes in inputs("config_json")) {
        let d = dir("config");
        std::fs::write(d.join("config.json"), &bytes).unwrap();
        let _ = checkpoint::load_config(&d);
    }
}

proptest! {
    #![proptest_config(config(2_000))]

    /// An adapter's PEFT `adapter_config.json`, by each of its readers.
    #[test]
    fn any_adapter_config_bytes_read_as_settings_or_an_error(bytes in inputs("adapter_config")) {
        let d = dir("adapter");
        std::fs::write(d.join("adapter_config.json"), &bytes).unwrap();
        let _ = checkpoint::load_adapter_config(&d);
        let _ = checkpoint::load_adapter_base(&d);
        let _ = checkpoint::load_adapter_dropout(&d);
    }
}

proptest! {
    #![proptest_config(config(5_000))]

    /// An adapter's `octet_lora.json`.
    #[test]
    fn any_octet_lora_bytes_read_as_a_record_or_an_error(bytes in inputs("octet_lora")) {
        let d = dir("lora-record");
        std::fs::write(d.join(checkpoint::LORA_RECORD), &bytes).unwrap();
        let _ = checkpoint::load_lora_record(&d);
    }
}

proptest! {
    #![proptest_config(config(5_000))]

    /// Token files, as u16 (`.bin`) and u32 (`.u32.bin`), under a small
    /// vocabulary (ids past it are errors) and GPT-2's.
    #[test]
    fn any_token_file_bytes_read_as_a_dataset_or_an_error(bytes in inputs("tokens_bin")) {
        let d = dir("tokens");
        for name in ["t.bin", "t.u32.bin"] {
            let p = d.join(name);
            std::fs::write(&p, &bytes).unwrap();
            for vocab in [256, 50_304] {
                let _ = Dataset::load(&p, vocab, 0.1);
            }
        }
    }
}
