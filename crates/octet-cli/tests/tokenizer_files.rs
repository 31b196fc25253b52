//! A run from a Hugging Face model folder writes that folder's tokenizer
//! files into everything it writes (training and LoRA checkpoints, merged
//! models, exports), byte for byte, and what reads such a folder later
//! (`octet generate`, `octet train --resume`) takes the tokenizer from it,
//! also after the model folder is gone. On the CPU with a tiny model.

use octet_nn::llama::{Llama, LlamaConfig};
use octet_tensor::DType;
use octet_train::checkpoint;
use std::path::Path;

mod common;

use common::TempDir;

/// The tokenizer files of the model folder, beside `tests/fixtures/tokenizer`'s
/// (`tokenizer.json` and `tokenizer_config.json`, 400 ids).
const EXTRA: [(&str, &[u8]); 6] = [
    (
        "special_tokens_map.json",
        br#"{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}"#,
    ),
    ("generation_config.json", br#"{"eos_token_id": 2}"#),
    (
        "chat_template.jinja",
        b"{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}",
    ),
    ("vocab.json", br#"{"a": 0}"#),
    ("merges.txt", b"#version: 0.2\na b\n"),
    ("tokenizer.model", b"\x0a\x05\x0a\x01a\x15\x00\x00\x80\xbf"),
];

/// Every tokenizer file of the model folder.
const FILES: [&str; 8] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// Run `octet ARGS` in `cwd`, which must not panic.
fn octet(cwd: &Path, args: &[&str]) -> (bool, String) {
    let (ok, text) = common::octet_in(cwd, args);
    assert!(!text.contains("panicked"), "{text}");
    (ok, text)
}

/// A Hugging Face model folder at `dir`: a random tiny model of 400 ids
/// and the tokenizer files.
fn model_folder(dir: &Path) {
    let mut cfg = LlamaConfig::preset("tiny").expect("preset");
    cfg.vocab_size = 400;
    let m = Llama::new_random(&cfg, DType::F32, None, 3).expect("model");
    checkpoint::save_model(dir, &m).expect("save the model");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../octet-train/tests/fixtures/tokenizer");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(f), dir.join(f)).expect("copy the fixture");
    }
    for (f, bytes) in EXTRA {
        std::fs::write(dir.join(f), bytes).expect("write a tokenizer file");
    }
}

/// `to` holds every tokenizer file of `from`, byte for byte.
fn assert_carried(from: &Path, to: &Path) {
    for f in FILES {
        let want = std::fs::read(from.join(f)).expect("the model folder's file");
        let got = std::fs::read(to.join(f))
            .unwrap_or_else(|e| panic!("{} has no {f}: {e}", to.display()));
        assert!(got == want, "{f} in {} differs", to.display());
    }
}

/// The flags of a quick CPU run.
const QUICK: [&str; 12] = [
    "--device",
    "cpu",
    "--batch",
    "2",
    "--seq",
    "16",
    "--eval-batches",
    "0",
    "--sample-tokens",
    "0",
    "--out-dir",
    "D",
];

#[test]
fn written_folders_carry_the_model_folders_tokenizer_files() {
    let dir = TempDir::new("tokenizer-files");
    let d = &dir.0;
    let hf = d.join("hf");
    model_folder(&hf);
    let run = |args: &[&str]| {
        let (ok, text) = octet(d, &[args, &QUICK[..]].concat());
        assert!(ok, "{args:?}: {text}");
    };
    run(&["train", "--init", "hf", "--steps", "2", "--name", "t"]);
    let ck = d.join("D/t/checkpoints/step_000002");
    assert_carried(&hf, &ck);
    assert!(
        !ck.join("hf").exists() && std::fs::read_dir(&ck).expect("ls").count() == FILES.len() + 3,
        "more than model, config, optimizer and tokenizer files"
    );
    run(&["lora", "--base", "hf", "--steps", "2", "--name", "l"]);
    let adapter = d.join("D/l/checkpoints/step_000002");
    assert_carried(&hf, &adapter);
    let (ok, text) = octet(
        d,
        &[
            "lora",
            "merge",
            "--base",
            "hf",
            "--adapter",
            "D/l",
            "--out",
            "M",
        ],
    );
    assert!(ok, "{text}");
    assert_carried(&hf, &d.join("M"));
    let (ok, text) = octet(d, &["export", "--checkpoint", "D/t", "--out", "E"]);
    assert!(ok, "{text}");
    assert_carried(&hf, &d.join("E"));

    // The model folder goes away: the written folders still have their tokenizer.
    std::fs::rename(&hf, d.join("gone")).expect("move the model folder away");
    let gen = |ck: &str, extra: &[&str]| {
        let base = [
            "generate",
            "--checkpoint",
            ck,
            "--device",
            "cpu",
            "--max-tokens",
            "6",
            "--prompt",
            "Hello there",
            "--temperature",
            "0",
        ];
        let (ok, text) = octet(d, &[&base[..], extra].concat());
        assert!(ok, "generate {ck} {extra:?}: {text}");
        text
    };
    let own = gen("D/t", &[]);
    let given = gen("D/t", &["--tokenizer", ck.to_str().expect("a UTF-8 path")]);
    assert_eq!(
        own.lines().find(|l| l.contains("Hello")),
        given.lines().find(|l| l.contains("Hello")),
        "auto:\n{own}\n--tokenizer:\n{given}"
    );
    gen("M", &[]);
    // A resume whose recorded tokenizer is gone goes on with the checkpoint's copy.
    let (ok, text) = octet(
        d,
        &[&["train", "--resume", "D/t", "--steps", "3"], &QUICK[..10]].concat(),
    );
    assert!(ok, "{text}");
    assert_carried(&d.join("gone"), &d.join("D/t/checkpoints/step_000003"));
}

/// A run on `--tokenizer DIR` carries DIR's files, not the model
/// folder's, and a run on the byte tokenizer carries none.
#[test]
fn an_explicit_tokenizer_is_the_one_carried() {
    let dir = TempDir::new("tokenizer-explicit");
    let d = &dir.0;
    let hf = d.join("hf");
    model_folder(&hf);
    let other = d.join("tok");
    std::fs::create_dir_all(&other).expect("mkdir");
    for f in FILES {
        std::fs::copy(hf.join(f), other.join(f)).expect("copy");
    }
    std::fs::write(
        other.join("special_tokens_map.json"),
        br#"{"eos_token": "<s>"}"#,
    )
    .expect("write");
    let (ok, text) = octet(
        d,
        &[
            &[
                "train",
                "--init",
                "hf",
                "--tokenizer",
                "tok",
                "--steps",
                "1",
                "--name",
                "x",
            ],
            &QUICK[..],
        ]
        .concat(),
    );
    assert!(ok, "{text}");
    assert_carried(&other, &d.join("D/x/checkpoints/step_000001"));
    let (ok, text) = octet(
        d,
        &[
            &["train", "--model", "tiny", "--steps", "1", "--name", "b"],
            &QUICK[..],
        ]
        .concat(),
    );
    assert!(ok, "{text}");
    let ck = d.join("D/b/checkpoints/step_000001");
    assert!(ck.join("model.safetensors").is_file());
    for f in FILES {
        assert!(!ck.join(f).exists(), "a byte-tokenizer run wrote {f}");
    }
}
