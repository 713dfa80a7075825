// Time to first token over the turns of one chat: each turn re-sends the whole conversation, which
// the server's prefix reuse serves from the previous turn's cache (docs/server.md, "Prefix reuse").
// Run it against `tandem serve` with and without --no-prefix-cache to see the difference.
//
//   node bench/bench_chat_turns.mjs [--url http://127.0.0.1:8080] [--model ID] [--turns 3]
//        [--repeat 60] [--max-tokens 16]
//
// The first user message is a sentence repeated --repeat times (60: ~1150 tokens with Gemma's
// tokenizer); later turns add a short question. Greedy, streamed; one JSON line per turn.
import { parseArgs } from "node:util";

import { sse_chunks } from "./sse_events.mjs";

const { values: options } = parseArgs({
  options: {
    url: { type: "string", default: "http://127.0.0.1:8080" },
    model: { type: "string", default: "" },
    turns: { type: "string", default: "3" },
    repeat: { type: "string", default: "60" },
    "max-tokens": { type: "string", default: "16" },
  },
});

async function model_id() {
  if (options.model) return options.model;
  const models = await (await fetch(`${options.url}/v1/models`)).json();
  return models.data[0].id;
}

// One streamed chat turn: time to the first content, total time, the answer and the usage.
async function turn(model, messages) {
  const start = performance.now();
  const response = await fetch(`${options.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({
      model, messages, max_tokens: Number(options["max-tokens"]), temperature: 0, stream: true,
      stream_options: { include_usage: true },
    }),
  });
  if (!response.ok) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  let text = "", usage = null, ttft = null;
  for await (const chunk of sse_chunks(response)) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices ?? []) {
      const piece = choice.delta?.content ?? "";
      if (piece && ttft === null) ttft = (performance.now() - start) / 1000;
      text += piece;
    }
  }
  return { ttft, seconds: (performance.now() - start) / 1000, text, usage };
}

const model = await model_id();
const sentence = "the river runs under old stone bridges while traders call out prices for salt, wool and copper; ";
const messages = [{ role: "user", content: "Read this and summarise it. " + sentence.repeat(Number(options.repeat)) }];
for (let t = 1; t <= Number(options.turns); ++t) {
  const r = await turn(model, messages);
  console.log(JSON.stringify({
    turn: t, prompt_tokens: r.usage?.prompt_tokens, cached_tokens: r.usage?.prompt_tokens_details?.cached_tokens,
    ttft_s: Number(r.ttft?.toFixed(2)), total_s: Number(r.seconds.toFixed(2)),
  }));
  messages.push({ role: "assistant", content: r.text });
  messages.push({ role: "user", content: "Now say it again in other words, please, in one line." });
}
