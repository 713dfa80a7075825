// Several choices of one long prompt (`n`): the server prefills the prompt once and the other
// choices start from its cache, sharing its blocks (docs/server.md, "Prefix reuse"). Run it against `tandem
// serve` with and without --no-prefix-cache to see the difference.
//
//   node bench/bench_choices.mjs [--url http://127.0.0.1:8080] [--model ID] [--n 4] [--repeat 50]
//        [--max-tokens 16] [--temperature 1]
//
// The prompt is a sentence repeated --repeat times (50: ~850 tokens with Gemma's tokenizer) and a
// number unique to the run, so no earlier run's cache serves it. Streamed; prints one JSON line
// with each choice's time to first token, the total time and the usage.
import { parseArgs } from "node:util";

import { sse_chunks } from "./sse_events.mjs";

const { values: options } = parseArgs({
  options: {
    url: { type: "string", default: "http://127.0.0.1:8080" },
    model: { type: "string", default: "" },
    n: { type: "string", default: "4" },
    repeat: { type: "string", default: "50" },
    "max-tokens": { type: "string", default: "16" },
    temperature: { type: "string", default: "1" },
  },
});

async function model_id() {
  if (options.model) return options.model;
  const models = await (await fetch(`${options.url}/v1/models`)).json();
  return models.data[0].id;
}

const model = await model_id();
const sentence = "The river runs past the old mill, under the stone bridge and on towards the sea. ";
const prompt = `Run ${Date.now()}. ` + sentence.repeat(Number(options.repeat)) + "Continue the story:";
const n = Number(options.n);
const start = performance.now();
const response = await fetch(`${options.url}/v1/completions`, {
  method: "POST",
  headers: { "Content-Type": "application/json" },
  body: JSON.stringify({
    model, prompt, n, max_tokens: Number(options["max-tokens"]), temperature: Number(options.temperature),
    stream: true, stream_options: { include_usage: true },
  }),
});
if (!response.ok) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
const ttft = Array(n).fill(null);
let usage = null;
for await (const chunk of sse_chunks(response)) {
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices ?? [])
    if (choice.text && ttft[choice.index] === null) ttft[choice.index] = (performance.now() - start) / 1000;
}
const round = (x) => (x === null ? null : Math.round(x * 1000) / 1000);
console.log(JSON.stringify({
  n, ttft_s: ttft.map(round), seconds: round((performance.now() - start) / 1000), usage,
}));
