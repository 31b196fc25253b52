//! A model folder's tokenizer.json, special tokens and chat template, and
//! fine-tuning JSONL: on a byte-level BPE trained here with Hugging Face's
//! `tokenizers` crate, and a ChatML template whose expected renderings are
//! Python jinja2's under transformers' settings.

use octet_nn::loss::IGNORE;
use octet_train::data::{Dataset, Split, Tokenizer};
use octet_train::finetune::{load_jsonl, LossOn};
use octet_train::hf_tokenizer::HfTokenizer;
use std::path::{Path, PathBuf};

const CORPUS: &[&str] = &[
    "The quick brown fox jumps over the lazy dog.",
    "Hello! How can I help? Name a colour. Blue.",
    "Fine-tuning data counts only the completion tokens by default.",
    "naïve café, 日本語, emoji 🦀 and tabs\tand\nnewlines.",
];

/// A ChatML template with blocks on their own lines (trim_blocks and
/// lstrip_blocks matter), a Python string method and `raise_exception`.
const TEMPLATE: &str = "{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'tool' %}
        {{ raise_exception('tool messages are not supported') }}
    {% endif %}
    {% if loop.first and message['role'] == 'system' %}
{{ '<|im_start|>system\\n' + message['content'].strip() + '<|im_end|>\\n' }}
    {% else %}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|im_start|>assistant\\n' }}
{% endif %}
{% if tools is not none %}{{ tools | tojson }}{% endif %}
";

const MESSAGES: &str = r#"[{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]"#;

/// Python jinja2 3.1.6 (ImmutableSandboxedEnvironment, trim_blocks,
/// lstrip_blocks, loopcontrols) on TEMPLATE and MESSAGES.
const RENDERED: &str = "<s>\n<|im_start|>system\nBe brief.<|im_end|>\n\n<|im_start|>user\nHi there<|im_end|>\n\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n\n<|im_start|>user\nName a colour.<|im_end|>\n\n<|im_start|>assistant\nBlue.<|im_end|>\n\n";
/// The same on the first four messages with the generation prompt.
const RENDERED_PROMPT: &str = "<s>\n<|im_start|>system\nBe brief.<|im_end|>\n\n<|im_start|>user\nHi there<|im_end|>\n\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n\n<|im_start|>user\nName a colour.<|im_end|>\n\n<|im_start|>assistant\n\n";

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("octet-hf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create the directory");
    d
}

