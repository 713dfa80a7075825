// Runs the peer tokenizer (@huggingface/tokenizers, pure JS) on a batch of inputs, so that the C++
// tests can compare Tandem's tokenizer with it.
//
//   node hf_tokenize.mjs encode TOKENIZER.json DOCS.json OUT.json [--bos] [--repeat N]
//       DOCS.json is a JSON array of strings; OUT.json gets
//       {"ids": [[...], ...], "load_ms": L, "encode_ms": E, "encode_cpu_ms": C, "bytes": B}
//       (--repeat N encodes the whole batch N times and reports the fastest run: for benchmarks;
//       encode_cpu_ms is the process's CPU time for that run, fairer on a busy machine)
//   node hf_tokenize.mjs decode TOKENIZER.json IDS.json OUT.json [--skip-special]
//       IDS.json is a JSON array of id arrays; OUT.json gets {"texts": [...]}
import { readFileSync, writeFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { Tokenizer } from "@huggingface/tokenizers";

const [mode, tokenizer_path, input_path, output_path, ...flags] = process.argv.slice(2);
if (!["encode", "decode"].includes(mode) || !output_path) {
  console.error("usage: node hf_tokenize.mjs encode|decode TOKENIZER.json INPUT.json OUT.json [flags]");
  process.exit(2);
}
const flag_value = (name, fallback) => {
  const i = flags.indexOf(name);
  return i >= 0 ? Number(flags[i + 1]) : fallback;
};

const load_start = performance.now();
// Gemma's tokenizer_config.json sets clean_up_tokenization_spaces=false (the JS default is true).
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizer_path, "utf8")), {
  clean_up_tokenization_spaces: false,
});
const load_ms = performance.now() - load_start;
const input = JSON.parse(readFileSync(input_path, "utf8"));

if (mode === "encode") {
  const add_special_tokens = flags.includes("--bos");
  const repeat = flag_value("--repeat", 1);
  let ids = null;
  let encode_ms = Infinity;
  let encode_cpu_ms = Infinity;
  for (let r = 0; r < repeat; ++r) {
    const start = performance.now();
    const cpu_start = process.cpuUsage();
    const batch = input.map((text) => tokenizer.encode(text, { add_special_tokens }).ids);
    const cpu = process.cpuUsage(cpu_start);
    encode_ms = Math.min(encode_ms, performance.now() - start);
    encode_cpu_ms = Math.min(encode_cpu_ms, (cpu.user + cpu.system) / 1000);
    ids = batch;
  }
  const bytes = input.reduce((n, text) => n + Buffer.byteLength(text, "utf8"), 0);
  writeFileSync(output_path, JSON.stringify({ ids, load_ms, encode_ms, encode_cpu_ms, bytes }));
} else {
  const skip_special_tokens = flags.includes("--skip-special");
  // The peer refuses an empty id list; the empty text is the obvious answer.
  const texts = input.map((ids) => (ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens })));
  writeFileSync(output_path, JSON.stringify({ texts }));
}
