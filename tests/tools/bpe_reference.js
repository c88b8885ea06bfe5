// The JavaScript reference of shardtrain's BPE (common/bpe.h):
// @lenml/tokenizers (transformers.js's tokenizers, the pinned npm package in
// third_party/llama3 and third_party/llama2) encodes a text file, as
// tests/unit/common/bpe_test.cc, sp_bpe_test.cc and bench/tokenizer_bench
// compare against.
//
//   node bpe_reference.js TOKENIZER IN OUT [REPEAT]
//
// TOKENIZER: a Hugging Face tokenizer.json, or gpt2:DIR for GPT-2's
// encoder.json + vocab.bpe in DIR (made into the tokenizer.json Hugging Face
// publishes for GPT-2: ByteLevel pre-tokenizer with GPT-2's pattern).
// IN: UTF-8 text, encoded with Hugging Face's defaults but no post-processor
// tokens (add_special_tokens: false; added tokens in the text are tokens).
// OUT: a first line with the best encode() time of REPEAT runs (seconds,
// start-up and load excluded), then the ids, space-separated.
"use strict";
const fs = require("fs");
const path = require("path");
// The same pinned version is in third_party/llama3 and third_party/llama2.
const { TokenizerLoader } = require(["llama3", "llama2"]
  .map((d) => path.join(__dirname, "../../third_party", d, "node_modules/@lenml/tokenizers"))
  .find((p) => fs.existsSync(p)) || "@lenml/tokenizers");

const [tokenizerArg, inPath, outPath, repeatArg] = process.argv.slice(2);
let tokenizerJSON;
if (tokenizerArg.startsWith("gpt2:")) {
  const dir = tokenizerArg.slice(5);
  const vocab = JSON.parse(fs.readFileSync(path.join(dir, "encoder.json"), "utf8"));
  const merges = fs.readFileSync(path.join(dir, "vocab.bpe"), "utf8").split("\n")
    .filter((l, i) => l.length > 0 && !(i === 0 && l.startsWith("#version")));
  tokenizerJSON = {
    version: "1.0", truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true,
                     use_regex: true },
    post_processor: null, decoder: { type: "ByteLevel" },
    model: { type: "BPE", vocab, merges, ignore_merges: false },
  };
} else {
  tokenizerJSON = JSON.parse(fs.readFileSync(tokenizerArg, "utf8"));
}
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON, tokenizerConfig: { tokenizer_class: "PreTrainedTokenizerFast" } });
const text = fs.readFileSync(inPath, "utf8");
let best = Infinity, ids = [];
for (let i = 0; i < Math.max(1, Number(repeatArg || 1)); ++i) {
  const t0 = process.hrtime.bigint();
  ids = tokenizer.encode(text, { add_special_tokens: false });
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
fs.writeFileSync(outPath, best + "\n" + ids.join(" ") + "\n");
