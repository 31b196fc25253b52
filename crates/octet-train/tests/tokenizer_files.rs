//! The tokenizer files a written folder carries
//! (`checkpoint::copy_tokenizer_files`): copied byte for byte, weights
//! left out, missing files skipped, an unreadable one an error naming it;
//! and a CPU run's checkpoints carry its tokenizer, which reading the
//! checkpoint back finds there.

use octet_train::checkpoint;
use octet_train::data::Tokenizer;
use octet_train::trainer::{train, Quiet};
use std::path::{Path, PathBuf};

mod common;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("octet-tokfiles-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create the directory");
    d
}

/// The committed tokenizer fixture (400 ids), copied to `dir` with a
/// `generation_config.json`, a `merges.txt` and a weight file beside it.
fn tokenizer_folder(dir: &Path) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    std::fs::create_dir_all(dir).expect("mkdir");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(f), dir.join(f)).expect("copy the fixture");
    }
    std::fs::write(
        dir.join("generation_config.json"),
        br#"{"eos_token_id": [1, 2]}"#,
    )
    .expect("write");
    std::fs::write(dir.join("merges.txt"), b"#version: 0.2\n\xc4\xa0 t\n").expect("write");
    std::fs::write(dir.join("model.safetensors"), b"not copied").expect("write");
}

const PRESENT: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "merges.txt",
];

fn assert_same(from: &Path, to: &Path, files: &[&str]) {
    for f in files {
        let want = std::fs::read(from.join(f)).expect("the source file");
        let got =
            std::fs::read(to.join(f)).unwrap_or_else(|e| panic!("no {f} in {}: {e}", to.display()));
        assert!(got == want, "{f} differs");
    }
}

#[test]
fn tokenizer_files_are_copied_byte_for_byte_and_weights_are_not() {
    let root = tmpdir("copy");
    let src = root.join("src");
    tokenizer_folder(&src);
    let out = root.join("out");
    std::fs::create_dir_all(&out).expect("mkdir");
    let copied = checkpoint::copy_tokenizer_files(&src, &out).expect("copy");
    assert_eq!(copied, PRESENT);
    assert_same(&src, &out, &PRESENT);
    assert!(!out.join("model.safetensors").exists());
    assert!(!out.join("special_tokens_map.json").exists());

    // A tokenizer.json given by its path (any name) arrives as tokenizer.json.
    std::fs::rename(src.join("tokenizer.json"), src.join("mine.json")).expect("rename");
    let out2 = root.join("out2");
    std::fs::create_dir_all(&out2).expect("mkdir");
    checkpoint::copy_tokenizer_files(&src.join("mine.json"), &out2).expect("copy");
    assert_eq!(
        std::fs::read(out2.join("tokenizer.json")).expect("tokenizer.json"),
        std::fs::read(src.join("mine.json")).expect("mine.json")
    );
    assert_same(&src, &out2, &PRESENT[1..]);

    // A file that is there but cannot be read is an error naming it.
    std::fs::create_dir_all(src.join("vocab.json")).expect("a folder in its place");
    let out3 = root.join("out3");
    std::fs::create_dir_all(&out3).expect("mkdir");
    let e = checkpoint::copy_tokenizer_files(&src, &out3)
        .expect_err("an unreadable vocab.json")
        .to_string();
    assert!(e.contains("vocab.json"), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A CPU run on a tokenizer folder writes its files into the checkpoint;
/// the checkpoint names itself as its tokenizer's source, also after the
/// tokenizer folder is gone, and tokenizes as the original did.
#[test]
fn a_checkpoint_carries_its_runs_tokenizer_and_reads_it_back() {
    let root = tmpdir("run");
    let tok = root.join("tok");
    tokenizer_folder(&tok);
    let mut cfg = common::quick_run("t", &root.join("runs"), 2);
    cfg.tokenizer = tok.display().to_string();
    cfg.seq = 16;
    train(&cfg, None, &mut Quiet).expect("train");
    let ck = root.join("runs/t/checkpoints/step_000002");
    assert_same(&tok, &ck, &PRESENT);
    assert!(
        std::fs::read(ck.join("model.safetensors")).expect("weights") != b"not copied",
        "the tokenizer folder's weight file was copied"
    );
    let text = "Hello! How can I help?";
    let want = Tokenizer::from_name(&cfg.tokenizer)
        .expect("the run's tokenizer")
        .encode(text);
    std::fs::rename(&tok, root.join("gone")).expect("move the tokenizer away");
    let source = checkpoint::tokenizer_source(&ck)
        .expect("read")
        .expect("a tokenizer");
    assert_eq!(source, ck);
    let read = Tokenizer::from_name(&source.display().to_string()).expect("the checkpoint's");
    assert_eq!(read.encode(text), want);
    assert_eq!(
        read.eos_ids(),
        [2, 1],
        "<|im_end|> and generation_config.json's"
    );
    let _ = std::fs::remove_dir_all(&root);
}