/// A model folder with a byte-level BPE trained on CORPUS, special tokens
/// `<s>`, `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, and
/// `tokenizer_config.json` holding `config` (JSON object text).
fn folder(tag: &str, config: &str) -> PathBuf {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::AddedToken;
    let dir = tmpdir(tag);
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let special = ["<s>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(400)
        .min_frequency(1)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(special.iter().map(|s| AddedToken::from(*s, true)).collect())
        .build()
        .into();
    tok.train(&mut trainer, CORPUS.iter().map(|s| s.to_string()))
        .expect("train a BPE");
    tok.save(dir.join("tokenizer.json"), false)
        .expect("save tokenizer.json");
    std::fs::write(dir.join("tokenizer_config.json"), config).expect("write the config");
    dir
}

fn chatml_config() -> String {
    serde_json::json!({
        "bos_token": "<s>",
        "eos_token": {"content": "<|endoftext|>", "special": true},
        "chat_template": TEMPLATE,
    })
    .to_string()
}

/// Text round-trips exactly, special tokens come from tokenizer_config.json
/// (a string or an object) and generation_config.json (an id or a list),
/// and `Tokenizer::from_name` takes the folder or the file.
#[test]
fn a_tokenizer_json_round_trips_text_and_reads_its_special_tokens() {
    let dir = folder("round-trip", &chatml_config());
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"bos_token_id": 0, "eos_token_id": [1, 3]}"#,
    )
    .expect("write");
    let tok = Tokenizer::from_name(&dir.display().to_string()).expect("the folder");
    let by_file =
        Tokenizer::from_name(&dir.join("tokenizer.json").display().to_string()).expect("the file");
    assert_eq!(tok, by_file);
    for text in CORPUS {
        let ids = tok.encode(text);
        assert!(ids.len() < text.len(), "{text}: BPE merges");
        assert_eq!(tok.decode(&ids), *text);
    }
    let Tokenizer::Hf(hf) = &tok else {
        panic!("not a tokenizer.json tokenizer")
    };
    let (bos, eos) = (hf.bos.clone().expect("bos"), hf.eos.clone().expect("eos"));
    assert_eq!((bos.text.as_str(), bos.id), ("<s>", 0));
    assert_eq!((eos.text.as_str(), eos.id), ("<|endoftext|>", 1));
    assert_eq!(tok.eos_ids(), [1, 3]);
    // Special tokens written in text are those tokens.
    assert_eq!(hf.encode("<|im_end|>", false).expect("encode"), [3]);
    assert!(tok.vocab() <= 400);
    assert_eq!(tok.loss_label(), "cross-entropy (nats/token)");
    let e = Tokenizer::from_name("/nonexistent/folder")
        .expect_err("no tokenizer")
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Streamed tokens read as the whole decode (a `▁`-less byte-level BPE
/// still splits characters across tokens).
#[test]
fn streamed_tokenizer_json_tokens_read_as_the_whole_decode() {
    let dir = folder("stream", &chatml_config());
    let tok = Tokenizer::from_name(&dir.display().to_string()).expect("the folder");
    let text = CORPUS.join(" ");
    let ids = tok.encode(&text);
    let mut s = octet_train::data::TextStream::new(tok.clone());
    let mut out: String = ids.iter().map(|&t| s.push(&[t])).collect();
    out.push_str(&s.finish());
    assert_eq!(out, text);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The template renders as Python's jinja2 renders it under transformers'
/// settings, with and without the generation prompt; a raise_exception and
/// a template that does not parse are errors naming the template's file.
#[test]
fn a_chat_template_renders_as_transformers_renders_it() {
    let dir = folder("template", &chatml_config());
    let hf = HfTokenizer::load(&dir).expect("load");
    assert_eq!(
        hf.render_chat_json(MESSAGES, false).expect("render"),
        RENDERED
    );
    let four: Vec<serde_json::Value> = serde_json::from_str(MESSAGES).expect("JSON");
    let four = serde_json::to_string(&four[..4]).expect("JSON");
    assert_eq!(
        hf.render_chat_json(&four, true).expect("render"),
        RENDERED_PROMPT
    );
    let tool = r#"[{"role": "tool", "content": "x"}]"#;
    let e = hf
        .render_chat_json(tool, false)
        .expect_err("raise")
        .to_string();
    assert!(
        e.contains("tool messages are not supported") && e.contains("tokenizer_config.json"),
        "{e}"
    );
    let broken = folder(
        "broken-template",
        r#"{"eos_token": "<|endoftext|>", "chat_template": "{% for m in messages %}{{ m['content'] }"}"#,
    );
    let hf = HfTokenizer::load(&broken).expect("loads: the template is read when used");
    let e = hf
        .render_chat_json(MESSAGES, false)
        .expect_err("broken")
        .to_string();
    assert!(e.contains("tokenizer_config.json"), "{e}");
    // chat_template.jinja wins over tokenizer_config.json's, as transformers reads it.
    std::fs::write(broken.join("chat_template.jinja"), TEMPLATE).expect("write");
    let hf = HfTokenizer::load(&broken).expect("load");
    let text = hf.render_chat_json(MESSAGES, false).expect("render");
    assert!(text.starts_with("\n<|im_start|>system"), "{text:?}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&broken);
}

/// JSONL examples: a conversation counts exactly its assistant messages'
/// tokens (with their end of turn), a prompt/completion its completion and
/// EOS, a text line everything; `--loss-on all` counts every token.
#[test]
fn jsonl_examples_count_the_completion_and_assistant_tokens() {
    let dir = folder("jsonl", &chatml_config());
    let tok = Tokenizer::from_name(&dir.display().to_string()).expect("the folder");
    let Tokenizer::Hf(hf) = &tok else {
        panic!("not a tokenizer.json tokenizer")
    };
    let data = dir.join("train.jsonl");
    let lines = [
        format!(r#"{{"messages": {MESSAGES}}}"#),
        r#"{"prompt": "Name a colour.", "completion": " Blue."}"#.to_string(),
        String::new(),
        r#"{"text": "The quick brown fox."}"#.to_string(),
    ];
    std::fs::write(&data, lines.join("\n")).expect("write");
    let p = load_jsonl(&data, &tok, LossOn::Completion).expect("load");
    // The conversation: the rendered text's tokens, counted where they are
    // the assistant's text.
    let (ids, _) = hf.encode_offsets(RENDERED, false).expect("encode");
    let n = ids.len();
    assert_eq!(&p.tokens[..n], &ids[..]);
    let counted: Vec<u32> = (0..n)
        .filter(|&i| p.counted[i])
        .map(|i| p.tokens[i])
        .collect();
    assert_eq!(
        hf.decode(&counted),
        "Hello! How can I help?\n\nBlue.\n\n",
        "special tokens are left out of the decode"
    );
    let counted_with_specials = counted.iter().filter(|&&t| t == 3).count();
    assert_eq!(counted_with_specials, 2, "each assistant turn's <|im_end|>");
    // The prompt and completion.
    let prompt = hf.encode("Name a colour.", true).expect("encode");
    let completion = hf.encode(" Blue.", false).expect("encode");
    let m = prompt.len() + completion.len() + 1;
    assert_eq!(p.tokens[n..n + m].last(), Some(&1), "ends in the EOS");
    assert!(p.counted[n..n + prompt.len()].iter().all(|c| !c));
    assert!(p.counted[n + prompt.len()..n + m].iter().all(|&c| c));
    // The text line: all counted.
    assert!(p.counted[n + m..].iter().all(|&c| c));
    assert_eq!(p.tokens.len(), p.counted.len());
    let all = load_jsonl(&data, &tok, LossOn::All).expect("load");
    assert_eq!(all.tokens, p.tokens);
    assert!(all.counted.iter().all(|&c| c));
    // Batches carry the mask: a masked target is IGNORE, the others the tokens.
    let d = Dataset::from_packed(p.clone(), tok.vocab(), 0.0).expect("dataset");
    assert!(d.is_masked());
    let (mut masked, mut kept) = (0, 0);
    for step in 0..20 {
        let (x, y) = d.batch(Split::Train, 4, 8, 1, step).expect("batch");
        for (row, (xr, yr)) in x.chunks(8).zip(y.chunks(8)).enumerate() {
            for i in 0..7 {
                assert!(
                    yr[i] == IGNORE || yr[i] == xr[i + 1],
                    "row {row} target {i}"
                );
            }
        }
        masked += y.iter().filter(|&&t| t == IGNORE).count();
        kept += y.iter().filter(|&&t| t != IGNORE).count();
    }
    assert!(masked > 0 && kept > 0, "{masked} masked, {kept} kept");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad line is an error naming the file and the line number; messages
/// without a chat template (or with the byte tokenizer) say what is missing.
#[test]
fn bad_jsonl_lines_are_errors_naming_the_file_and_line() {
    let dir = folder("jsonl-errors", &chatml_config());
    let tok = Tokenizer::from_name(&dir.display().to_string()).expect("the folder");
    let data = dir.join("bad.jsonl");
    let good = r#"{"text": "fine"}"#;
    let cases = [
        ("{\"text\": ", "not valid JSON"),
        (r#"{"prompt": "only a prompt"}"#, "completion"),
        (r#"{"text": 3}"#, "expected a string"),
        (r#"{"question": "?"}"#, "expected"),
        (r#"[1, 2]"#, "expected an object"),
        (r#"{"messages": []}"#, "non-empty list"),
        (r#"{"messages": [{"role": "user"}]}"#, "messages[0]"),
        (r#"{"text": "a", "messages": []}"#, "one of these forms"),
    ];
    for (bad, want) in cases {
        std::fs::write(&data, format!("{good}\n\n{good}\n{bad}\n{good}\n")).expect("write");
        let e = load_jsonl(&data, &tok, LossOn::Completion)
            .expect_err(bad)
            .to_string();
        let at = format!("{}:4:", data.display());
        assert!(e.contains(&at) && e.contains(want), "{bad}: {e}");
    }
    // A raise_exception in the template names the line and the template.
    std::fs::write(&data, r#"{"messages": [{"role": "tool", "content": "x"}]}"#).expect("write");
    let e = load_jsonl(&data, &tok, LossOn::Completion)
        .expect_err("raise")
        .to_string();
    assert!(
        e.contains(":1:") && e.contains("tokenizer_config.json") && e.contains("tool messages"),
        "{e}"
    );
    // Messages under the byte tokenizer.
    std::fs::write(&data, format!(r#"{{"messages": {MESSAGES}}}"#)).expect("write");
    let e = load_jsonl(&data, &Tokenizer::Byte, LossOn::Completion)
        .expect_err("byte")
        .to_string();
    assert!(e.contains("chat template") && e.contains(":1:"), "{e}");
    // An empty file.
    std::fs::write(&data, "\n\n").expect("write");
    assert!(load_jsonl(&data, &tok, LossOn::Completion).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A path that is not there reads as no tokenizer.
#[test]
fn a_missing_tokenizer_json_is_an_error_naming_it() {
    let e = HfTokenizer::load(Path::new("/nonexistent"))
        .expect_err("missing")
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
}

/// A CPU run on JSONL data from a model folder's tokenizer trains on the
/// masked loss (finite, falling losses); the GPU loop is not asked.
#[test]
fn a_cpu_run_trains_on_masked_jsonl_data() {
    use octet_train::trainer::{train, Quiet, TrainConfig};
    let dir = folder("run", &chatml_config());
    let data = dir.join("chat.jsonl");
    let line = format!(r#"{{"messages": {MESSAGES}}}"#);
    std::fs::write(&data, vec![line; 40].join("\n")).expect("write");
    let cfg = TrainConfig {
        name: "jsonl".into(),
        out_dir: dir.join("runs"),
        model: "tiny".into(),
        data: Some(data),
        tokenizer: dir.display().to_string(),
        recipe: "bf16".into(),
        batch: 2,
        seq: 32,
        steps: 6,
        eval_every: 0,
        eval_batches: 1,
        save: false,
        sample_tokens: 0,
        telemetry_every: 0,
        ..TrainConfig::default()
    };
    let run = train(&cfg, None, &mut Quiet).expect("train");
    assert!(run.losses.iter().all(|l| l.is_finite()), "{:?}", run.losses);
    assert!(run.losses[5] < run.losses[0], "{:?}", run.losses);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fixture made by Python's tokenizers and transformers
/// (`tests/fixtures/tokenizer/`): ids and decodes of its corpus, the chat
/// template's renderings and their ids all equal Python's, and a JSONL
/// conversation counts exactly the assistant's turn.
#[test]
fn the_python_fixture_ids_decodes_and_chat_renderings_match() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"),
    )
    .expect("JSON");
    let hf = HfTokenizer::load(&dir).expect("load the fixture");
    let tok = Tokenizer::Hf(hf.clone());
    let corpus = want["corpus"].as_array().expect("corpus");
    for (i, text) in corpus.iter().enumerate() {
        let text = text.as_str().expect("a string");
        let ids: Vec<u32> = serde_json::from_value(want["ids"][i].clone()).expect("ids");
        assert_eq!(tok.encode(text), ids, "corpus[{i}] {text:?}");
        assert_eq!(tok.decode(&ids), want["decoded"][i], "corpus[{i}]");
        // Text without special tokens round-trips exactly.
        if !text.contains("<|") {
            assert_eq!(tok.decode(&tok.encode(text)), text, "corpus[{i}]");
        }
    }
    assert_eq!(tok.eos_ids(), [hf.eos.as_ref().expect("eos").id]);
    assert!(hf.bos.is_none(), "bos_token is null");
    let chat = want["chat"].to_string();
    let rendered = hf.render_chat_json(&chat, false).expect("render");
    assert_eq!(rendered, want["rendered"]);
    let n = want["chat"].as_array().expect("chat").len();
    let before: Vec<serde_json::Value> = serde_json::from_value(want["chat"].clone()).unwrap();
    let prompt = serde_json::to_string(&before[..n - 1]).expect("JSON");
    assert_eq!(
        hf.render_chat_json(&prompt, true).expect("render"),
        want["rendered_generation_prompt"]
    );
    let ids: Vec<u32> = serde_json::from_value(want["rendered_ids"].clone()).expect("ids");
    assert_eq!(hf.encode(&rendered, false).expect("encode"), ids);
    // As fine-tuning data: the assistant's turn, and its end of turn, count.
    let data = tmpdir("fixture").join("chat.jsonl");
    std::fs::write(&data, format!(r#"{{"messages": {chat}}}"#)).expect("write");
    let p = load_jsonl(&data, &tok, LossOn::Completion).expect("load");
    assert_eq!(p.tokens, ids);
    let counted: Vec<u32> = (0..ids.len())
        .filter(|&i| p.counted[i])
        .map(|i| ids[i])
        .collect();
    let text = hf.encode("A Montague.<|im_end|>\n", false).expect("encode");
    assert_eq!(counted, text);
    let _ = std::fs::remove_dir_all(data.parent().expect("a folder"));
}
